"""What each benchmark suite runs, at its full size and at its ``--quick`` size.

A suite is a grid: models x datasets x target epsilons x seeds. Every cell trains with the
shipped presets that apply (``configs/<model>.yaml``, ``<model>_<dataset>.yaml`` where a paper
gives settings for that dataset, ``<model>_<dataset>_eps<epsilon>.yaml``) and is
evaluated on the protocol fixed in :mod:`lightning_dpgan.evaluate`; nothing here is tuned on a
test split. The quick size is a smoke test that finishes in minutes on 2 CPU cores: its figures
show the harness works, not what the models can do.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import product
from typing import Any

DELTA = 1e-5


def delta_for(dataset: str) -> float:
    """The delta a cell on ``dataset`` is trained and reported at: ``DELTA``, the papers' 1e-5,
    unless the dataset's training split is too large for it (delta must be below 1/n) and its
    datamodule says so (``default_delta``: Kaggle credit's 1e-6, what ``train`` uses too)."""
    from lightning_dpgan import registry

    return getattr(registry.lookup("dataset", dataset).load(), "default_delta", None) or DELTA


def epsilon_text(epsilon: float) -> str:
    """``epsilon`` as cell folders and commands write it: short (``1``, ``0.1``), yet exactly the
    value, so that a run trains to the cell's own target (``:g`` alone keeps 6 figures)."""
    short = f"{epsilon:g}"
    return short if float(short) == epsilon else repr(float(epsilon))


@dataclass(frozen=True)
class Cell:
    """One training run of the grid."""

    model: str
    dataset: str
    epsilon: float | None  # None: a non-private baseline
    seed: int

    @property
    def name(self) -> str:
        epsilon = "inf" if self.epsilon is None else epsilon_text(self.epsilon)
        return f"{self.model}_{self.dataset}_eps{epsilon}_seed{self.seed}"

    @property
    def record(self) -> dict[str, Any]:
        """What names this cell in a results file's runs."""
        return {"model": self.model, "dataset": self.dataset, "target_epsilon": self.epsilon, "seed": self.seed}


@dataclass(frozen=True)
class Size:
    """A suite's grid and run lengths at one size."""

    models: tuple[str, ...]
    datasets: tuple[str, ...]
    epsilons: tuple[float, ...]
    seeds: tuple[int, ...]
    max_steps: int | None = None  # None: the preset's own schedule (until the budget is spent)
    n_synthetic: int | None = None  # images: records drawn for the CNN (None: as many as training images)
    cnn_epochs: int = 10
    train_args: tuple[str, ...] = field(default_factory=tuple)  # extra train.py options for every cell

    def cells(self) -> list[Cell]:
        return [Cell(m, d, e, s) for m, d, e, s in product(self.models, self.datasets, self.epsilons, self.seeds)]

    def with_overrides(self, **overrides: Any) -> Size:
        """This size with the options the user gave on the command line (None: keep)."""
        given = {key: tuple(value) if isinstance(value, list) else value
                 for key, value in overrides.items() if value is not None}
        return replace(self, **given)


# dpgan on tables: the paper's MNIST settings on the MLP pair ``auto`` picks for records (a dev
# split kept them over its EHR settings: configs/dpgan_adult.yaml); smartnoise-synth's DPGAN is its peer
TABLE_MODELS = ("pategan", "dpgan", "dpctgan", "patectgan", "dpsactgan", "quail")
IMAGE_MODELS = ("gpate", "dpgan", "gswgan")
PEERS = ("mst", "mwem", "pategan", "dpgan", "dpctgan", "patectgan")

SUITES: dict[str, dict[str, Size]] = {
    "tables": {
        "full": Size(TABLE_MODELS, ("adult", "king", "kaggle-credit"), (0.1, 1.0, 10.0), (0, 1, 2)),
        "quick": Size(("pategan", "dpctgan"), ("adult",), (1.0,), (0,), max_steps=20),
    },
    "images": {
        "full": Size(IMAGE_MODELS, ("mnist", "fashion-mnist"), (1.0, 10.0), (0, 1, 2)),
        "quick": Size(("dpgan",), ("mnist",), (10.0,), (0,), max_steps=20, n_synthetic=2000, cnn_epochs=1),
    },
    # speed: wall time per model on Adult at epsilon 1 (the grid), plus the mechanism micro-benchmarks
    "speed": {
        "full": Size(TABLE_MODELS, ("adult",), (1.0,), (0, 1, 2)),
        "quick": Size(("pategan", "dpctgan"), ("adult",), (1.0,), (0,), max_steps=20),
    },
    # peers: smartnoise-synth's synthesizers on the tables protocol (models = peer synthesizers)
    "peers": {
        "full": Size(PEERS, ("adult",), (1.0,), (0, 1, 2)),
        "quick": Size(("mst", "pategan"), ("adult",), (1.0,), (0,), max_steps=2),
    },
}


def suite_size(suite: str, quick: bool) -> Size:
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}: choose one of {', '.join(SUITES)}")
    return SUITES[suite]["quick" if quick else "full"]


__all__ = ["Cell", "DELTA", "PEERS", "SUITES", "Size", "delta_for", "epsilon_text", "suite_size"]

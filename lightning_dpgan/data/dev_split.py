"""A development split: training records held out of training, to choose settings on.

Choosing a schedule, a learning rate or a number of epochs by the score on the real test set
makes that score optimistic (the practice that inflates published DP image results). With
``--data.dev_fraction F`` a datamodule withholds a share F of its training records from
training: the generator never sees them, and ``evaluate --split dev`` scores a run on them
instead of on the test split, which then stays untouched until the settings are fixed.

The dev records are private records like the others. Training's (ε, δ) covers the records it
trained on; the dev rows are read only by the evaluation, without noise, and what is learnt by
comparing runs on them is not covered by any ε (as for every choice made by looking at private
data; see docs/privacy.md). The split itself is a seeded permutation of record positions: it
depends on the number of records, the fraction and the seed, never on their values.
"""
from __future__ import annotations

import numpy as np

#: second word of the generator's seed, so the dev permutation is not the train/test one of the
#: same ``split_seed`` (:meth:`TabularDataModule._seeded_split`)
DEV_STREAM = 1


def check_dev_fraction(fraction: float, flag: str = "--data.dev_fraction") -> float:
    """``fraction`` as a float in [0, 1), or a ValueError naming ``flag``, the option that gave it."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
        raise ValueError(f"{flag} must be a number in [0, 1) (0: no dev split), got {fraction!r}")
    return float(fraction)


def dev_split(n: int, fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sorted positions ``(kept, dev)`` of ``n`` records, ``round(n * fraction)`` of them dev.

    ``fraction = 0`` keeps every record. A fraction that leaves either part empty is refused:
    a dev split of no record scores nothing, and one of every record leaves nothing to train on.
    """
    fraction = check_dev_fraction(fraction)
    if fraction == 0:
        return np.arange(n), np.arange(0)
    n_dev = int(round(n * fraction))
    if not 0 < n_dev < n:
        digits = max(3, len(str(n)) + 1)  # enough that (n - 1) / n does not print as 1
        raise ValueError(f"--data.dev_fraction {fraction!r} of {n} training records holds {n_dev} out for the dev "
                         f"split and leaves {n - n_dev} to train on; each needs at least one record (a fraction "
                         f"from {1 / n:.3g} to {(n - 1) / n:.{digits}g} gives both)")
    order = np.random.default_rng([seed, DEV_STREAM]).permutation(n)
    return np.sort(order[n_dev:]), np.sort(order[:n_dev])


#: the held-out splits a run can be scored on (``evaluate --split``)
HELD_OUT_SPLITS = ("test", "dev")


def scored_split(dev_fraction: float) -> str:
    """The split a run is scored on by default: its dev records when it held some out of
    training (so the test split stays unread while settings are chosen), else the test split."""
    return "dev" if dev_fraction else "test"


def check_held_out_split(split: str, dev_fraction: float, dataset: str) -> None:
    """Refuse a split that is not one of :data:`HELD_OUT_SPLITS`, or ``"dev"`` for a run that
    held no dev records out of training."""
    if split not in HELD_OUT_SPLITS:
        raise ValueError(f"split must be one of {list(HELD_OUT_SPLITS)}, got {split!r}")
    if split == "dev" and not dev_fraction:
        raise ValueError(f"this {dataset} run held no dev records out of training: train it with "
                         "--data.dev_fraction F (a share of the training records) to score it on a dev split")

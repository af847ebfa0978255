"""Names users type (``--model gan``) mapped to the classes that implement them.

Entries are import paths, loaded on first use, so adding a model is one line here and
``--help`` can list everything with the first line of each class docstring, read from the
source files without importing them (:mod:`lightning_dpgan.class_source`).
"""
from __future__ import annotations

import difflib
import importlib
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lightning_dpgan import class_source


@dataclass(frozen=True)
class Entry:
    name: str
    target: str | None  # "package.module:Class"; None for the empty choice (privacy "none")
    summary: str = ""  # used when there is no class to read a docstring from

    def load(self) -> Any:
        if self.target is None:
            return None
        module_name, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module_name), attr)

    @property
    def description(self) -> str:
        """The summary, else the first line of the class's docstring: read from its source file
        (:mod:`lightning_dpgan.class_source`), imported only when that cannot be read."""
        if self.summary or self.target is None:
            return self.summary
        module_name, _, attr = self.target.partition(":")
        line = class_source.first_doc_line(module_name, attr)
        if line is not None:
            return line
        doc = (self.load().__doc__ or "").strip()
        return doc.splitlines()[0] if doc else ""

    def settings(self) -> list[str]:
        """The keyword arguments the class takes (``**kwargs`` followed to its bases), read from
        source like :attr:`description`; [] for the empty choice."""
        if self.target is None:
            return []
        module_name, _, attr = self.target.partition(":")
        names = class_source.constructor_arguments(module_name, attr)
        if names is not None:
            return names
        from lightning_dpgan.argument_types import init_arguments

        return list(init_arguments(self.load()))


def _table(*entries: Entry) -> dict[str, Entry]:
    return {entry.name: entry for entry in entries}


MODELS = _table(
    Entry("gan", "lightning_dpgan.modules.gan:GAN"),
    Entry("wgan", "lightning_dpgan.modules.wgan:WGAN"),
    Entry("dpgan", "lightning_dpgan.modules.dpgan:DPGAN"),
    Entry("pategan", "lightning_dpgan.modules.pategan:PATEGAN"),
    Entry("gpate", "lightning_dpgan.modules.gpate:GPATE"),
    Entry("gswgan", "lightning_dpgan.modules.gswgan:GSWGAN"),
    Entry("ctgan", "lightning_dpgan.modules.ctgan:CTGAN"),
    Entry("dpctgan", "lightning_dpgan.modules.dpctgan:DPCTGAN"),
    Entry("patectgan", "lightning_dpgan.modules.patectgan:PATECTGAN"),
    Entry("dpsactgan", "lightning_dpgan.modules.dpsactgan:DPSACTGAN"),
    Entry("quail", "lightning_dpgan.quail:QUAIL"),
)

DATASETS = _table(
    Entry("mnist", "lightning_dpgan.datamodules.mnist:MNISTDataModule"),
    Entry("fashion-mnist", "lightning_dpgan.datamodules.fashion_mnist:FashionMNISTDataModule"),
    Entry("adult", "lightning_dpgan.datamodules.adult:AdultDataModule"),
    Entry("king", "lightning_dpgan.datamodules.king:KingDataModule"),
    Entry("kaggle-credit", "lightning_dpgan.datamodules.kaggle_credit:KaggleCreditDataModule"),
    Entry("csv", "lightning_dpgan.datamodules.csv:CSVDataModule"),
)

PRIVACY = _table(
    Entry("none", None, "no privacy mechanism: the non-private baseline (no epsilon: reported as null)"),
    Entry("dp-sgd", "lightning_dpgan.callbacks.dp_sgd:DPSGD"),
    Entry("pate", "lightning_dpgan.callbacks.pate:PATEAggregation"),
    Entry("gpate", "lightning_dpgan.callbacks.gpate:ProjectedVoting"),
    Entry("sanitizer", "lightning_dpgan.callbacks.gradient_sanitizer:GradientSanitizer"),
)

LOGGERS = _table(
    Entry("csv", None, "CSV files under <output-dir>/logs (default)"),
    Entry("tensorboard", None, "TensorBoard event files under <output-dir>/logs"),
    Entry("wandb", None, "Weights & Biases (needs the 'wandb' extra; WANDB_MODE=offline works without network)"),
)

TABLES = {"model": MODELS, "dataset": DATASETS, "privacy": PRIVACY, "logger": LOGGERS}


class UnknownNameError(ValueError):
    """A name that is not registered; the message lists the valid ones."""


def lookup(kind: str, name: str) -> Entry:
    """Return the entry called ``name`` in table ``kind`` or fail listing the valid names."""
    table = TABLES[kind]
    if name in table:
        return table[name]
    valid = ", ".join(table)
    raise UnknownNameError(f"unknown {kind} '{name}'.{did_you_mean(name, table)} Valid {kind} names: {valid}.")


def name_of(kind: str, cls: type) -> str | None:
    """The name table ``kind`` gives exactly ``cls`` (not a subclass of it), or None."""
    target = f"{cls.__module__}:{cls.__qualname__}"
    return next((name for name, entry in TABLES[kind].items() if entry.target == target), None)


def did_you_mean(name: str, names: Iterable[str]) -> str:
    """`` Did you mean 'x'?`` for the one of ``names`` closest to a misspelt ``name``, else ''."""
    close = difflib.get_close_matches(name, list(names), n=1)
    return f" Did you mean '{close[0]}'?" if close else ""


def models_with_slot(slot: type) -> list[str]:
    """Names of the models whose ``privacy_slot`` is ``slot``."""
    return [name for name, entry in MODELS.items() if getattr(entry.load(), "privacy_slot", None) is slot]


def describe_settings(kind: str, section: str, provided: tuple[str, ...] = ()) -> str:
    """Per registered class, the dotted overrides its constructor takes (``--privacy.sigma1``
    ...) but ``provided`` (set by flags), for ``--help``: where an error says "the strategy's
    settings", this lists them."""
    return "\n".join(settings_line(name, entry, section, provided)
                     for name, entry in TABLES[kind].items() if entry.target is not None)


def settings_line(name: str, entry: Entry, section: str, provided: tuple[str, ...] = ()) -> str:
    """``  name: --section.arg, ...`` wrapped at 100 columns: the dotted overrides ``entry``'s
    class takes but ``provided``."""
    settings = ", ".join(f"--{section}.{arg}" for arg in entry.settings() if arg not in provided)
    return textwrap.fill(settings, width=100, initial_indent=f"  {name}: ", subsequent_indent="    ")


def describe(kind: str) -> str:
    """One line per registered name, for ``--help``."""
    table = TABLES[kind]
    width = max(len(name) for name in table)
    return "\n".join(f"  {name:<{width}}  {entry.description}" for name, entry in table.items())

"""Names a package offers at its top (``from lightning_dpgan.callbacks import DPSGD``) without
importing them before they are used (PEP 562's module ``__getattr__``).

Why lazily: every import of ``lightning_dpgan.callbacks.dp_sgd`` or ``lightning_dpgan.modules.gan``
runs its package's ``__init__`` first. Importing every model, strategy and dataset there would
make each command (``sample`` of one model, say) and each such import load all of them; here a
name resolves, once, when code first asks for it.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from importlib import import_module
from typing import Any


def registry_targets(entries: Iterable[Any], package: str) -> dict[str, str]:
    """``{class name: "module:Class"}`` of the registry entries (``registry.MODELS`` and the like)
    whose class lives in ``package``: the names ``--model`` and friends offer, offered in Python."""
    return {entry.target.rpartition(":")[2]: entry.target for entry in entries
            if entry.target is not None and entry.target.startswith(f"{package}.")}


def lazy_exports(package: str, targets: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: a name of ``targets`` imports its
    ``"module:attribute"`` on first use and is kept in the package from then on; ``dir()`` lists
    them beside what the package holds already (its own names, submodules imported)."""

    def __getattr__(name: str) -> Any:
        target = targets.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module_name, _, attribute = target.partition(":")
        value = getattr(import_module(module_name), attribute)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *targets})

    return __getattr__, __dir__

"""The software a privacy report was computed with.

An (epsilon, delta) figure is only as good as the code that accounted it: the accountants here,
Opacus' (DP-SGD's RDP and PRV), numpy's and scipy's numerics under PATE's moments, torch's
clipping and noise. A report read months later, or by an auditor on another machine, should say
which code produced it, so that a bug found in it later can be matched to the reports it
touches. ``privacy.json`` carries :func:`software_versions` as ``software``, and ``--version``
prints the same. This package's version number alone does not tell its commits apart, so a run
from a git checkout (an editable install) also names its commit, and whether tracked files
differed from it.
"""
from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import lightning_dpgan

#: The distributions whose code computes or enforces a privacy figure, by their installed names.
ACCOUNTING_PACKAGES = ("torch", "lightning", "opacus", "numpy", "scipy")


def installed_version(distribution: str) -> str | None:
    """A distribution's installed version, or None where it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def git(repo: Path, *args: str) -> str | None:
    """``git args`` run in ``repo``, its output stripped; None where git fails or is missing."""
    try:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


@functools.cache
def source_commit() -> dict[str, Any] | None:
    """``{"commit": sha, "modified": bool}`` when this package is imported from a git checkout of
    lightning-dpgan (``modified``: a tracked file differs from the commit); None for an installed
    copy, whose version number says what it is. Read once per process."""
    root = Path(lightning_dpgan.__file__).resolve().parent.parent
    if not (root / ".git").exists() or not (root / "pyproject.toml").is_file():
        return None
    head, status = git(root, "rev-parse", "HEAD"), git(root, "status", "--porcelain", "--untracked-files=no")
    if head is None or status is None:
        return None
    return {"commit": head, "modified": bool(status)}


def torch_version() -> str | None:
    """torch's own version string, build tag included (``2.13.0+cpu``, ``2.13.0+cu130``): the
    installed metadata may lack the tag (PyPI's wheels carry none), so it is read where torch
    keeps it, ``torch/version.py``, without importing torch (a couple of seconds that
    ``--version`` need not spend); torch's ``__version__`` once torch is imported anyway, and
    where that file cannot be read. None where torch is not installed."""
    if "torch" in sys.modules:
        return sys.modules["torch"].__version__
    spec = importlib.util.find_spec("torch")
    if spec is None:
        return None
    for folder in spec.submodule_search_locations or ():
        if (written := _assigned_string(Path(folder) / "version.py", "__version__")) is not None:
            return written
    return importlib.import_module("torch").__version__


def _assigned_string(source: Path, name: str) -> str | None:
    """The string a module's top level assigns to ``name`` (``name = '...'`` or an annotated
    assignment), read from its source; None where the file or the assignment is missing."""
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        value = getattr(node, "value", None)
        if any(isinstance(target, ast.Name) and target.id == name for target in targets) \
                and isinstance(value, ast.Constant) and isinstance(value.value, str):
            return value.value
    return None


def software_versions() -> dict[str, Any]:
    """``{"lightning-dpgan": ..., "python": ..., "torch": ..., ...}``, with ``lightning-dpgan
    source`` (:func:`source_commit`) when run from a checkout. This package's version is its own
    ``__version__`` (a checkout run without installing has no metadata), torch's is the one it
    reports (its build tag, ``+cpu`` or ``+cu130``, included: :func:`torch_version`)."""
    versions: dict[str, Any] = {"lightning-dpgan": lightning_dpgan.__version__}
    if (source := source_commit()) is not None:
        versions["lightning-dpgan source"] = source
    versions["python"] = platform.python_version()
    for distribution in ACCOUNTING_PACKAGES:
        versions[distribution] = torch_version() if distribution == "torch" else installed_version(distribution)
    return versions


def version_line() -> str:
    """``lightning-dpgan 0.1.0 (commit 1a2b3c4d5e6f, modified; python 3.11.9, torch 2.13.0+cpu,
    ...)``: what ``--version`` prints."""
    versions = software_versions()
    own = versions.pop("lightning-dpgan")
    source = versions.pop("lightning-dpgan source", None)
    checkout = "" if source is None else f"commit {source['commit'][:12]}{', modified' if source['modified'] else ''}; "
    others = ", ".join(f"{name} {version or 'not installed'}" for name, version in versions.items())
    return f"lightning-dpgan {own} ({checkout}{others})"

"""The software a privacy report was computed with.

An (epsilon, delta) figure is only as good as the code that accounted it: the accountants here,
Opacus' (DP-SGD's RDP and PRV), numpy's and scipy's numerics under PATE's moments, torch's
clipping and noise. A report read months later, or by an auditor on another machine, should say
which versions produced it, so that a bug found in one of them later can be matched to the
reports it touches. ``privacy.json`` carries :func:`software_versions` as ``software``, and
``--version`` prints the same.
"""
from __future__ import annotations

import platform
from importlib import metadata

import lightning_dpgan

#: The distributions whose code computes or enforces a privacy figure, by their installed names.
ACCOUNTING_PACKAGES = ("torch", "lightning", "opacus", "numpy", "scipy")


def installed_version(distribution: str) -> str | None:
    """A distribution's installed version, or None where it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def software_versions() -> dict[str, str | None]:
    """``{"lightning-dpgan": ..., "python": ..., "torch": ..., ...}``. This package's version
    is its own ``__version__`` (a checkout run without installing has no metadata), torch's is
    the one it reports (its build tag, ``+cpu`` or ``+cu130``, included)."""
    import torch

    versions: dict[str, str | None] = {"lightning-dpgan": lightning_dpgan.__version__,
                                       "python": platform.python_version()}
    for distribution in ACCOUNTING_PACKAGES:
        versions[distribution] = torch.__version__ if distribution == "torch" else installed_version(distribution)
    return versions


def version_line() -> str:
    """``lightning-dpgan 0.1.0 (python 3.11.9, torch 2.13.0+cpu, ...)``: what ``--version`` prints."""
    versions = software_versions()
    own = versions.pop("lightning-dpgan")
    others = ", ".join(f"{name} {version or 'not installed'}" for name, version in versions.items())
    return f"lightning-dpgan {own} ({others})"

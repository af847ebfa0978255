"""Where the harness finds its scripts, reference figures and results: the ``benchmarks/``
folder of the checkout this package runs from (an editable install's repository), whatever the
current folder. A recorded command names them relative to that checkout, so a results file
names no path of the machine it ran on."""
from __future__ import annotations

from pathlib import Path

#: the checkout this package runs from (an editable install's repository)
REPO = Path(__file__).resolve().parents[2]
#: the benchmark scripts, ``reference.yaml``, ``results/`` and ``RESULTS.md``
BENCHMARKS = REPO / "benchmarks"


def check_benchmarks_folder(repo: Path | None = None) -> None:
    """Refuse up front when this installation is not a checkout (a wheel installed without it):
    the scripts, the papers' figures and the results live in its ``benchmarks/`` folder. Told by
    the checkout's own files, not by a ``benchmarks`` folder alone: installed, the package's
    parents' parent is ``site-packages``, where Opacus installs a ``benchmarks`` package of its own."""
    folder = BENCHMARKS if repo is None else repo / "benchmarks"
    repo = folder.parent
    if not ((repo / "pyproject.toml").is_file() and (folder / "reference.yaml").is_file()):
        raise SystemExit(f"benchmark: the harness needs the repository's benchmarks/ folder (its scripts, the papers' "
                         f"figures and the results), and this installation is not a checkout ({repo} holds no "
                         "pyproject.toml and benchmarks/reference.yaml): run it from a clone installed with pip "
                         "install -e")


__all__ = ["BENCHMARKS", "REPO", "check_benchmarks_folder"]

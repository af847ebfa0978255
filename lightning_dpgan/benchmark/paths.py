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


def check_benchmarks_folder() -> None:
    """Refuse up front when this installation has no ``benchmarks/`` folder (a wheel installed
    without its checkout): the scripts, the papers' figures and the results live there."""
    if not BENCHMARKS.is_dir():
        raise SystemExit(f"benchmark: the harness needs the repository's benchmarks/ folder (its scripts, the papers' "
                         f"figures and the results), and this installation has none at {BENCHMARKS}: run it from a "
                         "clone installed with pip install -e")


__all__ = ["BENCHMARKS", "REPO", "check_benchmarks_folder"]

"""benchmarks/quail.py: its mean ± std summary over seeds."""
import pytest

from test_dev_split import load_benchmark_script

script = load_benchmark_script("quail")


def test_the_spread_over_seeds_is_the_sample_standard_deviation():
    """As the harness's cells: ddof 1 (1, 3 -> 1.4142), not the population's (1.0)."""
    assert script.summary([{"auroc": 1.0}, {"auroc": 3.0}]) == {"auroc": "2.0000 ± 1.4142"}
    assert script.spread([0.5]) == 0.0
    assert script.spread([1.0, 2.0, 6.0]) == pytest.approx(2.6458, abs=1e-4)

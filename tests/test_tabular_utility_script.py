"""benchmarks/tabular_utility.py: classifiers' utility of a table run, refusing a run it cannot score."""
import re

import pytest

from lightning_dpgan.cli import main
from test_ctgan_models import DATA, run_args
from test_dev_split import load_benchmark_script

script = load_benchmark_script("tabular_utility")


@pytest.fixture(scope="module")
def king_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "king"
    assert main(run_args("dpctgan", "king", run, 2)) == 0
    return run


def test_a_regression_run_is_refused_with_the_script_that_scores_it(king_run):
    with pytest.raises(SystemExit, match=re.escape(f"has a continuous label: this script scores classifiers; "
                                                   f"`python -m lightning_dpgan evaluate --run {king_run}` scores regressors")):
        script.run_datamodule(king_run, None, str(DATA["king"][0]))


def test_a_run_of_another_dataset_than_asked_is_refused(king_run):
    with pytest.raises(SystemExit, match=re.escape(f"--dataset adult: the run at {king_run} was trained on king")):
        script.run_datamodule(king_run, "adult", str(DATA["king"][0]))

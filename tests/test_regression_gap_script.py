"""benchmarks/regression_gap.py: a QUAIL run's R² gap split into its labels' and its features' part."""
import re

import pandas as pd
import pytest

from lightning_dpgan.cli import main
from test_dev_split import load_benchmark_script
from test_quail import DATA, quail_args

script = load_benchmark_script("regression_gap")


def table_rows(out: str) -> dict[str, float]:
    """``| name | value |`` rows of the script's output, by name (the two-column tables)."""
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^\| ([^|]+) \| (-?[0-9.]+) \|$", out, re.MULTILINE)}


@pytest.fixture(scope="module")
def king_quail_run(tmp_path_factory):
    output = tmp_path_factory.mktemp("quail") / "run"
    assert main(quail_args(output, "dpgan", "king")) == 0
    return output


def test_the_label_models_labels_on_the_synthetic_features_reproduce_the_runs_forest(king_quail_run, capsys):
    script.main(["--run", str(king_quail_run), "--data-dir", str(DATA["king"][0])])
    out = capsys.readouterr().out
    forest = re.search(r"^\| random_forest \| (-?[0-9.]+) \| (-?[0-9.]+) \|$", out, re.MULTILINE)
    rows = table_rows(out)
    # relabelling the synthetic features with the stored label model gives back synthetic.csv's labels,
    # so the forest trained on them scores what the run's own random forest scored
    assert rows["synthetic rows"] == pytest.approx(float(forest.group(2)), abs=1e-3)
    features = [name for name in DATA["king"][1].names if name != "price"]
    assert all(f"synthetic rows, {name} drawn from its real marginal" in rows for name in features)
    assert {"real training rows", "real columns, each shuffled on its own"} <= set(rows)
    assert re.search(r"^\| zipcode \| \d+ \| \d+ \| [0-9.]+ \|$", out, re.MULTILINE)


def test_a_run_without_a_label_model_is_refused(king_quail_run, tmp_path):
    assert main(["train", "--model", "dpgan", "--dataset", "king", "--data-dir", str(DATA["king"][0]),
                 "--output-dir", str(tmp_path / "dpgan"), "--max-steps", "2", "--batch-size", "8", "--epsilon", "8",
                 "--delta", "1e-3", "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]) == 0
    assert pd.read_csv(tmp_path / "dpgan" / "synthetic.csv").shape[0] > 0
    with pytest.raises(SystemExit, match="not a QUAIL run"):
        script.main(["--run", str(tmp_path / "dpgan"), "--data-dir", str(DATA["king"][0])])

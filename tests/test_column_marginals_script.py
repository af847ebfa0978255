"""benchmarks/column_marginals.py: per-column total variation and invented values of a table run."""
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from lightning_dpgan.cli import main
from lightning_dpgan.evaluate import load_run_datamodule
from test_ctgan_models import DATA, run_args
from test_dev_split import load_benchmark_script

script = load_benchmark_script("column_marginals")


def test_each_few_valued_column_is_scored_against_the_runs_training_rows(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(run_args("dpctgan", "king", run, 2)) == 0
    twin = shutil.copytree(run, tmp_path / "twin")  # a second run with the same table: the mean is the same
    script.main(["--run", str(run), "--run", str(twin), "--data-dir", str(DATA["king"][0])])
    out = capsys.readouterr().out
    rows = {(m.group(1), m.group(2)): (float(m.group(3)), float(m.group(4)))
            for m in re.finditer(r"^\| (\w+) \| ([^|]+?) \| [^|]* \| [^|]* \| ([0-9.]+) \| ([0-9.]+) \|$", out, re.MULTILINE)}
    # categorical and integer columns and the stepped floors; not continuous sqft_living or price, nor
    # yr_renovated, whose 0..2015 are more grid values than MAX_FEW_VALUES
    assert {name for name, _ in rows} == {"date", "bedrooms", "bathrooms", "floors", "waterfront", "view", "condition",
                                          "grade", "yr_built", "zipcode"}
    train = load_run_datamodule(run, str(DATA["king"][0])).train_frame
    synthetic = pd.read_csv(run / "synthetic.csv")
    p, q = train["zipcode"].value_counts(normalize=True), synthetic["zipcode"].value_counts(normalize=True)
    tv, invented = rows[("zipcode", f"{tmp_path.name}/run")]
    assert tv == pytest.approx(0.5 * p.sub(q, fill_value=0).abs().sum(), abs=1e-3)
    assert invented == pytest.approx((~synthetic["zipcode"].isin(train["zipcode"])).mean(), abs=1e-3)
    assert rows[("zipcode", "mean of 2")] == (tv, invented)


def test_a_relative_run_is_named_by_its_folder_and_parent(tmp_path, monkeypatch):
    """``--run king_dpctgan`` typed in the runs' folder: named ``<that folder>/king_dpctgan``, not ``/king_dpctgan``."""
    (tmp_path / "runs" / "king_dpctgan").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "runs")
    assert script.run_label(Path("king_dpctgan")) == "runs/king_dpctgan"
    assert script.run_label(tmp_path / "runs" / "king_dpctgan") == "runs/king_dpctgan"

"""benchmarks/reference.yaml: the papers' figures, each table with its source, consistent in shape."""
from pathlib import Path

import numpy as np
import pytest
import yaml

REFERENCE = yaml.safe_load((Path(__file__).resolve().parents[1] / "benchmarks" / "reference.yaml").read_text())


def test_every_table_names_its_source():
    assert all(isinstance(entry.get("source"), str) and "Table" in entry["source"] for entry in REFERENCE.values())


@pytest.mark.parametrize("metric", ["auroc", "auprc"])
def test_pategan_table_1_averages_match_its_rows(metric):
    """The paper prints each row's average: recomputing it checks the transcription."""
    table = REFERENCE["pate_gan"]
    for model, row in table[metric].items():
        assert len(row) == len(table["classifiers"]) == 12
        assert np.mean(row) == pytest.approx(table[f"{metric}_average"][model], abs=6e-4)


def test_row_lengths_match_their_columns():
    for name, table in REFERENCE["dp_sactgan"].items():
        if isinstance(table, dict):
            assert all(len(row) == len(table["columns"]) for key, row in table.items() if key != "columns"), name
    credit = REFERENCE["gpate_credit"]
    assert all(len(row) == len(credit["classifiers"]) for metric in ("auroc", "auprc") for row in credit[metric].values())

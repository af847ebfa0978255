"""benchmarks/reference.yaml: the papers' figures, each table with its source, consistent in shape."""
from pathlib import Path

import numpy as np
import pytest
import yaml

REFERENCE = yaml.safe_load((Path(__file__).resolve().parents[1] / "benchmarks" / "reference.yaml").read_text())


#: lists the harness reads (plot markers pointing into the tables, the product's goals), not paper tables
HARNESS_KEYS = ("markers", "goals")
PAPER_ENTRIES = {name: entry for name, entry in REFERENCE.items() if name not in HARNESS_KEYS}


def test_every_table_names_its_source():
    """A transcribed paper table names its table; a figure quoted from a re-run study names the study."""
    for name, entry in PAPER_ENTRIES.items():
        source = entry.get("source")
        assert isinstance(source, str) and ("Table" in source or "re-running" in source), name


def test_every_plot_marker_points_at_a_figure_of_a_paper_entry():
    from lightning_dpgan.benchmark.report import figure_at

    for marker in REFERENCE["markers"]:
        assert marker["at"][0] in PAPER_ENTRIES
        assert 0 < figure_at(REFERENCE, marker["at"]) < 1
    assert figure_at(REFERENCE, ["gpate_images", "cnn_accuracy", "mnist", "gpate_eps10"]) == 0.8092
    with pytest.raises(ValueError, match="gpate_images.nope"):
        figure_at(REFERENCE, ["gpate_images", "nope"])


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

"""What rounding onto the schema's declared steps does to an older QUAIL run's regression utility.

Runs decoded before a schema declared a column's ``step`` (King's floors in halves, bathrooms in
quarters) hold values off that grid. This script rounds those columns of the run's
``synthetic.csv`` onto the grid, relabels the rows with the run's own label model (stored in its
checkpoint; QUAIL's labels are a function of the features), and prints DP-SACTGAN's regression
utility on the held-out split before and after, per regressor. Nothing is retrained: the
difference is the rounding's alone.

    python benchmarks/step_rounding.py --run RUN [RUN ...] --data-dir DIR
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from lightning_dpgan.evaluate import load_run_datamodule, read_synthetic_table
from lightning_dpgan.evaluation.utility import regression_utility
from lightning_dpgan.run_folder import LAST_CHECKPOINT
from lightning_dpgan.sampling import read_run_info, table_labeler


def rounded(features: pd.DataFrame, schema) -> pd.DataFrame:
    """``features`` with every column that declares a step rounded onto its grid."""
    stepped = [c for c in schema.columns if c.step is not None and c.name in features]
    return features.assign(**{c.name: c.typed(features[c.name].to_numpy()) for c in stepped})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, nargs="+", required=True, help="output dirs of QUAIL runs on a regression table")
    parser.add_argument("--data-dir", help="replaces the data folder saved in the runs' config.yaml")
    parser.add_argument("--split", default="test", choices=("test", "dev"))
    args = parser.parse_args(argv)
    print("| run | R² as decoded | R² rounded onto the steps | per regressor, as decoded -> rounded |\n|---|---|---|---|")
    for run in args.run:
        labeler = table_labeler(read_run_info(run / LAST_CHECKPOINT))
        if labeler is None:
            raise SystemExit(f"{run} is not a QUAIL run: its labels cannot be recomputed for rounded features")
        datamodule = load_run_datamodule(run, args.data_dir)
        schema, held_out = datamodule.schema, datamodule.held_out(args.split)
        features = read_synthetic_table(run / "synthetic.csv", schema).drop(columns=[schema.label])
        before, after = (regression_utility(labeler.label(table), held_out, schema) for table in (features, rounded(features, schema)))
        per = ", ".join(f"{name} {before['per_regressor'][name]['r2']:.3f} -> {after['per_regressor'][name]['r2']:.3f}"
                        for name in before["per_regressor"])
        print(f"| {run.name} | {before['average']['r2']:.3f} | {after['average']['r2']:.3f} | {per} |", flush=True)


if __name__ == "__main__":
    main()

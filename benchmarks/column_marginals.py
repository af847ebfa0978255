"""How close a table run's synthetic columns with few values are to the real ones, column by column.

The harness's fidelity measures average over columns (JSD over categorical ones, WD over numeric
ones). This script shows, for each categorical column and each numeric column on a public grid
(integers, stepped values; at most 1,000 of them, MAX_FEW_VALUES), the total-variation distance between the run's ``synthetic.csv``
and the real rows it trained on, and the share of synthetic rows holding a value that no real
row holds (values the synthesizer invented). Both are
``lightning_dpgan.evaluation.fidelity`` measures; the real rows are the run's training split
(without its dev rows, if it held some out), read as ``evaluate`` reads them.

    python benchmarks/column_marginals.py --run RUN [--run RUN ...] --data-dir DIR

With several runs it prints one row per column and run, and each column's mean over the runs.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from lightning_dpgan.evaluate import load_run_datamodule, read_synthetic_table
from lightning_dpgan.evaluation.fidelity import invented_share_per_column, total_variation_per_column


def column_marginals(run: Path, data_dir: str | None) -> dict[str, dict[str, float]]:
    """``{column: {"tv", "invented", "real_values", "synthetic_values"}}`` for one run."""
    datamodule = load_run_datamodule(run, data_dir)
    schema, train = datamodule.schema, datamodule.train_frame
    synthetic = read_synthetic_table(run / "synthetic.csv", schema)
    distances = total_variation_per_column(train, synthetic, schema)
    invented = invented_share_per_column(train, synthetic, schema)
    return {name: {"tv": distances[name], "invented": invented[name], "real_values": float(train[name].nunique()),
                   "synthetic_values": float(synthetic[name].nunique())} for name in distances}


def run_label(run: Path) -> str:
    """The run folder and its parent (``bench/dpctgan-king-eps1-seed0``), also for a relative
    ``--run``; a linked folder keeps the name it was given."""
    run = Path(os.path.abspath(run))
    return f"{run.parent.name}/{run.name}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, action="append", required=True, help="output dir of a table run (repeatable)")
    parser.add_argument("--data-dir", help="replaces the data folder saved in each run's config.yaml")
    args = parser.parse_args(argv)
    results = {run: column_marginals(run, args.data_dir) for run in args.run}
    print("| column | run | real values | synthetic values | total variation | synthetic rows on invented values |")
    print("|---|---|---|---|---|---|")
    for name in next(iter(results.values())):
        for run, columns in results.items():
            m = columns[name]
            print(f"| {name} | {run_label(run)} | {m['real_values']:.0f} | {m['synthetic_values']:.0f} | {m['tv']:.3f} | "
                  f"{m['invented']:.3f} |")
        if len(results) > 1:
            tv = np.mean([columns[name]["tv"] for columns in results.values()])
            invented = np.mean([columns[name]["invented"] for columns in results.values()])
            print(f"| {name} | mean of {len(results)} | – | – | {tv:.3f} | {invented:.3f} |")


if __name__ == "__main__":
    main()

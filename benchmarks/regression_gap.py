"""Where a regression run's R² gap comes from: per regressor, and features against labels.

DP-SACTGAN's R² gap (real-trained minus synthetic-trained, averaged over linear regression,
ridge and a random forest) mixes two losses: the labels the synthetic rows carry, and the
features they carry. A QUAIL run labels its synthetic rows with its label model (stored in its
checkpoint), so the two can be told apart: this script puts that label model's labels on other
feature tables and trains the random forest there:

- the real training features (what a perfect synthesizer would give);
- the real training columns, each shuffled on its own (the real marginals, no joint structure);
- the synthetic features with one column replaced by a draw from its real marginal, per column.

It also prints the total-variation distance between the real training rows and the synthetic
ones of each column with few values (``evaluation.fidelity.total_variation_per_column``;
``benchmarks/column_marginals.py`` prints that table alone, for any table run). Everything is
scored on the run's held-out ``--split`` (``test`` by default; ``dev`` for a run trained with
``--data.dev_fraction``).

    python benchmarks/regression_gap.py --run RUN --data-dir DIR [--split dev]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from lightning_dpgan.evaluate import load_run_datamodule, read_synthetic_table
from lightning_dpgan.evaluation.fidelity import total_variation_per_column
from lightning_dpgan.evaluation.utility import REGRESSORS, features_and_label, regression_utility
from lightning_dpgan.run_folder import LAST_CHECKPOINT
from lightning_dpgan.sampling import read_run_info, table_labeler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="output dir of a train.py run on a regression table")
    parser.add_argument("--data-dir", help="replaces the data folder saved in the run's config.yaml")
    parser.add_argument("--split", default="test", choices=("test", "dev"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    labeler = table_labeler(read_run_info(args.run / LAST_CHECKPOINT))
    if labeler is None:
        raise SystemExit(f"{args.run} is not a QUAIL run: only QUAIL's label model can be put on other features")
    datamodule = load_run_datamodule(args.run, args.data_dir)
    schema, train, held_out = datamodule.schema, datamodule.train_frame, datamodule.held_out(args.split)
    synthetic = read_synthetic_table(args.run / "synthetic.csv", schema)
    real = regression_utility(train, held_out, schema, seed=args.seed)["per_regressor"]
    synth = regression_utility(synthetic, held_out, schema, seed=args.seed)["per_regressor"]
    print(f"run {args.run}: {len(synthetic)} synthetic rows, {len(held_out)} {args.split} rows; R² per regressor")
    print("| regressor | trained on real | trained on synthetic |\n|---|---|---|")
    for name in real:
        print(f"| {name} | {real[name]['r2']:.3f} | {synth[name]['r2']:.3f} |")

    x_test, y_test = features_and_label(held_out, schema)

    def relabelled(features: pd.DataFrame) -> float:
        """The evaluation's random forest's R² when trained on ``features`` carrying the label
        model's labels."""
        x, y = features_and_label(labeler.label(features), schema)
        return float(REGRESSORS["random_forest"](args.seed).fit(x, y).score(x_test, y_test))

    rng = np.random.default_rng(args.seed)
    features = train.drop(columns=[schema.label])
    shuffled = features.apply(lambda column: column.sample(frac=1.0, random_state=int(rng.integers(2**31))).to_numpy())
    synthetic_features = synthetic.drop(columns=[schema.label])
    print("\n| random forest on the run's label model's labels, over these features | R² |\n|---|---|")
    print(f"| real training rows | {relabelled(features):.3f} |")
    print(f"| real columns, each shuffled on its own | {relabelled(shuffled):.3f} |")
    print(f"| synthetic rows | {relabelled(synthetic_features):.3f} |")
    for name in features.columns:
        draw = train[name].sample(len(synthetic), replace=True, random_state=args.seed).to_numpy()
        print(f"| synthetic rows, {name} drawn from its real marginal | {relabelled(synthetic_features.assign(**{name: draw})):.3f} |")

    distances = total_variation_per_column(train, synthetic, schema)
    print("\n| column with few values | real values | synthetic values | total variation |\n|---|---|---|---|")
    for name, distance in distances.items():
        if name != schema.label:
            print(f"| {name} | {train[name].nunique()} | {synthetic[name].nunique()} | {distance:.3f} |")


if __name__ == "__main__":
    main()

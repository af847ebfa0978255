"""The CTGAN family on Adult and King, measured the way DP-SACTGAN's Tables 1-4 report them.

For each model and dataset: train with its preset at the given epsilon, then compare a model
trained on the real train split with one trained on the synthetic table, both tested on the
real test split -- Adult: logistic regression accuracy (in %), AUROC and F1; King: Ridge MAE,
explained variance and R^2 on the target scaled by its public bounds -- and report real minus
synthetic (MAE: synthetic minus real), as the paper does. Fidelity: mean per-column
Wasserstein distance (numeric columns in [0, 1]) and Jensen-Shannon divergence (categorical),
and the correlation-matrix difference, synthetic vs the real train split. "Real" is the records
the run trained on: its datamodule is rebuilt from its config.yaml (records held out with
``--data.dev_fraction`` are not in it).

    python benchmarks/ctgan_family.py --data-dir DIR --models dpctgan patectgan dpsactgan \
        --datasets adult king --epsilon 1 [--max-steps N] --out-dir runs/ctgan_family \
        [--label NAME] [-- --model.loss cross_entropy ...]

Arguments after ``--`` go to ``train.py`` unchanged (a variant of the presets); ``--label``
names the variant in the output directory and the table.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from lightning_dpgan.evaluate import load_run_datamodule, read_synthetic_table
from lightning_dpgan.evaluation import classification_utility
from lightning_dpgan.evaluation.fidelity import correlation_difference, jensen_shannon_per_column, wasserstein_per_column
from lightning_dpgan.evaluation.utility import CLASSIFIERS, REGRESSORS, regression_utility


def train(model: str, dataset: str, args: argparse.Namespace) -> tuple[Path, float]:
    out = args.out_dir / "_".join(filter(None, (model, dataset, args.label)))
    command = [sys.executable, "train.py", "--model", model, "--dataset", dataset, "--epsilon", str(args.epsilon),
               "--output-dir", str(out), "--trainer.enable_progress_bar", "false", "--seed", str(args.seed)]
    if args.data_dir:
        command += ["--data-dir", args.data_dir]
    if args.max_steps:
        command += ["--max-steps", str(args.max_steps)]
    if args.accelerator:
        command += ["--accelerator", args.accelerator]
    command += args.train_args
    started = time.perf_counter()
    subprocess.run(command, check=True)
    return out, time.perf_counter() - started


def utility_gap(datamodule, synthetic: pd.DataFrame, seed: int) -> dict[str, float]:
    schema, real_train, real_test = datamodule.schema, datamodule.train_frame, datamodule.test_frame
    if schema.label_kind == "continuous":
        ridge = {"ridge": REGRESSORS["ridge"]}
        real = regression_utility(real_train, real_test, schema, ridge, seed)["per_regressor"]["ridge"]
        synth = regression_utility(synthetic, real_test, schema, ridge, seed)["per_regressor"]["ridge"]
        return {"Ridge MAE": synth["mae"] - real["mae"], "Ridge EVS": real["explained_variance"] - synth["explained_variance"],
                "Ridge R2": real["r2"] - synth["r2"]}
    lr = {"logistic_regression": CLASSIFIERS["logistic_regression"]}
    real = classification_utility(real_train, real_test, schema, lr, seed)["per_classifier"]["logistic_regression"]
    synth = classification_utility(synthetic, real_test, schema, lr, seed)["per_classifier"]["logistic_regression"]
    return {"LR ACC %": 100 * (real["accuracy"] - synth["accuracy"]), "LR AUC": real["auroc"] - synth["auroc"],
            "LR F1": real["f1"] - synth["f1"]}


def fidelity(datamodule, synthetic: pd.DataFrame) -> dict[str, float]:
    schema, real = datamodule.schema, datamodule.train_frame
    wd = list(wasserstein_per_column(real, synthetic, schema).values())
    jsd = list(jensen_shannon_per_column(real, synthetic, schema).values())
    return {"WD": sum(wd) / max(len(wd), 1), "JSD": sum(jsd) / max(len(jsd), 1),
            "Diff-Corr": correlation_difference(real, synthetic, schema)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["dpctgan", "patectgan", "dpsactgan"])
    parser.add_argument("--datasets", nargs="+", default=["adult", "king"])
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--data-dir")
    parser.add_argument("--max-steps", type=int, help="cap on training batches (the preset's schedule otherwise)")
    parser.add_argument("--accelerator")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=Path("runs/ctgan_family"))
    parser.add_argument("--label", default="", help="names a variant given by train arguments after --")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.train_args = argv[split + 1:]
    rows = []
    for dataset in args.datasets:
        for model in args.models:
            run, seconds = train(model, dataset, args)
            datamodule = load_run_datamodule(run, args.data_dir)  # the records and schema this run trained with
            privacy = json.loads((run / "privacy.json").read_text())
            synthetic = read_synthetic_table(run / "synthetic.csv", datamodule.schema)  # as evaluate reads it
            row = {"model": " ".join(filter(None, (model, args.label))), "dataset": dataset, "epsilon": privacy["epsilon"], "steps": privacy["steps"],
                   "minutes": seconds / 60, **utility_gap(datamodule, synthetic, args.seed), **fidelity(datamodule, synthetic)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(markdown_table(rows))


def markdown_table(rows: list[dict]) -> str:
    """Rows as a Markdown table (columns: the union of keys, in first-seen order)."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    cell = lambda value: f"{value:.4f}" if isinstance(value, float) else ("–" if value is None else str(value))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(column)) for column in columns) + " |" for row in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    main()

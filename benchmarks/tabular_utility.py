"""Utility of a tabular run: train on its synthetic.csv, test on the real test split.

Prints PATE-GAN's Setting A (train real, test real) and Setting B (train synthetic, test real)
AUROC/AUPRC for each of the 12 classifiers and their averages, plus the average over the four
models of the Adult goal (logistic regression, random forest, gradient boosting, MLP).

    python train.py --model pategan --dataset adult --epsilon 1 --output-dir RUN ...
    python benchmarks/tabular_utility.py --run RUN --data-dir DIR

Setting A trains on the records the run trained on: the run's datamodule is rebuilt from its
``config.yaml``, so records it held out (``--data.dev_fraction``) are not in the real baseline.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import yaml

from lightning_dpgan.evaluate import load_run_datamodule, read_synthetic_table
from lightning_dpgan.evaluation import classification_utility

FOUR = ("logistic_regression", "random_forest", "gradient_boosting", "mlp")


def run_datamodule(run: Path, dataset: str | None, data_dir: str | None):
    """The datamodule ``run`` trained with; a ``dataset`` other than the run's is refused."""
    config = yaml.safe_load((run / "config.yaml").read_text())
    if dataset is not None and dataset != config["data"]["name"]:
        raise SystemExit(f"--dataset {dataset}: the run at {run} was trained on {config['data']['name']}")
    datamodule = load_run_datamodule(run, data_dir)
    schema = getattr(datamodule, "schema", None)  # image datamodules have none
    if schema is None or schema.label_kind is None:
        raise SystemExit(f"the run at {run} has no table label: this script scores classifiers trained to predict one")
    if schema.label_kind == "continuous":
        raise SystemExit(f"the run at {run} has a continuous label: this script scores classifiers; "
                         f"`python -m lightning_dpgan evaluate --run {run}` scores regressors")
    return datamodule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="output dir of a train.py run on a table")
    parser.add_argument("--dataset", help="checked against the run's dataset, if given")
    parser.add_argument("--data-dir", help="replaces the data folder saved in the run's config.yaml")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    datamodule = run_datamodule(args.run, args.dataset, args.data_dir)
    synthetic = read_synthetic_table(args.run / "synthetic.csv", datamodule.schema)
    privacy = json.loads((args.run / "privacy.json").read_text())
    real = classification_utility(datamodule.train_frame, datamodule.test_frame, datamodule.schema, seed=args.seed)
    synth = classification_utility(synthetic, datamodule.test_frame, datamodule.schema, seed=args.seed)
    print(f"run {args.run}: epsilon {privacy['epsilon']} (target {privacy['target_epsilon']}, delta {privacy['delta']}), "
          f"{len(synthetic)} synthetic rows, {len(datamodule.test_frame)} real test rows")
    print(f"{'classifier':22} {'A AUROC':>8} {'B AUROC':>8} {'A AUPRC':>8} {'B AUPRC':>8}")
    for name, scores in real["per_classifier"].items():
        other = synth["per_classifier"][name]
        flag = " (degenerate)" if other["degenerate"] else ""
        print(f"{name:22} {scores['auroc']:8.4f} {other['auroc']:8.4f} {scores['auprc']:8.4f} {other['auprc']:8.4f}{flag}")
    for label, names in (("average of 12", list(real["per_classifier"])), ("average of LR/RF/GB/MLP", FOUR)):
        a = np.mean([real["per_classifier"][n]["auroc"] for n in names])
        b = np.mean([synth["per_classifier"][n]["auroc"] for n in names])
        print(f"{label:22} {a:8.4f} {b:8.4f}")


if __name__ == "__main__":
    main()

"""QUAIL against its own parts, over several seeds: is labelling a private synthesizer's rows
with a DP label model better than the synthesizer alone, and than the label model alone?

For each seed: train ``--model quail --quail-synthesizer S --quail-split p`` and, with
``--baseline``, the synthesizer S alone at the same epsilon; then, on the real test split
(Adult: ``adult.test`` without missing values), report

- ``label model``: QUAIL's DP label model used directly as the classifier (the paper's
  "vanilla" DP classifier, F1_v) -- its AUROC, accuracy and F1;
- ``train synthetic``: classifiers trained on the synthetic table (PATE-GAN's setting B):
  the random forest's F1 (the paper's F1_q), and the AUROC averaged over logistic
  regression, random forest, gradient boosting and MLP (the Adult goal; real data: 0.907);
- epsilon, steps and wall time.

Mean and standard deviation over the seeds. Nothing is tuned on the test split: the settings
are the presets' and QUAIL's defaults.

    python benchmarks/quail.py --data-dir DIR --dataset adult --epsilon 1 --seeds 0 1 2 \
        --synthesizer dpctgan --split 0.5 --baseline --out-dir runs/quail [-- TRAIN-ARGS]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from sklearn.metrics import accuracy_score, f1_score, roc_auc_score

from lightning_dpgan import registry
from lightning_dpgan.evaluate import load_run_datamodule, read_synthetic_table
from lightning_dpgan.evaluation import classification_utility
from lightning_dpgan.evaluation.utility import CLASSIFIERS
from lightning_dpgan.run_folder import LAST_CHECKPOINT
from lightning_dpgan.sampling import read_run_info, table_labeler

FOUR = ("logistic_regression", "random_forest", "gradient_boosting", "mlp")


def train(name: str, model_args: list[str], seed: int, args: argparse.Namespace) -> tuple[Path, float]:
    out = args.out_dir / f"{name}_{args.dataset}_eps{args.epsilon:g}_seed{seed}"
    command = [sys.executable, "train.py", *model_args, "--dataset", args.dataset, "--epsilon", str(args.epsilon),
               "--seed", str(seed), "--output-dir", str(out), "--trainer.enable_progress_bar", "false"]
    if args.data_dir:
        command += ["--data-dir", args.data_dir]
    command += args.train_args
    started = time.perf_counter()
    subprocess.run(command, check=True)
    return out, time.perf_counter() - started


def synthetic_scores(run: Path, datamodule, seed: int) -> dict[str, float]:
    """Train on the run's synthetic table, test on the real test split."""
    synthetic = read_synthetic_table(run / "synthetic.csv", datamodule.schema)
    chosen = {name: CLASSIFIERS[name] for name in FOUR}
    scores = classification_utility(synthetic, datamodule.test_frame, datamodule.schema, chosen, seed)["per_classifier"]
    privacy = json.loads((run / "privacy.json").read_text())
    return {
        "epsilon": privacy["epsilon"],
        "steps": privacy["steps"],
        "rf_f1": scores["random_forest"]["f1"],
        "auroc_4": float(np.mean([scores[name]["auroc"] for name in FOUR])),
    }


def label_model_scores(run: Path, datamodule) -> dict[str, float]:
    """QUAIL's label model as a classifier of the real test rows."""
    labeler = table_labeler(read_run_info(run / LAST_CHECKPOINT))
    schema = labeler.schema
    test = datamodule.test_frame
    scores = labeler.predict(test).softmax(dim=1)[:, 1].numpy()
    truth = (test[schema.label].astype(str) == str(schema.label_column.categories[1])).to_numpy()
    predicted = scores > 0.5
    return {"label_model_auroc": float(roc_auc_score(truth, scores)),
            "label_model_accuracy": float(accuracy_score(truth, predicted)),
            "label_model_f1": float(f1_score(truth, predicted))}


def summary(rows: list[dict[str, float]]) -> dict[str, str]:
    """Mean ± sample standard deviation (ddof 1) per figure, as the harness reports its cells."""
    keys = rows[0].keys()
    return {key: f"{np.mean([r[key] for r in rows]):.4f} ± {spread([r[key] for r in rows]):.4f}" for key in keys}


def spread(values: list[float]) -> float:
    """The sample standard deviation; 0 for a single seed, which measures no spread."""
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir")
    parser.add_argument("--dataset", default="adult")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--synthesizer", default="dpctgan")
    parser.add_argument("--split", type=float, default=0.5)
    parser.add_argument("--baseline", action="store_true", help="also train the synthesizer alone")
    parser.add_argument("--out-dir", type=Path, default=Path("runs/quail"))
    argv = sys.argv[1:]
    train_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    args.train_args = train_args
    datamodule = registry.lookup("dataset", args.dataset).load()(data_dir=args.data_dir)
    datamodule.setup("fit")
    if datamodule.schema.label_kind != "binary":
        raise SystemExit("this benchmark scores a binary label (adult, kaggle-credit, a binary csv)")
    quail, alone = [], []
    for seed in args.seeds:
        run, wall = train(f"quail-{args.synthesizer}-p{args.split:g}",
                          ["--model", "quail", "--quail-synthesizer", args.synthesizer, "--quail-split", str(args.split)], seed, args)
        scored = load_run_datamodule(run, args.data_dir)  # the run's schema and splits (train args may change them)
        quail.append({**synthetic_scores(run, scored, seed), **label_model_scores(run, scored), "minutes": wall / 60})
        print(json.dumps({"quail": quail[-1], "seed": seed}), flush=True)
        if args.baseline:
            run, wall = train(args.synthesizer, ["--model", args.synthesizer], seed, args)
            alone.append({**synthetic_scores(run, load_run_datamodule(run, args.data_dir), seed), "minutes": wall / 60})
            print(json.dumps({"alone": alone[-1], "seed": seed}), flush=True)
    print(f"\n{args.dataset}, epsilon {args.epsilon:g}, seeds {args.seeds} (mean ± std)")
    print(f"QUAIL({args.synthesizer}, split {args.split:g}):", json.dumps(summary(quail), indent=1))
    if alone:
        print(f"{args.synthesizer} alone:", json.dumps(summary(alone), indent=1))


if __name__ == "__main__":
    main()

"""QUAIL's label model alone, scored on a dev split: which DP-SGD settings to give it.

QUAIL's utility on a table is bounded by its label model: the synthetic rows carry that model's
predictions, and classifiers or regressors re-learnt from them keep at most what it knows. Its
settings (architecture, epochs, batch size, learning rate, clipping norm) do not change the
guarantee -- σ is calibrated to whatever schedule they give -- so they can be chosen freely,
but only by looking at rows the runs do not score on. This script holds ``--dev-fraction`` of
the training split out (the same rows ``train --data.dev_fraction`` holds out), trains the
label model on the rest at QUAIL's share of ``--epsilon`` for each ``--setting``, and reports,
over the seeds, its R² (a continuous label, in the evaluation's bounds-scaled target) or AUROC
(a binary label) on the dev rows. Nothing is scored on the test split.

    python benchmarks/quail_label_model.py --dataset king --data-dir DIR --epsilon 1 --seeds 0 1 2 \\
        --setting epochs=10,batch_size=256 --setting epochs=30,batch_size=1024 ...

A setting is ``key=value`` pairs of :class:`lightning_dpgan.quail.QUAIL`'s arguments
(``label_model``, ``epochs``, ``batch_size``, ``lr``, ``max_grad_norm``, ``scale_share``,
``hidden`` as ``64x64``, ``log_features`` as ``capital-gain+capital-loss``, ``log_label`` as
``true``); the others keep
QUAIL's defaults. The label model's noise draws from OS entropy,
so repeated calls differ by that noise; ``--seeds`` set the initial weights.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.metrics import r2_score, roc_auc_score

from lightning_dpgan import registry
from lightning_dpgan.evaluation.utility import features_and_label
from lightning_dpgan.quail import QUAIL

NUMBERS = {"epochs": int, "batch_size": int, "lr": float, "max_grad_norm": float, "scale_share": float, "split": float}


def parse_setting(text: str) -> dict[str, object]:
    """``epochs=30,batch_size=1024`` -> ``{"epochs": 30, "batch_size": 1024}``."""
    setting: dict[str, object] = {}
    for pair in filter(None, text.split(",")):
        key, _, value = pair.partition("=")
        if key == "hidden":
            setting[key] = [int(width) for width in value.split("x")]
        elif key == "log_features":
            setting[key] = value.split("+")
        elif key == "log_label":
            if value not in ("true", "false"):
                raise ValueError(f"log_label=true or log_label=false, got log_label={value}")
            setting[key] = value == "true"
        else:
            setting[key] = NUMBERS.get(key, str)(value)
    return setting


def dev_score(labeler, dev, schema) -> float:
    """The label model's R² (continuous label) or AUROC (binary label) on the dev rows."""
    _, truth = features_and_label(dev, schema)
    if schema.label_column.is_numeric:
        _, predicted = features_and_label(labeler.label(dev.drop(columns=[schema.label])), schema)
        return float(r2_score(truth, predicted))
    return float(roc_auc_score(truth, labeler.predict(dev).softmax(dim=1)[:, 1].numpy()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="king")
    parser.add_argument("--data-dir")
    parser.add_argument("--epsilon", type=float, default=1.0, help="QUAIL's whole budget; the label model gets split of it")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--dev-fraction", type=float, default=0.2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--setting", action="append", default=[], help="key=value,... (repeat); none: QUAIL's defaults")
    args = parser.parse_args(argv)
    if not 0 < args.dev_fraction < 1:
        parser.error("--dev-fraction must be in (0, 1): settings are chosen on held-out training rows, never on the test split")
    datamodule = registry.lookup("dataset", args.dataset).load()(data_dir=args.data_dir, dev_fraction=args.dev_fraction)
    dev, schema = datamodule.held_out("dev"), datamodule.schema
    measure = "R²" if schema.label_column.is_numeric else "AUROC"
    print(f"{args.dataset}: {len(datamodule.train_frame)} training rows, {len(dev)} dev rows; label model's {measure} on the dev rows")
    print(f"| setting | label model ε | {measure} per seed | mean ± std | s per fit |")
    print("|---|---|---|---|---|")
    for text in args.setting or [""]:
        quail = QUAIL(**parse_setting(text))
        scores, costs, started = [], [], time.perf_counter()
        for seed in args.seeds:
            labeler = quail.fit_labeler(datamodule, args.epsilon, args.delta, "add-remove", seed=seed)
            scores.append(dev_score(labeler, dev, schema))
            costs.append(labeler.cost["epsilon"])
        seconds = (time.perf_counter() - started) / len(args.seeds)
        print(f"| {text or 'defaults'} | {max(costs):.4f} | {', '.join(f'{s:.3f}' for s in scores)} | "
              f"{np.mean(scores):.3f} ± {np.std(scores, ddof=1) if len(scores) > 1 else 0.0:.3f} | {seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()

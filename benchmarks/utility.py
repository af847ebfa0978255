"""Utility benchmark: how well does a classifier trained on synthetic images do on real ones?

For each seed: train the model with ``train.py``, draw ``--n-synthetic`` labelled records with
``python -m lightning_dpgan sample``, train the G-PATE evaluation CNN on them on a fixed
schedule, and test it once on the REAL test split. A "real data reference" trains the same CNN,
same schedule, on as many real training records, so the table shows the ceiling too.

    python benchmarks/utility.py --model dpgan --dataset mnist --epsilon 1 --data-dir DIR
    python benchmarks/utility.py --model gan --dataset mnist --quick --seeds 0

Arguments this script does not know are passed through to ``train.py`` (e.g.
``--model.lr_generator 1e-4``). Results go to ``<output-dir>/utility.json``; each seed's run,
training log and ``synthetic.npz`` go to ``<output-dir>/seed<S>/``.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from lightning_dpgan import registry
from lightning_dpgan.evaluate import load_run_datamodule
from lightning_dpgan.evaluation import cnn_accuracy, load_synthetic_npz
from lightning_dpgan.outputs import write_json
from lightning_dpgan.run_folder import LAST_CHECKPOINT

REPO = Path(__file__).resolve().parents[1]
QUICK = {"max_steps": 300, "n_synthetic": 5000, "cnn_epochs": 1}
FULL = {"max_steps": None, "n_synthetic": 60000, "cnn_epochs": 10}


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """Benchmark options, plus the unknown ones, which are meant for ``train.py``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    add = parser.add_argument
    add("--model", required=True, help="model name, as for train.py")
    add("--dataset", required=True, choices=("mnist", "fashion-mnist"))
    add("--epsilon", type=float, help="target epsilon passed to train.py (not for non-private models)")
    add("--data-dir", help="folder with the IDX files (passed to train.py and used for the real splits)")
    add("--max-steps", type=int, help="training batches per run (default: the model's preset; --quick: 300)")
    add("--n-synthetic", type=int, help="synthetic records drawn per run (default 60000; --quick: 5000)")
    add("--cnn-epochs", type=int, help="epochs of the evaluation CNN (default 10; --quick: 1)")
    add("--cnn-batch-size", type=int, default=128, help="batch size of the evaluation CNN")
    add("--cnn-lr", type=float, default=1e-3, help="Adam learning rate of the evaluation CNN")
    add("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one training run per seed")
    add("--quick", action="store_true", help="a few minutes on 2 CPU cores: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    add("--device", default="cpu", help="device of the evaluation CNN")
    add("--output-dir", type=Path, help="default outputs/utility-<model>-<dataset>-<timestamp>")
    args, train_extra = parser.parse_known_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.output_dir is None:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        args.output_dir = REPO / "outputs" / f"utility-{args.model}-{args.dataset}-{stamp}"
    # the commands run from the repository root: make the user's relative paths absolute
    args.output_dir = args.output_dir.resolve()
    if args.data_dir is not None:
        args.data_dir = str(Path(args.data_dir).resolve())
    return args, train_extra


def privacy_name(model: str, train_extra: list[str]) -> str:
    """The privacy strategy train.py will use: ``--privacy`` if passed through, else the model's default."""
    for index, token in enumerate(train_extra):
        if token.startswith("--privacy="):
            return token.split("=", 1)[1]
        if token == "--privacy" and index + 1 < len(train_extra):
            return train_extra[index + 1]
    return getattr(registry.lookup("model", model).load(), "default_privacy", "none")


def is_private(model: str, train_extra: list[str]) -> bool:
    return registry.lookup("privacy", privacy_name(model, train_extra)).target is not None


def train_command(args: argparse.Namespace, seed: int, run_dir: Path, private: bool, train_extra: list[str]) -> list[str]:
    command = [sys.executable, "train.py", "--model", args.model, "--dataset", args.dataset, "--seed", str(seed), "--output-dir", str(run_dir)]
    if private and args.epsilon is not None:
        command += ["--epsilon", str(args.epsilon)]
    if args.max_steps is not None:
        command += ["--max-steps", str(args.max_steps)]
    if args.data_dir is not None:
        command += ["--data-dir", args.data_dir]
    return command + train_extra


def sample_command(run_dir: Path, n: int, seed: int) -> list[str]:
    checkpoint = run_dir / LAST_CHECKPOINT
    return [sys.executable, "-m", "lightning_dpgan", "sample", "--checkpoint", str(checkpoint), "-n", str(n), "--out", str(run_dir / "synthetic.npz"), "--seed", str(seed)]


def run_logged(command: list[str], log: Path) -> None:
    """Run ``command`` from the repository root, its output into ``log``; on failure show the tail and stop."""
    print(f"$ {shlex.join(command)}", flush=True)
    with log.open("a") as handle:
        result = subprocess.run(command, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        sys.exit(f"command failed (exit {result.returncode}); last lines of {log}:\n{tail}")


def real_splits(run_dir: Path, data_dir: str | None) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """The real (train, test) splits of a finished run as (images in [-1, 1], labels): its own
    datamodule, rebuilt from its ``config.yaml``, so records the run held out of training
    (``--data.dev_fraction`` passed through) are not in the real reference's train split."""
    datamodule = load_run_datamodule(run_dir, data_dir)
    return datamodule.train_dataset.tensors, datamodule.test_dataset.tensors


def real_subset(train: tuple[torch.Tensor, torch.Tensor], n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` real training records (all of them if fewer), so the reference sees as many records as the synthetic runs."""
    images, labels = train
    index = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))[: min(n, len(images))]
    return images[index], labels[index]


def train_and_sample(args: argparse.Namespace, seed: int, private: bool, train_extra: list[str]) -> tuple[Path, list[list[str]]]:
    """Train one seed and draw its synthetic records; returns its run folder and the commands."""
    run_dir = args.output_dir / f"seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    commands = [train_command(args, seed, run_dir, private, train_extra), sample_command(run_dir, args.n_synthetic, seed)]
    for command in commands:
        run_logged(command, run_dir / "benchmark.log")
    return run_dir, commands


def score_seed(args: argparse.Namespace, seed: int, run_dir: Path, commands: list[list[str]],
               test: tuple[torch.Tensor, torch.Tensor]) -> dict[str, Any]:
    """The CNN trained on one seed's synthetic records, tested on ``test``: its row of the table."""
    synthetic_images, synthetic_labels = load_synthetic_npz(run_dir / "synthetic.npz")
    result = cnn_accuracy(synthetic_images, synthetic_labels, *test, **cnn_schedule(args, seed))
    privacy = json.loads((run_dir / "privacy.json").read_text())
    return {
        "seed": seed,
        **result,
        "epsilon": privacy.get("epsilon"),
        "delta": privacy.get("delta"),
        "mechanism": privacy.get("mechanism"),
        "steps": privacy.get("steps"),
        "run_dir": str(run_dir),
        "commands": [shlex.join(command) for command in commands],
    }


def cnn_schedule(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    return {"epochs": args.cnn_epochs, "batch_size": args.cnn_batch_size, "lr": args.cnn_lr, "seed": seed, "device": args.device}


def summarize(accuracies: list[float]) -> dict[str, Any]:
    """Mean and sample standard deviation (0 for a single seed, which has no spread to report)."""
    spread = statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
    return {"mean": statistics.fmean(accuracies), "std": spread, "n": len(accuracies)}


def format_epsilon(value: float | None) -> str:
    return "none (not private)" if value is None else f"{value:.4g}"


def print_table(report: dict[str, Any]) -> None:
    """The figure table: per-seed rows, mean ± std, the real-data ceiling and the exact commands."""
    settings = report["settings"]
    print(f"\n== Utility: train on synthetic, test on real | {report['model']} on {report['dataset']} ==")
    print(f"CNN: SmallCNN (G-PATE A.5), {settings['cnn_epochs']} epoch(s), batch {settings['cnn_batch_size']}, Adam lr {settings['cnn_lr']}, fixed schedule")
    print(f"{'seed':>4}  {'steps':>6}  {'epsilon':>20}  {'delta':>8}  {'synthetic':>9}  {'test':>6}  {'accuracy':>8}")
    for row in report["runs"]:
        delta = "-" if row["delta"] is None else f"{row['delta']:.0e}"
        print(f"{row['seed']:>4}  {row['steps']:>6}  {format_epsilon(row['epsilon']):>20}  {delta:>8}  {row['train_records']:>9}  {row['test_records']:>6}  {row['accuracy']:>8.4f}")
    synthetic, real = report["summary"], report["real_reference"]
    print(f"synthetic: {synthetic['mean']:.4f} ± {synthetic['std']:.4f} (mean ± std over {synthetic['n']} seed(s))")
    print(f"real data reference ({real['train_records']} real train records, same CNN schedule): {real['mean']:.4f} ± {real['std']:.4f} over {real['n']} seed(s)")
    print("commands:")
    for row in report["runs"]:
        for command in row["commands"]:
            print(f"  {command}")


def main(argv: list[str] | None = None) -> int:
    args, train_extra = parse_args(argv)
    private = is_private(args.model, train_extra)
    if not private:
        dropped = f" --epsilon {args.epsilon} is NOT passed to train.py;" if args.epsilon is not None else ""
        print(f"note: model '{args.model}' trains without privacy (--privacy none):{dropped} its results carry no (epsilon, delta) guarantee.")
    elif args.epsilon is None:
        print(f"note: no --epsilon given: train.py uses the target epsilon of the '{args.model}' preset; each run's privacy.json has the value.")
    trained = [train_and_sample(args, seed, private, train_extra) for seed in args.seeds]
    train, test = real_splits(trained[0][0], args.data_dir)  # every seed trains on the same records
    runs = [score_seed(args, seed, run_dir, commands, test) for seed, (run_dir, commands) in zip(args.seeds, trained)]
    reference = [cnn_accuracy(*real_subset(train, args.n_synthetic, seed), *test, **cnn_schedule(args, seed)) for seed in args.seeds]
    report = {
        "model": args.model,
        "dataset": args.dataset,
        "target_epsilon": args.epsilon if private else None,
        "private": private,
        "settings": {key: getattr(args, key) for key in ("max_steps", "n_synthetic", "cnn_epochs", "cnn_batch_size", "cnn_lr", "seeds", "quick")},
        "train_extra_args": train_extra,
        "runs": runs,
        "summary": summarize([row["accuracy"] for row in runs]),
        "real_reference": {**summarize([row["accuracy"] for row in reference]), "train_records": reference[0]["train_records"], "accuracies": [row["accuracy"] for row in reference]},
    }
    print_table(report)
    path = write_json(args.output_dir / "utility.json", report)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

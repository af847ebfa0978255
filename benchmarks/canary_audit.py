"""Full-size end-to-end audits: the CI audit (tests/test_canary_audit.py) with many more trials,
at several claimed epsilons, for DP-SGD as implemented and with its noise switched off.

With n trials per side a perfect membership test can show at most ln(q / (1 - q)), where
q = (α/4)^(1/n), at confidence 1 - α (each of the four interval ends the bound reads may miss
with α/4; 0.82 for n = 12, 2.39 for 50, 3.11 for 100 at 95%; close to ln(n / ln(4 / α)) only
for large n), so the CI test (12 per
side) can only catch a broken mechanism claiming less than 1. Here the trial count is a flag:
at 100 per side a broken run claiming up to ~3 is caught, and a sound run's lower bound shows
how close the test gets to the claim. A folder of ``--out-dir`` that already holds an audit is
refused before any trial runs.

    python benchmarks/canary_audit.py --trials 200 --epsilons 0.25 1 2 --out-dir runs/canary_audit

Prints, per claimed epsilon: the lower bound for the sound and the broken training, the counts
and the threshold. The broken variant is built here through the audit's test-only hook; it is
not a user option.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml

from lightning_dpgan import run_folder
from lightning_dpgan.canary_audit import balanced_assignment, run_audit
from lightning_dpgan.cli import build_config

TRAIN_RECORDS = 6


def tiny_table(root: Path) -> list[str]:
    """Eight records of two numeric columns in [0, 0.2] of bounds [0, 1] (six train, two test)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    pd.DataFrame({"x": rng.uniform(0, 0.2, 8).round(3), "y": rng.uniform(0, 0.2, 8).round(3)}).to_csv(root / "t.csv", index=False)
    schema = {"label": "y", "label_kind": "continuous", "columns": [
        {"name": "x", "kind": "continuous", "bounds": [0, 1]}, {"name": "y", "kind": "continuous", "bounds": [0, 1]}]}
    (root / "schema.yaml").write_text(yaml.safe_dump(schema))
    return ["--dataset", "csv", "--data.csv", str(root / "t.csv"), "--data.schema", str(root / "schema.yaml")]


def without_noise(run) -> None:
    """The broken variant: DP-SGD adds no noise; the accountant still charges the calibrated σ."""
    install = run.strategy.install

    def broken_install(trainer, module):
        install(trainer, module)
        run.strategy.mechanism.noise_multiplier = 0.0

    run.strategy.install = broken_install


def audit_folder(out_dir: Path, epsilon: float, variant: str) -> Path:
    return out_dir / f"eps{epsilon:g}_{variant.replace(' ', '_')}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.25, 1.0, 2.0])
    parser.add_argument("--out-dir", type=Path, default=Path("runs/canary_audit"))
    args = parser.parse_args()
    try:  # refused before any output: each audit would stop at its first trial with a traceback
        balanced_assignment(args.trials, np.random.default_rng(0))
    except ValueError as error:
        parser.error(str(error))
    repeated = sorted({f"{e:g}" for e in args.epsilons if sum(f"{o:g}" == f"{e:g}" for o in args.epsilons) > 1})
    if repeated:  # one folder each: the second audit of an epsilon would write over the first's trials
        parser.error(f"--epsilons repeats {', '.join(repeated)}: give each epsilon once")
    variants = (("sound", None), ("no noise", without_noise))
    held = [folder for folder in (audit_folder(args.out_dir, epsilon, variant) for epsilon in args.epsilons
                                  for variant, _ in variants)
            if any((folder / name).exists() for name in run_folder.AUDIT_OUTPUTS)]
    if held:  # refused before the first trial: a new audit would write its trials over these
        holds = "holds" if len(held) == 1 else "hold"
        parser.error(f"{', '.join(map(str, held))} {holds} an audit already: choose another --out-dir")
    torch.set_num_threads(1)  # tiny nets: threads only add waiting
    data = tiny_table(args.out_dir / "data")
    print(f"{'claimed':>8} {'variant':8} {'eps_lower':>9} {'TP':>4} {'FP':>4} {'per side':>8} {'threshold':>9}")
    for epsilon in args.epsilons:
        for variant, hook in variants:
            config = build_config([
                "--model", "gan", "--privacy", "dp-sgd", *data, "--epsilon", str(epsilon), "--max-steps", "40",
                "--batch-size", str(TRAIN_RECORDS), "--accelerator", "cpu", "--model.latent_dim", "8",
                "--model.generator_kwargs.hidden", "[32,32]", "--model.discriminator_kwargs.hidden", "[32,32]",
                "--privacy.max_grad_norm", "100", "--model.lr_generator", "5e-3", "--model.lr_discriminator", "5e-3",
                "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
            ])
            out = audit_folder(args.out_dir, epsilon, variant)
            audit = run_audit(config, out, trials=args.trials, samples=1000, prepare_run=hook).to_dict()
            print(f"{audit['claimed_epsilon']:8.3f} {variant:8} {audit['epsilon_lower']:9.3f} {audit['true_positives']:4d} "
                  f"{audit['false_positives']:4d} {args.trials // 2:8d} {audit['threshold']:9.4f}", flush=True)


if __name__ == "__main__":
    main()

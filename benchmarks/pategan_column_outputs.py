"""PATE-GAN on Adult with a generator whose output follows the columns' public structure.

The paper's generator ends in one sigmoid per encoded column, so its first rows sum to about 54
where a real row sums to about 10.4, and the teachers tell them apart from their first update
(benchmarks/RESULTS.md, "What the teachers answered"). This script swaps that output for a
softmax over each categorical column's one-hot group and a sigmoid per numeric column (the
schema's column slices: public), trains the ``pategan_adult`` preset's teachers and noise
through a plain Lightning Trainer, and prints what the teachers answered and what it spent.

    python benchmarks/pategan_column_outputs.py --data-dir DIR --seeds 0 1 2 --teacher-steps 50 5

Prints one line per run: seed, teacher updates per step, generator steps taken, the released
answers by class ("generated", "real"), epsilon spent, and the fit's wall time.
"""
from __future__ import annotations

import argparse
import os
import time
import warnings

import lightning as L
import torch
from torch import Tensor, nn

from lightning_dpgan.callbacks import StepLimit
from lightning_dpgan.callbacks.budget import PrivacyBudgetStopping
from lightning_dpgan.callbacks.pate import PATEAggregation
from lightning_dpgan.datamodules.adult import AdultDataModule
from lightning_dpgan.modules.pategan import PATEGAN


class ColumnOutputs(nn.Module):
    """The MLP generator with its final sigmoid replaced: softmax per one-hot group, sigmoid per
    single-column slice."""

    def __init__(self, generator: nn.Module, slices: list[slice]) -> None:
        super().__init__()
        self.generator = generator
        self.generator.head[-1] = nn.Identity()
        self.slices = slices

    def forward(self, z: Tensor, labels: Tensor | None = None) -> Tensor:
        logits = self.generator(z, labels)
        return torch.cat([torch.sigmoid(logits[:, part]) if part.stop - part.start == 1
                          else torch.softmax(logits[:, part], dim=1) for part in self.slices], dim=1)


def run(data: AdultDataModule, seed: int, teacher_steps: int, args: argparse.Namespace) -> str:
    L.seed_everything(seed, verbose=False)
    model = PATEGAN(data.data_shape, data.num_classes, teacher_steps=teacher_steps)
    model.generator = ColumnOutputs(model.generator, list(data.encoded_schema.column_slices.values()))
    pate = PATEAggregation(num_teachers=args.teachers, lap_inverse_scale=args.lap_inverse_scale,
                           target_epsilon=args.epsilon, delta=1e-5)
    trainer = L.Trainer(max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[StepLimit(args.steps), pate,
                                                               PrivacyBudgetStopping(args.epsilon)])
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the strategy's end-of-fit warnings say what the line below prints
        trainer.fit(model, datamodule=data)
    answers = dict(zip(("generated", "real"), pate.answer_counts.tolist()))
    return (f"seed {seed}  teacher_steps {teacher_steps:3d}  steps {model.train_steps:5d}  answers {answers}  "
            f"epsilon {pate.epsilon():.3f}  fit {time.perf_counter() - start:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("LIGHTNING_DPGAN_DATA_DIR"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--teacher-steps", type=int, nargs="+", default=[50, 5])
    parser.add_argument("--teachers", type=int, default=100, help="the pategan_adult preset's")
    parser.add_argument("--lap-inverse-scale", type=float, default=0.5, help="the pategan_adult preset's")
    parser.add_argument("--steps", type=int, default=1000, help="the pategan_adult preset's cap")
    parser.add_argument("--epsilon", type=float, default=1.0)
    args = parser.parse_args()
    data = AdultDataModule(data_dir=args.data_dir, batch_size=64)
    data.prepare_data()
    data.setup("fit")
    for seed in args.seeds:
        for teacher_steps in args.teacher_steps:
            print(run(data, seed, teacher_steps, args), flush=True)


if __name__ == "__main__":
    main()

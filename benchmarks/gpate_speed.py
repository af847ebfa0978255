"""G-PATE training speed: iterations per second of the real training step, batched teachers vs a loop.

Each run is a Lightning fit of ``gpate`` with the ``gpate`` strategy on MNIST (one iteration =
one teacher update of all K teachers + their input-gradients on the generated batch + the
projected Confident-GNMax aggregation + one generator update). The reference replaces the
batched :class:`~lightning_dpgan.nets.ensemble.TeacherEnsemble` with a Python loop over K
separate teacher modules (same teachers, same step, one fused Adam over all of them), timed at
the same K. It used to be timed at a small K and scaled to the batched one, which no line does
well: part of an iteration does not grow with K (the generator update, the aggregation), and a
teacher's share grows as the teachers outgrow the caches (on 2 CPU cores, 2.6 ms a teacher
between K = 10 and 20, 5.6 ms between 40 and 80).
The budget is set far above what the iterations spend, so no run stops early.

    python benchmarks/gpate_speed.py --data-dir DIR --device cuda --ks 2000 4000
    python benchmarks/gpate_speed.py --data-dir DIR --ks 100 --teacher-channels 8 --teacher-hidden 32
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn

from lightning_dpgan.callbacks.gpate import ProjectedVoting
from lightning_dpgan.callbacks.step_limit import StepLimit
from lightning_dpgan.datamodules.mnist import MNISTDataModule
from lightning_dpgan.host_memory import reuse_freed_memory
from lightning_dpgan.modules.gpate import GPATE
from lightning_dpgan.nets.ensemble import ConvTeacher, TeacherEnsemble


class LoopTeacherEnsemble(TeacherEnsemble):
    """The reference: K separate teacher modules, every pass a Python loop over them."""

    def __init__(self, teachers: list[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(teachers)
        self.num_teachers, self.num_classes = len(teachers), teachers[0].num_classes

    def forward(self, x: Tensor, labels: Tensor | None = None) -> Tensor:
        return torch.stack([t(x[k], None if labels is None else labels[k]) for k, t in enumerate(self.members)])

    def forward_shared(self, x: Tensor, labels: Tensor | None = None) -> Tensor:
        return torch.stack([t(x, labels) for t in self.members])

    def input_gradients(self, x: Tensor, labels: Tensor | None = None, transform: Any = None) -> Tensor:
        grads = []
        for t in self.members:
            inputs = x.detach().requires_grad_()
            out = t(inputs, labels)
            grads.append(torch.autograd.grad((out if transform is None else transform(out)).sum(), inputs)[0])
        return torch.stack(grads)

    def teacher(self, k: int) -> nn.Module:
        return self.members[k]


class LoopGPATE(GPATE):
    """``gpate`` with the loop reference in place of the batched ensemble."""

    def build_teachers(self, num_teachers: int, keep: slice | None = None) -> TeacherEnsemble:
        if keep is not None:
            raise ValueError("the loop reference runs in one process: it has no DDP shard")
        if self.teachers is None:
            self.teachers = LoopTeacherEnsemble(
                [ConvTeacher(self.data_shape, self.num_classes, **self.teacher_kwargs) for _ in range(num_teachers)]
            )
        return self.teachers


class StepTimer(L.Callback):
    """Wall time of each training iteration (synchronised on GPUs)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize()
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self._start)


def seconds_per_iteration(module_class: type[GPATE], k: int, args: argparse.Namespace) -> float:
    """Median seconds per iteration over ``args.steps`` iterations after ``args.warmup``."""
    torch.manual_seed(0)
    if args.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    datamodule = MNISTDataModule(data_dir=args.data_dir, verify_checksums=False)
    module = module_class((1, 28, 28), 10, latent_dim=args.latent_dim,
                          teacher_kwargs={"channels": args.teacher_channels, "hidden": args.teacher_hidden})
    strategy = ProjectedVoting(num_teachers=k, teacher_batch_size=args.batch, sigma1=args.sigma1, sigma2=args.sigma2,
                               target_epsilon=1e6, delta=1e-5)
    timer = StepTimer()
    trainer = L.Trainer(max_epochs=-1, callbacks=[StepLimit(args.warmup + args.steps), strategy, timer], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        accelerator="gpu" if args.device == "cuda" else "cpu", devices=1)
    trainer.fit(module, datamodule=datamodule)
    return statistics.median(timer.times[args.warmup:])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True, help="folder with mnist/ IDX files")
    parser.add_argument("--ks", type=int, nargs="+", default=[2000, 4000], help="numbers of teachers (batched)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch", type=int, default=15, help="records per teacher and generated records per step")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--teacher-channels", type=int, default=32)
    parser.add_argument("--teacher-hidden", type=int, default=64,
                        help="the presets' FC size (the paper's 256 did not fit 2000 teachers on an 80 GB GPU)")
    parser.add_argument("--latent-dim", type=int, default=100)
    parser.add_argument("--sigma1", type=float, default=600.0)
    parser.add_argument("--sigma2", type=float, default=100.0)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--json", help="also write the rows to this JSON file (the benchmark harness reads it)")
    args = parser.parse_args(argv)
    reuse_freed_memory()  # as the command line does: see lightning_dpgan.host_memory
    torch.set_num_threads(args.threads)
    print(f"device {args.device}, torch {torch.__version__}, teachers conv {args.teacher_channels} x 5x5/2 + FC "
          f"{args.teacher_hidden}, batch {args.batch}; median of {args.steps} iterations after {args.warmup}", flush=True)
    rows = []
    for k in args.ks:
        batched = seconds_per_iteration(GPATE, k, args)
        peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else None  # how many runs share a GPU
        loop = seconds_per_iteration(LoopGPATE, k, args)
        print(f"K={k:5d}: batched {batched * 1000:9.1f} ms/iteration ({1 / batched:7.2f} it/s), loop "
              f"{loop * 1000:9.1f} ms -> {loop / batched:6.1f}x"
              + (f"; peak GPU memory {peak:.1f} GiB (batched)" if peak is not None else ""), flush=True)
        rows.append({"k": k, "batched_ms": batched * 1000, "iterations_per_s": 1 / batched, "loop_ms": loop * 1000,
                     "speedup": loop / batched, "peak_gpu_gib": peak})
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "steps": args.steps, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

"""Speed of the batched teacher ensemble against a Python loop of K teacher modules.

One PATE step, timed in three parts, each the median of ``--reps`` runs after a warm-up:

- votes: every teacher labels one shared batch of 64 records (PATE-GAN's vote count);
- input-gradients: d logit_k(x_b) / d x_b for every teacher on a shared batch of 64 (G-PATE);
- update: the teachers' training step in PATE-GAN and G-PATE: every teacher's BCE on its own
  batch of 8 records labelled real and on the shared batch of 64 labelled generated, one
  forward/backward, then one Adam step over all teachers.

The loop baseline gets the same single Adam (``fused`` where supported) over all its teachers'
parameters, which flatters it: public PATE code steps K separate optimizers. When K exceeds
``--loop-max``, the loop is timed over ``--loop-max`` teachers and scaled by K / loop-max
(marked ``*``); its cost is linear in K.

    python benchmarks/teacher_ensemble.py --quick
    python benchmarks/teacher_ensemble.py --device cuda --ks 100 1000 4000
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from lightning_dpgan.host_memory import reuse_freed_memory
from lightning_dpgan.nets.ensemble import ConvTeacher, MLPTeacher, TeacherEnsemble, build_teacher_ensemble

SHARED_BATCH = 64
OWN_BATCH = 8
PARTS = ("votes", "input-gradients", "update")


@dataclass(frozen=True)
class Arch:
    """A teacher architecture: its record shape and how to build one teacher or K batched."""

    name: str
    data_shape: tuple[int, ...]
    make_teacher: Callable[[], nn.Module]
    make_ensemble: Callable[[int], TeacherEnsemble]


def architectures(mlp_hidden: tuple[int, ...], conv_channels: int, conv_hidden: int) -> dict[str, Arch]:
    """MLP teachers on 30 features (default: logistic regression) and small 1x28x28 conv teachers, unconditional."""
    mlp_shape, conv_shape = (30,), (1, 28, 28)
    conv_kwargs = {"channels": conv_channels, "hidden": conv_hidden}
    return {
        "mlp": Arch(
            "mlp",
            mlp_shape,
            lambda: MLPTeacher(30, mlp_hidden),
            lambda k: build_teacher_ensemble(k, mlp_shape, hidden=mlp_hidden),
        ),
        "conv": Arch(
            "conv",
            conv_shape,
            lambda: ConvTeacher(conv_shape, **conv_kwargs),
            lambda k: build_teacher_ensemble(k, conv_shape, **conv_kwargs),
        ),
    }


def median_ms(fn: Callable[[], object], reps: int, device: torch.device) -> float:
    """Median wall time of ``fn`` in milliseconds, after one warm-up run."""
    fn()
    times = []
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fused_adam(params: list[Tensor]) -> torch.optim.Adam:
    try:
        return torch.optim.Adam(params, lr=1e-3, fused=True)
    except RuntimeError:
        return torch.optim.Adam(params, lr=1e-3, foreach=True)


def _bce(logits: Tensor, targets: Tensor) -> Tensor:
    return nn.functional.binary_cross_entropy_with_logits(logits, targets)


def batched_steps(ensemble: TeacherEnsemble, shared: Tensor, own: Tensor) -> dict[str, Callable[[], object]]:
    """The three timed parts for the batched ensemble."""
    optimizer = ensemble.make_optimizer(lr=1e-3)

    def update() -> None:
        optimizer.zero_grad(set_to_none=True)
        # the modules' own loss: summed over teachers, so teacher k gets exactly its own gradient
        ensemble.discriminator_loss(own, None, shared, None).backward()
        optimizer.step()

    return {
        "votes": lambda: ensemble.votes(shared),
        "input-gradients": lambda: ensemble.input_gradients(shared),
        "update": update,
    }


def loop_steps(teachers: list[nn.Module], shared: Tensor, own: Tensor) -> dict[str, Callable[[], object]]:
    """The same three parts as a Python loop over teacher modules."""
    optimizer = _fused_adam([p for t in teachers for p in t.parameters()])

    @torch.no_grad()
    def votes() -> Tensor:
        return torch.stack([torch.sigmoid(t(shared)) > 0.5 for t in teachers]).sum(0)

    def input_gradients() -> Tensor:
        grads = []
        for t in teachers:
            x = shared.detach().requires_grad_()
            grads.append(torch.autograd.grad(t(x).sum(), x)[0])
        return torch.stack(grads)

    def update() -> None:
        optimizer.zero_grad(set_to_none=True)
        for k, t in enumerate(teachers):
            real, fake = t(own[k]), t(shared)
            (_bce(real, torch.ones_like(real)) + _bce(fake, torch.zeros_like(fake))).backward()
        optimizer.step()

    return {"votes": votes, "input-gradients": input_gradients, "update": update}


def measure(
    arch: Arch, k: int, loop_max: int, reps: int, device: torch.device
) -> tuple[str, dict[str, tuple[float, float, bool]]]:
    """The batched form's class name, and per part: (batched ms, loop ms scaled to K, loop extrapolated?)."""
    shared = torch.randn(SHARED_BATCH, *arch.data_shape, device=device)
    own = torch.randn(k, OWN_BATCH, *arch.data_shape, device=device)
    ensemble = arch.make_ensemble(k).to(device)
    form = type(ensemble).__name__
    batched = {name: median_ms(fn, reps, device) for name, fn in batched_steps(ensemble, shared, own).items()}
    del ensemble
    k_loop = min(k, loop_max)
    teachers = [arch.make_teacher().to(device) for _ in range(k_loop)]
    loop = {name: median_ms(fn, reps, device) for name, fn in loop_steps(teachers, shared, own).items()}
    scale = k / k_loop
    return form, {name: (batched[name], loop[name] * scale, k_loop < k) for name in PARTS}


def print_rows(arch: Arch, k: int, form: str, results: dict[str, tuple[float, float, bool]]) -> list[dict]:
    """Print one line per part and the whole step; return them as records."""
    total_batched = sum(r[0] for r in results.values())
    total_loop = sum(r[1] for r in results.values())
    rows = [*((name, *results[name]) for name in PARTS), ("step", total_batched, total_loop, any(r[2] for r in results.values()))]
    records = []
    for name, batched_ms, loop_ms, extrapolated in rows:
        loop_text = f"{loop_ms:10.1f}{'*' if extrapolated else ' '}"
        print(f"{arch.name:5} {form:20} {k:6d} {name:16} {batched_ms:10.1f} {loop_text} {loop_ms / batched_ms:8.1f}x", flush=True)
        records.append({"arch": arch.name, "form": form, "k": k, "part": name, "batched_ms": batched_ms,
                        "loop_ms": loop_ms, "speedup": loop_ms / batched_ms, "loop_extrapolated": extrapolated})
    return records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ks", type=int, nargs="+", default=[100, 1000, 4000], help="ensemble sizes")
    parser.add_argument("--archs", nargs="+", default=["mlp", "conv"], choices=["mlp", "conv"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--reps", type=int, help="timed runs per part (default 7; --quick: 3)")
    parser.add_argument("--loop-max", type=int, default=1000, help="time the loop over at most this many teachers")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--mlp-hidden", type=int, nargs="*", default=[], help="MLP teacher hidden widths (default none)")
    parser.add_argument("--conv-channels", type=int, default=8, help="conv teacher: channels of its one conv layer")
    parser.add_argument("--conv-hidden", type=int, default=32, help="conv teacher: width of its FC layer")
    parser.add_argument("--quick", action="store_true", help="3 reps per part")
    parser.add_argument("--json", help="also write the rows to this JSON file (the benchmark harness reads it)")
    args = parser.parse_args(argv)
    reuse_freed_memory()  # as the command line does: see lightning_dpgan.host_memory
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    reps = args.reps or (3 if args.quick else 7)
    archs = architectures(tuple(args.mlp_hidden), args.conv_channels, args.conv_hidden)
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    print(f"device {device}, {torch.get_num_threads()} threads{load}, torch {torch.__version__}, median of {reps} runs (ms)")
    mlp_widths = " -> ".join(map(str, [30, *args.mlp_hidden, 1]))
    print(f"conv teacher: 1x28x28, conv {args.conv_channels}x5x5 stride 2, FC {args.conv_hidden}; mlp teacher: {mlp_widths}")
    print(f"{'arch':5} {'batched form':20} {'K':>6} {'part':16} {'batched':>10} {'loop':>11} {'speedup':>9}")
    rows = []
    for name in args.archs:
        arch = archs[name]
        for k in args.ks:
            rows += print_rows(arch, k, *measure(arch, k, args.loop_max, reps, device))
    print(f"* loop timed over {args.loop_max} teachers and scaled linearly to K")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": str(device), "reps": reps, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

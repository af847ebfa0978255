"""DP-SGD overhead: median discriminator-step time with DP-SGD vs without, as a ratio.

One step is what ``GANModule.discriminator_step`` does: the real part (clipped per record
under DP-SGD), the generated part (a public pass), and the optimizer step (noise under DP-SGD).
Critics: the DCGAN discriminator for 28x28 images and an MLP critic (794-512-256-1: the 784 pixels and
the one-hot label), batch 64.

    python benchmarks/dpsgd_overhead.py            # 30 timed steps per configuration
    python benchmarks/dpsgd_overhead.py --steps 10 --device cuda

Timings are interleaved (every configuration once per round) so a change in machine load hits
all of them alike; the ratio is the median of per-round ratios.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from lightning_dpgan.host_memory import reuse_freed_memory
from lightning_dpgan.nets import build_networks
from lightning_dpgan.privacy.dp_sgd import DPSGDMechanism

BATCH = 64


def make_step(arch: str, mode: str | None, device: str):
    """A closure running one discriminator update; ``mode=None`` is the non-private step."""
    torch.manual_seed(0)
    hidden = {"hidden": (512, 256)} if arch == "mlp" else {}
    _, critic = build_networks(arch, (1, 28, 28), latent_dim=8, num_classes=10, discriminator_kwargs=hidden)
    critic = critic.to(device)
    optimizer = torch.optim.RMSprop(critic.parameters(), lr=5e-5)
    mechanism = None
    if mode is not None:
        mechanism = DPSGDMechanism(1.0, 1.0, BATCH, mode=mode)
        mechanism.attach(critic)
        optimizer = mechanism.wrap_optimizer(optimizer)
    real = torch.randn(BATCH, 1, 28, 28, device=device)
    fake = torch.randn(BATCH, 1, 28, 28, device=device)
    labels = torch.randint(0, 10, (BATCH,), device=device)

    def step() -> None:
        optimizer.zero_grad()
        per_record = -critic(real, labels)
        if mechanism is None:
            per_record.mean().backward()
            critic(fake, labels).mean().backward()
        else:
            mechanism.backward_real(per_record)
            mechanism.backward_public(critic(fake, labels))
        optimizer.step()

    return step, (mechanism.mode if mechanism else "non-private")


def timed(step, device: str) -> float:
    on_gpu = torch.device(device).type == "cuda"  # "cuda:1" too: unsynchronised, only the launches are timed
    if on_gpu:
        torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    if on_gpu:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the rows to this JSON file (the benchmark harness reads it)")
    args = parser.parse_args()
    reuse_freed_memory()  # as the command line does: see lightning_dpgan.host_memory
    torch.set_num_threads(args.threads)
    configs = {(arch, mode): make_step(arch, mode, args.device)
               for arch in ("dcgan", "mlp") for mode in (None, "auto", "hooks")}
    times: dict[tuple, list[float]] = {key: [] for key in configs}
    for round_index in range(args.warmup + args.steps):
        for key, (step, _) in configs.items():
            elapsed = timed(step, args.device)
            if round_index >= args.warmup:
                times[key].append(elapsed)
    print(f"DP-SGD overhead, batch {BATCH}, device {args.device}, {args.threads} threads, median of {args.steps} steps")
    print(f"{'critic':7} {'requested':10} {'ran':12} {'ms/step':>8} {'ratio':>6}")
    rows = []
    for (arch, mode), (_, ran) in configs.items():
        baseline = times[(arch, None)]
        ratio = statistics.median(t / b for t, b in zip(times[(arch, mode)], baseline))
        milliseconds = 1000 * statistics.median(times[(arch, mode)])
        print(f"{arch:7} {str(mode or '-'):10} {ran:12} {milliseconds:8.1f} {ratio:6.2f}")
        rows.append({"critic": arch, "requested": mode, "ran": ran, "ms_per_step": milliseconds, "ratio": ratio})
    if args.json:
        Path(args.json).write_text(json.dumps({"batch": BATCH, "device": args.device, "steps": args.steps, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

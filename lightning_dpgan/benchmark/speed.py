"""The speed suite's mechanism benchmarks: the scripts under ``benchmarks/`` run as they are (each
writes its rows with ``--json``), so the harness and a person running a script by hand measure
the same thing.

- DP-SGD overhead (``dpsgd_overhead.py``): a discriminator step with DP-SGD over one without;
- teacher ensemble (``teacher_ensemble.py``): the batched PATE step over a loop of teachers;
- G-PATE iterations per second (``gpate_speed.py``): needs the MNIST files. At 2000 and 4000
  teachers, the presets' size on a GPU and conv 8 + FC 32 teachers on a CPU.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from lightning_dpgan.benchmark.paths import BENCHMARKS
from lightning_dpgan.benchmark.runner import portable, portable_text, run_logged


#: G-PATE teachers small enough for thousands on a CPU (the README's suggestion): conv 8 + FC 32
CPU_SIZED_TEACHERS = ["--teacher-channels", "8", "--teacher-hidden", "32"]


def _arguments(quick: bool, data_dir: str | None, device: str) -> dict[str, list[str] | None]:
    mnist = data_dir or os.environ.get("LIGHTNING_DPGAN_DATA_DIR")
    gpate = None
    if mnist and (Path(mnist) / "mnist").is_dir():
        gpate = ["--data-dir", mnist, "--device", device]
        if quick:
            gpate += ["--ks", "50", "--steps", "3", "--warmup", "1", *CPU_SIZED_TEACHERS]
        elif device == "cpu":  # the presets' 2000 teachers need ~31 GiB of host memory to train
            gpate += ["--ks", "2000", "4000", "--steps", "5", "--warmup", "1", *CPU_SIZED_TEACHERS]
    return {
        "dpsgd_overhead": ["--device", device, *(["--steps", "5", "--warmup", "1"] if quick else [])],
        "teacher_ensemble": ["--device", device, *(["--quick", "--ks", "100", "--archs", "mlp"] if quick else [])],
        "gpate_speed": gpate,
    }


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}" if isinstance(value, float) else str(value).replace("|", "/")


def _markdown(name: str, rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    keys = list(rows[0])
    lines = [f"`{name}`:", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(value) for value in row.values()) + " |")
    return [*lines, ""]


def micro_benchmarks(quick: bool, data_dir: str | None, accelerator: str | None, out_dir: Path) -> dict[str, Any]:
    """Run each script; return its rows (or why it did not run) and a Markdown table of them."""
    device = "cuda" if accelerator in ("gpu", "cuda") else "cpu"
    extras: dict[str, Any] = {}
    for name, arguments in _arguments(quick, data_dir, device).items():
        if arguments is None:
            extras[name] = {"skipped": "no MNIST files (give --data-dir)", "markdown": [f"`{name}`: skipped, no MNIST files.", ""]}
            continue
        output = out_dir / f"{name}.json"
        command = [sys.executable, str(BENCHMARKS / f"{name}.py"), *arguments, "--json", str(output)]
        try:
            seconds = run_logged(command, out_dir / f"{name}.log")
            result = json.loads(output.read_text())
        except (RuntimeError, OSError, ValueError) as error:  # the other scripts still run
            reason = portable_text(str(error).strip().splitlines()[-1], data_dir, out_dir=out_dir)
            extras[name] = {"failed": reason, "markdown": [f"`{name}`: failed (`{reason}`).", ""]}
            continue
        extras[name] = {**result, "command": portable(command, data_dir, out_dir=out_dir), "seconds": seconds,
                        "markdown": _markdown(name, result["rows"])}
    return extras


__all__ = ["micro_benchmarks"]

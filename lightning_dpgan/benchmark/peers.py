"""The peers suite: smartnoise-synth's synthesizers run on the tables protocol.

smartnoise-synth pins ``opacus<0.15``, which cannot live beside this package's Opacus, so it gets
its own virtualenv (made on first use) and runs ``benchmarks/peers/smartnoise_synth.py`` there.
The protocol is ours, unchanged:

- the same train split, written from our datamodule (the test split never leaves this process);
- the same preprocessing budget rule: the public bounds and category sets our schema declares are
  handed over as declared, so the peer spends nothing estimating them (``preprocessor_epsilon``
  0), as ours spend nothing on them. A peer then trains on all of epsilon, at our delta
  (``--delta``); our mode-specific models (the CTGAN family) spend a part of the same total on
  their DP mode histogram. A dataset whose schema would be estimated from the data under DP
  (``csv`` without a schema file) is refused: the peer would get that estimate for free;
- its synthetic table is evaluated here with :func:`lightning_dpgan.evaluate.evaluate_table`, the
  function that evaluates our runs.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch

from lightning_dpgan.benchmark.paths import BENCHMARKS
from lightning_dpgan.benchmark.runner import (Settings, failed_run, portable, portable_text, read_json, run_logged,
                                              skip_reason, with_derived_measures)
from lightning_dpgan.benchmark.stopping import stop_if_terminated
from lightning_dpgan.benchmark.suites import Cell, Size, delta_for, epsilon_text

SMARTNOISE = "smartnoise-synth==1.0.8"
SCRIPT = BENCHMARKS / "peers" / "smartnoise_synth.py"
DEFAULT_VENV = Path.home() / ".cache" / "lightning-dpgan" / "peers-venv"


def ensure_venv(venv: Path, log: Path) -> Path:
    """The peers' Python, after making their virtualenv if it is missing: the torch version this
    package runs on first, pinned (a CPU build only where pip's index serves one, as the README's
    own install does), then smartnoise-synth held to it.

    A virtualenv that cannot be made (no network, say) raises :class:`SystemExit` with the way
    out: an existing virtualenv given as ``--peers-venv``."""
    python = venv / "bin" / "python"
    if python.is_file() and subprocess.run([str(python), "-c", "import snsynth"], capture_output=True).returncode == 0:
        return python
    _refuse_a_folder_not_ours(venv)
    torch_pin = f"torch=={torch.__version__.split('+')[0]}"
    venv.mkdir(parents=True, exist_ok=True)
    (venv / VENV_MARKER).write_text("made by lightning-dpgan's benchmark for the peers; delete the folder to remake it\n")
    constraints = venv / "constraints.txt"
    constraints.write_text(torch_pin + "\n")
    try:
        run_logged([sys.executable, "-m", "venv", str(venv)], log)
        run_logged([str(python), "-m", "pip", "install", "-q", torch_pin], log)
        # packaging: imported by smartnoise-synth 1.0.8's GAN synthesizers but not declared by it
        run_logged([str(python), "-m", "pip", "install", "-q", SMARTNOISE, "packaging", "-c", str(constraints)], log)
    except RuntimeError as error:
        last = [line for line in str(error).splitlines() if line.strip()][-1:]
        raise SystemExit(f"benchmark: could not make the peers' virtualenv {venv} ({SMARTNOISE} with {torch_pin}; "
                         f"pip's output is in {log}{': ' + last[0].strip() if last else ''}). Without network access, "
                         "give --peers-venv a virtualenv that has them; nothing ran") from None
    return python


#: written into a peers' virtualenv the harness makes: only such a folder (or a missing or empty one) is
#: installed into, so that an interrupted install can be finished
VENV_MARKER = ".lightning-dpgan-peers"


def _refuse_a_folder_not_ours(venv: Path) -> None:
    """Refuse to install into a folder the harness did not make: smartnoise-synth pins opacus<0.15,
    so installing it into the user's own environment (``--peers-venv .venv``) would break it."""
    if not venv.exists() or (venv / VENV_MARKER).is_file():
        return
    if venv.is_dir() and not any(venv.iterdir()):
        return
    raise SystemExit(f"benchmark: --peers-venv {venv} exists but cannot import snsynth, and the benchmark did not make "
                     f"it: it installs {SMARTNOISE} (which pins opacus<0.15) only into a virtualenv of its own. Give a "
                     "virtualenv that has it, or a new folder for the benchmark to make one in; nothing ran")


def table_spec(schema: Any) -> dict[str, Any]:
    """The public facts of ``schema`` a peer may use: bounds, category sets, integer columns."""
    spec: dict[str, Any] = {"categorical": {}, "continuous": {}, "integer": [], "label": schema.label,
                            "preprocessor_epsilon": 0.0}
    for column in schema.columns:
        if column.is_numeric:
            spec["continuous"][column.name] = [float(b) for b in column.bounds]
            if column.kind == "integer":
                spec["integer"].append(column.name)
        else:
            spec["categorical"][column.name] = [c.item() if hasattr(c, "item") else c for c in column.categories]
    return spec


def load_datamodule(dataset: str, data_dir: str | None) -> Any:
    from lightning_dpgan import registry

    datamodule = registry.lookup("dataset", dataset).load()(data_dir=data_dir)
    if getattr(datamodule, "kind", "image") == "image":
        raise ValueError(f"the peers run on tables; {dataset} holds images")
    if getattr(datamodule, "estimates_schema", False):
        raise ValueError(f"{dataset} has no declared schema (it would be estimated under DP): give the peers a schema file")
    datamodule.prepare_data()
    datamodule.setup()
    return datamodule


def export_split(datamodule: Any, folder: Path) -> tuple[Path, Path]:
    """The train split and the spec, as the peer script reads them."""
    folder.mkdir(parents=True, exist_ok=True)
    schema = datamodule.schema
    train, spec = folder / "train.csv", folder / "spec.json"
    datamodule.train_frame[schema.names].to_csv(train, index=False)
    spec.write_text(json.dumps(table_spec(schema), indent=1))
    return train, spec


def peer_command(python: Path, cell: Cell, train: Path, spec: Path, n: int, size: Size, folder: Path) -> list[str]:
    command = [str(python), str(SCRIPT), "--synthesizer", cell.model, "--train", str(train), "--spec", str(spec),
               "--epsilon", epsilon_text(cell.epsilon), "--n", str(n), "--seed", str(cell.seed),
               "--out", str(folder / "synthetic.csv"), "--report", str(folder / "peer.json"), "--delta", f"{delta_for(cell.dataset):g}"]
    if size.max_steps:  # the peers count epochs, not steps: the quick size's few
        command += ["--epochs", str(size.max_steps)]
    return command


def peer_folder(out_dir: Path, cell: Cell) -> Path:
    return out_dir / f"smartnoise-{cell.name}"


def run_peers(size: Size, settings: Settings, venv: Path | None,
              on_run: Callable[[list[dict[str, Any]]], Any] = lambda runs: None) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Every peer cell: fit in the peers' venv, evaluate here; ``on_run`` gets the runs so far
    after each. Returns the runs and skipped datasets."""
    from lightning_dpgan.evaluate import evaluate_table

    venv = venv or DEFAULT_VENV
    python = ensure_venv(venv, settings.out_dir / "peers-venv.log")
    runs, skipped = [], {}
    for dataset in size.datasets:
        stop_if_terminated()
        try:
            datamodule = load_datamodule(dataset, settings.data_dir)
        except Exception as error:  # noqa: BLE001 - a dataset that cannot be loaded is skipped, with why
            skipped[dataset] = skip_reason(error, settings.data_dir, settings.out_dir)
            continue
        train, spec = export_split(datamodule, settings.out_dir / f"{dataset}-split")
        for cell in (c for c in size.cells() if c.dataset == dataset):
            stop_if_terminated()  # a SIGTERM during the last cell's scoring (in this process): nothing more starts
            folder = peer_folder(settings.out_dir, cell)
            command = peer_command(python, cell, train, spec, len(datamodule.train_frame), size, folder)
            print(f"benchmark: smartnoise {cell.name}", flush=True)
            try:
                seconds = run_logged(command, folder / "peer.log")
                report = read_json(folder / "peer.json")
                synthetic = pd.read_csv(folder / "synthetic.csv")
                measures = with_derived_measures(evaluate_table(datamodule, synthetic, seed=cell.seed))
                measures["held_out_split"] = "test"  # peers are never scored on a dev split
            except Exception as error:  # noqa: BLE001 - a failed cell is recorded and the suite goes on
                runs.append(failed_run(cell, error, settings, str(venv)))
                on_run(runs)
                continue
            runs.append({
                "status": "ok", **cell.record,
                # spent: Opacus' own accounting where smartnoise has one (its GANs); else only the target is known
                "epsilon": report.get("options", {}).get("epsilon_spent_opacus_rdp"), "delta": report.get("delta"),
                "steps": None,
                "train_seconds": seconds, "fit_seconds": report.get("fit_seconds"),
                "measures": {key: value for key, value in measures.items() if not isinstance(value, dict)},
                "commands": [portable(command, settings.data_dir, str(venv), out_dir=settings.out_dir)],
                "run_dir": portable_text(str(folder), out_dir=settings.out_dir), "peer": report,
            })
            on_run(runs)
    return runs, skipped


__all__ = ["DEFAULT_VENV", "ensure_venv", "export_split", "peer_command", "run_peers", "table_spec"]

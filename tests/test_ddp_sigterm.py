"""SIGTERM under DDP: the handler holds no collective, and rank 0 alone decides when all stop.

Lightning 2.6's handler broadcast from within itself, once per SIGTERM received; a SIGTERM to
the whole process group reached rank 1 twice and hung both processes (one stop in three on two
CPU processes). The end-to-end test sends exactly that signal to a two-process run.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lightning_dpgan.ddp_sigterm import CollectiveFreeSignalConnector

REPO = Path(__file__).resolve().parents[1]
ADULT = REPO / "tests" / "fixtures" / "adult_tiny"


def connector(rank: int, kills: list) -> CollectiveFreeSignalConnector:
    launcher = SimpleNamespace(kill=kills.append)
    trainer = SimpleNamespace(global_rank=rank, local_rank=rank, world_size=2, strategy=SimpleNamespace(launcher=launcher))
    return CollectiveFreeSignalConnector(trainer)


@pytest.fixture
def no_collectives(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a collective inside the SIGTERM handler")

    for name in ("broadcast", "all_reduce", "barrier"):
        monkeypatch.setattr(torch.distributed, name, refuse)


def test_rank_zero_forwards_the_first_sigterm_and_sets_the_flag_without_a_collective(no_collectives):
    kills = []
    rank_zero = connector(0, kills)
    rank_zero._sigterm_notifier_fn(signal.SIGTERM, None)
    rank_zero._sigterm_notifier_fn(signal.SIGTERM, None)  # a second one (the group's and a forwarded one)
    assert rank_zero.received_sigterm is True
    assert kills == [signal.SIGTERM]  # forwarded once to the processes it launched


def test_another_rank_leaves_the_decision_to_rank_zero(no_collectives):
    """Its own flag would stop it alone at the end of a batch, and rank 0 would fail in its next
    collective; rank 0's flag, broadcast before each batch, stops it with the others."""
    kills = []
    follower = connector(1, kills)
    follower._sigterm_notifier_fn(signal.SIGTERM, None)
    assert follower.received_sigterm is False and kills == []


def test_the_runs_trainer_uses_it(tmp_path):
    from lightning_dpgan.cli import build_config
    from lightning_dpgan.run import Run

    config = build_config(["--model", "gan", "--dataset", "adult", "--data-dir", str(ADULT), "--accelerator", "cpu",
                           "--max-steps", "1", "--batch-size", "8"])
    run = Run(config, tmp_path / "run")
    assert isinstance(run.trainer._signal_connector, CollectiveFreeSignalConnector)


def test_a_sigterm_to_every_process_of_a_two_process_run_stops_it_as_one(tmp_path):
    """As a scheduler ending a job does: all processes stop, rank 0 says what is kept, exit 143."""
    out = tmp_path / "run"
    command = [sys.executable, str(REPO / "train.py"), "--dataset", "adult", "--data-dir", str(ADULT), "--model",
               "dpgan", "--output-dir", str(out), "--accelerator", "cpu", "--devices", "2", "--strategy", "ddp",
               "--batch-size", "8", "--epsilon", "1000", "--max-steps", "100000", "--checkpoint_every_n_steps", "10",
               "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("LOCAL_RANK", None)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not (out / "checkpoints" / "last.ckpt").is_file():  # training has taken steps on both ranks
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
            time.sleep(0.5)
        time.sleep(2)
        os.killpg(process.pid, signal.SIGTERM)
        _, err = process.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail("the processes did not stop within 90 s of the SIGTERM")
    assert process.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert err.count("train: stopped by SIGTERM after") == 1
    assert not (out / "privacy.json").exists()

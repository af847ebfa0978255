"""Seeded draws (sample grids, the evaluation CNN, real records' draws) leave every random
stream of the caller as it was, an accelerator's included."""
from __future__ import annotations

from contextlib import contextmanager

import torch

from lightning_dpgan import random_streams
from lightning_dpgan.callbacks.samples import sample_grid
from lightning_dpgan.evaluation import cnn_accuracy
from lightning_dpgan.random_streams import devices_reseeded, seeded_stream


def test_draws_inside_come_from_the_seed_and_the_callers_stream_goes_on_untouched():
    torch.manual_seed(7)
    expected_after = torch.rand(3)
    torch.manual_seed(7)
    with seeded_stream(5):
        inside = torch.rand(2)
    with seeded_stream(5):
        assert torch.equal(torch.rand(2), inside)
    assert torch.equal(torch.rand(3), expected_after)


def test_the_processs_own_cuda_device_is_put_back_as_manual_seed_reseeds_it_too(monkeypatch):
    """fork_rng(devices=[]) saved the CPU's stream alone, while torch.manual_seed reseeded the
    GPU's too: after each sample grid a GPU run's latents and labels restarted from seed 0."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # a DDP process's own GPU
    assert devices_reseeded("cpu") == ([1], "cuda")  # a CNN on the CPU in a process that uses its GPU
    assert devices_reseeded(torch.device("cuda", 1)) == ([1], "cuda")
    assert devices_reseeded(torch.device("cuda")) == ([1], "cuda")
    assert devices_reseeded(torch.device("cuda", 0)) == ([0, 1], "cuda")
    assert devices_reseeded(torch.device("mps")) == ([torch.device("mps")], "mps")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert devices_reseeded("cpu") == ([], "cuda")  # nothing started: nothing to save


def test_the_sample_grid_and_the_evaluation_cnn_put_back_the_gpus_streams(monkeypatch):
    forked = []

    @contextmanager
    def recording_fork(devices=None, enabled=True, device_type="cuda", **kwargs):
        forked.append((list(devices), device_type))
        state = torch.get_rng_state()
        yield
        torch.set_rng_state(state)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: None)  # no GPU here to reseed
    monkeypatch.setattr(random_streams.torch.random, "fork_rng", recording_fork)

    class Module:
        num_classes, device = 2, torch.device("cpu")

        def sample(self, n, labels):
            return torch.rand(n, 1, 4, 4) * 2 - 1

    sample_grid(Module(), columns=2)
    images = torch.zeros(4, 1, 28, 28)
    cnn_accuracy(images, torch.arange(4) % 2, images, torch.arange(4) % 2, epochs=1, batch_size=4, lr=1e-3)
    assert forked == [([0], "cuda"), ([0], "cuda")]

"""Command lines for tiny end-to-end runs on the fixture data (see conftest.tiny_image_data_dir)."""
import contextlib
import json
import signal
from pathlib import Path


def tiny_run_args(data_dir, output_dir, model="gan", dataset="mnist", steps=4, batch_size=16):
    """A ``main([...])`` argument list that trains tiny nets for a few batches on fixture data
    (``steps=None``: no ``--max-steps``, for runs that another limit ends)."""
    length = [] if steps is None else ["--max-steps", str(steps)]
    return [
        "train", "--model", model, "--dataset", dataset, "--data-dir", str(data_dir),
        "--output-dir", str(output_dir), *length, "--batch-size", str(batch_size),
        "--accelerator", "cpu", "--data.verify_checksums", "false",
        "--model.latent_dim", "8", "--model.generator_kwargs.base_channels", "4",
        "--model.discriminator_kwargs.base_channels", "4", "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false", "--sample_columns", "3",
    ]


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def opacus_epsilon(sigma, rate, steps, delta, kind="rdp"):
    """DP-SGD's epsilon computed independently, with Opacus' own accountant."""
    from opacus.accountants import PRVAccountant, RDPAccountant

    accountant = RDPAccountant() if kind == "rdp" else PRVAccountant()
    for _ in range(steps):
        accountant.step(noise_multiplier=sigma, sample_rate=rate)
    return accountant.get_epsilon(delta)


def sanitizer_epsilon(report: dict) -> float:
    """The gradient sanitizer's training epsilon from its privacy report, independently: a
    Gaussian of multiplier s (sensitivity units) costs alpha / (2 s^2) at every order, the
    generator steps compose by addition, and Opacus' own function converts."""
    import numpy as np
    from opacus.accountants.analysis.rdp import get_privacy_spent

    from lightning_dpgan.privacy.analysis.rdp import DEFAULT_ORDERS

    orders = np.array(DEFAULT_ORDERS)
    rdp = report["generator_steps"] * orders / (2 * report["effective_noise_multiplier"] ** 2)
    return get_privacy_spent(orders=orders, rdp=rdp, delta=report["delta_training"])[0]


def checkpoint_accountant_state(run_dir: Path) -> dict:
    """The full accountant state a run's last checkpoint keeps for resuming (the privacy report
    shows only its public part)."""
    import torch

    checkpoint = torch.load(Path(run_dir) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    states = [state["accountant"] for state in checkpoint["callbacks"].values()
              if isinstance(state, dict) and state.get("accountant")]
    assert len(states) == 1, f"expected one privacy strategy's state, found {len(states)}"
    return states[0]


def record_calls(monkeypatch, owner, name: str) -> list[tuple]:
    """Wrap ``owner.name`` so that each call's positional arguments are recorded, in order, in
    the returned list before the original runs: which frame or records a function was given."""
    calls: list[tuple] = []
    original = getattr(owner, name)

    def spy(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return calls


def grid_tiles(picture, n: int, columns: int, size: int = 28, padding: int = 2):
    """The ``n`` images of a grey image grid, read back row-major from its pixel positions
    (independent of the code that tiled them): shape (n, size, size)."""
    import numpy as np

    step = size + padding
    tops = [padding + (i // columns) * step for i in range(n)]
    lefts = [padding + (i % columns) * step for i in range(n)]
    return np.stack([picture[top:top + size, left:left + size] for top, left in zip(tops, lefts)])


def empty_folder(parent: Path) -> Path:
    """An existing folder with no files: a data dir from which nothing can be read."""
    folder = parent / "nothing-here"
    folder.mkdir(exist_ok=True)
    return folder


def assert_resume_restores_sampler_draws(strategy_over) -> None:
    """A teacher or critic strategy's state, loaded into a fresh strategy over the same records,
    goes on with its sampler's next draws (not the first segment's again); over other records of
    the same count it is refused. ``strategy_over(records)`` builds the strategy and its sampler."""
    import pytest
    import torch

    data = torch.randn(60, 4)
    first = strategy_over(data)
    first_draws = [first.sampler.draw_indices() for _ in range(2)]
    saved = first.state_dict()
    expected = [first.sampler.draw_indices() for _ in range(3)]
    resumed = strategy_over(data)
    resumed.load_state_dict(saved)
    got = [resumed.sampler.draw_indices() for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert not torch.equal(got[0], first_draws[0])  # not the first segment's draws replayed
    with pytest.raises(ValueError, match="other training records"):
        strategy_over(torch.randn(60, 4)).load_state_dict(saved)


def act_after_training_step(monkeypatch, step: int, action) -> None:
    """Runs built from now on call ``action()`` (a Ctrl-C, a SIGTERM) once their module has taken
    ``step`` training steps."""
    import lightning as L

    from lightning_dpgan.run import Run

    class Act(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            if pl_module.train_steps == step:
                action()

    built = Run._callbacks
    monkeypatch.setattr(Run, "_callbacks", lambda self: [*built(self), Act()])


def press_ctrl_c() -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigint_restored():
    """Lightning ignores a second Ctrl-C while it shuts down after one: the handler is put back."""
    previous = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def train_outside_a_trainer(module) -> dict:
    """Let ``module.training_step`` run without a Trainer, as Lightning would run it: the module's
    own optimizers, a plain backward; returns the dict that collects what the step logs."""
    optimizers = module.configure_optimizers()
    module.optimizers = lambda: optimizers
    module.manual_backward = lambda loss: loss.backward()
    logged = {}
    module.log_dict = lambda values, *args, **kwargs: logged.update(values)
    module.log = lambda name, value, *args, **kwargs: logged.update({name: value})
    return logged


def stream_after_training_steps(module, records, sizes=(0, 5, 9)) -> list:
    """The run's next draw after one training step of ``module`` on the first ``n`` of ``records``,
    for each ``n`` of ``sizes``, from the same seed: equal draws mean the draws made on real records
    left the run's (public) stream where a batch of any size would. The module trains outside a
    Trainer, generating a fixed batch as DP-SGD has it generate (not the private batch's size)."""
    import torch

    train_outside_a_trainer(module)
    module.generated_batch_size = 4
    draws = []
    for rows in sizes:
        torch.manual_seed(0)
        module.training_step(records[:rows], 0)
        draws.append(torch.rand(3))
    return draws

"""Checkpoints are written whole or not at all, read back as this process's own copy, and the
callbacks around them (the periodic save, the step limit, the divergence guard, the lineage a
resume carries on) keep what a run already did. Fast unit tests on stand-ins, no training."""
from collections import namedtuple
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_dpgan.callbacks.checkpoint import LastCheckpoint, save_checkpoint_atomically
from lightning_dpgan.callbacks.finite_generator import FiniteGeneratorGuard, TrainingDivergedError
from lightning_dpgan.callbacks.step_limit import StepLimit
from lightning_dpgan.checkpoint_io import ShareReadingCheckpointIO, copied_out
from lightning_dpgan.lineage import UNRECORDED, extended_lineage, new_run_id


class Share:
    """A module that holds a share: keeps the first row of every ``teachers.*`` tensor."""

    def __init__(self, holds=True):
        self.holds, self.cut = holds, []

    def holds_a_share(self):
        return self.holds

    def keep_own_share(self, checkpoint):
        for key, value in checkpoint["state_dict"].items():
            if key.startswith("teachers."):
                checkpoint["state_dict"][key] = value[:1]
                self.cut.append(key)


def test_a_failed_write_keeps_the_previous_checkpoint_and_leaves_no_partial_file(tmp_path, monkeypatch):
    """A full disk mid-write: the checkpoint already there is the last good one, so it must stay
    byte for byte, and the half-written temporary file must not be left beside it."""
    from lightning_dpgan import checkpoint_io

    path = tmp_path / "checkpoints" / "last.ckpt"
    writer = ShareReadingCheckpointIO(Share(holds=False))
    writer.save_checkpoint({"state_dict": {"w": torch.ones(3)}}, path)
    before = path.read_bytes()

    def full_disk(obj, f, *args, **kwargs):
        with open(f, "wb") as file:
            file.write(b"half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_io.torch, "save", full_disk)
    with pytest.raises(OSError, match="No space left"):
        writer.save_checkpoint({"state_dict": {"w": torch.zeros(3)}}, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]


def test_a_shared_read_keeps_the_share_in_memory_of_its_own(tmp_path):
    """A rank holding a share reads the file mapped, cuts it, and gets tensors that no longer
    live in the mapping: rewriting the file in place afterwards changes nothing it holds."""
    path = tmp_path / "last.ckpt"
    teachers, generator = torch.arange(12.0).reshape(4, 3), torch.full((5,), 2.0)
    torch.save({"state_dict": {"teachers.w": teachers, "generator.w": generator}}, path)
    module = Share()
    checkpoint = ShareReadingCheckpointIO(module).load_checkpoint(path)
    with open(path, "r+b") as file:  # in place, as `cp` over it would
        file.write(bytes(path.stat().st_size))
    kept = checkpoint["state_dict"]["teachers.w"]
    assert module.cut == ["teachers.w"] and torch.equal(kept, teachers[:1])
    assert kept.untyped_storage().nbytes() == kept.numel() * kept.element_size()  # the share, not the whole
    assert torch.equal(checkpoint["state_dict"]["generator.w"], generator)


def test_a_shared_read_of_a_missing_file_names_it(tmp_path):
    path = tmp_path / "nowhere.ckpt"
    with pytest.raises(FileNotFoundError, match="Checkpoint file not found: .*nowhere.ckpt"):
        ShareReadingCheckpointIO(Share()).load_checkpoint(path)


def test_a_whole_module_or_a_remote_path_is_read_as_lightning_does(tmp_path, monkeypatch):
    """Only a local file read by a process holding a share is mapped and cut."""
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": {"teachers.w": torch.ones(4, 2)}}, path)
    whole = Share(holds=False)
    checkpoint = ShareReadingCheckpointIO(whole).load_checkpoint(path)
    assert whole.cut == [] and checkpoint["state_dict"]["teachers.w"].shape == (4, 2)
    read = []
    monkeypatch.setattr(TorchCheckpointIO, "load_checkpoint", lambda self, p, **kwargs: read.append(p) or {})
    share = Share()
    assert ShareReadingCheckpointIO(share).load_checkpoint("s3://bucket/last.ckpt") == {}
    assert read == ["s3://bucket/last.ckpt"] and share.cut == []


def test_copied_out_copies_every_tensor_and_keeps_the_containers():
    Pair = namedtuple("Pair", "a b")
    parameter = torch.nn.Parameter(torch.ones(2))
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    tensor = torch.arange(3.0)
    inner = [tensor, 1]
    value = {"p": parameter, "f": frozen, "list": inner, "tuple": (tensor, "x"), "pair": Pair(tensor, 2)}
    out = copied_out(value)
    assert out is value and out["list"] is inner  # filled in place
    for copy in (out["list"][0], out["tuple"][0], out["pair"].a):
        assert torch.equal(copy, tensor) and copy.data_ptr() != tensor.data_ptr()
    assert isinstance(out["pair"], Pair) and out["pair"].b == 2 and out["tuple"][1] == "x"
    assert isinstance(out["p"], torch.nn.Parameter) and out["p"].requires_grad
    assert out["p"].data_ptr() != parameter.data_ptr()
    assert isinstance(out["f"], torch.nn.Parameter) and not out["f"].requires_grad


class SavingTrainer(SimpleNamespace):
    """A trainer whose ``save_checkpoint`` writes its step (or fails, when ``fail`` is set)."""

    def save_checkpoint(self, path, weights_only=False):
        assert weights_only is False  # a resume needs the whole state
        path.write_text(f"step {self.step}")
        if self.fail:
            raise OSError(28, "No space left on device")


def test_an_atomic_save_that_fails_keeps_the_previous_checkpoint_and_no_temporary_file(tmp_path):
    path = tmp_path / "checkpoints" / "last.ckpt"
    trainer = SavingTrainer(step=1, fail=False, is_global_zero=True)
    assert save_checkpoint_atomically(trainer, path) == path and path.read_text() == "step 1"
    trainer.step, trainer.fail = 2, True
    with pytest.raises(OSError):
        save_checkpoint_atomically(trainer, path)
    assert path.read_text() == "step 1" and sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]


def test_only_rank_zero_puts_the_checkpoint_in_place(tmp_path):
    path = tmp_path / "last.ckpt"
    save_checkpoint_atomically(SavingTrainer(step=1, fail=False, is_global_zero=False), path)
    assert not path.exists()


def test_a_failed_save_on_another_rank_leaves_rank_zeros_temporary_file(tmp_path):
    """Each rank enters the save; only rank 0 writes the file and removes its temporary one when
    the save fails. Another rank's failure removing it would pull the file from under rank 0."""
    path = tmp_path / "last.ckpt"
    temporary = tmp_path / ".last.ckpt.tmp"
    temporary.write_bytes(b"rank 0 is writing")

    def failing_save(path, weights_only=False):  # this rank's share of a collective save failed
        raise RuntimeError("a peer process was lost")

    with pytest.raises(RuntimeError):
        save_checkpoint_atomically(SimpleNamespace(is_global_zero=False, save_checkpoint=failing_save), path)
    assert temporary.read_bytes() == b"rank 0 is writing"


def test_storage_options_for_a_local_checkpoint_are_refused_as_lightnings_own_writer_does(tmp_path):
    """Lightning's TorchCheckpointIO takes no storage options: they would be dropped unsaid."""
    with pytest.raises(TypeError, match="storage_options"):
        ShareReadingCheckpointIO(None).save_checkpoint({}, tmp_path / "x.ckpt", storage_options={"a": 1})


def saved_steps(callback, trainer, steps):
    """The steps after which ``callback`` saved, driven as Lightning's loop does."""
    saved, module = [], SimpleNamespace(train_steps=0)
    for step in range(1, steps + 1):
        module.train_steps = trainer.step = step
        callback.on_train_batch_end(trainer, module)
        if callback.path.exists():
            saved.append(int(callback.path.read_text().split()[1]))
            callback.path.unlink()
    return saved, module


def test_the_last_checkpoint_is_saved_at_its_cadence_before_every_release_and_at_the_end(tmp_path):
    trainer = SavingTrainer(step=0, fail=False, is_global_zero=True, world_size=1)
    callback = LastCheckpoint(tmp_path / "last.ckpt", every_n_steps=4, release_every_n_steps=3)
    saved, module = saved_steps(callback, trainer, 9)
    assert saved == [3, 4, 6, 8, 9]
    only_at_end = LastCheckpoint(tmp_path / "end.ckpt")
    assert saved_steps(only_at_end, trainer, 5)[0] == []
    only_at_end.on_train_end(trainer, module)
    assert only_at_end.path.read_text() == "step 5"
    for cadence in ({"every_n_steps": -1}, {"release_every_n_steps": -3}):
        with pytest.raises(ValueError, match="must be >= 0"):
            LastCheckpoint(tmp_path / "x.ckpt", **cadence)


def test_a_sigterm_saves_the_steps_since_the_last_checkpoint_and_other_stops_do_not(tmp_path):
    """SIGTERM stops between two batches, where the state is whole: saved (in one process). A
    crash or Ctrl-C can land inside a batch, and a peer may not join a multi-process save."""
    callback = LastCheckpoint(tmp_path / "last.ckpt")
    trainer = SavingTrainer(step=7, fail=False, is_global_zero=True, world_size=1)
    callback.on_exception(trainer, None, KeyboardInterrupt())
    callback.on_exception(trainer, None, RuntimeError("a crash mid-batch"))
    callback.on_exception(SavingTrainer(step=7, fail=False, is_global_zero=True, world_size=2), None,
                          SIGTERMException())
    assert not callback.path.exists()
    callback.on_exception(trainer, None, SIGTERMException())
    assert callback.path.read_text() == "step 7"


def test_the_step_limit_stops_at_its_step_and_a_finished_run_resumed_trains_no_more():
    limit, trainer = StepLimit(5), SimpleNamespace(should_stop=False)
    limit.on_train_start(trainer, SimpleNamespace(train_steps=4))
    limit.on_train_batch_end(trainer, SimpleNamespace(train_steps=4))
    assert not trainer.should_stop
    limit.on_train_batch_end(trainer, SimpleNamespace(train_steps=5))
    assert trainer.should_stop
    resumed = SimpleNamespace(should_stop=False)
    limit.on_train_start(resumed, SimpleNamespace(train_steps=5))
    assert resumed.should_stop
    with pytest.raises(ValueError, match="at least 1, got 0"):
        StepLimit(0)  # a run of no batches would release an untrained generator as trained


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_one_non_finite_generator_weight_stops_the_run(bad):
    """Most weights still finite: a single NaN or inf is already a diverged generator."""
    from lightning_dpgan.callbacks.dp_sgd import DPSGD

    generator = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    module = SimpleNamespace(generator=generator, train_steps=3)
    private, baseline = SimpleNamespace(callbacks=[DPSGD(noise_multiplier=1.0)]), SimpleNamespace(callbacks=[])
    guard = FiniteGeneratorGuard()
    guard.on_train_batch_end(private, module)  # all finite: nothing happens
    with torch.no_grad():
        generator[1].bias[0] = bad
    with pytest.raises(TrainingDivergedError, match="at training step 3") as diverged:
        guard.on_train_batch_end(private, module)
    # what is left and what to change: the folder's config.yaml and logs/ block a rerun without --overwrite, and
    # a clipping bound of 1e300 (noise of that scale) diverges as surely as a learning rate
    assert "keeps its config.yaml and logs/ (a rerun there needs --overwrite)" in str(diverged.value)
    assert "--privacy.max_grad_norm" in str(diverged.value)
    # a baseline has no noise, and PATE no clipping bound: the --privacy.* remedy would be refused for them
    from lightning_dpgan.callbacks.pate import PATEAggregation

    for unclipped in (baseline, SimpleNamespace(callbacks=[PATEAggregation(num_teachers=5, target_epsilon=1.0)])):
        with pytest.raises(TrainingDivergedError) as diverged:
            guard.on_train_batch_end(unclipped, module)
        assert "--model.*lr*" in str(diverged.value) and "--privacy." not in str(diverged.value)


def test_a_resume_extends_its_checkpoints_lineage_without_changing_it():
    run_id = new_run_id()
    assert run_id != new_run_id() and len(run_id) == 32
    assert extended_lineage(None, 0, run_id) == [{"run_id": run_id, "from_step": 0}]
    parent = {"lineage": [{"run_id": "a", "from_step": 0}, {"run_id": "b", "from_step": 4}]}
    child = extended_lineage(parent, 9, run_id)
    assert child == [*parent["lineage"], {"run_id": run_id, "from_step": 9}]
    child[0]["run_id"] = "edited"
    assert parent["lineage"][0]["run_id"] == "a"  # the parent's record is copied, not shared
    # a checkpoint from before lineages were kept: its steps are an unrecorded run's
    assert extended_lineage({"model": "gan"}, 6, run_id) == [{"run_id": UNRECORDED, "from_step": 0},
                                                             {"run_id": run_id, "from_step": 6}]


def test_a_non_finite_weight_in_the_generators_first_layer_stops_the_run_too():
    """Every parameter is checked, the first layer's as much as the last's."""
    generator = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    module = SimpleNamespace(generator=generator, train_steps=1)
    with torch.no_grad():
        generator[0].weight[2, 1] = float("nan")
    with pytest.raises(TrainingDivergedError):
        FiniteGeneratorGuard().on_train_batch_end(SimpleNamespace(callbacks=[]), module)

"""What ``train`` reports and refuses around the run itself (run.py): the privacy report of a
private run, the length a resume given no ``--max-steps`` gets, and the figure an untrained
generator's warning gives."""
from types import SimpleNamespace

import pytest

from lightning_dpgan.cli import main
from lightning_dpgan.config import ConfigError
from lightning_dpgan.run import DEFAULT_MAX_STEPS, Run
from lightning_dpgan.sampling import read_run_info
from run_helpers import read_json, tiny_run_args


def test_a_private_runs_report_holds_its_lineage_as_the_checkpoint_does(tiny_image_data_dir, tmp_path):
    """A private run's privacy.json names the runs its training went through, as a non-private
    run's does: two branches resumed from one checkpoint must be told apart by their reports,
    and it is the private reports whose epsilon a reader adds up."""
    out = tmp_path / "private"
    assert main(tiny_run_args(tiny_image_data_dir, out, model="wgan", steps=2) + [
        "--privacy", "dp-sgd", "--epsilon", "5"]) == 0
    report = read_json(out / "privacy.json")
    assert report["mechanism"] != "none" and report["epsilon"] is not None  # a private report indeed
    lineage = report["lineage"]
    assert len(lineage) == 1 and lineage[0]["from_step"] == 0
    assert read_run_info(out / "checkpoints" / "last.ckpt")["lineage"] == lineage


def test_a_resume_given_no_run_length_is_held_to_the_default_length():
    """With neither --max-steps nor --max-epochs (from a flag, a config file or a preset) a run
    is DEFAULT_MAX_STEPS long, resumed or not: a checkpoint already past that length would take
    no step and only rewrite its run's outputs, as a --max-steps below its steps would. Given
    --max-epochs alone, the epochs set the length and no step count is implied."""
    def check(steps_taken, **length):
        config = {"max_steps": None, "max_epochs": None, "resume": "last.ckpt", **length}
        Run._check_resume_takes_steps(SimpleNamespace(config=config, resumed_steps=steps_taken))

    check(DEFAULT_MAX_STEPS)  # equal: writes the outputs of a run cut off after its last checkpoint
    with pytest.raises(ConfigError, match=f"has taken {DEFAULT_MAX_STEPS + 1} steps and --max-steps {DEFAULT_MAX_STEPS} "):
        check(DEFAULT_MAX_STEPS + 1)
    check(DEFAULT_MAX_STEPS + 1, max_epochs=3)
    check(DEFAULT_MAX_STEPS + 1, max_steps=DEFAULT_MAX_STEPS + 2)


def test_an_untrained_generators_warning_gives_the_epsilon_its_training_spent():
    """A budget that ran out within the first step: the warning's figure is what training spent
    (of --epsilon), not the total with the data's preprocessing (a DP schema, DP modes), which
    would read as training having spent the whole budget and point at the wrong remedy."""
    strategy = SimpleNamespace(refusal="answering would spend epsilon 3.2", target_epsilon=2.0,
                               training_epsilon=lambda: 0.25, epsilon=lambda: 1.25)  # 1.0 of preprocessing
    run = SimpleNamespace(module=SimpleNamespace(hparams={}, train_steps=0, generator_updates=0), strategy=strategy)
    reason = Run.untrained_reason(run)
    assert "ran out within the first step (answering would spend epsilon 3.2; epsilon 0.25 spent on training, " \
           "of --epsilon 2)" in reason

"""DPSGD strategy and DPGAN through the CLI: accounting against Opacus, budget stopping,
calibration, resume, composition, and refusals."""
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lightning_dpgan.callbacks.dp_sgd import DPSGD
from lightning_dpgan.callbacks.strategy import IncompatibleModelError
from lightning_dpgan.cli import main
from lightning_dpgan.modules import GAN
from lightning_dpgan.privacy.accountants import OpacusAccountant, calibrate_noise_multiplier
from lightning_dpgan.privacy.slots import LabelAggregator
from lightning_dpgan.run import rounded_up
from run_helpers import opacus_epsilon, read_json, tiny_run_args

TRAIN_RECORDS, BATCH = 160, 16
RATE = BATCH / TRAIN_RECORDS
REPORT_KEYS = {"mechanism", "epsilon", "delta", "target_epsilon", "steps", "accountant",
               "noise_multiplier", "sample_rate", "max_grad_norm"}


def dpgan(data_dir, output_dir, steps, *extra, model="dpgan"):
    return main(tiny_run_args(data_dir, output_dir, model=model, steps=steps, batch_size=BATCH) + list(extra))


@pytest.fixture(scope="module")
def fixed_noise_run(tiny_image_data_dir, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("dp") / "fixed"
    assert dpgan(tiny_image_data_dir, output_dir, 7, "--privacy.noise_multiplier", "1.3", "--delta", "1e-4",
                 "--privacy.noise_seed", "0") == 0
    return output_dir


def test_privacy_report_recomputes_with_opacus(fixed_noise_run):
    report = read_json(fixed_noise_run / "privacy.json")
    assert REPORT_KEYS <= set(report)
    assert report["mechanism"].startswith("dp-sgd") and report["accountant"] == "rdp"
    assert (report["steps"], report["noise_multiplier"], report["sample_rate"]) == (7, 1.3, RATE)
    assert report["stopped_by"] == "max-steps"  # a fixed noise at epsilon's default target lasts longer
    # the figures as one sentence a reader signs off on: what, against which change, what is taken as public
    assert report["guarantee"].startswith(f"({rounded_up(report['epsilon'], 4)}, 0.0001)-differential privacy of "
                                          "what the run releases")
    assert "against one record added to or removed from the training records" in report["guarantee"]
    assert "train_records" in report["guarantee"] and "data-dependent" not in report["guarantee"]
    assert "A record is one training image" in report["guarantee"] and "schema" not in report["guarantee"]
    # its noise came from --privacy.noise_seed: the sentence says the figure is not for release
    assert "Not for release: its secret draws came from a fixed seed" in report["guarantee"]
    # an image run's preprocessing is named, not an unexplained 0
    assert report["preprocessing"] == {"epsilon": 0.0, "delta": 0.0, "neighbours": "add-remove", "mechanism":
                                       "fixed pixel scaling to [-1, 1] (reads no statistic of the images)"}
    # the accountant's code, for a reader of the report later: the installed Opacus and torch
    assert (report["software"]["opacus"], report["software"]["torch"]) == (metadata.version("opacus"), torch.__version__)
    expected = opacus_epsilon(report["noise_multiplier"], report["sample_rate"], report["steps"], report["delta"])
    assert report["epsilon"] == pytest.approx(expected, rel=1e-12)


def test_prv_accountant_matches_opacus(tiny_image_data_dir, tmp_path):
    assert dpgan(tiny_image_data_dir, tmp_path / "prv", 5, "--privacy.noise_multiplier", "1.0",
                 "--privacy.accountant", "prv") == 0
    report = read_json(tmp_path / "prv" / "privacy.json")
    assert report["accountant"] == "prv"
    assert report["epsilon"] == pytest.approx(opacus_epsilon(1.0, RATE, 5, report["delta"], "prv"), rel=1e-9)


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_calibrated_noise_spends_at_most_the_target_over_the_planned_steps(tiny_image_data_dir, tmp_path, accountant):
    """sigma is calibrated under the accountant that reports: PRV's tighter bound needs less noise
    than RDP's for the same target."""
    assert dpgan(tiny_image_data_dir, tmp_path / "cal", 6, "--epsilon", "4", "--delta", "1e-4",
                 "--privacy.accountant", accountant) == 0
    report = read_json(tmp_path / "cal" / "privacy.json")
    assert report["steps"] == 6 and report["calibrated_for_steps"] == 6 and report["accountant"] == accountant
    assert report["epsilon"] <= 4 and report["epsilon"] > 3.9  # calibrated, not merely safe
    assert opacus_epsilon(report["noise_multiplier"], RATE, 6, 1e-4, accountant) == pytest.approx(report["epsilon"],
                                                                                                   rel=1e-9)
    if accountant == "prv":
        assert report["noise_multiplier"] < calibrate_noise_multiplier(4.0, 1e-4, RATE, 6, kind="rdp")


def test_budget_stops_before_the_step_that_would_exceed_it(tiny_image_data_dir, tmp_path, capsys):
    target, sigma = 2.0, 1.2
    assert dpgan(tiny_image_data_dir, tmp_path / "budget", 500, "--epsilon", str(target),
                 "--privacy.noise_multiplier", str(sigma), "--delta", "1e-4") == 0
    report = read_json(tmp_path / "budget" / "privacy.json")
    steps = report["steps"]
    assert 0 < steps < 500
    # the run and its report say that the budget, not the step limit, ended it
    assert report["stopped_by"] == "budget"
    assert f"training stopped after {steps} of 500 steps: the privacy budget" in capsys.readouterr().out
    assert report["epsilon"] <= target
    assert opacus_epsilon(sigma, RATE, steps + 1, 1e-4) > target  # one more step would have passed it
    metrics = read_json(tmp_path / "budget" / "metrics.json")
    assert metrics["steps"] == steps and metrics["privacy/epsilon"] == pytest.approx(report["epsilon"])


def test_a_budget_stop_in_the_last_epoch_is_not_the_epochs_limit(tiny_image_data_dir, tmp_path, capsys):
    """Lightning counts an epoch stopped part-way as done; the report must still name the budget."""
    args = tiny_run_args(tiny_image_data_dir, tmp_path / "epoch", model="dpgan", steps=None, batch_size=BATCH)
    assert main(args + ["--max-epochs", "1", "--epsilon", "1.6", "--privacy.noise_multiplier", "1.2", "--delta", "1e-4"]) == 0
    report = read_json(tmp_path / "epoch" / "privacy.json")
    assert 0 < report["steps"] < TRAIN_RECORDS // BATCH  # the epoch's 10 batches were not all taken
    assert report["stopped_by"] == "budget" and "the privacy budget" in capsys.readouterr().out


def test_a_budget_too_small_for_one_step_is_refused(tiny_image_data_dir, tmp_path, capsys):
    code = dpgan(tiny_image_data_dir, tmp_path / "tiny", 5, "--epsilon", "0.05", "--privacy.noise_multiplier", "0.6")
    assert code == 2
    assert "a single training step would spend" in capsys.readouterr().err
    assert not (tmp_path / "tiny" / "privacy.json").exists()


def test_resume_spends_exactly_like_an_uninterrupted_run(tiny_image_data_dir, tmp_path):
    common = ("--privacy.noise_multiplier", "1.1", "--delta", "1e-4")
    assert dpgan(tiny_image_data_dir, tmp_path / "straight", 20, *common) == 0
    assert dpgan(tiny_image_data_dir, tmp_path / "first", 10, *common) == 0
    assert dpgan(tiny_image_data_dir, tmp_path / "second", 20, *common,
                 "--resume", str(tmp_path / "first" / "checkpoints" / "last.ckpt")) == 0
    straight = read_json(tmp_path / "straight" / "privacy.json")
    resumed = read_json(tmp_path / "second" / "privacy.json")
    assert resumed["steps"] == straight["steps"] == 20
    assert resumed["epsilon"] == straight["epsilon"]


def test_resume_keeps_the_calibrated_noise(tiny_image_data_dir, tmp_path):
    assert dpgan(tiny_image_data_dir, tmp_path / "a", 4, "--epsilon", "6", "--delta", "1e-4") == 0
    first = read_json(tmp_path / "a" / "privacy.json")
    assert dpgan(tiny_image_data_dir, tmp_path / "b", 8, "--epsilon", "6", "--delta", "1e-4",
                 "--resume", str(tmp_path / "a" / "checkpoints" / "last.ckpt")) == 0
    second = read_json(tmp_path / "b" / "privacy.json")
    assert second["noise_multiplier"] == first["noise_multiplier"]
    assert second["epsilon"] <= 6 and second["steps"] >= first["steps"]


def test_a_resume_that_takes_no_step_keeps_the_checkpoints_noise_and_reports_the_last_steps_settings(
        tiny_image_data_dir, tmp_path):
    """A resume refused at its first step (σ 0.3 would pass the target at once) rewrites the
    checkpoint: it kept its own σ, and the calibrated σ was lost to the next resume, which then
    trained at 0.3; and privacy.json's clip norm was the refused resume's, not the last step's."""
    assert dpgan(tiny_image_data_dir, tmp_path / "a", 4, "--epsilon", "6", "--delta", "1e-4") == 0
    first = read_json(tmp_path / "a" / "privacy.json")
    assert first["calibrated_for_steps"] == 4
    assert dpgan(tiny_image_data_dir, tmp_path / "b", 8, "--epsilon", "6", "--delta", "1e-4",
                 "--privacy.noise_multiplier", "0.3", "--privacy.max_grad_norm", "2", "--privacy.poisson_sampling", "false",
                 "--resume", str(tmp_path / "a" / "checkpoints" / "last.ckpt")) == 0
    refused = read_json(tmp_path / "b" / "privacy.json")
    assert refused["steps"] == 4 and refused["epsilon"] == first["epsilon"]
    for key in ("noise_multiplier", "max_grad_norm", "sampling", "grad_sample_mode", "calibrated_for_steps"):
        assert refused[key] == first[key], key
    checkpoint = torch.load(tmp_path / "b" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    (state,) = [value for key, value in checkpoint["callbacks"].items() if "DPSGD" in key]
    assert (state["noise_multiplier"], state["calibrated_for_steps"]) == (first["noise_multiplier"], 4)
    assert dpgan(tiny_image_data_dir, tmp_path / "c", 6, "--epsilon", "20", "--delta", "1e-4",
                 "--resume", str(tmp_path / "b" / "checkpoints" / "last.ckpt")) == 0
    resumed = read_json(tmp_path / "c" / "privacy.json")
    assert resumed["steps"] == 6 and resumed["noise_multiplier"] == first["noise_multiplier"]


def test_a_resume_under_a_larger_target_draws_the_noise_it_charges(tiny_image_data_dir, tmp_path, monkeypatch):
    """The checkpoint's sigma must reach the optimizer that draws the noise, not only the report
    and the accountant: recalibrated for the larger target it would be smaller than what is charged."""
    from lightning_dpgan.privacy.dp_sgd import DPSGDMechanism

    assert dpgan(tiny_image_data_dir, tmp_path / "a", 4, "--epsilon", "6", "--delta", "1e-4") == 0
    first = read_json(tmp_path / "a" / "privacy.json")
    drawn_with, wrap = [], DPSGDMechanism.wrap_optimizer

    def recording_wrap(self, optimizer):
        private = wrap(self, optimizer)
        drawn_with.append(private.noise_multiplier)  # the sigma Opacus' optimizer adds noise with
        return private

    monkeypatch.setattr(DPSGDMechanism, "wrap_optimizer", recording_wrap)
    assert dpgan(tiny_image_data_dir, tmp_path / "b", 8, "--epsilon", "20", "--delta", "1e-4",
                 "--resume", str(tmp_path / "a" / "checkpoints" / "last.ckpt")) == 0
    second = read_json(tmp_path / "b" / "privacy.json")
    assert drawn_with == [first["noise_multiplier"]] == [second["noise_multiplier"]]


def test_resuming_under_a_target_below_what_the_checkpoint_spent_is_refused(tiny_image_data_dir, tmp_path, capsys):
    assert dpgan(tiny_image_data_dir, tmp_path / "a", 4, "--epsilon", "6", "--delta", "1e-4") == 0
    spent = read_json(tmp_path / "a" / "privacy.json")["epsilon"]
    code = dpgan(tiny_image_data_dir, tmp_path / "b", 8, "--epsilon", str(round(spent / 2, 3)), "--delta", "1e-4",
                 "--resume", str(tmp_path / "a" / "checkpoints" / "last.ckpt"))
    assert code == 2
    said = capsys.readouterr().err
    assert f"already spent epsilon = {spent:.4g}, more than --epsilon {round(spent / 2, 3):g}: its" in said
    assert not (tmp_path / "b" / "privacy.json").exists()  # no report whose epsilon passes its target
    # the same target with a lower delta: the same steps state more epsilon, and the refusal says so
    code = dpgan(tiny_image_data_dir, tmp_path / "c", 8, "--epsilon", "6", "--delta", "1e-12",
                 "--resume", str(tmp_path / "a" / "checkpoints" / "last.ckpt"))
    assert code == 2
    said = capsys.readouterr().err
    assert "more than --epsilon 6 (at --delta 1e-12, below the checkpoint's 0.0001: a lower delta states a larger" in said


def test_resume_without_accountant_state_is_refused(tiny_image_data_dir, tmp_path, capsys):
    assert main(tiny_run_args(tiny_image_data_dir, tmp_path / "plain", steps=2, batch_size=BATCH)) == 0
    code = dpgan(tiny_image_data_dir, tmp_path / "dp", 4, "--privacy", "dp-sgd", "--privacy.noise_multiplier", "1.0",
                 "--resume", str(tmp_path / "plain" / "checkpoints" / "last.ckpt"), model="gan")
    assert code == 2
    assert "holds no dp-sgd accountant state" in capsys.readouterr().err


def test_resume_with_corrupt_accountant_state_is_refused(fixed_noise_run, tiny_image_data_dir, tmp_path, capsys):
    checkpoint = torch.load(fixed_noise_run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    (key,) = [k for k in checkpoint["callbacks"] if "DPSGD" in k]
    checkpoint["callbacks"][key]["accountant"]["history"] = "garbage"
    torch.save(checkpoint, tmp_path / "corrupt.ckpt")
    code = dpgan(tiny_image_data_dir, tmp_path / "out", 9, "--privacy.noise_multiplier", "1.3",
                 "--resume", str(tmp_path / "corrupt.ckpt"))
    assert code == 2
    assert "history" in capsys.readouterr().err


@pytest.mark.parametrize("missing", ["all", "one"])
def test_resume_with_an_accountant_that_charged_fewer_steps_than_were_taken_is_refused(
        fixed_noise_run, tiny_image_data_dir, tmp_path, capsys, missing):
    """An emptied history would restart the budget at zero under networks that already spent it;
    one step short would under-report by a step (one charge per training step, no fewer)."""
    checkpoint = torch.load(fixed_noise_run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    (key,) = [k for k in checkpoint["callbacks"] if "DPSGD" in k]
    history = checkpoint["callbacks"][key]["accountant"]["history"]
    taken = checkpoint["lightning_dpgan"]["train_steps"]
    assert [entry["steps"] for entry in history] == [taken]
    if missing == "all":
        history.clear()
    else:
        history[0]["steps"] -= 1
    charged = 0 if missing == "all" else taken - 1
    torch.save(checkpoint, tmp_path / "short.ckpt")
    code = dpgan(tiny_image_data_dir, tmp_path / "out", 12, "--privacy.noise_multiplier", "1.3",
                 "--resume", str(tmp_path / "short.ckpt"))
    assert code == 2
    assert f"accountant charged {charged} steps, but its networks took {taken} training steps" in capsys.readouterr().err
    assert not (tmp_path / "out" / "privacy.json").exists()


def test_a_resumed_reports_noise_source_and_sampling_cover_every_segment(tiny_image_data_dir, tmp_path, capsys):
    """A first segment with a fixed noise seed and shuffled batches, resumed with neither: the
    report must not describe the whole run by the last segment's settings, nor the console."""
    common = ("--privacy.noise_multiplier", "1.3", "--delta", "1e-4")
    assert dpgan(tiny_image_data_dir, tmp_path / "first", 4, *common, "--privacy.noise_seed", "0",
                 "--privacy.poisson_sampling", "false") == 0
    assert "segments" not in read_json(tmp_path / "first" / "privacy.json")  # one segment: nothing to list
    assert "train: warning: batches were shuffled (in an order" in capsys.readouterr().err
    assert dpgan(tiny_image_data_dir, tmp_path / "second", 8, *common,
                 "--resume", str(tmp_path / "first" / "checkpoints" / "last.ckpt")) == 0
    assert "train: warning: batches were shuffled in the segment(s) from step 0 " in capsys.readouterr().err
    report = read_json(tmp_path / "second" / "privacy.json")
    assert [(s["from_step"], s["sampling"]) for s in report["segments"]] == [(0, "shuffle"), (4, "poisson")]
    assert report["noise_source"].startswith("from step 0: FIXED SEED 0")
    assert "; then from step 4: own generator seeded from OS entropy" in report["noise_source"]
    assert report["sampling"] == "poisson" and "shuffled in the segment(s) from step 0" in report["note"]


def test_a_target_raised_on_resume_shows_in_the_segments(tiny_image_data_dir, tmp_path):
    """Going on past the first target is the user's right; hiding that it was raised is not."""
    assert dpgan(tiny_image_data_dir, tmp_path / "first", 4, "--epsilon", "3", "--delta", "1e-4") == 0
    spent = read_json(tmp_path / "first" / "privacy.json")["epsilon"]
    assert dpgan(tiny_image_data_dir, tmp_path / "second", 8, "--epsilon", "6", "--delta", "1e-4",
                 "--resume", str(tmp_path / "first" / "checkpoints" / "last.ckpt")) == 0
    report = read_json(tmp_path / "second" / "privacy.json")
    assert [(s["from_step"], s["target_epsilon"]) for s in report["segments"]] == [(0, 3.0), (4, 6.0)]
    assert report["target_epsilon"] == 6.0 and spent <= 3.0 < report["epsilon"] <= 6.0


def test_a_resume_with_other_model_settings_of_the_same_shapes_is_refused(fixed_noise_run, tiny_image_data_dir,
                                                                           tmp_path, capsys):
    """Same shapes, other computation: the weights would load and the generator draw its latent
    codes from another distribution (or Adam keep the checkpoint's learning rate)."""
    resume = ("--privacy.noise_multiplier", "1.3", "--resume", str(fixed_noise_run / "checkpoints" / "last.ckpt"))
    saved = torch.load(fixed_noise_run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    other = "uniform" if saved["hyper_parameters"]["latent_distribution"] != "uniform" else "normal"
    assert dpgan(tiny_image_data_dir, tmp_path / "latent", 9, *resume, "--model.latent_distribution", other) == 2
    assert "built with other settings: latent_distribution" in capsys.readouterr().err
    assert dpgan(tiny_image_data_dir, tmp_path / "lr", 9, *resume, "--model.lr_generator", "0.5") == 2
    assert "lr_generator" in capsys.readouterr().err
    assert not (tmp_path / "lr" / "privacy.json").exists()
    assert dpgan(tiny_image_data_dir, tmp_path / "same", 9, *resume) == 0  # the same settings resume


def test_a_checkpoint_from_before_segments_were_kept_says_its_segment_is_not_recorded(
        fixed_noise_run, tiny_image_data_dir, tmp_path):
    """Its first segment may have had a fixed seed: the report must not describe the run by the
    resumed segment's OS-entropy source alone."""
    checkpoint = torch.load(fixed_noise_run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    (key,) = [k for k in checkpoint["callbacks"] if "DPSGD" in k]
    del checkpoint["callbacks"][key]["segments"]
    torch.save(checkpoint, tmp_path / "older.ckpt")
    assert dpgan(tiny_image_data_dir, tmp_path / "out", 9, "--privacy.noise_multiplier", "1.3",
                 "--resume", str(tmp_path / "older.ckpt")) == 0
    report = read_json(tmp_path / "out" / "privacy.json")
    assert report["noise_source"].startswith("from step 0: not recorded")
    assert [segment["from_step"] for segment in report["segments"]] == [0, 7]


def test_a_resumed_fixed_noise_seed_goes_on_from_the_steps_taken(tiny_image_data_dir, tmp_path, monkeypatch):
    """The strategy moves its seeded stream on at a resume (NoiseSource.continue_after, whose
    draws test_noise_source checks), before the resumed segment's first draw."""
    from lightning_dpgan.privacy.noise_source import NoiseSource

    calls, original = [], NoiseSource.continue_after

    def spy(self, steps):
        held = self.generator("cpu")  # the one the batch sampler and the noise draw from
        original(self, steps)
        calls.append((self.seed, steps, torch.rand(1, generator=held).item()))

    common = ("--privacy.noise_multiplier", "1.3", "--delta", "1e-4", "--privacy.noise_seed", "0")
    assert dpgan(tiny_image_data_dir, tmp_path / "first", 4, *common) == 0
    monkeypatch.setattr(NoiseSource, "continue_after", spy)
    assert dpgan(tiny_image_data_dir, tmp_path / "second", 8, *common,
                 "--resume", str(tmp_path / "first" / "checkpoints" / "last.ckpt")) == 0
    assert [(seed, steps) for seed, steps, _ in calls] == [(0, 4)]
    continued = NoiseSource(0)
    original(continued, 4)  # not the spy, still in place
    # the generator handed out before the checkpoint was read now draws the resumed stream
    assert calls[0][2] == torch.rand(1, generator=continued.generator("cpu")).item()
    assert calls[0][2] != torch.rand(1, generator=NoiseSource(0).generator("cpu")).item()


def test_wgan_with_dp_sgd_is_dpgan(fixed_noise_run, tiny_image_data_dir, tmp_path):
    """--model wgan --privacy dp-sgd composes the same thing as --model dpgan."""
    assert dpgan(tiny_image_data_dir, tmp_path / "wgan", 7, "--privacy", "dp-sgd",
                 "--privacy.noise_multiplier", "1.3", "--delta", "1e-4", "--privacy.noise_seed", "0", model="wgan") == 0
    composed = read_json(tmp_path / "wgan" / "privacy.json")
    assert composed["epsilon"] == read_json(fixed_noise_run / "privacy.json")["epsilon"]
    load = lambda run: torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)["state_dict"]  # noqa: E731
    dp, wgan = load(fixed_noise_run), load(tmp_path / "wgan")
    assert dp.keys() == wgan.keys()
    assert all(torch.equal(dp[k], wgan[k]) for k in dp)


def test_the_run_seed_does_not_fix_the_dp_noise(fixed_noise_run, tiny_image_data_dir, tmp_path):
    """The same --seed (same initial weights, recorded in config.yaml) twice: different noise and
    batches, so different critics. Only --privacy.noise_seed (tests) reproduces a private run, and
    the privacy report says so."""
    for name in ("a", "b"):
        assert dpgan(tiny_image_data_dir, tmp_path / name, 3, "--privacy.noise_multiplier", "1.3", "--delta", "1e-4") == 0
    load = lambda run: torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)["state_dict"]  # noqa: E731
    first, second = load(tmp_path / "a"), load(tmp_path / "b")
    # tensors of many entries: RMSProp's first steps move each entry by about lr * sign(gradient),
    # so a single bias entry ends equal in two runs whenever its three noisy signs agree
    critic = [k for k in first if k.startswith("discriminator.") and first[k].numel() >= 8]
    unchanged = [k for k in critic if torch.equal(first[k], second[k])]
    assert critic and not unchanged, unchanged
    assert "OS entropy" in read_json(tmp_path / "a" / "privacy.json")["noise_source"]
    assert "FIXED SEED 0" in read_json(fixed_noise_run / "privacy.json")["noise_source"]


def test_the_critic_step_clips_the_generated_records_through_the_mechanism(tiny_image_data_dir, tmp_path, monkeypatch):
    """Every critic step hands its generated records' per-record losses to the mechanism's
    ``backward_public`` (which clips each one: test_dp_sgd_mechanism), a fixed number a step."""
    from lightning_dpgan.privacy.dp_sgd import DPSGDMechanism
    seen = []
    original = DPSGDMechanism.backward_public

    def spy(self, per_record_losses):
        seen.append(tuple(per_record_losses.shape))
        return original(self, per_record_losses)

    monkeypatch.setattr(DPSGDMechanism, "backward_public", spy)
    assert dpgan(tiny_image_data_dir, tmp_path / "spy", 4, "--privacy.noise_multiplier", "1.3") == 0
    assert seen == [(BATCH,)] * 4


def test_dp_sgd_composes_with_the_plain_gan(tiny_image_data_dir, tmp_path):
    assert dpgan(tiny_image_data_dir, tmp_path / "gan", 3, "--privacy", "dp-sgd",
                 "--privacy.noise_multiplier", "2.0", model="gan") == 0
    report = read_json(tmp_path / "gan" / "privacy.json")
    assert report["steps"] == 3
    assert report["epsilon"] == pytest.approx(opacus_epsilon(2.0, RATE, 3, report["delta"]), rel=1e-12)


def test_dp_checkpoint_samples_like_any_other(fixed_noise_run, tmp_path):
    """A DP-trained checkpoint (hooks were on the critic) loads into a plain module for sampling."""
    out = tmp_path / "s.npz"
    assert main(["sample", "--checkpoint", str(fixed_noise_run / "checkpoints/last.ckpt"), "-n", "10", "--out", str(out)]) == 0
    import numpy as np

    arrays = np.load(out)
    assert arrays["images"].shape == (10, 1, 28, 28) and arrays["labels"].tolist() == list(range(10))


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--epsilon", "0"], "--epsilon must be a finite number > 0, got 0.0"),
        (["--epsilon", "-1"], "--epsilon must be a finite number > 0, got -1.0"),
        (["--epsilon", "1", "--delta", "0"], "--delta must be strictly between 0 and 1, got 0.0"),
        (["--epsilon", "1", "--delta", "0.01"], "is not below 1/n = 0.00625 for the n = 160 training records"),
        (["--epsilon", "1", "--privacy.max_grad_norm", "0"], "--privacy.max_grad_norm must be a finite number > 0, got 0"),
        (["--privacy.noise_multiplier", "-1"], "--privacy.noise_multiplier must be a finite number > 0, got -1"),
        (["--privacy.accountant", "gdp"], "--privacy.accountant must be 'rdp' or 'prv', got 'gdp'"),
        (["--epsilon", "1", "--model.gradient_penalty", "10"],
         "dp-sgd cannot clip per-record gradients of a gradient penalty: set --model.gradient_penalty 0"),
    ],
)
def test_bad_privacy_settings_are_refused(tiny_image_data_dir, tmp_path, capsys, extra, message):
    assert dpgan(tiny_image_data_dir, tmp_path / "bad", 3, *extra) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "bad" / "privacy.json").exists()


def test_an_unknown_grad_sample_mode_is_refused_as_the_strategy_is_built():
    """Before the data is read, naming the option (it was refused only as Opacus was attached)."""
    with pytest.raises(ValueError, match="--privacy.grad_sample_mode must be one of"):
        DPSGD(noise_multiplier=1.0, grad_sample_mode="bogus")


def test_dpgan_needs_a_target_or_a_noise_multiplier():
    with pytest.raises(ValueError, match="needs --epsilon"):
        DPSGD()


def test_a_model_without_the_slot_is_refused_with_the_compatible_models():
    class LabelOnlyModel(GAN):
        privacy_slot = LabelAggregator

    with pytest.raises(IncompatibleModelError, match="Models that take --privacy dp-sgd: gan, wgan, dpgan"):
        DPSGD(noise_multiplier=1.0).check_compatible(LabelOnlyModel((4,), None))


def test_training_batches_are_poisson_sampled_at_the_charged_rate(tiny_image_data_dir):
    """The accountant assumes each record joins each batch independently with probability q:
    batch sizes must then be Binomial(N, q) -- mean qN, variance qN(1-q) -- not a fixed size."""
    from lightning_dpgan.datamodules.mnist import MNISTDataModule

    datamodule = MNISTDataModule(data_dir=tiny_image_data_dir, batch_size=BATCH, verify_checksums=False)
    datamodule.setup("fit")
    strategy = DPSGD(noise_multiplier=1.0, noise_seed=0)  # reproducible draws
    strategy.sample_rate = BATCH / TRAIN_RECORDS
    strategy._use_poisson_sampling(datamodule)
    sizes = torch.tensor([len(batch[0]) for _ in range(40) for batch in datamodule.train_dataloader()], dtype=torch.float64)
    expected_mean = TRAIN_RECORDS * RATE
    expected_var = TRAIN_RECORDS * RATE * (1 - RATE)
    assert len(sizes) == 400  # 1/q batches per pass
    assert abs(sizes.mean().item() - expected_mean) < 4 * (expected_var / len(sizes)) ** 0.5
    assert 0.7 < sizes.var().item() / expected_var < 1.3


def test_a_run_killed_mid_training_resumes_without_losing_spent_budget(tiny_image_data_dir, tmp_path):
    """SIGKILL a training process once a few steps are checkpointed, then resume: the resumed
    run's accountant starts from the checkpoint's steps and ends at exactly the epsilon Opacus
    gives for all steps at the run's noise (the killed process released nothing after it)."""
    import signal
    import subprocess
    import sys
    import time

    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "killed"
    command = [sys.executable, str(repo / "train.py"),
               *tiny_run_args(tiny_image_data_dir, out, model="dpgan", steps=100000, batch_size=BATCH)[1:],
               "--privacy.noise_multiplier", "1.1", "--delta", "1e-4", "--checkpoint_every_n_steps", "1"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=repo)
    checkpoint_path = out / "checkpoints" / "last.ckpt"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if checkpoint_path.exists() and torch.load(checkpoint_path, map_location="cpu", weights_only=False)[
                    "lightning_dpgan"]["train_steps"] >= 3:
                break
            time.sleep(0.2)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    assert not (out / "privacy.json").exists()  # killed: no report that looks complete
    killed_at = torch.load(checkpoint_path, map_location="cpu", weights_only=False)["lightning_dpgan"]["train_steps"]
    assert killed_at >= 3
    total = killed_at + 4
    assert dpgan(tiny_image_data_dir, tmp_path / "resumed", total, "--privacy.noise_multiplier", "1.1", "--delta", "1e-4",
                 "--resume", str(checkpoint_path)) == 0
    report = read_json(tmp_path / "resumed" / "privacy.json")
    assert report["steps"] == total
    assert report["epsilon"] == pytest.approx(opacus_epsilon(1.1, RATE, total, 1e-4), rel=1e-9)


def test_every_sample_grid_is_covered_by_a_checkpoint_saved_before_it(tiny_image_data_dir, tmp_path, monkeypatch):
    """A grid is a release of the generator: when it is written, the checkpoint on disk must
    already hold its step (and the accountant that charged it), or a run killed after the grid
    and resumed from an earlier checkpoint would train those steps again with fresh noise,
    uncharged. Checkpoints every 500 steps, grids every 2: the grids force their own saves."""
    from lightning_dpgan.callbacks import samples

    out, seen = tmp_path / "grids", []
    write_png = samples.write_png

    def write_and_check(path, picture):
        checkpoint = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
        seen.append((Path(path).name, checkpoint["lightning_dpgan"]["train_steps"]))
        return write_png(path, picture)

    monkeypatch.setattr(samples, "write_png", write_and_check)
    assert dpgan(tiny_image_data_dir, out, 5, "--sample_every_n_steps", "2", "--checkpoint_every_n_steps", "500") == 0
    assert seen == [("step_0000002.png", 2), ("step_0000004.png", 4)]


def logged_epsilons(run_dir):
    """``privacy/epsilon`` values of ``logs/metrics.csv`` (the CSV logger), in order."""
    import pandas as pd

    logged = pd.read_csv(Path(run_dir) / "logs" / "metrics.csv", float_precision="round_trip")
    return logged["privacy/epsilon"].dropna().tolist()


def test_the_final_epsilon_is_logged_when_max_steps_ends_the_run_off_the_logging_cadence(fixed_noise_run):
    """7 steps at the default cadence of 50: before the last step's figure was logged, metrics.json
    held no epsilon at all and the logs none either."""
    report = read_json(fixed_noise_run / "privacy.json")
    assert read_json(fixed_noise_run / "metrics.json")["privacy/epsilon"] == pytest.approx(report["epsilon"], rel=1e-12)
    assert logged_epsilons(fixed_noise_run)[-1] == report["epsilon"]  # the accountant's float64, not a float32 near it


@pytest.mark.parametrize("epochs", [1, 2])
def test_sigma_calibrated_for_epochs_is_calibrated_for_the_batches_they_hold(tiny_image_data_dir, tmp_path, epochs):
    """160 records in batches of 12: Opacus' epoch is int(160 / 12) = 13 batches; planning 14
    added noise for a step never taken, and two epochs are 26 (noise for one would spend the
    budget in half the run)."""
    args = tiny_run_args(tiny_image_data_dir, tmp_path / "epoch", model="dpgan", steps=None, batch_size=12)
    assert main(args + ["--max-epochs", str(epochs), "--epsilon", "5", "--delta", "1e-4"]) == 0
    report = read_json(tmp_path / "epoch" / "privacy.json")
    assert report["calibrated_for_steps"] == report["steps"] == 13 * epochs and report["stopped_by"] == "max-epochs"
    assert 4.9 < report["epsilon"] <= 5


@pytest.mark.parametrize("limit, per_epoch", [("3", 3), ("0.5", 6), ("40", 13)], ids=["count", "fraction", "above"])
def test_sigma_is_calibrated_for_the_batches_a_train_batch_limit_leaves_each_epoch(tiny_image_data_dir, tmp_path, limit,
                                                                                    per_epoch):
    """--trainer.limit_train_batches cuts each epoch short (Lightning: a count, or int(13 * 0.5) = 6
    of the 13 batches): sigma was calibrated for the whole epochs, 942 steps planned for 6 taken,
    and the run spent a fraction of its target."""
    args = tiny_run_args(tiny_image_data_dir, tmp_path / "limited", model="dpgan", steps=None, batch_size=12)
    assert main(args + ["--max-epochs", "2", "--epsilon", "5", "--delta", "1e-4", "--trainer.limit_train_batches", limit]) == 0
    report = read_json(tmp_path / "limited" / "privacy.json")
    assert report["calibrated_for_steps"] == report["steps"] == 2 * per_epoch and report["stopped_by"] == "max-epochs"
    assert 4.9 < report["epsilon"] <= 5


def test_a_fast_dev_run_is_named_as_what_ended_it(tiny_image_data_dir, tmp_path, capsys):
    """Lightning's debugging run ended a private run after one batch, and privacy.json called it
    stopped by the budget: nothing in the report said it was a check of the code, not a run."""
    args = tiny_run_args(tiny_image_data_dir, tmp_path / "dev", model="dpgan", steps=5, batch_size=16)
    assert main(args + ["--epsilon", "5", "--delta", "1e-4", "--trainer.fast_dev_run", "true"]) == 0
    report = read_json(tmp_path / "dev" / "privacy.json")
    assert report["stopped_by"] == "fast-dev-run" and report["steps"] == 1
    assert report["guarantee"].endswith("It is Lightning's fast_dev_run, a check of the code: not a run to publish.")
    assert "--trainer.fast_dev_run, Lightning's debugging run of a few batches" in capsys.readouterr().out
    # on a resume it is refused from the flags: Lightning refused it once the checkpoint was restored
    # ("You restored a checkpoint with current_epoch=2, but you have set Trainer(max_epochs=1)")
    before = (tmp_path / "dev" / "privacy.json").read_bytes()
    assert main(args + ["--epsilon", "5", "--delta", "1e-4", "--trainer.fast_dev_run", "true", "--resume",
                        str(tmp_path / "dev" / "checkpoints" / "last.ckpt"), "--max-steps", "8"]) == 2
    assert ("trainer.fast_dev_run runs a few batches of a fresh run in one epoch, and --resume continues the "
            "checkpoint's epochs: leave one of them out") in capsys.readouterr().err
    assert (tmp_path / "dev" / "privacy.json").read_bytes() == before


def test_the_final_epsilon_is_logged_when_max_epochs_ends_the_run(tiny_image_data_dir, tmp_path):
    args = tiny_run_args(tiny_image_data_dir, tmp_path / "epochs", model="dpgan", steps=None, batch_size=BATCH)
    assert main(args + ["--max-epochs", "1", "--privacy.noise_multiplier", "1.3", "--delta", "1e-4",
                        "--trainer.log_every_n_steps", "4"]) == 0
    report = read_json(tmp_path / "epochs" / "privacy.json")
    assert report["steps"] == TRAIN_RECORDS // BATCH and report["stopped_by"] == "max-epochs"
    assert read_json(tmp_path / "epochs" / "metrics.json")["privacy/epsilon"] == pytest.approx(report["epsilon"], rel=1e-12)
    assert logged_epsilons(tmp_path / "epochs")[-1] == report["epsilon"]


@pytest.mark.parametrize("strategy", ["ddp_spawn", "ddp_find_unused_parameters_true"])
def test_lightnings_other_strategies_are_refused_for_a_private_run_before_anything_is_written(
        tiny_image_data_dir, tmp_path, capsys, strategy):
    """They average gradients before a mechanism could clip them (ddp_spawn failed inside its
    workers with Lightning's sampler error, leaving a config.yaml behind)."""
    assert dpgan(tiny_image_data_dir, tmp_path / "spawn", 2, "--strategy", strategy) == 2
    error = capsys.readouterr().err
    assert f"--strategy {strategy} cannot train a private model" in error and "--strategy ddp" in error
    assert not (tmp_path / "spawn").exists() or not any((tmp_path / "spawn").iterdir())


def test_a_resume_whose_max_steps_leaves_no_step_is_refused_and_the_run_kept(tiny_image_data_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert dpgan(tiny_image_data_dir, run, 6, "--privacy.noise_multiplier", "1.1", "--delta", "1e-4") == 0
    before = sorted(p.name for p in run.iterdir())
    code = dpgan(tiny_image_data_dir, run, 4, "--privacy.noise_multiplier", "1.1", "--delta", "1e-4",
                 "--resume", str(run / "checkpoints" / "last.ckpt"))
    assert code == 2
    assert "has taken 6 steps and --max-steps 4 counts them" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == before and read_json(run / "privacy.json")["steps"] == 6


def test_a_resume_the_budget_lets_take_no_step_keeps_the_step_log(tiny_image_data_dir, tmp_path):
    """Noise calibrated to 6 steps at epsilon 4: resumed towards 12, no step fits. The earlier
    steps' log stays at logs/metrics.csv (it was moved to previous/ and nothing replaced it)."""
    run = tmp_path / "spent"
    assert dpgan(tiny_image_data_dir, run, 6, "--epsilon", "4", "--delta", "1e-4") == 0
    earlier = (run / "logs" / "metrics.csv").read_text()
    assert dpgan(tiny_image_data_dir, run, 12, "--epsilon", "4", "--delta", "1e-4",
                 "--resume", str(run / "checkpoints" / "last.ckpt")) == 0
    assert read_json(run / "privacy.json")["steps"] == 6
    assert "segments" not in read_json(run / "privacy.json")  # a segment that took no step is not one
    assert (run / "logs" / "metrics.csv").read_text() == earlier
    assert logged_epsilons(run)[-1] == pytest.approx(read_json(run / "privacy.json")["epsilon"], rel=1e-6)
    # its metrics.json keeps the final losses of the generator it saved (the earlier run's): it logged none
    metrics, before = read_json(run / "metrics.json"), read_json(run / "previous" / "metrics.json")
    assert metrics["loss/generator"] == before["loss/generator"] and metrics["steps"] == 6


def test_a_resume_that_trains_with_another_logger_leaves_no_stale_step_log(tiny_image_data_dir, tmp_path):
    """The earlier CSV log goes to previous/; a resumed run that trains and logs elsewhere
    (tensorboard) must not get it back as its own, whose last epsilon would be too low."""
    run = tmp_path / "run"
    common = ("--privacy.noise_multiplier", "1.1", "--delta", "1e-4")
    assert dpgan(tiny_image_data_dir, run, 4, *common) == 0
    assert dpgan(tiny_image_data_dir, run, 8, *common, "--logger", "tensorboard",
                 "--resume", str(run / "checkpoints" / "last.ckpt")) == 0
    assert read_json(run / "privacy.json")["steps"] == 8
    assert not (run / "logs" / "metrics.csv").exists() and (run / "previous" / "logs" / "metrics.csv").is_file()


def test_the_final_epsilon_is_logged_when_the_wall_time_limit_ends_the_run(tiny_image_data_dir, tmp_path):
    """Lightning's Timer decides after the budget callback has run; the last step's epsilon is
    written at the end of training instead."""
    run = tmp_path / "timed"
    assert dpgan(tiny_image_data_dir, run, 100000, "--privacy.noise_multiplier", "5", "--delta", "1e-4",
                 "--trainer.max_time", "00:00:00:03", "--trainer.log_every_n_steps", "1000") == 0
    report = read_json(run / "privacy.json")
    assert 0 < report["steps"] < 100000 and report["stopped_by"] == "other"
    assert logged_epsilons(run)[-1] == pytest.approx(report["epsilon"], rel=1e-6)


def test_shuffled_batches_draw_their_order_from_the_noise_source_not_the_run_seed(tiny_image_data_dir):
    """``--privacy.poisson_sampling false``: the datamodule's shuffle draws from torch's global
    generator, which ``--seed`` fixes and config.yaml records, so the batches were public. The
    order now comes from the strategy's noise source: the same run seed gives other batches,
    and a fixed noise seed (tests only) the same ones; the batches stay full-size and each
    record comes once per pass."""
    from lightning_dpgan.datamodules.mnist import MNISTDataModule

    def first_pass(noise_seed):
        datamodule = MNISTDataModule(data_dir=tiny_image_data_dir, batch_size=BATCH, verify_checksums=False)
        datamodule.setup("fit")
        strategy = DPSGD(noise_multiplier=1.0, poisson_sampling=False, noise_seed=noise_seed)
        strategy._use_secret_shuffle(datamodule)
        torch.manual_seed(0)  # what --seed does
        return [batch[0] for batch in datamodule.train_dataloader()]

    secret_a, secret_b = first_pass(None), first_pass(None)
    assert not all(torch.equal(a, b) for a, b in zip(secret_a, secret_b))
    assert all(torch.equal(a, b) for a, b in zip(first_pass(7), first_pass(7)))
    assert {len(batch) for batch in secret_a} == {BATCH} and len(secret_a) == TRAIN_RECORDS // BATCH
    pixels = sorted(tuple(image.flatten().tolist()) for batch in secret_a for image in batch)
    assert len(set(pixels)) == len(pixels)  # no record twice in a pass


def test_shuffled_batches_are_refused_under_ddp(monkeypatch):
    """Under DDP each rank would take a full batch: a step would hold more records than q charges."""
    import lightning_dpgan.callbacks.dp_sgd as dp_sgd

    monkeypatch.setattr(dp_sgd, "is_distributed", lambda: True)
    with pytest.raises(ValueError, match="poisson_sampling false trains in one process only"):
        DPSGD(noise_multiplier=1.0, poisson_sampling=False)._use_secret_shuffle(object())


def test_the_reports_top_level_rate_is_the_last_charged_steps_after_a_resume_that_changed_it():
    """A resume with another batch size that stops before its first step (budget spent): the
    next step's rate described no step taken, and Opacus fed the top-level fields got an epsilon
    above the target."""
    from types import SimpleNamespace

    from lightning_dpgan.privacy.accountants import OpacusAccountant

    strategy = DPSGD(noise_multiplier=0.9, noise_seed=0)
    strategy.accountant = OpacusAccountant("rdp")
    for _ in range(20):
        strategy.accountant.step(noise_multiplier=0.9, sample_rate=0.0033)
    strategy.sample_rate, strategy.mechanism = 0.0066, SimpleNamespace(mode="hooks")  # the resumed run's batch
    report = strategy.report_parameters()
    assert report["sample_rate"] == 0.0033 and report["noise_multiplier"] == 0.9
    for _ in range(5):  # a segment that did step at the new rate: the last charged, not the first
        strategy.accountant.step(noise_multiplier=0.9, sample_rate=0.0066)
    assert strategy.report_parameters()["sample_rate"] == 0.0066
    fresh = DPSGD(noise_multiplier=0.9, noise_seed=0)
    fresh.accountant, fresh.sample_rate, fresh.mechanism = OpacusAccountant("rdp"), 0.01, SimpleNamespace(mode="hooks")
    assert fresh.report_parameters()["sample_rate"] == 0.01  # before any step: the next one's


def test_a_run_with_shuffled_batches_trains_on_the_secret_order(tiny_image_data_dir, tmp_path, monkeypatch):
    """The strategy installs its own shuffle for --privacy.poisson_sampling false: the batches
    the run trains on come from a sampler on the strategy's noise generator."""
    samplers = []
    install = DPSGD._use_secret_shuffle

    def recording(self, datamodule):
        install(self, datamodule)
        loader = datamodule.train_dataloader()
        samplers.append((loader.sampler, self.noise.generator("cpu")))

    monkeypatch.setattr(DPSGD, "_use_secret_shuffle", recording)
    args = tiny_run_args(tiny_image_data_dir, tmp_path / "run", model="dpgan", steps=2, batch_size=BATCH)
    assert main(args + ["--privacy.noise_multiplier", "1.0", "--delta", "1e-4", "--privacy.poisson_sampling", "false"]) == 0
    (sampler, generator), = samplers
    assert isinstance(sampler, torch.utils.data.RandomSampler) and sampler.generator is generator
    assert read_json(tmp_path / "run" / "privacy.json")["sampling"] == "shuffle"


def test_the_mechanism_clips_and_noises_as_reported_and_divides_by_the_charged_batch(tiny_image_data_dir, tmp_path,
                                                                                     monkeypatch):
    """What privacy.json reports (C, q) is what the mechanism and Opacus' optimizer use: a
    mechanism clipping at another C, or averaging over another batch, would go unnoticed otherwise."""
    from lightning_dpgan.privacy import dp_sgd

    made = []
    original = dp_sgd.DPSGDMechanism.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(dp_sgd.DPSGDMechanism, "__init__", spy)
    assert dpgan(tiny_image_data_dir, tmp_path / "run", 2, "--privacy.noise_multiplier", "1.3",
                 "--privacy.max_grad_norm", "0.7") == 0
    report = read_json(tmp_path / "run" / "privacy.json")
    (mechanism,) = made
    assert report["max_grad_norm"] == 0.7 and report["sample_rate"] == pytest.approx(BATCH / TRAIN_RECORDS)
    assert mechanism.max_grad_norm == 0.7 and mechanism._optimizer.max_grad_norm == 0.7
    assert mechanism.expected_batch_size == BATCH and mechanism._optimizer.expected_batch_size == BATCH
    # and the noise it adds is the noise charged: a fresh run's mechanism built with another sigma
    # than the accountant's went unnoticed (only a resume, which restores sigma, was checked)
    assert report["noise_multiplier"] == 1.3
    assert mechanism.noise_multiplier == 1.3 and mechanism._optimizer.noise_multiplier == 1.3


def test_train_ends_with_the_epsilon_it_spent(tiny_image_data_dir, tmp_path, capsys):
    """DPGAN and GS-WGAN printed no epsilon at the end: the figure was in privacy.json and the
    progress bar alone (rounded there, 5.000 for 4.996)."""
    import json

    from lightning_dpgan.cli import main
    from run_helpers import tiny_run_args

    out = tmp_path / "run"
    assert main(tiny_run_args(tiny_image_data_dir, out, model="dpgan", steps=5) + ["--epsilon", "5"]) == 0
    report = json.loads((out / "privacy.json").read_text())
    line = [line for line in capsys.readouterr().out.splitlines() if line.startswith("train: privacy:")]
    assert line == [f"train: privacy: epsilon {report['epsilon']:.6g} of --epsilon 5 at delta {report['delta']:g} "
                    f"({out / 'privacy.json'})"]


def test_noise_is_calibrated_to_what_preprocessing_left_and_batches_are_poisson_samples(tmp_path, monkeypatch):
    """A CSV's DP schema estimate spends part of epsilon and delta before training: sigma is
    calibrated to the training share of both (Opacus, by hand), and the loader the run trains with
    is Opacus' Poisson sampler at the rate the accountant charges (privacy.json says "poisson")."""
    import numpy as np
    import pandas as pd

    from lightning_dpgan.callbacks import dp_sgd

    loaders = []

    class RecordedLoader(dp_sgd.DPDataLoader):
        def __init__(self, dataset, sample_rate, **kwargs):
            loaders.append(sample_rate)
            super().__init__(dataset, sample_rate=sample_rate, **kwargs)

    monkeypatch.setattr(dp_sgd, "DPDataLoader", RecordedLoader)
    rng = np.random.default_rng(0)
    pd.DataFrame({"age": rng.integers(20, 90, 400), "kind": rng.choice(["a", "b"], 400),
                  "label": rng.choice(["no", "yes"], 400)}).to_csv(tmp_path / "data.csv", index=False)
    assert main(["train", "--model", "dpgan", "--dataset", "csv", "--data.csv", str(tmp_path / "data.csv"),
                 "--data.target", "label", "--data.categorical", "kind,label", "--data.label_kind", "binary",
                 "--data.bounds_epsilon", "1", "--data.bounds_delta", "5e-5", "--epsilon", "4", "--delta", "1e-4",
                 "--max-steps", "6", "--batch-size", "32", "--output-dir", str(tmp_path / "run"),
                 "--trainer.enable_progress_bar", "false"]) == 0
    report = read_json(tmp_path / "run" / "privacy.json")
    spent = report["preprocessing"]
    assert spent["epsilon"] == 1 and spent["delta"] == 5e-5  # what the schema estimate took
    expected = calibrate_noise_multiplier(4 - 1, 1e-4 - 5e-5, report["sample_rate"], report["calibrated_for_steps"])
    assert report["noise_multiplier"] == pytest.approx(expected, rel=1e-12)
    assert report["sampling"] == "poisson" and loaders and set(loaders) == {report["sample_rate"]}


# --- the strategy's state across resumes, and what it reports (unit level)

def _checkpointed(steps=6, sigma=1.1, rate=0.01, segments=None, calibrated_for_steps=None):
    """A dp-sgd strategy state as a checkpoint holds it, ``steps`` charged."""
    accountant = OpacusAccountant("rdp")
    for _ in range(steps):
        accountant.step(noise_multiplier=sigma, sample_rate=rate)
    state = {"strategy": "dp-sgd", "accountant": accountant.state_dict(), "noise_multiplier": sigma,
             "calibrated_for_steps": calibrated_for_steps}
    if segments is not None:
        state["segments"] = segments
    return state


def _installed(**kwargs):
    """A DPSGD as ``install`` leaves it (accountant, mechanism), before the checkpoint is loaded."""
    strategy = DPSGD(noise_seed=None, **kwargs)
    strategy.accountant = OpacusAccountant("rdp")
    strategy.sample_rate, strategy.train_records = 0.01, 100
    strategy.noise_multiplier = strategy.noise_multiplier or 0.7  # as calibrated for the resumed run's target
    strategy.mechanism = SimpleNamespace(noise_multiplier=strategy.noise_multiplier, mode="hooks")
    return strategy


def test_a_second_resume_keeps_every_earlier_segment():
    """Three segments (0, 4, 8): the checkpoint of the second resume holds two earlier ones; the
    report and the next checkpoint must keep both, not only the latest."""
    earlier = [{"from_step": 0, "noise_source": "FIXED SEED 0", "target_epsilon": 3.0, "sampling": "shuffle"},
               {"from_step": 4, "noise_source": "OS entropy", "target_epsilon": 6.0, "sampling": "poisson"}]
    strategy = _installed(noise_multiplier=1.1)
    strategy.load_state_dict(_checkpointed(steps=8, segments=earlier))
    strategy.segment_start, strategy.charged_at_start = 8, 8
    strategy.accountant.step(noise_multiplier=1.1, sample_rate=0.01)  # the third segment takes a step
    assert [s["from_step"] for s in strategy.segments()] == [0, 4, 8]
    assert [s["from_step"] for s in strategy.state_dict()["segments"]] == [0, 4, 8]
    assert strategy.noise_source_report(strategy.segments()).startswith("from step 0: FIXED SEED 0")


def test_a_noise_multiplier_given_on_resume_is_the_one_used_not_the_checkpoints():
    strategy = _installed(noise_multiplier=2.0)
    strategy.load_state_dict(_checkpointed(sigma=1.1, calibrated_for_steps=40))
    assert strategy.noise_multiplier == 2.0 and strategy.mechanism.noise_multiplier == 2.0
    assert strategy.next_step_params()["noise_multiplier"] == 2.0


def test_a_calibrated_noise_multiplier_and_its_plan_come_back_from_the_checkpoint():
    """Not given on resume: the checkpoint's sigma reaches the mechanism (not only the accountant)
    and the steps it was calibrated for come back (the report and the stop sentence use them)."""
    strategy = _installed(target_epsilon=20.0)
    strategy.load_state_dict(_checkpointed(sigma=1.1, calibrated_for_steps=40))
    assert strategy.noise_multiplier == 1.1 and strategy.mechanism.noise_multiplier == 1.1
    assert strategy.calibrated_for_steps == 40
    assert strategy.report_parameters()["calibrated_for_steps"] == 40


def test_preprocessing_that_spent_exactly_the_delta_or_the_target_is_refused():
    """Equal leaves training a delta (or an epsilon) of 0: refused by name, not a traceback later."""
    for cost, match in (({"epsilon": 0.5, "delta": 1e-5, "mechanism": "bounds"}, "spent delta"),
                        ({"epsilon": 1.0, "delta": 0.0, "mechanism": "bounds"}, "spent epsilon")):
        strategy = DPSGD(noise_multiplier=1.0, target_epsilon=1.0, delta=1e-5)
        with pytest.raises(ValueError, match=match):
            strategy._compose_preprocessing(SimpleNamespace(privacy_cost=lambda cost=cost: cost))


def test_training_gets_the_delta_preprocessing_left():
    strategy = DPSGD(noise_multiplier=1.0, delta=1e-4)
    strategy._compose_preprocessing(SimpleNamespace(privacy_cost=lambda: {"epsilon": 0.5, "delta": 3e-5, "mechanism": "b"}))
    assert strategy.training_delta == pytest.approx(7e-5)


def test_each_dp_sgd_segment_records_its_clipping_norm_and_records():
    strategy = _installed(noise_multiplier=1.0, max_grad_norm=0.5)
    assert {"max_grad_norm": 0.5, "train_records": 100}.items() <= strategy.segment().items()


def test_the_report_states_the_total_delta_not_trainings_share():
    strategy = _installed(noise_multiplier=1.0, delta=1e-4)
    strategy.preprocessing = {"epsilon": 0.5, "delta": 3e-5}
    strategy.accountant.step(noise_multiplier=1.0, sample_rate=0.01)
    report = strategy.privacy_report()
    assert report["delta"] == 1e-4 and report["delta_training"] == pytest.approx(7e-5)


def test_a_strategy_used_as_a_lightning_callback_refuses_a_model_without_its_slot_at_setup():
    """Outside ``train`` (which checks first), the callback's own ``setup`` is the only check: a
    model without the slot must be refused there, before anything is installed."""
    class LabelOnlyModel(GAN):
        privacy_slot = LabelAggregator

    trainer = SimpleNamespace(world_size=1, strategy=None)  # anything past the check would fail differently
    with pytest.raises(IncompatibleModelError, match="needs a model with a GradientPrivatizer slot"):
        DPSGD(noise_multiplier=1.0).setup(trainer, LabelOnlyModel((4,), None), "fit")


def test_a_module_fitted_before_is_refused_and_the_checkpoint_resume_it_names_charges_every_step(
        tiny_image_data_dir, tmp_path):
    """A second fit() of one module object ended in Opacus' "hooks twice" with the same or a new
    DPSGD; a new accountant would have charged the second fit's steps alone. The refusal names
    the resume that works: a module built afresh, fitted from the checkpoint (which Lightning
    could not load while the datamodule's ``data_dir`` was kept in it as a ``pathlib.Path``)."""
    import lightning as L

    from lightning_dpgan.callbacks.step_limit import StepLimit
    from lightning_dpgan.datamodules.mnist import MNISTDataModule
    from lightning_dpgan.modules.dpgan import DPGAN

    data = MNISTDataModule(data_dir=tiny_image_data_dir / "mnist", batch_size=BATCH, verify_checksums=False)  # a Path

    def build():
        return DPGAN((1, 28, 28), 10, latent_dim=4, generator_kwargs={"base_channels": 4},
                     discriminator_kwargs={"base_channels": 4})

    def fit(module, strategy, steps, ckpt_path=None):
        trainer = L.Trainer(max_epochs=-1, callbacks=[StepLimit(steps), strategy], logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            default_root_dir=tmp_path)
        trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
        return trainer

    module, first = build(), DPSGD(noise_multiplier=1.0, delta=1e-3)
    fit(module, first, 3).save_checkpoint(tmp_path / "three.ckpt")
    for again in (first, DPSGD(noise_multiplier=1.0, delta=1e-3)):
        with pytest.raises(ValueError, match=r"this DPGAN object already trained 3 steps \(in an earlier fit\(\), or in "
                                             r"the checkpoint it was loaded from\).*build a new module .* ckpt_path="):
            fit(module, again, 6)
    assert module.train_steps == 3 and first.steps_taken() == 3
    loaded = DPGAN.load_from_checkpoint(tmp_path / "three.ckpt")  # its trained steps come with it
    with pytest.raises(ValueError, match=r"this DPGAN object already trained 3 steps"):
        fit(loaded, DPSGD(noise_multiplier=1.0, delta=1e-3), 6)

    resumed = DPSGD(noise_multiplier=1.0, delta=1e-3)
    fit(build(), resumed, 6, ckpt_path=tmp_path / "three.ckpt")
    assert resumed.steps_taken() == 6
    assert resumed.epsilon() == pytest.approx(opacus_epsilon(1.0, RATE, 6, 1e-3), rel=1e-12)


def test_a_trainer_built_by_hand_in_mixed_precision_is_refused_before_its_first_step(tiny_image_data_dir, tmp_path):
    """``train`` refused bf16-mixed for a clipping strategy, and a Trainer built by hand was not
    checked: its per-record norms and clipped sum in bfloat16 moved by more than the bound."""
    import lightning as L

    from lightning_dpgan.callbacks.step_limit import StepLimit
    from lightning_dpgan.datamodules.mnist import MNISTDataModule
    from lightning_dpgan.modules.dpgan import DPGAN

    module = DPGAN((1, 28, 28), 10, latent_dim=4, generator_kwargs={"base_channels": 4},
                   discriminator_kwargs={"base_channels": 4})
    strategy = DPSGD(noise_multiplier=1.0, delta=1e-3)
    trainer = L.Trainer(max_epochs=-1, callbacks=[StepLimit(2), strategy], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                        precision="bf16-mixed")
    data = MNISTDataModule(data_dir=tiny_image_data_dir / "mnist", batch_size=BATCH, verify_checksums=False)
    with pytest.raises(ValueError, match=r"trainer.precision bf16-mixed cannot train under --privacy dp-sgd.*"
                                         r"Trainer\(precision='32-true'\)"):
        trainer.fit(module, datamodule=data)
    assert module.train_steps == 0 and module.privacy is None and strategy.accountant is None


def test_a_vote_counting_strategy_refuses_only_a_loss_scaled_precision_at_setup():
    """PATE's votes are counts in any precision; fp16's loss scaler still lets one record decide
    whether every teacher steps. (On CPU Lightning turns 16-mixed into bf16-mixed, so the Trainer
    is a stand-in.)"""
    from lightning_dpgan.callbacks.pate import PATEAggregation
    from lightning_dpgan.modules.pategan import PATEGAN

    with pytest.raises(ValueError, match="trainer.precision 16-mixed cannot train a private model: its loss scaler"):
        PATEAggregation().setup(SimpleNamespace(world_size=1, precision="16-mixed"), PATEGAN((6,)), "fit")
    assert PATEAggregation().precision_refusal("bf16-mixed") is None
    assert "float32 arithmetic" in DPSGD(noise_multiplier=1.0).precision_refusal("bf16-mixed")
    # weights in bf16, refused by train alone: a Trainer built by hand met torch's "mat1 and mat2 must have the same dtype"
    with pytest.raises(ValueError, match="trainer.precision bf16-true keeps the networks' weights in another type than "
                                         r"float32.*use --trainer.precision bf16-mixed"):
        PATEAggregation().setup(SimpleNamespace(world_size=1, precision="bf16-true"), PATEGAN((6,)), "fit")
    assert "--trainer.precision 32-true" in DPSGD(noise_multiplier=1.0).precision_refusal("64-true")


def test_a_clipping_strategy_gives_both_reasons_against_fp16():
    """16-mixed breaks DP-SGD twice: bfloat16-sized rounding of the clipped sum and a loss scaler
    that lets one record skip a step. The message gave only the first, where the README gives
    the second."""
    refusal = DPSGD(noise_multiplier=1.0).precision_refusal("16-mixed")
    assert "float32 arithmetic" in refusal and "loss scaler" in refusal and "32-true" in refusal
    assert "loss scaler" not in DPSGD(noise_multiplier=1.0).precision_refusal("bf16-mixed")
    assert DPSGD(noise_multiplier=1.0).precision_refusal("32-true") is None


def test_records_given_as_a_dataloader_are_refused_with_what_the_strategy_needs(tiny_image_data_dir, tmp_path):
    """DP-SGD counts the records and re-samples the batches; a DataLoader given as
    ``train_dataloaders`` ended in "'NoneType' object has no attribute 'train_dataset'"."""
    import lightning as L

    from lightning_dpgan.callbacks.step_limit import StepLimit
    from lightning_dpgan.datamodules.mnist import MNISTDataModule
    from lightning_dpgan.modules.dpgan import DPGAN

    data = MNISTDataModule(data_dir=tiny_image_data_dir / "mnist", batch_size=BATCH, verify_checksums=False)
    data.setup("fit")
    module = DPGAN((1, 28, 28), 10, latent_dim=4, generator_kwargs={"base_channels": 4},
                   discriminator_kwargs={"base_channels": 4})
    trainer = L.Trainer(max_epochs=-1, callbacks=[StepLimit(2), DPSGD(noise_multiplier=1.0, delta=1e-3)], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path)
    with pytest.raises(ValueError, match=r"needs the records as one of this package's datamodules, passed as "
                                         r"trainer.fit\(module, datamodule=...\)"):
        trainer.fit(module, train_dataloaders=data.train_dataloader())
    assert module.train_steps == 0 and module.privacy is None


def test_overfit_batches_on_a_trainer_built_by_hand_is_refused_before_a_batch_repeats(tiny_image_data_dir, tmp_path):
    """Lightning swaps the secret shuffle for a sequential sampler and trains on the same first
    batch each step, which the accountant charged as a fresh draw at q = batch/N."""
    import lightning as L

    from lightning_dpgan.callbacks.step_limit import StepLimit
    from lightning_dpgan.datamodules.mnist import MNISTDataModule
    from lightning_dpgan.modules.dpgan import DPGAN

    module = DPGAN((1, 28, 28), 10, latent_dim=4, generator_kwargs={"base_channels": 4},
                   discriminator_kwargs={"base_channels": 4})
    strategy = DPSGD(noise_multiplier=1.0, delta=1e-3, poisson_sampling=False)
    trainer = L.Trainer(max_epochs=-1, callbacks=[StepLimit(3), strategy], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                        overfit_batches=1)
    data = MNISTDataModule(data_dir=tiny_image_data_dir / "mnist", batch_size=BATCH, verify_checksums=False)
    with pytest.raises(ValueError, match="trainer.overfit_batches 1 cannot train a private model"):
        trainer.fit(module, datamodule=data)
    assert module.train_steps == 0 and strategy.accountant is None


def test_a_datamodule_reused_after_a_poisson_fit_gives_secret_shuffle_batches_of_the_batch_size(
        tiny_image_data_dir, tmp_path):
    """The shuffle was built from the datamodule's loader as an earlier fit's strategy left it:
    Opacus' Poisson loader, which has no batch size, so the next fit got single records and failed
    in the critic."""
    import lightning as L

    from lightning_dpgan.callbacks.step_limit import StepLimit
    from lightning_dpgan.datamodules.mnist import MNISTDataModule
    from lightning_dpgan.modules.dpgan import DPGAN

    data = MNISTDataModule(data_dir=tiny_image_data_dir / "mnist", batch_size=BATCH, verify_checksums=False)
    sizes = []

    class BatchSizes(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            sizes.append(len(batch[0]))

    for poisson in (True, False):
        module = DPGAN((1, 28, 28), 10, latent_dim=4, generator_kwargs={"base_channels": 4},
                       discriminator_kwargs={"base_channels": 4})
        strategy = DPSGD(noise_multiplier=1.0, delta=1e-3, poisson_sampling=poisson)
        sizes.clear()
        L.Trainer(max_epochs=-1, callbacks=[StepLimit(3), strategy, BatchSizes()], logger=False,
                  enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                  default_root_dir=tmp_path).fit(module, datamodule=data)
        assert module.train_steps == 3
    assert sizes == [BATCH] * 3 and strategy.privacy_report()["sampling"] == "shuffle"

"""Private training in several processes (``--strategy ddp``) releases what one process would.

Mechanism tests run in two gloo processes (tests/ddp_workers.py) and compare with the
single-process mechanism computed here; end-to-end tests run ``train.py --devices 2 --strategy
ddp`` on the CPU and compare its privacy report with a single-process run's.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import yaml

import ddp_workers as workers
from run_helpers import opacus_epsilon
from lightning_dpgan.ddp import PrivateDDPStrategy, resolve_strategy
from lightning_dpgan.distributed import shard

REPO = Path(__file__).resolve().parents[1]
ADULT = REPO / "tests" / "fixtures" / "adult_tiny"


# ------------------------------------------------------------------ in one process
def test_shards_cover_the_teachers_once_in_order():
    for total, count in [(7, 2), (9, 4), (4, 4), (1000, 3)]:
        parts = [shard(total, index, count) for index in range(count)]
        assert [index for part in parts for index in range(part.start, part.stop)] == list(range(total))
        assert max(p.stop - p.start for p in parts) - min(p.stop - p.start for p in parts) <= 1
    with pytest.raises(ValueError, match="at least one"):
        shard(1, 0, 2)


def test_ddp_means_the_private_strategy_and_other_names_pass_through():
    assert isinstance(resolve_strategy("ddp"), PrivateDDPStrategy)
    assert resolve_strategy("auto") == "auto"
    assert resolve_strategy("ddp_spawn") == "ddp_spawn"


# --------------------------------------------------------------- in two processes
@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_dp_sgd_over_two_ranks_is_the_single_process_update(mode):
    """Without noise, two ranks' clipped sums, added up and divided by the global expected batch,
    move the parameters exactly as one process training on both halves."""
    results = workers.run_on_ranks(workers.dp_sgd_worker, 0.0, 2, mode, False)
    reference = workers.dp_sgd_steps(workers.dp_sgd_records(), 0.0, 2, mode, expected_batch=8)
    for changes, final in results:
        torch.testing.assert_close(final, reference[1])
        torch.testing.assert_close(torch.stack(changes), torch.stack(reference[0]))


def test_dp_sgd_over_two_ranks_draws_the_noise_once():
    """With no gradient signal, each step moves the parameters by the noise alone: its variance
    is that of ONE draw, (sigma C / B)^2, not two; and the ranks stay in step."""
    sigma, clip, batch, steps = 2.0, 0.5, 8, 150
    (changes0, final0), (changes1, final1) = workers.run_on_ranks(workers.dp_sgd_worker, sigma, steps, "hooks", True)
    torch.testing.assert_close(final0, final1)
    observed = torch.stack(changes0).var().item()
    one_draw = (sigma * clip / batch) ** 2
    assert 0.85 < observed / one_draw < 1.15, observed / one_draw  # two draws would give 2


def test_pate_answers_over_two_ranks_match_one_process():
    """Each rank counts its shard of the 7 teachers; the summed votes are charged and answered
    with rank 0's noise, which is what one process with the same seed answers."""
    (answers0, charged0), (answers1, charged1) = workers.run_on_ranks(workers.pate_worker, 11)
    expected, expected_charged = workers.pate_answers(workers.pate_votes(), 11)
    assert torch.equal(answers0, expected) and torch.equal(answers1, expected)
    assert charged0 == charged1 == expected_charged
    other_seed, _ = workers.pate_answers(workers.pate_votes(), 12)
    assert not torch.equal(other_seed, expected)  # the noise decides some answers: the match is not vacuous


def test_gpate_answers_over_two_ranks_match_one_process():
    """Projections and Confident-GNMax noise from rank 0, vote histograms summed over the shards."""
    (back0, (checked0, charged0)), (back1, (checked1, _)) = workers.run_on_ranks(workers.gpate_worker, 21)
    expected, (checked, charged) = workers.gpate_answers(workers.teacher_gradients(), 21)
    assert torch.equal(checked0[0], checked[0]) and torch.equal(checked1[0], checked[0])
    assert int(checked[0].sum(1).unique()) == 9  # every teacher voted once per query
    assert torch.equal(charged0[0], charged[0])
    torch.testing.assert_close(back0, expected)
    torch.testing.assert_close(back1, expected)


def test_shards_gathered_on_rank_zero_are_the_whole_tensor_and_the_others_keep_theirs():
    gathered, kept = workers.run_on_ranks(workers.gather_worker, 5)
    whole = torch.arange(15, dtype=torch.float32).reshape(5, 3)
    assert torch.equal(gathered, whole)  # shards of 3 and 2 rows: the padding row is cut
    assert gathered.device.type == "cpu"  # rank 0's host memory, wherever the shards live
    assert torch.equal(kept, whole[3:])


def test_every_rank_leaves_its_process_group_together_at_the_end():
    """Each rank, its work saved, leaves with leave_process_group (barrier, destroy) and ends with
    a non-zero status if its group outlived the call (``ddp_workers._entry``), which fails here.
    A group of one that the caller made is left alone: nothing of a run of several processes."""
    import torch.distributed as dist

    from lightning_dpgan.distributed import leave_process_group

    assert workers.run_on_ranks(workers.joined_worker) == [(0, True), (1, True)]
    with tempfile.TemporaryDirectory() as directory:
        dist.init_process_group("gloo", init_method=f"file://{directory}/group", rank=0, world_size=1)
        try:
            leave_process_group()
            assert dist.is_initialized()
        finally:
            dist.destroy_process_group()


def test_ranks_building_only_their_shards_hold_together_the_teachers_one_process_builds():
    """Under DDP each rank builds its shard alone (1/N of the host memory); gathered, the shards
    are the teachers a single process builds from the same seed, conv and MLP forms."""
    gathered, rank_one = workers.run_on_ranks(workers.teacher_build_worker, 5)
    for index, model in enumerate(workers.teacher_models()):
        torch.manual_seed(0)
        model.build_teachers(5)
        for name, value in model.teachers.named_parameters():
            assert torch.equal(gathered[index][name], value.detach()), name
            assert torch.equal(rank_one[index][name], value.detach()[3:]), name  # rank 1 holds teachers 3 and 4


def test_sanitizer_over_two_ranks_is_the_single_process_release():
    """Each rank sanitizes its half of the B generated records; averaging the generator's
    gradients gives the single-process gradient without noise, and with noise the variance of
    one draw per released entry."""
    no_noise = workers.run_on_ranks(workers.sanitizer_worker, 0.0, 1.0, 1)
    expected = workers.sanitized_gradient(workers.sanitizer_latents(), 0.0, 1.0)
    assert expected.abs().max() > 0
    for (gradient,) in no_noise:
        torch.testing.assert_close(gradient, expected)

    sigma, draws = 3.0, 300
    noisy, _ = workers.run_on_ranks(workers.sanitizer_worker, sigma, 0.0, draws)
    latents, bound = workers.sanitizer_latents(), 0.05 / 8
    # gradient of W[j, i] is sum_b z[b, i] * noise[b, j]: variance (sigma C / B)^2 sum_b z[b, i]^2
    per_entry = (sigma * bound) ** 2 * (latents ** 2).sum(0).repeat(4)
    ratio = (torch.stack(noisy).var(0) / per_entry).mean().item()
    assert 0.85 < ratio < 1.15, ratio


# ------------------------------------------------------------------- end to end
def run_train(output: Path, *args: str, devices: int = 1, timeout: int = 240) -> subprocess.CompletedProcess:
    """``train.py`` on the tiny Adult table in its own process(es), ``--strategy ddp`` with several devices."""
    command = [
        sys.executable, str(REPO / "train.py"), "--dataset", "adult", "--data-dir", str(ADULT),
        "--output-dir", str(output), "--accelerator", "cpu", "--devices", str(devices),
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", *args,
    ]
    if devices > 1:
        command += ["--strategy", "ddp"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("LOCAL_RANK", None)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def train(output: Path, *args: str, devices: int = 1, timeout: int = 240) -> dict:
    return reports(output, run_train(output, *args, devices=devices, timeout=timeout))


def reports(output: Path, result: subprocess.CompletedProcess) -> dict:
    """privacy.json and metrics.json of a run that succeeded, which rank 0 alone reported."""
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("train: wrote") == 1  # rank 0 alone reports (and writes)
    return {name: json.loads((output / f"{name}.json").read_text()) for name in ("privacy", "metrics")}


def test_a_finished_run_leaves_its_process_group_once_rank_0_has_written_it(tmp_path, monkeypatch):
    """Every process of a run calls leave_process_group once training and rank 0's writes are
    done: the others wait for rank 0's files (they exited meanwhile, and one aborting in its
    teardown had Lightning kill rank 0 mid-write). One process here, where the call does nothing."""
    from lightning_dpgan import run as run_module
    from lightning_dpgan.cli import main

    left = []
    monkeypatch.setattr(run_module, "leave_process_group", lambda: left.append((tmp_path / "run" / "privacy.json").is_file()))
    assert main(["train", "--model", "gan", "--dataset", "adult", "--data-dir", str(ADULT), "--accelerator", "cpu",
                 "--output-dir", str(tmp_path / "run"), "--max-steps", "2", "--trainer.enable_progress_bar",
                 "false", "--trainer.enable_model_summary", "false"]) == 0
    assert left == [True]


def test_a_refusal_raised_in_every_process_is_printed_once(tmp_path):
    """Under DDP each process runs the strategy's setup, so a setting its share of the step rules
    out is refused in both (the sanitizer's one generated record a process, for a BatchNorm
    generator); the user reads the refusal once (rank 0's), and nothing is left behind."""
    result = run_train(tmp_path / "run", "--model", "gswgan", "--privacy.generated_batch_size", "2", "--max-steps", "2",
                       devices=2)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Starting with 2 processes" in result.stdout + result.stderr  # both reached the strategy's setup
    refusals = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert refusals == ["error: the generator normalizes each batch (BatchNorm), which needs at least 2 generated "
                        "records a step in each process, and --privacy.generated_batch_size 2 over 2 processes gives 1: "
                        "use --privacy.generated_batch_size 4 or more"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("options, processes", [
    ({"devices": 2}, 2), ({"devices": 2, "num_nodes": 3}, 6), ({"devices": [0, 1]}, 2), ({"devices": 1}, 1),
    ({"devices": "2"}, 2), ({"devices": " 0,1 "}, 2), ({"devices": "1,"}, 1), ({"devices": "3", "num_nodes": "2"}, 6),
    ({"devices": "auto"}, None), ({"devices": -1}, None), ({"devices": "-1"}, None), ({}, None)])
def test_the_processes_a_run_asks_for_are_read_off_devices_and_nodes(options, processes):
    from lightning_dpgan.run import planned_processes

    assert planned_processes(options) == processes


@pytest.mark.parametrize("model, flags, said", [
    ("dpgan", ["--privacy.poisson_sampling", "false", "--batch-size", "8"],
     "--privacy.poisson_sampling false trains in one process only"),
    ("dpsactgan", ["--privacy.generated_batch_size", "3"], "--privacy.generated_batch_size 3 must be a multiple of the 2"),
    ("dpsactgan", ["--batch-size", "63"], "--batch-size 63 (the generated records a step, B, unless "
                                         "--privacy.generated_batch_size is given) must be a multiple of the 2"),
    ("patectgan", ["--privacy.num_teachers", "1", "--epsilon", "1000"], "1 teachers cannot be shared among 2 processes"),
])
def test_what_the_processes_cannot_share_is_refused_before_they_start_and_before_any_release(tmp_path, model, flags,
                                                                                              said):
    """Each process's setup refused these, after the processes had started: DP-SACTGAN's and
    PATE-CTGAN's DP mode histograms had by then spent epsilon 0.1, which the refusal could only
    ask the user to count as spent."""
    result = run_train(tmp_path / "run", "--model", model, *flags, "--max-steps", "2", devices=2)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Starting with 2 processes" not in result.stdout + result.stderr
    (refusal,) = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert said in refusal and "spent" not in refusal
    assert not (tmp_path / "run").exists()


def test_every_rank_stops_when_one_read_a_stale_preprocessing_release():
    """A release file left by a killed run, read by a node before rank 0 replaced it, would have
    two machines train on two DP releases: at setup each rank compares the digest of the bytes it
    read with rank 0's, and all stop (rank 0 too, or it would wait on the others forever)."""
    from lightning_dpgan.callbacks.same_release import release_digest

    fresh, stale = release_digest(b"rank 0's release"), release_digest(b"an interrupted run's release")
    assert fresh != stale and release_digest(b"rank 0's release") == fresh
    assert workers.run_on_ranks(workers.same_release_worker, [fresh, fresh]) == ["ok", "ok"]
    stopped = workers.run_on_ranks(workers.same_release_worker, [fresh, stale])
    assert all("another preprocessing release than rank 0 wrote" in why for why in stopped)


def test_a_sanitizer_run_on_two_processes_calibrates_sigma_for_the_steps_it_takes(tmp_path):
    """With --max-epochs, each process reads half the records a batch at a time: the one-critic
    sanitizer planned the single-process count of batches, twice the steps two processes take,
    and so added more noise than the target asked for (epsilon 2.7 of 5 on Adult)."""
    run = train(tmp_path / "two", "--model", "gswgan", "--privacy.num_critics", "1", "--batch-size", "2",
                "--privacy.generated_batch_size", "4", "--epsilon", "5", "--max-epochs", "1", devices=2)
    privacy = run["privacy"]
    assert privacy["calibrated_for_steps"] == privacy["generator_steps"] > 0
    assert 4.5 < privacy["epsilon"] <= 5
    # a share that batches do not divide: the loader drops the short last batch, which the plan
    # counted (36 rows in one process, 18 in each of two, batch 8: 4 and 2 steps, planned 5 and 3)
    for devices, steps in ((1, 4), (2, 2)):
        privacy = train(tmp_path / f"short-{devices}", "--model", "dpsactgan", "--batch-size", "8", "--epsilon", "5",
                        "--max-epochs", "1", devices=devices)["privacy"]
        assert privacy["calibrated_for_steps"] == privacy["generator_steps"] == steps
        assert 4.5 < privacy["epsilon"] <= 5


def test_dp_sgd_run_on_two_processes_spends_what_one_process_does(tmp_path):
    """Same batch size, noise and steps: the same epsilon (q from the global batch), every rank
    stops at the same step, and the budget stop lands on the single-process step."""
    common = ["--model", "dpgan", "--batch-size", "8", "--privacy.noise_multiplier", "1.2", "--max-steps", "5"]
    one = train(tmp_path / "one", *common)
    two = train(tmp_path / "two", *common, devices=2)
    assert two["privacy"]["sample_rate"] == one["privacy"]["sample_rate"] == 8 / one["privacy"]["train_records"]
    assert two["privacy"]["epsilon"] == pytest.approx(one["privacy"]["epsilon"], rel=1e-9)
    assert two["metrics"]["steps_per_rank"] == [5, 5]

    budget = ["--model", "dpgan", "--batch-size", "8", "--privacy.noise_multiplier", "1.2", "--epsilon", "3",
              "--max-steps", "500"]
    one = train(tmp_path / "one_budget", *budget)
    two = train(tmp_path / "two_budget", *budget, devices=2)
    assert one["privacy"]["steps"] < 500  # the budget stopped it
    assert two["metrics"]["steps_per_rank"] == [one["privacy"]["steps"]] * 2
    assert two["privacy"]["epsilon"] == pytest.approx(one["privacy"]["epsilon"]) and two["privacy"]["epsilon"] <= 3


def test_pategan_run_on_two_processes_keeps_all_teachers_and_resumes_in_one_or_two(tmp_path):
    """Sharded teachers: the checkpoint rank 0 writes holds all K (gathered); a single process
    resumes from it with the accountant's spend carried over, and two processes, each reading its
    shard of the checkpoint, resume to the same teachers and the same spend. The two processes
    share a terminal: what both reach alike (an unused --batch-size, teacher batches drawn with
    replacement from partitions of 7 records) is printed once."""
    args = ["--model", "pategan", "--privacy.num_teachers", "5", "--batch-size", "4", "--epsilon", "5000",
            "--max-steps", "2"]
    started = run_train(tmp_path / "two", *args, devices=2)
    two = reports(tmp_path / "two", started)
    for warning in ("data.batch_size 4 (--batch-size", "drawn with replacement from its partition"):
        assert started.stderr.count(warning) == 1, started.stderr[-3000:]
    # the library's logged warning reads as train's own lines do (it was date-stamped, in Opacus' format)
    [logged] = [line for line in started.stderr.splitlines() if "drawn with replacement" in line]
    assert logged.startswith("train: warning: "), logged
    assert two["metrics"]["steps_per_rank"] == [2, 2]
    checkpoint = torch.load(tmp_path / "two" / "checkpoints" / "last.ckpt", weights_only=False)
    weights = checkpoint["state_dict"]["teachers.layers.0.weight"]
    assert weights.shape[0] == 5 and not torch.equal(weights[0], weights[4])
    teacher_state = checkpoint["optimizer_states"][-1]["state"]
    assert all(state["exp_avg"].shape[0] == 5 for state in teacher_state.values())
    checkpoint_path = str(tmp_path / "two" / "checkpoints" / "last.ckpt")
    resumed = train(tmp_path / "resumed", *args[:-1], "4", "--resume", checkpoint_path)
    assert resumed["privacy"]["steps"] == 4
    assert resumed["privacy"]["epsilon"] > two["privacy"]["epsilon"]
    resumed_two = train(tmp_path / "resumed_two", *args[:-1], "4", "--resume", checkpoint_path, devices=2)
    assert resumed_two["metrics"]["steps_per_rank"] == [4, 4]
    assert resumed_two["privacy"]["epsilon"] == pytest.approx(resumed["privacy"]["epsilon"])
    ends = [torch.load(tmp_path / run / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
            for run in ("resumed", "resumed_two")]
    # batched updates over 3 and 2 teachers round differently from one over 5: ~3e-5 after 2 Adam steps
    assert torch.allclose(ends[1]["teachers.layers.0.weight"], ends[0]["teachers.layers.0.weight"], atol=1e-4)


@pytest.mark.parametrize("model, answers", [
    (["--model", "pategan", "--privacy.num_teachers", "5", "--batch-size", "4", "--epsilon", "5000"], "answers"),
    (["--model", "gpate", "--privacy.num_teachers", "3", "--epsilon", "5"], "answers_per_bin"),
], ids=["pategan", "gpate"])
def test_one_seed_gives_one_teacher_run_on_one_process_or_two(tmp_path, model, answers):
    """Lightning re-seeds each DDP process as it sets them up, after the generator is built, and
    not a single process: the teachers started from other values, and a tiny PATE-GAN run spent
    426 on two processes and 315 on one for the same --seed. With the teachers' stream restarted
    from --seed, the same seed (and noise seed) gives the same votes, answers and spend."""
    args = [*model, "--max-steps", "3", "--privacy.noise_seed", "7"]
    one = train(tmp_path / "one", *args)["privacy"]
    two = train(tmp_path / "two", *args, devices=2)["privacy"]
    assert one["steps"] == two["steps"] == 3
    assert one[answers] == two[answers] and sum(one[answers].values() if answers == "answers" else one[answers]) > 0
    assert two["epsilon"] == pytest.approx(one["epsilon"], rel=1e-9)
    ends = [torch.load(tmp_path / run / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
            for run in ("one", "two")]
    generator = [name for name in ends[0] if name.startswith("generator.")]
    # batched teacher updates over 3 and 2 teachers round differently from one over 5 (see above)
    assert all(torch.allclose(ends[1][name], ends[0][name], atol=1e-4) for name in generator)


@pytest.mark.parametrize("model", [
    ["--model", "gpate", "--privacy.num_teachers", "3", "--epsilon", "5"],
    ["--model", "gswgan", "--privacy.num_critics", "2", "--epsilon", "10"],
    ["--model", "dpctgan", "--epsilon", "5"],
], ids=["gpate", "gswgan-2-critics", "dpctgan"])
def test_every_family_trains_on_two_processes_within_its_budget(tmp_path, model):
    result = train(tmp_path / "run", *model, "--batch-size", "8", "--max-steps", "3", devices=2)
    assert result["metrics"]["steps_per_rank"] == [result["privacy"]["steps"]] * 2
    privacy = result["privacy"]
    assert 0 < privacy["epsilon"] <= float(model[-1])
    assert privacy["epsilon"] == pytest.approx(privacy["preprocessing"]["epsilon"] + privacy["epsilon_training"], rel=1e-12)
    if model[1] == "dpctgan":  # two ranks' shares of the Poisson sample are one DP-SGD step each: Opacus' bill
        assert privacy["epsilon_training"] == pytest.approx(opacus_epsilon(
            privacy["noise_multiplier"], privacy["sample_rate"], privacy["steps"], privacy["delta_training"]), rel=1e-9)
    assert (tmp_path / "run" / "synthetic.csv").exists()
    assert not (tmp_path / "run" / ".released_preprocessing.pt").exists()


def test_a_run_continued_in_its_own_folder_by_two_processes_reads_its_settings_once(tmp_path):
    """The continue command (--config RUN/config.yaml --resume ... --output-dir RUN) with two
    processes: rank 0 sets the folder's config.yaml aside before Lightning starts rank 1, which
    read the command line again, found no config file and died (exit 137, no message, the folder
    left without its privacy.json). The other processes now take rank 0's settings."""
    run = tmp_path / "run"
    train(run, "--model", "gan", "--batch-size", "8", "--max-steps", "2")
    continued = train(run, "--config", str(run / "config.yaml"), "--resume", str(run / "checkpoints" / "last.ckpt"),
                      "--max-steps", "4", devices=2)
    assert continued["metrics"]["steps_per_rank"] == [4, 4] and continued["privacy"]["steps"] == 4
    assert (run / "previous" / "config.yaml").is_file() and (run / "config.yaml").is_file()


def test_the_settings_handed_to_the_other_processes_read_back_as_given():
    """Rank 0 hands its settings over as YAML text, only where they read back to the same values
    (a date stays a date); otherwise the other processes parse the command line as before. Every
    run made that text as JSON, which refused a date with a TypeError, one process or several."""
    import datetime

    from lightning_dpgan.cli import _settings_text, build_config

    config = build_config(["--model", "gan", "--dataset", "adult", "--logger", "wandb", "--logger.version", "2024-06-01"])
    assert config["logger"]["version"] == datetime.date(2024, 6, 1)
    assert yaml.safe_load(_settings_text(config)) == config
    assert _settings_text({**config, "extra": (1, 2)}) is None  # a tuple would come back a list


def test_a_table_whose_share_per_process_is_smaller_than_the_batch_still_trains(tmp_path):
    """The loader dropped short batches whenever the whole table held a batch: two processes
    reading 18 of the 36 rows each with --batch-size 32 took no step (Lightning: "no training
    batches") and the run reported a trainer limit. Each step now takes a process's whole share."""
    result = train(tmp_path / "run", "--model", "gan", "--batch-size", "32", "--max-steps", "3", devices=2)
    assert result["metrics"]["train_records"] == 36
    assert result["metrics"]["steps_per_rank"] == [3, 3]


def test_a_share_per_process_that_ctgan_cannot_pack_is_refused_before_anything_is_written(tmp_path):
    """Each step trains on a process's whole share when it is smaller than the batch: 18 rows a
    process do not cut into CTGAN's packs of 10, which failed at the first step."""
    from lightning_dpgan.cli import build_config
    from lightning_dpgan.config import ConfigError
    from lightning_dpgan.run import Run

    args = ["--model", "ctgan", "--dataset", "adult", "--data-dir", str(ADULT), "--accelerator", "cpu", "--strategy", "ddp"]
    with pytest.raises(ConfigError, match="each of the 2 processes reads 18 of the training table's rows, fewer than "
                                          "--batch-size 500.*--model.pac to a divisor of 18"):
        Run(build_config([*args, "--devices", "2"]), tmp_path / "two")
    with pytest.raises(ConfigError, match="the training table has 36 rows"):
        Run(build_config([*args, "--devices", "1"]), tmp_path / "one")
    Run(build_config([*args, "--devices", "2", "--model.pac", "2"]), tmp_path / "packs")
    assert not any(tmp_path.iterdir())


def test_a_rank_resuming_has_its_shard_built_before_lightning_reads_the_checkpoint(tmp_path, monkeypatch):
    """What the share reader relies on: Lightning runs the strategy's setup, which builds this
    rank's shard of the teachers, before it reads the ``--resume`` checkpoint, so the reader cuts
    the file to the shard. One process posing as rank 1 of 2 (no collectives are needed)."""
    from lightning_dpgan import distributed
    from lightning_dpgan.callbacks import teachers as teacher_strategy
    from lightning_dpgan.checkpoint_io import ShareReadingCheckpointIO
    from lightning_dpgan.cli import main

    args = ["train", "--model", "pategan", "--dataset", "adult", "--data-dir", str(ADULT), "--accelerator", "cpu",
            "--privacy.num_teachers", "5", "--batch-size", "4", "--epsilon", "5000",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    assert main([*args, "--output-dir", str(tmp_path / "first"), "--max-steps", "2"]) == 0
    for module in (distributed, teacher_strategy):
        monkeypatch.setattr(module, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "rank", lambda: 1)
    kept = []
    read = ShareReadingCheckpointIO.load_checkpoint

    def spy(self, *given, **options):
        checkpoint = read(self, *given, **options)
        kept.append(checkpoint["state_dict"]["teachers.layers.0.weight"].shape[0])
        return checkpoint

    monkeypatch.setattr(ShareReadingCheckpointIO, "load_checkpoint", spy)
    resume = ["--resume", str(tmp_path / "first" / "checkpoints" / "last.ckpt")]
    assert main([*args, "--output-dir", str(tmp_path / "rank1"), "--max-steps", "3", *resume]) == 0
    assert kept == [2]  # teachers 3 and 4 of the 5: rank 1's shard, cut by the reader


@pytest.mark.parametrize("scaling", [[], ["--devices", "2", "--strategy", "ddp"]], ids=["one", "ddp"])
def test_the_trainer_reads_a_resume_checkpoint_through_the_modules_share_reader(tmp_path, scaling):
    """What makes a DDP rank's ``--resume`` read only its shard of the teachers (the reader
    itself is tested in test_gpate.py)."""
    from lightning_dpgan.checkpoint_io import ShareReadingCheckpointIO
    from lightning_dpgan.cli import build_config
    from lightning_dpgan.run import Run

    run = Run(build_config(["--model", "pategan", "--dataset", "adult", "--data-dir", str(ADULT),
                            "--privacy.num_teachers", "3", "--epsilon", "1000", "--accelerator", "cpu", *scaling]),
              tmp_path)  # an epsilon its first step fits in: a run that could not train is refused as it is built
    reader = run.trainer.strategy.checkpoint_io
    assert isinstance(reader, ShareReadingCheckpointIO)
    assert reader.module is run.module


def test_the_release_file_the_other_ranks_read_holds_no_digest_of_the_private_rows(tmp_path, monkeypatch):
    """Rank 0 writes its run information to the run folder for the other ranks (a killed run leaves
    the file there): the DP releases they need, never the SHA-256 of the training rows, which only
    the (private) checkpoint keeps."""
    from lightning_dpgan.cli import build_config
    from lightning_dpgan.run import RANK_ZERO_RELEASE, Run

    run = Run(build_config(["--model", "dpctgan", "--dataset", "adult", "--data-dir", str(ADULT), "--accelerator", "cpu",
                            "--devices", "2", "--strategy", "ddp", "--epsilon", "5", "--batch-size", "8"]), tmp_path)
    assert run.trainer.world_size == 2 and len(run.module.run_info["train_rows_digest"]) == 64
    read = []
    monkeypatch.setattr(run, "_fit_and_write", lambda: read.append(torch.load(tmp_path / RANK_ZERO_RELEASE, weights_only=False)))
    run.fit()
    (release,) = read
    assert "train_rows_digest" not in release
    assert release == {key: value for key, value in run.module.run_info.items() if key != "train_rows_digest"}
    assert "schema" in release and "table_transformer" in release
    assert not (tmp_path / RANK_ZERO_RELEASE).exists()


@pytest.mark.parametrize("scaling,private_ddp", [(["--devices", "2"], True), (["--devices", "1"], False),
                                                 (["--devices", "1", "--strategy", "single_device"], False),
                                                 (["--devices", "1", "--strategy", "ddp"], False)])
def test_several_devices_without_a_strategy_train_with_the_private_ddp(tmp_path, scaling, private_ddp):
    """Lightning's own pick for several devices fails on a GAN's alternating updates (parameters
    unused in a step); --devices N alone now means --strategy ddp, and a strategy named stays
    (Lightning's other multi-process ones are refused: test_cli)."""
    from lightning_dpgan.cli import build_config
    from lightning_dpgan.run import Run

    run = Run(build_config(["--model", "gan", "--dataset", "adult", "--data-dir", str(ADULT), "--accelerator", "cpu",
                            *scaling]), tmp_path)
    assert isinstance(run.trainer.strategy, PrivateDDPStrategy) is private_ddp


@pytest.mark.parametrize("sampling", ["poisson", "shuffle"])
def test_ddp_in_one_process_trains_on_the_strategys_own_batches(tmp_path, sampling):
    """--strategy ddp with one device (a DDP run's config.yaml resumed with --devices 1): Lightning's
    DDP put its distributed sampler in place of DP-SGD's. Opacus' Poisson batches failed with a
    TypeError; the secret shuffle was replaced by an order --seed fixes, which gets no
    amplification. One process now trains as one process does."""
    from lightning_dpgan.cli import build_config
    from lightning_dpgan.run import Run

    args = ["--model", "dpgan", "--dataset", "adult", "--data-dir", str(ADULT), "--accelerator", "cpu", "--devices", "1",
            "--strategy", "ddp", "--batch-size", "8", "--epsilon", "5", "--max-steps", "2",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    run = Run(build_config([*args, "--privacy.poisson_sampling", str(sampling == "poisson").lower()]), tmp_path)
    kinds = [type(callback).__name__ for callback in run.trainer.callbacks if type(callback).__name__ != "LambdaCallback"]
    assert len(kinds) == len(set(kinds))  # the trainer built again holds each callback once
    run.fit()
    assert run.module.train_steps == 2
    sampler = run.trainer.train_dataloader.sampler
    if sampling == "shuffle":
        assert isinstance(sampler, torch.utils.data.RandomSampler)
        assert sampler.generator is run.strategy.noise.generator("cpu")
    else:
        assert not isinstance(sampler, torch.utils.data.DistributedSampler)


def test_scaling_flags_reach_the_trainer():
    from lightning_dpgan.cli import build_config

    config = build_config(["--model", "gan", "--dataset", "mnist", "--devices", "4", "--num-nodes", "2",
                           "--strategy", "ddp"])
    assert config["trainer"]["num_nodes"] == 2 and config["trainer"]["devices"] == 4
    assert config["trainer"]["strategy"] == "ddp"


#: what says where machine 0 is, or which process this is: cleared so that the machine running
#: the tests (a SLURM or LSF job, a torchrun) decides nothing
LAUNCHER_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "RANK", "WORLD_SIZE", "GROUP_RANK",
                      "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")


@pytest.fixture
def no_launcher(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("SLURM_", "LSB_", "OMPI_", "PMI_")) or name in LAUNCHER_VARIABLES:
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize("environment,refused", [
    ({}, True),  # each machine would wait for the others at its own 127.0.0.1
    ({"MASTER_ADDR": "10.0.0.1"}, False),
    ({"SLURM_NTASKS": "2", "SLURM_JOB_NAME": "train"}, False),  # the cluster says where machine 0 is
    ({"TORCHELASTIC_RUN_ID": "run-1"}, False),  # torchrun
])
def test_several_machines_are_refused_only_where_none_could_find_machine_0(no_launcher, environment, refused):
    from lightning_dpgan.config import ConfigError
    from lightning_dpgan.run import check_machines_can_meet

    for name, value in environment.items():
        no_launcher.setenv(name, value)
    check_machines_can_meet(1)  # one machine needs no meeting place
    if refused:
        with pytest.raises(ConfigError, match="--num-nodes 2 trains on 2 machines, but MASTER_ADDR is not set"):
            check_machines_can_meet(2)
    else:
        check_machines_can_meet(2)


@pytest.mark.parametrize("node_rank", [None, "1"])
def test_a_run_on_several_machines_without_a_meeting_place_is_refused_before_anything_is_written(
        tmp_path, no_launcher, capsys, node_rank):
    """Machine 1 too: it used to wait for machine 0's release (which never came) and fail after
    10 minutes blaming a folder not shared between machines."""
    from lightning_dpgan import run
    from lightning_dpgan.cli import main

    if node_rank is not None:
        no_launcher.setenv("NODE_RANK", node_rank)
    no_launcher.setattr(run, "FOLLOWER_WAIT_S", 1)  # a regression fails in a second, not in ten minutes
    out = tmp_path / "run"
    args = ["train", "--model", "gan", "--dataset", "adult", "--data-dir", str(Path(__file__).parent / "fixtures" /
            "adult_tiny"), "--output-dir", str(out), "--max-steps", "1", "--num-nodes", "2", "--strategy", "ddp"]
    assert main(args) == 2
    assert "MASTER_ADDR (machine 0's address), MASTER_PORT and its own NODE_RANK" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("environment,flags", [
    ({"TORCHELASTIC_RUN_ID": "run-1", "WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1"}, []),
    ({"MASTER_ADDR": "10.0.0.1"}, ["--num-nodes", "2", "--strategy", "ddp"]),
    ({"SLURM_NTASKS": "2", "SLURM_JOB_NAME": "train", "MASTER_ADDR": "127.0.0.1"}, ["--devices", "2"]),
])
def test_processes_started_each_on_its_own_need_an_output_dir(tmp_path, no_launcher, capsys, environment, flags):
    """Under torchrun, or on several machines, each process runs the command and named the default
    folder by its own clock: processes a second apart trained into two folders, one waiting ten
    minutes on the other's release. Refused before anything is written; one process is not."""
    from lightning_dpgan.cli import main

    no_launcher.chdir(tmp_path)
    for name, value in environment.items():
        no_launcher.setenv(name, value)
    args = ["train", "--model", "gan", "--dataset", "adult", "--data-dir", str(Path(__file__).parent / "fixtures" /
            "adult_tiny"), "--max-steps", "1", *flags]
    assert main(args) == 2
    assert "--output-dir is needed" in capsys.readouterr().err
    assert not (tmp_path / "outputs").exists()
    no_launcher.setenv("WORLD_SIZE", "1")  # torchrun of one process: the default folder is its own
    if "TORCHELASTIC_RUN_ID" in environment:
        assert main(args + ["--trainer.enable_progress_bar", "false"]) == 0
        assert len(list((tmp_path / "outputs").iterdir())) == 1


def test_one_process_of_any_launcher_keeps_its_default_folder(no_launcher):
    """A SLURM job of one task, torchrun of one process, --num-nodes 1 and Lightning's own children
    (handed rank 0's folder) are not refused for want of --output-dir."""
    from lightning_dpgan.cli import _processes_started_apart

    one_machine = {"trainer": {"num_nodes": 1}}
    assert _processes_started_apart(one_machine) is None
    for environment in ({"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "train"}, {"TORCHELASTIC_RUN_ID": "r", "WORLD_SIZE": "1"},
                        {"LOCAL_RANK": "1", "WORLD_SIZE": "2"}):
        for name, value in environment.items():
            no_launcher.setenv(name, value)
        assert _processes_started_apart(one_machine) is None, environment
        for name in environment:
            no_launcher.delenv(name)


def test_dp_sgd_poisson_sampling_over_two_ranks_is_one_poisson_sample_at_the_global_rate():
    """Each rank samples its own records (disjoint shards) and each record joins a batch with
    probability q = batch / N: the rate the accountant charges, not q per rank twice over."""
    records, batch, epochs = 200, 20, 30
    rank0, rank1 = workers.run_on_ranks(workers.poisson_worker, records, batch, epochs)
    assert len(rank0) == len(rank1) == epochs * records // batch  # the ranks step together
    assert not set(sum(rank0, [])) & set(sum(rank1, []))
    joined = sum(len(b0) + len(b1) for b0, b1 in zip(rank0, rank1))
    rate = joined / (len(rank0) * records)
    assert abs(rate - batch / records) < 0.01, rate  # 300 steps x 200 records: std ~ 0.0012


def test_dp_sgd_ranks_keep_stepping_together_through_empty_poisson_batches():
    """At 10 records per rank and q = 0.1 about a third of each rank's draws are empty. An
    empty draw is still a step (the noise is drawn for it): dropping it, as Opacus' distributed
    sampler does, would leave that rank a step behind and hang the next collective."""
    records, batch, epochs = 20, 2, 20
    rank0, rank1 = workers.run_on_ranks(workers.poisson_worker, records, batch, epochs)
    assert len(rank0) == len(rank1) == epochs * records // batch
    empty = sum(not b for b in rank0 + rank1)
    assert 0.2 < empty / (2 * len(rank0)) < 0.5, empty  # (1 - 0.1)^10 = 0.35 over 400 draws


def test_teacher_query_inputs_are_rank_zeros_on_every_rank():
    """The records the teachers vote on are rank 0's on every rank even when the ranks' random
    streams drift apart: otherwise each shard votes on other records and the sum mixes them."""
    zero, one = workers.run_on_ranks(workers.query_worker)
    for (latent0, labels0), (latent1, labels1) in zip(zero, one):
        torch.testing.assert_close(latent1, latent0)
        if labels0 is not None:
            torch.testing.assert_close(labels1, labels0)


def test_ranks_seeded_alike_generate_the_single_process_batch_in_distinct_shares():
    """Every process is seeded alike (--seed), so each drew the same latent codes: the shares of a
    generated batch (DP-SGD's critic, the sanitizer's B / W) repeated one another's rows. Each now
    keeps its own rows of one draw for all: together the rows one process draws for the batch,
    with the random streams still in step."""
    from lightning_dpgan.modules.gan import GAN

    zero, one = workers.run_on_ranks(workers.generated_share_worker, 4)
    torch.manual_seed(7)
    module = GAN((6,), num_classes=3)
    labels, latent = module.sample_labels(8), module.sample_latent(8)
    torch.testing.assert_close(torch.cat([zero[1], one[1]]), latent)
    torch.testing.assert_close(torch.cat([zero[0], one[0]]), labels)
    assert not torch.equal(zero[1], one[1])
    torch.testing.assert_close(zero[2], one[2])
    torch.manual_seed(7)
    single = GAN((6,), num_classes=3).generated_share(4)  # one process: its own draw of 4, as before
    torch.manual_seed(7)
    module = GAN((6,), num_classes=3)
    torch.testing.assert_close(single, (module.sample_labels(4), module.sample_latent(4)))


@pytest.mark.parametrize("model", [["--model", "gan"], ["--model", "ctgan", "--model.pac", "2"]], ids=["gan", "ctgan"])
def test_every_training_step_generates_this_processs_share(tmp_path, monkeypatch, model):
    """The discriminator and generator steps (CTGAN's own generator step too) draw their generated
    records through own_share_of_draw, so that under DDP the shares differ (see the test above)."""
    from lightning_dpgan.cli import main
    from lightning_dpgan.distributed import own_share_of_draw
    from lightning_dpgan.modules import base, ctgan

    calls = []

    def recording(draw, n):
        calls.append(n)
        return own_share_of_draw(draw, n)

    monkeypatch.setattr(base, "own_share_of_draw", recording)
    monkeypatch.setattr(ctgan, "own_share_of_draw", recording)
    assert main(["train", *model, "--dataset", "adult", "--data-dir", str(ADULT), "--output-dir", str(tmp_path / "run"),
                 "--batch-size", "8", "--max-steps", "3", "--trainer.enable_progress_bar", "false"]) == 0
    assert calls == [8] * 6  # a discriminator step and a generator step each, three times


def test_every_rank_steps_the_generator_through_rank_zeros_answering_critic():
    """GS-WGAN with N critics: the generator steps through rank 0's secret answering critic on
    every rank, whatever each rank's loader drew."""
    assert workers.run_on_ranks(workers.answer_worker) == [[1], [1]]


# ------------------------------------------------------------- a script in two processes
#: DP-CTGAN on the tiny Adult table with DP modes, on a Trainer built in Python with two processes
#: (Lightning's launcher runs the script again for the second); argv[1], when given, names the
#: releases every process restores instead of drawing its own.
PYTHON_DDP_SCRIPT = """
import sys
import lightning as L
from lightning_dpgan.callbacks import DPSGD, PrivacyBudgetStopping, StepLimit
from lightning_dpgan.datamodules import AdultDataModule
from lightning_dpgan.ddp import PrivateDDPStrategy
from lightning_dpgan.modules import DPCTGAN

data = AdultDataModule(data_dir=sys.argv[2], batch_size=8, encoding="mode-specific", max_modes=1)
if sys.argv[1] != "-":
    data.restore_releases(sys.argv[1])
data.setup("fit")
model = DPCTGAN(data.data_shape, data.num_classes, table_layout=data.table_layout)
strategy = DPSGD(target_epsilon=8.0, delta=1e-3)
trainer = L.Trainer(accelerator="cpu", devices=2, strategy=PrivateDDPStrategy(), max_epochs=-1, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    callbacks=[StepLimit(2), strategy, PrivacyBudgetStopping(8.0)])
trainer.fit(model, datamodule=data)
if trainer.is_global_zero:
    print("epsilon", strategy.epsilon(), "modes epsilon", data.privacy_cost()["epsilon"])
"""


def test_a_script_in_two_processes_trains_on_one_dp_release_or_is_refused(tmp_path, no_launcher):
    """Each process of a script runs it anew, so each datamodule drew its own DP modes: two
    releases, one charged, and records encoded differently per process. Refused in both
    processes; with the releases drawn once and restored in each (the refusal's remedy), it trains
    and the report charges the one release."""
    script = tmp_path / "ddp_script.py"
    script.write_text(PYTHON_DDP_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}

    def run(releases: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script), releases, str(ADULT)], capture_output=True, text=True,
                              timeout=240, env=env, cwd=tmp_path)

    refused = run("-")
    assert refused.returncode != 0
    assert "the processes of this run drew different DP preprocessing releases" in refused.stderr
    assert "epsilon" not in refused.stdout

    from lightning_dpgan.datamodules import AdultDataModule

    data = AdultDataModule(data_dir=ADULT, batch_size=8, encoding="mode-specific", max_modes=1)
    data.setup("fit")
    torch.save(data.state_dict(), tmp_path / "releases.pt")
    trained = run(str(tmp_path / "releases.pt"))
    assert trained.returncode == 0, trained.stderr[-2000:]
    (line,) = [line for line in trained.stdout.splitlines() if line.startswith("epsilon")]
    epsilon, modes = float(line.split()[1]), float(line.split()[-1])
    assert modes == data.privacy_cost()["epsilon"] > 0 and modes < epsilon <= 8.0

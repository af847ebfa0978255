"""The ``--logger`` choices: what W&B is given (and what it is not), without a W&B server."""
import json
import warnings

import pytest
from lightning.pytorch.loggers import CSVLogger, WandbLogger

from lightning_dpgan import loggers


@pytest.fixture
def recorded_wandb(monkeypatch):
    """``build_logger("wandb", ...)`` with Lightning's WandbLogger replaced by a recorder of the
    keyword arguments it would have been given (nothing is started)."""
    given = {}

    class Recorder:
        def __init__(self, **kwargs):
            given.update(kwargs)

    monkeypatch.setattr("lightning.pytorch.loggers.WandbLogger", Recorder)
    return given


def test_wandb_gets_the_run_folders_name_the_default_project_and_no_console(tmp_path, monkeypatch, recorded_wandb):
    """The console carries the datamodule's counts of private rows (blanked categories, clipped
    values), which are for the data holder: W&B is told not to upload it."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    loggers.build_logger("wandb", tmp_path / "run", {}, "run")
    assert recorded_wandb["project"] == "lightning-dpgan" and recorded_wandb["name"] == "run"
    assert recorded_wandb["save_dir"] == str(tmp_path / "run" / "logs")
    assert recorded_wandb["settings"].console == "off"
    assert "offline" not in recorded_wandb  # WANDB_MODE decides


def test_wandb_flags_replace_the_defaults_and_reach_wandb_under_its_own_names(tmp_path, monkeypatch, recorded_wandb):
    monkeypatch.setenv("WANDB_MODE", "offline")
    loggers.build_logger("wandb", tmp_path, {"run_name": "mine", "project": "p", "entity": "team"}, "folder")
    assert (recorded_wandb["name"], recorded_wandb["project"], recorded_wandb["entity"]) == ("mine", "p", "team")
    assert "run_name" not in recorded_wandb


def _without_wandb_credentials(monkeypatch, home):
    for name in ("WANDB_MODE", "WANDB_API_KEY", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))


def test_an_api_key_in_netrc_counts_as_credentials(tmp_path, monkeypatch):
    """``wandb login`` writes the key to ~/.netrc: a run with it is not forced offline."""
    _without_wandb_credentials(monkeypatch, tmp_path)
    assert not loggers._has_wandb_credentials()  # no ~/.netrc
    netrc_file = tmp_path / ".netrc"
    netrc_file.write_text("machine example.org login someone password other\n")
    netrc_file.chmod(0o600)
    assert not loggers._has_wandb_credentials()  # another machine's entry
    netrc_file.write_text("machine api.wandb.ai login user password 0123456789abcdef\n")
    assert loggers._has_wandb_credentials()
    monkeypatch.setenv("WANDB_API_KEY", "k")
    netrc_file.unlink()
    assert loggers._has_wandb_credentials()


def test_without_credentials_wandb_logs_offline_unless_its_offline_setting_is_given(tmp_path, monkeypatch,
                                                                                    recorded_wandb, caplog):
    """Said through the library's log, which a command prints as ``train: warning: ...`` like its
    other warnings (a Python warning printed the source file's path and line first)."""
    _without_wandb_credentials(monkeypatch, tmp_path)
    with caplog.at_level("WARNING", logger="lightning_dpgan"), warnings.catch_warnings():
        warnings.simplefilter("error")
        loggers.build_logger("wandb", tmp_path, {}, "run")
    assert "logging offline" in caplog.text and caplog.records[0].name == "lightning_dpgan.loggers"
    assert recorded_wandb["offline"] is True
    recorded_wandb.clear()
    caplog.clear()
    with caplog.at_level("WARNING", logger="lightning_dpgan"):  # the user's own choice: no warning, and it is kept
        loggers.build_logger("wandb", tmp_path, {"offline": False}, "run")
    assert recorded_wandb["offline"] is False and "logging offline" not in caplog.text


@pytest.mark.parametrize("mode", ["disabled", " Disabled"])
def test_wandb_disabled_by_its_environment_is_said_to_log_nothing(tmp_path, monkeypatch, recorded_wandb, caplog, mode):
    """WANDB_MODE=disabled makes W&B take every call and keep nothing: the run ended with an empty
    logs folder and no word said."""
    monkeypatch.setenv("WANDB_MODE", mode)
    with caplog.at_level("WARNING", logger="lightning_dpgan"):
        loggers.build_logger("wandb", tmp_path, {}, "run")
    assert "--logger wandb with WANDB_MODE=disabled: W&B keeps nothing of this run" in caplog.text
    assert "offline" not in recorded_wandb  # not forced offline: the environment decides
    caplog.clear()
    monkeypatch.setenv("WANDB_MODE", "offline")
    with caplog.at_level("WARNING", logger="lightning_dpgan"):
        loggers.build_logger("wandb", tmp_path, {}, "run")
    assert "W&B keeps nothing" not in caplog.text


class _FakeRun:
    def __init__(self):
        self.id, self.summary, self.artifacts, self.finished = "abc", {}, [], False

    def log_artifact(self, artifact):
        self.artifacts.append(artifact)

    def finish(self):
        self.finished = True


class _FakeWandbLogger(WandbLogger):
    """A WandbLogger (publish_run's test) whose run is :class:`_FakeRun`."""

    def __init__(self):  # no wandb.init
        self.run, self.images = _FakeRun(), []

    @property
    def experiment(self):
        return self.run

    def log_image(self, key, images, **kwargs):
        self.images.append((key, images))


class _FakeArtifact:
    def __init__(self, name, type):
        self.name, self.type, self.files = name, type, []

    def add_file(self, path):
        self.files.append(path)


def test_publish_run_sends_finite_final_metrics_the_samples_and_the_privacy_report(tmp_path, monkeypatch):
    """The summary takes numbers only, and no NaN or infinity (a diverged loss would make W&B's
    summary unreadable); the privacy report goes as an artifact named after the run."""
    import wandb

    monkeypatch.setattr(wandb, "Artifact", _FakeArtifact)
    (tmp_path / "privacy.json").write_text(json.dumps({"epsilon": 1.0}))
    (tmp_path / "samples.png").write_bytes(b"png")
    logger = _FakeWandbLogger()
    metrics = {"steps": 6, "loss/generator": 0.5, "loss/discriminator": float("nan"), "privacy/epsilon": float("inf"),
               "steps_per_rank": [6]}
    loggers.publish_run(logger, tmp_path, metrics)
    assert logger.run.summary == {"final/steps": 6, "final/loss/generator": 0.5}
    (artifact,) = logger.run.artifacts
    assert (artifact.name, artifact.type, artifact.files) == ("privacy-report-abc", "privacy-report",
                                                              [str(tmp_path / "privacy.json")])
    assert logger.images == [("samples", [str(tmp_path / "samples.png")])]
    assert logger.run.finished

    table_run = _FakeWandbLogger()  # a table run: no grid; a run whose report is missing: no artifact
    (tmp_path / "samples.png").unlink()
    (tmp_path / "privacy.json").unlink()
    loggers.publish_run(table_run, tmp_path, {"steps": 2})
    assert table_run.images == [] and table_run.run.artifacts == [] and table_run.run.finished


def test_publish_run_leaves_other_loggers_alone(tmp_path):
    logger = CSVLogger(save_dir=str(tmp_path), name="", version="")
    loggers.publish_run(logger, tmp_path, {"steps": 1})
    assert not any(tmp_path.iterdir())


def test_only_wandbs_own_errors_at_the_start_of_its_run_are_said_as_wandbs():
    """log_run_config turns W&B's failure to start into a refusal naming W&B; another logger's
    error (a full disk under the csv logger) is its own and reaches the user as it is."""
    from lightning_dpgan.config import ConfigError
    from lightning_dpgan.loggers import log_run_config

    class Failing:
        def __init__(self, error):
            self.error = error

        def log_hyperparams(self, params):
            raise self.error

    with pytest.raises(OSError, match="No space left"):
        log_run_config(Failing(OSError(28, "No space left on device")), {})
    wandb_error = type("CommError", (Exception,), {"__module__": "wandb.errors"})("network is unreachable")
    with pytest.raises(ConfigError, match="W&B could not start its run"):
        log_run_config(Failing(wandb_error), {})


def test_a_wandb_setting_wandb_refuses_is_named_with_the_environment_that_set_it(monkeypatch):
    """WANDB_MODE=bogus ended in pydantic's bare "1 validation error for Settings", naming no
    variable: W&B validates its settings, the environment's among them, as its run starts (a
    real start is not made here: W&B keeps its refused setup for the rest of the process)."""
    from typing import Literal

    import pydantic

    from lightning_dpgan.config import ConfigError
    from lightning_dpgan.loggers import log_run_config

    class Settings(pydantic.BaseModel):  # W&B's Settings model validates its mode so
        mode: Literal["online", "offline", "disabled"]

    with pytest.raises(pydantic.ValidationError) as refused:
        Settings(mode="bogus")

    class Starting:
        def log_hyperparams(self, params):
            raise refused.value

    monkeypatch.setenv("WANDB_MODE", "bogus")
    monkeypatch.setenv("WANDB_BASE_URL", "https://user:secret@example.org")
    with pytest.raises(ConfigError, match=r"W&B refused its settings \(mode Input should be 'online'.*input_value="
                                          r"'bogus'.*\): check the WANDB_\* environment variables \(.*WANDB_MODE") as said:
        log_run_config(Starting(), {})
    assert "secret" not in str(said.value)  # the variables are named, not their values

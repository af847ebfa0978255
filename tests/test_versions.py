"""The software versions a privacy report names (``software`` in privacy.json) and ``--version``."""
import json
import platform
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import torch

import lightning_dpgan
from lightning_dpgan.cli import main
from lightning_dpgan.versions import installed_version, software_versions, version_line

REPO = Path(__file__).resolve().parents[1]


def test_the_report_names_this_package_and_the_installed_accounting_packages():
    """Each figure read independently: the installed distributions' metadata, torch's own
    version string with its build tag, and this package's ``__version__``."""
    versions = software_versions()
    assert versions["lightning-dpgan"] == lightning_dpgan.__version__
    assert versions["python"] == platform.python_version()
    assert versions["torch"] == torch.__version__
    for name in ("lightning", "opacus", "numpy", "scipy"):
        assert versions[name] == metadata.version(name)
    assert json.loads(json.dumps(versions)) == versions  # plain JSON, as privacy.json holds it


def test_a_package_that_is_not_installed_reads_as_none():
    assert installed_version("no-such-distribution-lightning-dpgan") is None


def test_the_package_version_is_set_in_one_place():
    """pyproject.toml takes the version from ``lightning_dpgan.__version__`` (the installed
    metadata then says the same), so the two cannot drift apart."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "lightning_dpgan.__version__"}
    assert metadata.version("lightning-dpgan") == lightning_dpgan.__version__


@pytest.mark.parametrize("argv", [["--version"], ["train", "--version"], ["sample", "--version"]])
def test_version_option_prints_the_versions_alone(argv, capsys):
    assert main(argv) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == version_line()
    assert printed.startswith(f"lightning-dpgan {lightning_dpgan.__version__} (python {platform.python_version()}, "
                              f"torch {torch.__version__}, ")
    assert f"opacus {metadata.version('opacus')}" in printed


def test_version_among_other_options_is_not_taken_as_the_version_request(capsys):
    """Only ``--version`` alone (or after a command) prints it: within a training command line it is
    an unknown option of train's, refused as such, nothing trained."""
    assert main(["train", "--model", "gan", "--version"]) == 2
    assert "--version" in capsys.readouterr().err

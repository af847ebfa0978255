"""The software versions a privacy report names (``software`` in privacy.json) and ``--version``."""
import json
import platform
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import torch

import lightning_dpgan
from lightning_dpgan.cli import main
from lightning_dpgan import versions as versions_module
from lightning_dpgan.versions import installed_version, software_versions, source_commit, version_line

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


def exit_code(argv):
    """``main``'s status: returned, or a command parser's exit (argparse exits from --version)."""
    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code


@pytest.mark.parametrize("argv", [["--version"], ["--version", "--help"], ["train", "--version"],
                                  ["sample", "--version"], ["evaluate", "--version"], ["audit", "--version"],
                                  ["benchmark", "--version"]])
def test_version_option_prints_the_versions_on_one_line(argv, capsys):
    assert exit_code(argv) in (0, None)
    printed = capsys.readouterr().out
    assert printed == version_line() + "\n"
    assert printed.startswith(f"lightning-dpgan {lightning_dpgan.__version__} (")
    assert f"python {platform.python_version()}, torch {torch.__version__}, " in printed
    assert f"opacus {metadata.version('opacus')}" in printed


def test_version_answers_without_importing_torch_and_names_its_build_tag():
    """torch's version is read from its ``version.py`` (about two seconds saved): in a process
    that never imports torch it must still read as torch's own ``__version__``, tag included."""
    code = ("import sys\nfrom lightning_dpgan.cli import main\n"
            "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
            "print('TORCH LOADED' if 'torch' in sys.modules else 'NO TORCH')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    line, verdict = result.stdout.rstrip().splitlines()
    assert verdict == "NO TORCH"
    assert f", torch {torch.__version__}, " in line  # its build tag too where it has one (+cpu here)


def test_torch_version_falls_back_to_importing_torch_where_its_file_says_nothing(tmp_path, monkeypatch):
    """A torch whose version.py is missing or assigns no string: its imported ``__version__``."""
    (tmp_path / "version.py").write_text("__version__ = compute()\n")

    class Spec:
        submodule_search_locations = [str(tmp_path)]

    class ImportedTorch:
        __version__ = "9.9.9+rocm7"

    monkeypatch.setattr(versions_module.importlib.util, "find_spec", lambda name: Spec())
    monkeypatch.setattr(versions_module.importlib, "import_module", lambda name: ImportedTorch)
    monkeypatch.delitem(sys.modules, "torch")  # as in a process that has not imported it (restored after)
    assert versions_module.torch_version() == "9.9.9+rocm7"
    (tmp_path / "version.py").write_text("__version__ = '9.9.9+cpu'\n")
    assert versions_module.torch_version() == "9.9.9+cpu"


def test_an_assigned_string_is_read_from_source_plain_or_annotated(tmp_path):
    module = tmp_path / "version.py"
    module.write_text("from typing import Optional\n__version__: str = '9.9.9+cu130'\ncuda = '13.0'\n")
    assert versions_module._assigned_string(module, "__version__") == "9.9.9+cu130"
    assert versions_module._assigned_string(module, "cuda") == "13.0"
    assert versions_module._assigned_string(module, "hip") is None
    assert versions_module._assigned_string(tmp_path / "missing.py", "__version__") is None


def test_version_among_training_options_prints_it_and_trains_nothing(tmp_path, capsys):
    """As argparse's version option does: it answers and exits before anything is read or written."""
    out = tmp_path / "run"
    assert exit_code(["train", "--model", "gan", "--dataset", "mnist", "--output-dir", str(out), "--version"]) in (0, None)
    assert capsys.readouterr().out == version_line() + "\n"
    assert not out.exists()


def test_a_checkout_names_its_commit_and_an_installed_copy_does_not():
    """The suite runs from a git checkout (CI clones one): the report names its HEAD, read here
    with git itself; without one (an sdist), nothing."""
    source = software_versions().get("lightning-dpgan source")
    if (REPO / ".git").exists():
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
        assert source["commit"] == head.stdout.strip() and isinstance(source["modified"], bool)
        assert f"commit {head.stdout.strip()[:12]}" in version_line()
    else:
        assert source is None


def _commit_all(repo):
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"], cwd=repo, check=True)


def test_the_commit_says_whether_tracked_files_were_modified_and_a_copy_without_git_has_none(tmp_path, monkeypatch,
                                                                                              request):
    """A package imported from a checkout of its own (pyproject.toml beside it, under git): its
    commit, modified once a tracked file differs (an untracked file does not count); the same
    files outside git: no commit."""
    package = tmp_path / "checkout" / "lightning_dpgan"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "0.1.0"\n')
    (package.parent / "pyproject.toml").write_text("[project]\nname = 'lightning-dpgan'\n")
    monkeypatch.setattr(lightning_dpgan, "__file__", str(package / "__init__.py"))
    request.addfinalizer(source_commit.cache_clear)  # then the real checkout's is read again

    def read():
        source_commit.cache_clear()
        return source_commit()

    assert read() is None  # not under git: an installed copy
    subprocess.run(["git", "init", "-q"], cwd=package.parent, check=True)
    _commit_all(package.parent)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=package.parent, capture_output=True, text=True,
                          check=True).stdout.strip()
    (package / "notes.txt").write_text("untracked")
    assert read() == {"commit": head, "modified": False}
    (package / "__init__.py").write_text('__version__ = "0.1.0"  # edited\n')
    assert read() == {"commit": head, "modified": True}
    assert f"(commit {head[:12]}, modified; python " in version_line()


def _read_source(package, monkeypatch, request):
    monkeypatch.setattr(lightning_dpgan, "__file__", str(package / "__init__.py"))
    request.addfinalizer(source_commit.cache_clear)
    source_commit.cache_clear()
    return source_commit()


def _package_in(folder):
    package = folder / "lightning_dpgan"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "0.1.0"\n')
    return package


def test_a_copy_inside_someone_elses_repository_names_no_commit(tmp_path, monkeypatch, request):
    """The commit is this package's checkout's only: a copy unpacked inside the user's own git
    repository (no .git beside its pyproject.toml), or a package folder vendored at the root of
    another repository (no pyproject.toml), would name that repository's commit as ours."""
    unpacked = _package_in(tmp_path / "outer" / "checkout")
    (unpacked.parent / "pyproject.toml").write_text("[project]\nname = 'lightning-dpgan'\n")
    vendored = _package_in(tmp_path / "vendored")
    for repository in (tmp_path / "outer", vendored.parent):
        subprocess.run(["git", "init", "-q"], cwd=repository, check=True)
        _commit_all(repository)
    assert _read_source(unpacked, monkeypatch, request) is None
    assert _read_source(vendored, monkeypatch, request) is None


def test_a_checkout_git_cannot_read_or_a_machine_without_git_names_no_commit(tmp_path, monkeypatch, request):
    """A broken .git folder, or git not installed (a slim image): the report names no commit and
    nothing fails (every privacy report asks)."""
    package = _package_in(tmp_path / "checkout")
    (package.parent / "pyproject.toml").write_text("[project]\nname = 'lightning-dpgan'\n")
    (package.parent / ".git").mkdir()  # not a repository git can read
    assert _read_source(package, monkeypatch, request) is None
    assert version_line().startswith(f"lightning-dpgan {lightning_dpgan.__version__} (python ")
    subprocess.run(["git", "init", "-q"], cwd=package.parent, check=True)  # readable now, but no git to read it

    def no_git(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "git")

    monkeypatch.setattr("lightning_dpgan.versions.subprocess.run", no_git)
    assert _read_source(package, monkeypatch, request) is None


def test_a_package_that_is_not_installed_is_said_so_in_the_version_line(monkeypatch):
    monkeypatch.setattr("lightning_dpgan.versions.installed_version", lambda name: None)
    assert "scipy not installed" in version_line() and "None" not in version_line()


def test_the_top_level_help_lists_the_version_option(capsys):
    assert exit_code(["--help"]) in (0, None)
    assert "--version" in capsys.readouterr().out


def test_the_report_names_the_checkouts_state_as_the_run_started(tiny_image_data_dir, tmp_path, monkeypatch, request):
    """The checkout's state was read as privacy.json was written: a file edited (or a commit made)
    while the run trained was reported as the code that trained it."""
    from run_helpers import act_after_training_step, read_json, tiny_run_args

    package = _package_in(tmp_path / "checkout")
    (package.parent / "pyproject.toml").write_text("[project]\nname = 'lightning-dpgan'\n")
    subprocess.run(["git", "init", "-q"], cwd=package.parent, check=True)
    _commit_all(package.parent)
    monkeypatch.setattr(lightning_dpgan, "__file__", str(package / "__init__.py"))
    request.addfinalizer(source_commit.cache_clear)
    source_commit.cache_clear()
    act_after_training_step(monkeypatch, 1, lambda: (package / "__init__.py").write_text("# edited while training\n"))
    assert main(tiny_run_args(tiny_image_data_dir, tmp_path / "run", steps=2)) == 0
    assert read_json(tmp_path / "run" / "privacy.json")["software"]["lightning-dpgan source"]["modified"] is False
    source_commit.cache_clear()
    assert source_commit()["modified"] is True  # the edit happened, after the run had read the state

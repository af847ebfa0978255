"""The library's log records on a command's console (``lightning_dpgan.console_log``)."""
import logging

import pytest

from lightning_dpgan.console_log import LIBRARY_LOGGER, route_library_log_to_console


@pytest.fixture
def library_logger():
    """The package's logger, its handlers and propagation put back afterwards."""
    logger = logging.getLogger(LIBRARY_LOGGER)
    handlers, propagate = list(logger.handlers), logger.propagate
    yield logger
    logger.handlers[:] = handlers
    logger.propagate = propagate


def test_the_librarys_warnings_read_like_the_commands_own_lines_and_print_once(library_logger, capsys):
    """Opacus' root configuration stamped them '12/01/2026 11:11:11:WARNING:...' between train's
    own 'train: warning: ...' lines; routed, each prints once (not again through the root)."""
    root_records = []

    class Collect(logging.Handler):
        def emit(self, record):
            root_records.append(record)

    collect = Collect()
    logging.getLogger().addHandler(collect)
    try:
        route_library_log_to_console("train")
        logging.getLogger("lightning_dpgan.callbacks.gpate").warning("--privacy.sigma2 %d drowns them", 100)
        logging.getLogger("lightning_dpgan.data").error("cannot read it")
    finally:
        logging.getLogger().removeHandler(collect)
    assert capsys.readouterr().err == "train: warning: --privacy.sigma2 100 drowns them\ntrain: error: cannot read it\n"
    assert root_records == []


@pytest.mark.parametrize("entry", ["train.py", "-m"])
def test_both_entry_points_route_the_librarys_warnings(entry, tiny_image_data_dir, tmp_path):
    """train.py and python -m lightning_dpgan print a logged warning (the unverified image files)
    as 'train: warning: ...'."""
    import subprocess
    import sys
    from pathlib import Path

    from run_helpers import tiny_run_args

    repo = Path(__file__).resolve().parents[1]
    args = tiny_run_args(tiny_image_data_dir, tmp_path / "run", steps=1)
    start = [str(repo / "train.py"), *args[1:]] if entry == "train.py" else ["-m", "lightning_dpgan", *args]
    result = subprocess.run([sys.executable, *start], capture_output=True, text=True, cwd=repo, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if "--data.verify_checksums false" in line]
    assert len(said) == 4 and all(line.startswith("train: warning: mnist: --data.verify_checksums false: ")
                                  for line in said), said  # one per file: each printed once, in train's words

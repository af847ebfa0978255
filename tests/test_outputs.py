"""The writers of a run's files (``lightning_dpgan.outputs``): what the bytes on disk hold --
valid JSON, one CSV header, pixels mapped and tiled as documented -- and that a failed write
leaves the earlier file as it was."""
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from lightning_dpgan.outputs import (
    OutputWriteError,
    atomic_write,
    image_grid,
    images_to_uint8,
    write_csv_chunks,
    write_json,
    write_yaml,
)
from run_helpers import grid_tiles


def strict_json(path):
    """JSON as the standard has it: Python's reader would accept NaN and Infinity."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_json_reports_hold_no_nan_or_infinity(tmp_path):
    """An unbounded epsilon (inf) or an undefined figure (nan) is written as null: ``Infinity``
    is not JSON, and other tools reading privacy.json would refuse the whole report."""
    data = {"epsilon": math.inf, "loss": float("nan"), "steps": np.int64(3), "delta": torch.tensor(1e-5),
            "per_step": [1.0, -math.inf, np.float32(0.5)], "nested": {1: torch.tensor([1.0, 2.0])}}
    report = strict_json(write_json(tmp_path / "privacy.json", data))
    assert report == {"epsilon": None, "loss": None, "steps": 3, "delta": pytest.approx(1e-5),
                      "per_step": [1.0, None, 0.5], "nested": {"1": [1.0, 2.0]}}
    assert list(report) == list(data)  # in the order written, not sorted
    import yaml

    assert yaml.safe_load(write_yaml(tmp_path / "c.yaml", {"e": math.inf}).read_text()) == {"e": None}


def test_csv_chunks_are_one_table_with_one_header(tmp_path):
    chunks = [pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}), pd.DataFrame({"a": [3], "b": ["z"]})]
    out = write_csv_chunks(tmp_path / "t.csv", iter(chunks))
    assert out.read_text() == "a,b\n1,x\n2,y\n3,z\n"


def test_a_failed_write_keeps_the_earlier_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "synthetic.csv"
    path.write_text("earlier\n")

    def half_then_full(handle):
        handle.write(b"half a table")
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputWriteError, match="still holds its previous content") as excinfo:
        atomic_write(path, half_then_full)
    assert excinfo.value.errno == 28 and "Free some disk space" in str(excinfo.value)
    assert path.read_text() == "earlier\n" and sorted(p.name for p in tmp_path.iterdir()) == ["synthetic.csv"]


def test_a_file_where_the_path_needs_a_folder_is_named_not_the_permissions(tmp_path):
    """``sample --out a.csv/x.csv`` beside an existing a.csv: mkdir says only "File exists"."""
    (tmp_path / "a.csv").write_text("earlier\n")
    with pytest.raises(OutputWriteError) as excinfo:
        atomic_write(tmp_path / "a.csv" / "x.csv", lambda handle: handle.write(b"rows"))
    message = str(excinfo.value)
    assert f"{tmp_path / 'a.csv'} is a file, where the path needs a folder" in message
    assert "writable" not in message and (tmp_path / "a.csv").read_text() == "earlier\n"


def test_a_name_too_long_for_the_file_system_is_said_with_the_usual_advice(tmp_path):
    """Asking whether such a path exists raises OSError itself: it did so inside the error's own
    message, which then lost its "Nothing was half-written"."""
    with pytest.raises(OutputWriteError, match="File name too long. Nothing was half-written: x.csv was not created"):
        atomic_write(tmp_path / ("n" * 300) / "x.csv", lambda handle: handle.write(b"rows"))


def test_a_full_disk_quota_is_said_as_a_full_disk(tmp_path):
    """EDQUOT (a user's quota on a shared cluster) is a full disk to the user: free space, not permissions."""
    import errno

    message = str(OutputWriteError(tmp_path / "y.json", OSError(errno.EDQUOT, "Disk quota exceeded")))
    assert "Free some disk space" in message and "writable" not in message


def test_an_output_reaches_the_disk_before_it_is_renamed_into_place(tmp_path, monkeypatch):
    """Renamed without fsync, a crash (power, a node lost) can leave the report in place and empty."""
    import os

    events, real_fsync, real_replace = [], os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda *args: (events.append("replace"), real_replace(*args))[1])
    write_json(tmp_path / "privacy.json", {"epsilon": 1.0})
    assert events == ["fsync", "replace"] and strict_json(tmp_path / "privacy.json") == {"epsilon": 1.0}


def test_pixels_map_minus_one_to_zero_and_one_to_255_clipping_outside():
    values = torch.tensor([-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 4.0]).view(1, 1, 1, 7)
    # independently: clip to [-1, 1], then (v + 1) / 2 * 255 to the nearest integer
    expected = [0, 0, round(0.25 * 255), 128, round(0.75 * 255), 255, 255]
    pixels = images_to_uint8(values)
    assert pixels.dtype == np.uint8 and pixels.shape == (1, 1, 1, 7)
    assert pixels.ravel().tolist() == expected


def test_grey_grid_tiles_images_row_major_with_padding():
    """Seven 28x28 images in 3 columns: image i at row i // 3, column i % 3, two pixels apart and
    from the edge; the rest of the grid (padding, the empty cells) is black."""
    pixels = np.stack([np.full((1, 28, 28), 10 * (i + 1), np.uint8) for i in range(7)])
    grid = image_grid(pixels, 3)
    assert grid.shape == (3 * 30 + 2, 3 * 30 + 2) and grid.dtype == np.uint8
    tiles = grid_tiles(grid, 7, columns=3)
    assert [int(t.min()) for t in tiles] == [int(t.max()) for t in tiles] == [10 * (i + 1) for i in range(7)]
    assert int(grid.sum()) == sum(10 * (i + 1) * 28 * 28 for i in range(7))  # nothing outside the tiles


def test_colour_grid_is_height_width_channels():
    pixels = np.zeros((2, 3, 4, 5), np.uint8)
    pixels[1, 2] = 200  # the second image's blue channel
    grid = image_grid(pixels, 2, padding=1)
    assert grid.shape == (1 + 4 + 1, 1 + 2 * (5 + 1), 3)
    assert (grid[1:5, 7:12, 2] == 200).all() and grid[..., :2].sum() == 0 and grid[1:5, 1:6].sum() == 0

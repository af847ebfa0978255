"""``sample_to_file`` and the checkpoint checks in front of it, with a stand-in module (no
training): how many records are written, from which seed, decoded how, and that a bad request
is refused before anything is drawn or any file is touched."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from lightning_dpgan import sampling
from lightning_dpgan.data.schema import Column, TableSchema
from lightning_dpgan.modules.base import CHECKPOINT_KEY
from lightning_dpgan.privacy.dp_label_model import label_network
from lightning_dpgan.quail import QuailLabeler
from lightning_dpgan.sampling import CheckpointError, read_run_info, resume_checkpoint, sample_to_file
from run_helpers import grid_tiles
from test_quail import LABELLED as QUAIL_SCHEMA

SCHEMA = TableSchema((Column("x", "continuous", bounds=(0.0, 10.0), source="test"),
                      Column("c", "categorical", categories=("a", "b", "c"), source="test")))


def fake_checkpoint(path, run, train_steps=7):
    """A file as ``GANModule.on_save_checkpoint`` leaves it, without any network in it."""
    torch.save({CHECKPOINT_KEY: {"format": 1, "train_steps": train_steps, "run": run}}, path)
    return path


class TableModule:
    """Stands in for a trained table generator: uniform encoded records from torch's stream."""

    def sample(self, n):
        return torch.rand(n, SCHEMA.encoded_dim)


class ImageModule:
    """A conditional image generator whose every pixel tells its label (and some noise)."""

    num_classes = 10
    data_shape = (1, 28, 28)

    def balanced_labels(self, n):
        return torch.arange(n) % self.num_classes

    def sample(self, n, labels):
        assert labels is not None and len(labels) == n
        base = (labels.float() / 9 * 2 - 1).view(-1, 1, 1, 1).expand(n, 1, 28, 28)
        return (base + 0.01 * torch.rand(n, 1, 28, 28)).clamp(-1, 1)


@pytest.fixture
def table_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr(sampling, "load_module", lambda path: TableModule())
    # as train writes it now: the files it read (here none that a test writes to) are kept in it
    return fake_checkpoint(tmp_path / "last.ckpt", {"model": "gan", "dataset": "csv", "schema": SCHEMA.to_dict(),
                                                    "data_files": [str(tmp_path / "private.csv")]})


@pytest.fixture
def image_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr(sampling, "load_module", lambda path: ImageModule())
    return fake_checkpoint(tmp_path / "last.ckpt", {"model": "gan", "dataset": "mnist"})


def expected_rows(seed, sizes):
    """The rows of a table drawn from ``seed`` in chunks of ``sizes``, decoded by the schema:
    what the table holds (its size probe is drawn aside and must not shift these draws)."""
    torch.manual_seed(seed)
    return pd.concat([SCHEMA.decode(TableModule().sample(k)) for k in sizes], ignore_index=True)


def test_a_table_holds_n_rows_of_the_seeds_own_draws_across_chunks(table_checkpoint, tmp_path, monkeypatch):
    """17 rows in chunks of 7: one header, 17 rows, and exactly the seed's draws -- the disk-size
    probe before them must not consume the stream (else -n 17 --seed 3 would not be the rows a
    reader reproducing --seed 3 gets)."""
    monkeypatch.setattr(sampling, "SAMPLE_CHUNK_ROWS", 7)
    out = sample_to_file(table_checkpoint, 17, tmp_path / "t.csv", seed=3)
    text = out.read_text()
    assert text.count("x,c") == 1
    table = pd.read_csv(out)
    assert list(table.columns) == ["x", "c"] and len(table) == 17
    expected = expected_rows(3, [7, 7, 3])
    np.testing.assert_allclose(table["x"].to_numpy(), expected["x"].to_numpy(), rtol=1e-12)
    assert table["c"].tolist() == expected["c"].astype(str).tolist()
    assert set(table["c"]) <= {"a", "b", "c"} and table["x"].between(0, 10).all()
    other = sample_to_file(table_checkpoint, 17, tmp_path / "other.csv", seed=4)
    assert not pd.read_csv(other).equals(table)  # another seed, other rows


def test_a_table_is_refused_before_drawing_when_the_disk_has_no_room(table_checkpoint, tmp_path, monkeypatch):
    import shutil

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=100))
    with pytest.raises(ValueError, match="-n 50 rows would take about"):
        sample_to_file(table_checkpoint, 50, tmp_path / "t.csv")
    assert not (tmp_path / "t.csv").exists()
    assert sample_to_file(table_checkpoint, 1, tmp_path / "t.csv").is_file()  # one row (~20 bytes) fits in 100


def test_the_room_is_that_of_the_disk_out_will_be_on_when_its_folder_is_new(table_checkpoint, tmp_path, monkeypatch):
    """``--out /big/disk/new/t.csv``: the folder to be made is on /big/disk, not where the command
    was typed, so the nearest folder that exists is measured."""
    import shutil

    measured = []
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: measured.append(path) or usage)
    monkeypatch.chdir(table_checkpoint.parent.parent)
    sample_to_file(table_checkpoint, 5, tmp_path / "new" / "deeper" / "t.csv")
    assert measured == [tmp_path]


def test_npz_images_keep_each_label_with_its_image_across_chunks(image_checkpoint, tmp_path, monkeypatch):
    """Drawn 4 at a time, image i must be of label i: a chunk asked for the first chunk's labels
    again would pair images with the wrong labels in the published arrays."""
    monkeypatch.setattr(sampling, "IMAGE_CHUNK", 4)
    out = sample_to_file(image_checkpoint, 10, tmp_path / "s.npz", seed=1)
    arrays = np.load(out)
    images, labels = arrays["images"], arrays["labels"]
    assert images.shape == (10, 1, 28, 28) and images.dtype == np.uint8 and labels.tolist() == list(range(10))
    # pixel of label k: (k / 9 * 2 - 1 + noise in [0, 0.01]) mapped from [-1, 1] to [0, 255]
    for image, label in zip(images, labels):
        assert abs(float(image.mean()) - label / 9 * 255) < 3, label
    again = np.load(sample_to_file(image_checkpoint, 10, tmp_path / "again.npz", seed=1))["images"]
    assert np.array_equal(again, images)
    assert not np.array_equal(np.load(sample_to_file(image_checkpoint, 10, tmp_path / "b.npz", seed=2))["images"], images)


def test_png_grid_has_the_columns_asked_for(image_checkpoint, tmp_path):
    out = sample_to_file(image_checkpoint, 7, tmp_path / "s.png", columns=3)
    picture = np.asarray(Image.open(out))
    assert picture.shape == (3 * 30 + 2, 3 * 30 + 2)  # 3 rows of 3 columns, 2-pixel padding
    tiles = grid_tiles(picture, 7, columns=3)
    for label, tile in enumerate(tiles):
        assert abs(float(tile.mean()) - label / 9 * 255) < 3, label


def test_classes_cycle_through_the_chunks_with_each_image_of_its_label(image_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(sampling, "IMAGE_CHUNK", 4)
    arrays = np.load(sample_to_file(image_checkpoint, 7, tmp_path / "s.npz", classes=[9, 0, 4]))
    assert arrays["labels"].tolist() == [9, 0, 4, 9, 0, 4, 9]
    for image, label in zip(arrays["images"], arrays["labels"]):
        assert abs(float(image.mean()) - label / 9 * 255) < 3, label


@pytest.mark.parametrize("classes, message", [
    ([], "one or more class indices"), ([-1], "whole numbers >= 0"), ([2, True], "whole numbers >= 0"),
    ([3, 1, 3], "names class 3 more than once"),
    # five classes for three images: classes 4 and 5 were left out without a word
    ([1, 2, 3, 4, 5], "-n 3 is fewer than the 5 --classes: each is drawn in turn, so the last 2 would get no image"),
])
def test_bad_classes_are_refused_before_the_checkpoint_is_read(tmp_path, classes, message):
    with pytest.raises(ValueError, match=message):
        sample_to_file(tmp_path / "missing.ckpt", 3, tmp_path / "s.npz", classes=classes)
    assert not (tmp_path / "s.npz").exists()


def test_classes_the_model_does_not_have_are_refused_before_writing(image_checkpoint, tmp_path):
    with pytest.raises(ValueError, match="--classes 10, 12: this model's classes are 0 to 9"):
        sample_to_file(image_checkpoint, 5, tmp_path / "s.npz", classes=[1, 10, 12])
    assert not (tmp_path / "s.npz").exists()


def test_classes_of_an_unconditional_image_model_are_refused(image_checkpoint, tmp_path, monkeypatch):
    class Unconditional(ImageModule):
        num_classes = None

    monkeypatch.setattr(sampling, "load_module", lambda path: Unconditional())
    with pytest.raises(ValueError, match="draws its images without a class"):
        sample_to_file(image_checkpoint, 5, tmp_path / "s.png", classes=[1])
    assert not (tmp_path / "s.png").exists()


def test_classes_of_a_table_model_are_refused_before_its_generator_is_loaded(table_checkpoint, tmp_path, monkeypatch):
    def never(path):
        raise AssertionError("the generator was loaded")

    monkeypatch.setattr(sampling, "load_module", never)
    with pytest.raises(ValueError, match="keep the rows of the classes you want"):
        sample_to_file(table_checkpoint, 5, tmp_path / "t.csv", classes=[1])
    assert not (tmp_path / "t.csv").exists()


@pytest.mark.parametrize("n", [0, -3, True, 2.5, "5"])
def test_a_bad_n_is_refused_before_the_checkpoint_is_read(tmp_path, monkeypatch, n):
    monkeypatch.setattr(sampling, "read_run_info", lambda path: pytest.fail("read the checkpoint"))
    with pytest.raises(ValueError, match="-n must be a whole number >= 1"):
        sample_to_file(tmp_path / "c.ckpt", n, tmp_path / "t.csv")
    assert not list(tmp_path.iterdir())


def test_the_checkpoint_itself_is_never_written_over(table_checkpoint):
    before = table_checkpoint.read_bytes()
    with pytest.raises(ValueError, match="is the checkpoint itself"):
        sample_to_file(table_checkpoint, 5, table_checkpoint, overwrite=True)
    assert table_checkpoint.read_bytes() == before


def test_the_runs_own_data_and_schema_files_are_never_written_over(tmp_path, monkeypatch):
    """Even with --overwrite: a run's config.yaml names the private CSV and the schema file it
    was trained with, and a synthetic table written over either loses what cannot be redrawn."""
    monkeypatch.setattr(sampling, "load_module", lambda path: TableModule())
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    checkpoint = fake_checkpoint(run / "checkpoints" / "last.ckpt", {"model": "gan", "dataset": "csv",
                                                                      "schema": SCHEMA.to_dict()})
    private, schema = tmp_path / "private.csv", tmp_path / "schema.yaml"
    for file in (private, schema):
        file.write_text("the user's own\n")
    (run / "config.yaml").write_text(f"data:\n  name: csv\n  csv: {private}\n  schema: {schema}\n")
    for out in (private, schema, tmp_path / "." / "private.csv"):
        with pytest.raises(ValueError, match="is a file the run trained on"):
            sample_to_file(checkpoint, 5, out, overwrite=True)
    monkeypatch.chdir(run / "checkpoints")  # the checkpoint given from its own folder: its run is still found
    with pytest.raises(ValueError, match="is a file the run trained on"):
        sample_to_file("last.ckpt", 5, "../../private.csv", overwrite=True)
    assert private.read_text() == schema.read_text() == "the user's own\n"
    assert len(pd.read_csv(sample_to_file(checkpoint, 5, tmp_path / "synthetic.csv"))) == 5  # any other file


def test_the_runs_own_data_is_never_written_over_when_its_config_is_gone(tmp_path, monkeypatch):
    """A checkpoint copied alone, or a run whose config.yaml was removed: the CSV it trained on was
    replaced by five synthetic rows with --overwrite. The checkpoint keeps the files now; one from
    before that refuses --overwrite of an existing file for a CSV run, where nothing can tell."""
    monkeypatch.setattr(sampling, "load_module", lambda path: TableModule())
    private, other = tmp_path / "private.csv", tmp_path / "other.csv"
    for file in (private, other):
        file.write_text("the user's own\n")
    run = {"model": "gan", "dataset": "csv", "schema": SCHEMA.to_dict()}
    kept = fake_checkpoint(tmp_path / "kept.ckpt", {**run, "data_files": [str(private)]})
    with pytest.raises(ValueError, match="is a file the run trained on"):
        sample_to_file(kept, 5, private, overwrite=True)
    assert len(pd.read_csv(sample_to_file(kept, 5, other, overwrite=True))) == 5  # not the run's: replaced
    other.write_text("the user's own\n")
    older = fake_checkpoint(tmp_path / "older.ckpt", run)
    for out in (private, other):
        with pytest.raises(ValueError, match="which files this run trained on cannot be told"):
            sample_to_file(older, 5, out, overwrite=True)
    assert private.read_text() == other.read_text() == "the user's own\n"
    assert len(pd.read_csv(sample_to_file(older, 5, tmp_path / "new.csv"))) == 5  # a new file: nothing to lose
    builtin = fake_checkpoint(tmp_path / "adult.ckpt", {**run, "dataset": "adult"})
    assert len(pd.read_csv(sample_to_file(builtin, 5, other, overwrite=True))) == 5  # its files are checksummed


def test_a_built_in_datasets_files_are_those_found_in_its_data_folder_not_its_downloads(tmp_path):
    """What a checkpoint keeps for sample --out to refuse: King's Kaggle file where the user keeps
    it (in the folder or its king/ subfolder), Adult's two files; none for a folder without them
    (the downloads are checksummed and fetched again), and none for a CSV, whose own are kept."""
    from lightning_dpgan.datamodules.adult import AdultDataModule
    from lightning_dpgan.datamodules.csv import CSVDataModule
    from lightning_dpgan.datamodules.king import KingDataModule
    from lightning_dpgan.run_folder import located_data_files

    fixtures = Path(__file__).parent / "fixtures"
    (tmp_path / "king").mkdir()
    original = tmp_path / "king" / "kc_house_data.csv"
    original.write_bytes((fixtures / "king_tiny" / "kc_house_data.csv").read_bytes())
    assert located_data_files(KingDataModule(data_dir=tmp_path)) == [str(original.resolve())]
    adult = fixtures / "adult_tiny"
    assert located_data_files(AdultDataModule(data_dir=adult)) == [str((adult / name).resolve())
                                                                   for name in ("adult.data", "adult.test")]
    assert located_data_files(AdultDataModule(data_dir=tmp_path)) == []  # only its downloads would be read
    assert located_data_files(CSVDataModule(csv=original, target="price", label_kind="continuous")) == []


def test_a_config_yaml_that_is_not_utf8_does_not_stop_sample_and_the_checkpoints_files_stay_guarded(tmp_path, monkeypatch):
    """config.yaml is read only to name the run's data files, which the checkpoint keeps too: one
    byte of Latin-1 in it (an editor's save) stopped `sample` with a bare codec error."""
    monkeypatch.setattr(sampling, "load_module", lambda path: TableModule())
    private = tmp_path / "private.csv"
    private.write_text("the user's own\n")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_bytes(b"data:\n  name: csv\n# caf\xe9\n")
    checkpoint = fake_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt",
                                 {"model": "gan", "dataset": "csv", "schema": SCHEMA.to_dict(), "data_files": [str(private)]})
    with pytest.raises(ValueError, match="is a file the run trained on"):
        sample_to_file(checkpoint, 5, private, overwrite=True)
    assert len(pd.read_csv(sample_to_file(checkpoint, 5, tmp_path / "synthetic.csv"))) == 5


def test_an_existing_out_is_kept_unless_overwrite(table_checkpoint, tmp_path):
    out = tmp_path / "synthetic.csv"
    out.write_text("earlier table\n")
    with pytest.raises(ValueError, match="exists: give another file, or --overwrite"):
        sample_to_file(table_checkpoint, 5, out)
    assert out.read_text() == "earlier table\n"
    sample_to_file(table_checkpoint, 5, out, overwrite=True)
    assert len(pd.read_csv(out)) == 5


@pytest.mark.parametrize("name, run", [
    ("t.png", {"model": "gan", "dataset": "csv", "schema": SCHEMA.to_dict()}),
    ("t.npz", {"model": "gan", "dataset": "csv", "schema": SCHEMA.to_dict()}),
    ("s.csv", {"model": "gan", "dataset": "mnist"}),
], ids=["table-png", "table-npz", "image-csv"])
def test_out_of_the_wrong_kind_is_refused(tmp_path, monkeypatch, name, run):
    monkeypatch.setattr(sampling, "load_module", lambda path: pytest.fail("loaded the generator"))
    with pytest.raises(ValueError, match="must end in"):
        sample_to_file(fake_checkpoint(tmp_path / "c.ckpt", run), 5, tmp_path / name)
    assert not (tmp_path / name).exists()


def test_an_upper_case_extension_is_the_same_kind_of_file(image_checkpoint, tmp_path):
    """samples.PNG was refused as "must end in .png or .npz"."""
    png = sample_to_file(image_checkpoint, 4, tmp_path / "samples.PNG")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with np.load(sample_to_file(image_checkpoint, 4, tmp_path / "samples.NPZ")) as arrays:
        assert arrays["images"].shape[0] == 4


def test_an_upper_case_csv_extension_is_a_table(table_checkpoint, tmp_path):
    assert len(pd.read_csv(sample_to_file(table_checkpoint, 5, tmp_path / "synthetic.CSV"))) == 5


def test_an_extension_alone_as_out_is_told_to_take_a_name(tmp_path, monkeypatch):
    """".csv" has no suffix to Python (a hidden file's name): it was refused as "must end in .csv,
    got .csv"."""
    monkeypatch.setattr(sampling, "load_module", lambda path: pytest.fail("loaded the generator"))
    checkpoint = fake_checkpoint(tmp_path / "c.ckpt", {"model": "gan", "dataset": "csv", "schema": SCHEMA.to_dict()})
    with pytest.raises(ValueError, match=r"must end in \.csv, got a name before the extension, e\.g\. synthetic\.csv, "
                                         r"not \.csv"):
        sample_to_file(checkpoint, 5, tmp_path / ".csv")


def test_more_images_than_free_memory_holds_are_refused_before_drawing(image_checkpoint, tmp_path, monkeypatch):
    """A trillion images ended in torch's allocation traceback (or, unconditional, ran until the
    system killed it): the float32 pixels gathered before writing are counted first."""
    monkeypatch.setattr(ImageModule, "balanced_labels", lambda self, n: pytest.fail("drew labels"))
    with pytest.raises(ValueError, match=r"-n 1000000000000 images would take about 2852\.2 TiB of memory"):
        sample_to_file(image_checkpoint, 10**12, tmp_path / "huge.npz")
    assert not (tmp_path / "huge.npz").exists()


def test_free_memory_is_what_the_kernel_can_give_not_only_its_free_pages(monkeypatch):
    """Free pages alone leave out the page cache the kernel reclaims on demand: on a machine whose
    cache had filled, it read 12 GiB of 23 GiB available and refused draws that fit."""
    import io
    import os

    meminfo = "MemTotal:       100 kB\nMemFree:         10 kB\nMemAvailable:    50 kB\n"
    monkeypatch.setattr(sampling, "open", lambda path, *args: io.StringIO(meminfo), raising=False)
    assert sampling.free_memory() == 50 * 1024

    def no_proc(path, *args):
        raise FileNotFoundError(path)

    monkeypatch.setattr(sampling, "open", no_proc, raising=False)  # not Linux: the free pages POSIX reports
    monkeypatch.setattr(os, "sysconf", lambda name: {"SC_AVPHYS_PAGES": 3, "SC_PAGE_SIZE": 4096}[name])
    assert sampling.free_memory() == 3 * 4096


def test_out_named_as_a_folder_is_refused_not_written_as_a_file(table_checkpoint, tmp_path):
    """--out new.csv/ was written as the file new.csv (the path drops the slash)."""
    with pytest.raises(ValueError, match="names a folder: give a file in it"):
        sample_to_file(table_checkpoint, 3, f"{tmp_path / 'new.csv'}/")
    assert list(tmp_path.iterdir()) == [table_checkpoint]


def test_out_that_is_a_folder_is_refused(table_checkpoint, tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(ValueError, match="names a folder: give a file in it"):
        sample_to_file(table_checkpoint, 5, tmp_path / "out")


@pytest.mark.parametrize("out", ["", "  "])
def test_an_empty_out_is_refused_as_empty_not_as_the_current_folder(table_checkpoint, out):
    """--out '' (an unset shell variable) read as '.', and was refused as "--out . names a folder"."""
    with pytest.raises(ValueError, match=r"^--out is empty: give the file to write"):
        sample_to_file(table_checkpoint, 3, out)


def test_a_run_folder_given_as_checkpoint_names_the_file_to_pass(tmp_path):
    with pytest.raises(CheckpointError, match="is a folder, not a checkpoint") as excinfo:
        read_run_info(tmp_path)
    assert str(tmp_path / "checkpoints" / "last.ckpt") in str(excinfo.value)


def test_a_checkpoints_folder_given_as_checkpoint_names_the_file_in_it(tmp_path):
    """The run's checkpoints/ itself was told to pass checkpoints/checkpoints/last.ckpt."""
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(CheckpointError, match="is a folder, not a checkpoint") as excinfo:
        read_run_info(tmp_path / "checkpoints")
    assert str(excinfo.value).endswith(f"e.g. {tmp_path / 'checkpoints' / 'last.ckpt'}")


def test_a_folder_of_checkpoints_of_its_own_names_one_it_holds(tmp_path):
    """A folder holding step-500.ckpt (checkpoints copied out of their run) was told to pass
    FOLDER/checkpoints/last.ckpt, which it does not have."""
    import os

    (tmp_path / "step-500.ckpt").write_bytes(b"")
    (tmp_path / "step-1000.ckpt").write_bytes(b"")
    os.utime(tmp_path / "step-500.ckpt", (1_000, 1_000))  # written first
    with pytest.raises(CheckpointError, match="is a folder, not a checkpoint") as excinfo:
        read_run_info(tmp_path)
    assert str(excinfo.value).endswith(f"e.g. {tmp_path / 'step-1000.ckpt'}")  # the newest it holds
    # a run folder whose checkpoints/ holds step files but no last.ckpt: one of those, not last.ckpt
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step-20.ckpt").write_bytes(b"")
    with pytest.raises(CheckpointError) as excinfo:
        read_run_info(run)
    assert str(excinfo.value).endswith(f"e.g. {run / 'checkpoints' / 'step-20.ckpt'}")


def test_a_checkpoint_made_by_hand_with_run_information_is_refused_not_a_traceback(tmp_path):
    """torch.save of the run information alone passed every check, then Lightning's loader ended
    in KeyError: 'pytorch-lightning_version'."""
    from lightning_dpgan.sampling import load_module

    path = fake_checkpoint(tmp_path / "c.ckpt", {"model": "gan", "dataset": "mnist"})
    with pytest.raises(CheckpointError, match="not a --model gan Lightning can rebuild .*KeyError"):
        load_module(path)


def test_run_information_without_a_model_is_refused(tmp_path):
    path = fake_checkpoint(tmp_path / "c.ckpt", {"dataset": "mnist"})
    with pytest.raises(CheckpointError, match="was not written by lightning-dpgan's train"):
        read_run_info(path)


def test_resume_returns_the_steps_the_checkpoint_holds(tmp_path):
    run = {"model": "gan", "dataset": "mnist"}
    assert resume_checkpoint(fake_checkpoint(tmp_path / "a.ckpt", run, 7), "gan", "mnist") == (run, 7)
    assert resume_checkpoint(fake_checkpoint(tmp_path / "b.ckpt", run, None), "gan", "mnist") == (run, 0)


def test_resume_refuses_a_quail_checkpoint_for_a_plain_run_and_the_reverse(tmp_path):
    plain = fake_checkpoint(tmp_path / "plain.ckpt", {"model": "dpgan", "dataset": "adult"})
    quail = fake_checkpoint(tmp_path / "quail.ckpt", {"model": "dpgan", "dataset": "adult", "quail": {}})
    with pytest.raises(CheckpointError, match="is not a QUAIL run's checkpoint, and this run is a QUAIL one"):
        resume_checkpoint(plain, "dpgan", "adult", quail=True)
    with pytest.raises(CheckpointError, match="is a QUAIL run's checkpoint, and this run is not one"):
        resume_checkpoint(quail, "dpgan", "adult", quail=False)
    assert resume_checkpoint(quail, "dpgan", "adult", quail=True)[0]["quail"] == {}


def test_a_table_whose_size_is_a_chunk_plus_one_keeps_its_last_row(table_checkpoint, tmp_path, monkeypatch):
    """15 rows in chunks of 7: the last chunk is a single row, and it is written."""
    monkeypatch.setattr(sampling, "SAMPLE_CHUNK_ROWS", 7)
    assert len(pd.read_csv(sample_to_file(table_checkpoint, 15, tmp_path / "t.csv"))) == 15


class FeatureModule:
    def sample(self, n):
        return torch.rand(n, QUAIL_SCHEMA.without_label().encoded_dim)


@pytest.fixture
def quail_checkpoint(tmp_path, monkeypatch):
    """A QUAIL run whose label model is a coin toss (equal scores): 'sample' draws, 'most-likely' would give 'no'."""
    monkeypatch.setattr(sampling, "load_module", lambda path: FeatureModule())
    network = label_network("logistic", 3, 2, [])
    with torch.no_grad():
        network[0].weight.zero_()
        network[0].bias.zero_()
    labeler = QuailLabeler(network, "logistic", [], QUAIL_SCHEMA, {"epsilon": 1.0}, labels="sample")
    return fake_checkpoint(tmp_path / "last.ckpt", {"model": "gan", "dataset": "csv", "schema": QUAIL_SCHEMA.to_dict(),
                                                    "quail": labeler.to_dict(), "data_files": []})


def test_sample_draws_quail_labels_from_its_seed_as_the_checkpoint_says(quail_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(sampling, "SAMPLE_CHUNK_ROWS", 100)
    tables = {name: pd.read_csv(sample_to_file(quail_checkpoint, 400, tmp_path / f"{name}.csv", seed=seed))
              for name, seed in (("a", 1), ("again", 1), ("b", 2))}
    assert list(tables["a"].columns) == ["x", "y", "c"]
    pd.testing.assert_frame_equal(tables["a"], tables["again"])  # one seed, one table, labels included
    yes = (tables["a"]["y"] == "yes").mean()
    assert 0.4 < yes < 0.6  # drawn ('sample'), not the argmax, which is 'no' for every row
    assert not tables["a"]["y"].equals(tables["b"]["y"])  # another seed, other label draws
    assert not tables["a"]["y"].iloc[:100].reset_index(drop=True).equals(tables["a"]["y"].iloc[100:200].reset_index(drop=True))


def test_the_runs_data_named_through_a_symlinked_folder_is_still_guarded(tmp_path, monkeypatch):
    """The checkpoint names the CSV through a symlinked folder; --out names its real path: both are one file."""
    monkeypatch.setattr(sampling, "load_module", lambda path: TableModule())
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    private = real / "private.csv"
    private.write_text("the user's own\n")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    checkpoint = fake_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt",
                                 {"model": "gan", "dataset": "csv", "schema": SCHEMA.to_dict(),
                                  "data_files": [str(tmp_path / "link" / "private.csv")]})
    with pytest.raises(ValueError, match="is a file the run trained on"):
        sample_to_file(checkpoint, 5, private, overwrite=True)
    assert private.read_text() == "the user's own\n"


def test_without_overwrite_an_existing_out_is_told_to_add_overwrite(tmp_path, monkeypatch):
    """Without --overwrite the file is simply kept: said as such, not as a warning about private records."""
    monkeypatch.setattr(sampling, "load_module", lambda path: TableModule())
    older = fake_checkpoint(tmp_path / "older.ckpt", {"model": "gan", "dataset": "csv", "schema": SCHEMA.to_dict()})
    out = tmp_path / "earlier.csv"
    out.write_text("earlier\n")
    with pytest.raises(ValueError, match="exists: give another file, or --overwrite"):
        sample_to_file(older, 5, out)


def test_a_checkpoint_is_read_for_its_checksums_once_while_unchanged(tmp_path, monkeypatch):
    """evaluate checks an image run's checkpoint, then loads it to draw: a G-PATE checkpoint of
    tens of GB was read whole twice. Changed since, it is read again, and a damage is found."""
    import os
    import zipfile

    from lightning_dpgan.sampling import verify_checkpoint_bytes

    path = tmp_path / "last.ckpt"
    torch.save({"weights": torch.arange(1000.0)}, path)
    reads = []
    testzip = zipfile.ZipFile.testzip
    monkeypatch.setattr(zipfile.ZipFile, "testzip", lambda self: reads.append(1) or testzip(self))
    verify_checkpoint_bytes(path)
    verify_checkpoint_bytes(path)
    assert len(reads) == 1
    data = bytearray(path.read_bytes())
    data[data.find(b"\x00\x00\x80\x3f") + 2] ^= 0x01  # inside the tensor 1.0's bytes: the record's CRC no longer holds
    path.write_bytes(bytes(data))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a rewrite, whatever the clock's grain
    with pytest.raises(CheckpointError, match="does not match the checksum"):
        verify_checkpoint_bytes(path)
    assert len(reads) == 2

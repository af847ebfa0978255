"""Drawing synthetic records from a checkpoint: what a data holder publishes."""
from __future__ import annotations

import io
import json
import math
import os
import pickle
import sys
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from lightning_dpgan import registry
from lightning_dpgan.modules.base import CHECKPOINT_KEY
from lightning_dpgan.data.schema import TableSchema
from lightning_dpgan.data.table_transformer import TableTransformer
from lightning_dpgan.error_text import byte_size, first_line
from lightning_dpgan.outputs import (atomic_write, file_sha256, image_grid, images_to_uint8, write_csv_chunks,
                                     write_json, write_png)
from lightning_dpgan.privacy.noise_source import fixed_seed_sources, not_for_release
from lightning_dpgan.python_run_info import refuse_outside_python, trained_in_python
from lightning_dpgan.run_folder import LAST_CHECKPOINT


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt, or not from lightning-dpgan."""


def read_run_info(path: str | Path) -> dict[str, Any]:
    """The run information stored by ``GANModule.on_save_checkpoint``; refuses foreign files."""
    return _checkpoint_record(path)["run"]


def read_spent_privacy(path: str | Path) -> dict[str, Any] | None:
    """The (epsilon, delta) the privacy strategy had spent when the checkpoint was saved
    (``PrivacyStrategy.spent_figures``; at the end of training, what ``privacy.json`` states);
    None for a run without a strategy, or a checkpoint from before the figures were kept."""
    return spent_privacy(read_checkpoint(path))


def strategy_state(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The privacy strategy's state in a checkpoint already read ({} for a run without one)."""
    states = (checkpoint.get("callbacks") or {}).values()
    return next((state for state in states if isinstance(state, dict) and "strategy" in state), {})


def spent_privacy(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`read_spent_privacy` of a checkpoint already read."""
    state = strategy_state(checkpoint)
    if not isinstance(state.get("spent"), dict):
        return None
    spent, accountant = dict(state["spent"]), state.get("accountant")
    if "accounting" not in spent and isinstance(accountant, dict) and "accounting" in accountant:
        spent["accounting"] = accountant["accounting"]  # a teacher checkpoint from before spent said which
    return spent


def strategy_segments(checkpoint: dict[str, Any]) -> list[dict[str, Any]]:
    """The training segments a checkpoint's privacy strategy recorded (none without one)."""
    segments = strategy_state(checkpoint).get("segments")
    return segments if isinstance(segments, list) else []


def guarantee_note(path: str | Path) -> str:
    """What ``sample`` tells its user the records it drew are released under: drawing from a
    trained generator is post-processing, so they carry the checkpoint's spend (the figures its
    run's ``privacy.json`` states) whatever their number, and a run without privacy carries none.
    The checkpoint is read once (``sample`` has checked it already)."""
    checkpoint = read_checkpoint(path)
    run = checkpoint[CHECKPOINT_KEY]["run"]
    if run.get("privacy") == "none":
        return "trained without privacy: these records carry no (epsilon, delta) guarantee"
    if run.get("audit_trial"):
        return (f"warning: these records are not for release: the checkpoint is of {run['audit_trial']}. Release "
                "records drawn from a generator trained by train")
    if trained_in_python(run):
        report = "the privacy_report() of the strategy that trained it"
    elif (beside := run_of(Path(path)) / "privacy.json").is_file():
        report = ("its run's privacy.json" if not reports_another_run(beside, run) else
                  "the privacy.json of the run that wrote it; the privacy.json beside it is another run's (their "
                  "lineage, the run ids training went through, differs) and states another spend than this one")
    else:  # a run stopped before its end (SIGTERM) writes it when continued; an earlier one in previous/ is not it
        report = ("the privacy.json of the run that wrote it, which is not beside it: a run stopped before its end "
                  "writes it when continued, and a checkpoint copied out of its run folder left it there")
    if sources := fixed_seed_sources(strategy_segments(checkpoint)):
        return f"warning: these records are not for release: the checkpoint's run is not private: {not_for_release(sources)}"
    spent = spent_privacy(checkpoint)
    if spent is None:  # a checkpoint from before the figures were kept
        return f"the checkpoint does not record its privacy spend: {report} states the guarantee"
    epsilon = "not finite" if spent["epsilon"] is None else f"{spent['epsilon']:.6g}"
    if spent.get("accounting") == "data-dependent":
        return data_dependent_note(epsilon, spent, report)
    if spent.get("segments_stopped_on_the_votes"):  # data-independent since a resume
        from lightning_dpgan.callbacks.teachers import votes_decided_note

        voted = votes_decided_note(spent["segments_stopped_on_the_votes"], spent.get("segments_accounting_not_recorded", False))
        return (f"released under the checkpoint's privacy spend, epsilon {epsilon} and delta {spent['delta']:g}, the "
                f"data-independent bound of the queries the run asked (how it was accounted: {report}). But {voted}. "
                "Drawing more records spends nothing more")
    return (f"released under the checkpoint's privacy spend, epsilon {epsilon} and delta {spent['delta']:g} (how it "
            f"was accounted: {report}); drawing more records spends nothing more")


def reports_another_run(report: Path, run: dict[str, Any]) -> bool:
    """Whether the ``privacy.json`` at ``report`` is of another run than the checkpoint's run
    information ``run`` (:func:`~lightning_dpgan.lineage.of_other_runs`); False where it cannot
    be read as one."""
    from lightning_dpgan.lineage import of_other_runs

    try:
        written = json.loads(report.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(written, dict) and of_other_runs(written, run)


def data_dependent_note(epsilon: str, spent: dict[str, Any], report: str) -> str:
    """``sample``'s note for a teacher strategy under data-dependent accounting: the checkpoint's
    epsilon is the figure the PATE papers report, computed from the teachers' votes and so not
    itself differentially private; the data-independent bound of the queries the run asked holds
    whatever their votes, but how many it asked was decided on the votes too."""
    from lightning_dpgan.callbacks.teachers import QUERY_COUNT_CAVEAT

    if "epsilon_data_independent" in spent:
        independent = spent["epsilon_data_independent"]
        bound = f"epsilon {'not finite' if independent is None else format(independent, '.6g')}"
    else:  # a checkpoint from before spent kept it
        bound = "privacy.json's epsilon_data_independent"
    if bound == f"epsilon {epsilon}":  # the votes were not unanimous enough to price any lower
        return (f"released under the checkpoint's privacy spend, epsilon {epsilon} and delta {spent['delta']:g}: both the "
                "data-dependent figure the PATE papers report and the data-independent bound of the queries the run "
                f"asked, which holds whatever their votes (how it was accounted: {report}). But {QUERY_COUNT_CAVEAT}. "
                "Drawing more records spends nothing more")
    return (f"the checkpoint's epsilon {epsilon} (delta {spent['delta']:g}) is the data-dependent figure the PATE papers "
            "report: computed from the teachers' votes, it is not itself differentially private. The data-independent "
            f"bound of the queries the run asked is {bound} at that delta (how it was accounted: {report}); "
            f"{QUERY_COUNT_CAVEAT}. Drawing more records spends nothing more")


def untrained_warning(path: str | Path) -> str | None:
    """For ``sample``: that the checkpoint's generator never took a step, so what it draws is its
    random initialisation (``train`` said so as it ended; a user sampling later may not have read
    it). None for a trained generator, and for checkpoints that predate the count."""
    record = read_checkpoint(path)[CHECKPOINT_KEY]
    if record.get("generator_updates") != 0:
        return None
    return (f"the checkpoint's generator took no update in its {record['train_steps']} training steps: these records "
            "are drawn from its random initialisation, not learnt from the data")


def _checkpoint_record(path: str | Path) -> dict[str, Any]:
    """What ``GANModule.on_save_checkpoint`` stored (the run information and the step count),
    read once; refuses a missing, corrupt or foreign file by name."""
    path = Path(path)
    if path.is_dir():
        example = path / (LAST_CHECKPOINT.name if path.name == LAST_CHECKPOINT.parent.name else LAST_CHECKPOINT)
        held = [*path.glob("*.ckpt"), *path.glob(f"{LAST_CHECKPOINT.parent.name}/*.ckpt")]
        if not example.is_file() and held:  # checkpoints of their own: the newest written
            example = max(held, key=lambda checkpoint: checkpoint.stat().st_mtime)
        raise CheckpointError(f"{path} is a folder, not a checkpoint: pass the checkpoint file in it, e.g. {example}")
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    if not zipfile.is_zipfile(path):  # torch.load's own words would advise re-saving it for mmap
        raise CheckpointError(f"{path} is not a readable checkpoint (corrupt or truncated?): it "
                              f"is not the zip archive torch.save writes. {_CHECKPOINT_HINT}")
    try:
        checkpoint = read_checkpoint(path)
    except Exception as error:  # torch.load of a foreign file: RuntimeError, UnpicklingError, KeyError, ...
        if isinstance(error, pickle.UnpicklingError) and "Weights only load failed" in str(error):
            # torch's own words say how to load it anyway, in terminal colours
            raise CheckpointError(f"{path} holds Python objects, not only the tensors and settings a checkpoint of "
                                  f"train holds, and is not loaded (it could run code). {_CHECKPOINT_HINT}") from error
        raise CheckpointError(f"{path} is not a readable checkpoint (corrupt or truncated?): {type(error).__name__}: "
                              f"{first_line(error)}. {_CHECKPOINT_HINT}") from error
    info = checkpoint.get(CHECKPOINT_KEY) if isinstance(checkpoint, dict) else None
    if not isinstance(info, dict) or not isinstance(info.get("run"), dict) or "model" not in info["run"]:
        raise CheckpointError(f"{path} was not written by lightning-dpgan's train (no run information in it; a Trainer "
                              "built in Python records it for the models train names, on an image or table datamodule, "
                              f"but not for QUAIL's synthesizer alone). {_CHECKPOINT_HINT}")
    return info


#: said with every unreadable checkpoint, whichever command read it (sample, evaluate, train --resume)
_CHECKPOINT_HINT = "A run's checkpoint is the checkpoints/last.ckpt that train wrote in the run's folder, whole."


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint whose tensors stay in the file until used (memory-mapped): a PATE run's
    checkpoint holds thousands of teachers and their Adam state (~20 GB for the G-PATE ε = 1
    preset), which reading the run information or the generator must not load."""
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def verify_checkpoint_bytes(path: str | Path) -> None:
    """Refuse a checkpoint whose bytes changed after ``train`` wrote it (a disk or copy error).

    ``torch.save`` stores a CRC-32 of every record of its zip archive, but ``torch.load`` does
    not check them: a flipped bit inside a tensor loads as a silently wrong weight, and a resumed
    run or its samples would carry it. Reading every record once against its checksum costs
    seconds even for a G-PATE checkpoint of tens of GB (about 2 GB/s), so it is done before
    training resumes from a file and before samples are drawn from one, not for reading the run
    information alone. A file checked once in this process is not read again while its size and
    time are unchanged (evaluate checks an image run's checkpoint, then loads it to draw)."""
    path = Path(path)
    try:
        seen = path.stat()
        stamp = (str(path.resolve()), seen.st_size, seen.st_mtime_ns)
    except OSError:
        stamp = None  # the archive's own open below names the problem
    if stamp is not None and stamp in _verified_checkpoints:
        return
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as error:
        raise CheckpointError(f"{path} is not a readable checkpoint (corrupt or truncated?): {type(error).__name__}: "
                              f"{first_line(error)}. {_CHECKPOINT_HINT}") from error
    if damaged is not None:
        record = damaged.split("/", 1)[-1]  # under the archive's folder, named after the file torch.save wrote
        raise CheckpointError(f"{path} is corrupt: its record {record} does not match the checksum it was written "
                              "with, so its weights cannot be trusted. Restore the file from a copy, or train again.")
    if stamp is not None:
        _verified_checkpoints.add(stamp)


#: (path, size, modification time) of the checkpoints :func:`verify_checkpoint_bytes` found whole
_verified_checkpoints: set[tuple[str, int, int]] = set()


def checkpoint_steps(path: str | Path) -> int:
    """The training steps a checkpoint of ``train`` holds (0 where it does not say); refuses a
    missing, corrupt or foreign file as :func:`resume_checkpoint` does."""
    return _train_steps(_checkpoint_record(path))


def _train_steps(record: dict[str, Any]) -> int:
    steps = record.get("train_steps")
    return steps if isinstance(steps, int) else 0


def resume_checkpoint(path: str | Path, model: str, dataset: str, quail: bool = False) -> tuple[dict[str, Any], int]:
    """Refuse a ``--resume`` checkpoint that is missing, corrupt, foreign, or from a run of another
    model or dataset -- before anything is built, trained or written; return its run information
    and the training steps it holds (0 where it does not say), from one read of the file.
    A QUAIL run and a run of its synthesizer alone are different runs: resuming one from the
    other would drop (or invent) the label model's cost."""
    record = _checkpoint_record(path)
    info = record["run"]
    refuse_outside_python(info, path, "--resume")
    if ("quail" in info) != quail:
        theirs, ours = ("a QUAIL", "not") if "quail" in info else ("not a QUAIL", "a QUAIL")
        raise CheckpointError(f"--resume {path} is {theirs} run's checkpoint, and this run is {ours} one: resume "
                              "with the model it was trained with (--model quail for a QUAIL run), or drop --resume.")
    theirs = (info.get("model"), info.get("dataset"))
    if theirs != (model, dataset):
        flag = "--model quail --quail-synthesizer" if quail else "--model"  # a QUAIL run's model is its synthesizer
        raise CheckpointError(
            f"--resume {path} is a checkpoint of {flag} {theirs[0]} --dataset {theirs[1]}, but this run is "
            f"{flag} {model} --dataset {dataset}. Resume with the model and dataset it was trained with, "
            "or drop --resume to start a new run."
        )
    verify_checkpoint_bytes(path)
    return info, _train_steps(record)


def table_decoder(info: dict[str, Any]) -> Any:
    """What turns a table run's generated records into rows: its mode-specific transformer when
    it trained on one, else its schema's min-max / one-hot encoding (of the features alone for
    QUAIL, whose synthesizer generates no label)."""
    if "table_transformer" in info:
        return TableTransformer.from_dict(info["table_transformer"])
    schema = TableSchema.from_dict(info["schema"])
    return schema.without_label() if "quail" in info else schema


def table_labeler(info: dict[str, Any]) -> Any:
    """QUAIL's label model from a run's information; ``None`` for other runs."""
    if "quail" not in info:
        return None
    from lightning_dpgan.quail import QuailLabeler

    return QuailLabeler.from_dict(info["quail"])


def synthetic_rows(module: Any, decoder: Any, labeler: Any, n: int) -> Any:
    """``n`` generated table rows, decoded; labelled by QUAIL's label model when there is one."""
    rows = decoder.decode(module.sample(n))
    return rows if labeler is None else labeler.label(rows)


#: Rows generated, decoded and written at a time by ``sample``: any ``-n`` fits in memory.
SAMPLE_CHUNK_ROWS = 100_000


#: rows drawn to estimate a table's size on disk (from a random stream of their own)
SIZE_PROBE_ROWS = 200


def check_room_for_table(out: Path, n: int, module: Any, decoder: Any, labeler: Any) -> None:
    """Refuse, before writing, a table of ``n`` rows that the disk holding ``out`` has no room
    for: its size estimated from a few rows drawn aside, a chunk at most (the table's own draws
    are those of the same seed without the probe). A full disk would end the write anyway, after
    minutes or hours, with nothing to show for it."""
    import shutil

    with torch.random.fork_rng():
        probe = synthetic_rows(module, decoder, labeler, min(n, SIZE_PROBE_ROWS, SAMPLE_CHUNK_ROWS))
    per_row = len(probe.to_csv(index=False, header=False).encode()) / len(probe)
    needed = n * per_row
    held_by = next(folder for folder in out.absolute().parents if folder.exists())  # --out's folder may be new
    free = shutil.disk_usage(held_by).free
    if needed > free:
        raise ValueError(f"-n {n} rows would take about {byte_size(needed)} (about {per_row:.0f} bytes a row), "
                         f"and the disk holding --out {out} has {byte_size(free)} free: draw fewer rows, or "
                         "write them elsewhere")


def free_memory() -> int | None:
    """Bytes of memory available to a new allocation, or None where the system does not say: Linux's
    MemAvailable (free memory and the page cache the kernel can reclaim; free memory alone, which
    long-running machines fill with cache, refused draws that fit), else free pages (POSIX)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # in kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory_for_images(n: int, module: Any, remedy: str = "draw fewer at a time") -> None:
    """Refuse, before drawing, ``n`` images that the memory this machine has free cannot hold:
    they are gathered as float32 before they are written or scored (a trillion asked for ended in
    torch's allocation traceback, or ran until the system killed it)."""
    needed = n * math.prod(module.data_shape) * 4  # float32 pixels, gathered on the CPU
    free = free_memory()
    if free is not None and needed > free:
        raise ValueError(f"-n {n} images would take about {byte_size(needed)} of memory as they are drawn, and "
                         f"this machine has {byte_size(free)} free: {remedy}")


def synthetic_row_chunks(module: Any, decoder: Any, labeler: Any, n: int) -> Iterator[Any]:
    """:func:`synthetic_rows` of ``n`` rows, :data:`SAMPLE_CHUNK_ROWS` at a time."""
    chunk = SAMPLE_CHUNK_ROWS
    for start in range(0, n, chunk):
        yield synthetic_rows(module, decoder, labeler, min(chunk, n - start))


#: Images drawn per generator call: one chunk's activations are in memory at a time (``sample``
#: keeps no graph). 60,000 MNIST images from a DCGAN in one call took about 19 GiB (0.32 GB per
#: 1,000); 20,000 in chunks of 10,000 peaked at 3.9 GiB, in chunks of 1,000 at 0.8 GiB, and
#: faster (2-core CPU).
IMAGE_CHUNK = 1_000


def draw_images(module: Any, n: int, labels: torch.Tensor | None) -> torch.Tensor:
    """``n`` images of ``labels`` (or unconditional), drawn :data:`IMAGE_CHUNK` at a time on the
    module's device and gathered on the CPU."""
    return torch.cat([module.sample(min(IMAGE_CHUNK, n - start),
                                    None if labels is None else labels[start:start + IMAGE_CHUNK]).cpu()
                      for start in range(0, n, IMAGE_CHUNK)])


def load_module(path: str | Path) -> Any:
    """Rebuild the trained module from a checkpoint written by ``train``, to draw samples: in
    the memory its generator needs. The optimizers' and callbacks' state and what the module
    leaves out for sampling (the PATE teachers) are never loaded (the checksum check streams
    their bytes, without keeping them)."""
    info = read_run_info(path)
    verify_checkpoint_bytes(path)
    cls = registry.lookup("model", info["model"]).load()
    checkpoint = read_checkpoint(path)
    for training_only in ("optimizer_states", "lr_schedulers", "callbacks", "loops"):
        checkpoint.pop(training_only, None)
    cls.leave_out_for_sampling(checkpoint)
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)  # Lightning's loader reads what is left from memory
    buffer.seek(0)
    try:
        module = cls.load_from_checkpoint(buffer, map_location="cpu")
    except (KeyError, RuntimeError, TypeError, ValueError) as error:  # made by hand, or parts of it lost
        raise CheckpointError(f"{path} holds lightning-dpgan's run information, but not a --model {info['model']} "
                              f"Lightning can rebuild ({type(error).__name__}: {first_line(error)}). "
                              f"{_CHECKPOINT_HINT}") from error
    module.eval()
    return module


def recorded_data_files(checkpoint: Path) -> list[Path] | None:
    """The files a checkpoint's run read its records and schema from (``data.csv``,
    ``data.schema``): those the checkpoint keeps, and those the ``config.yaml`` two levels up,
    where ``train`` writes it, records. None when neither says (a checkpoint from before they
    were kept, copied alone or with its config.yaml gone)."""
    kept = read_run_info(checkpoint).get("data_files")
    try:
        data = yaml.safe_load((run_of(checkpoint) / "config.yaml").read_text())["data"]
        named = [Path(data[key]).expanduser() for key in ("csv", "schema") if data.get(key)]
    except (OSError, UnicodeDecodeError, yaml.YAMLError, TypeError, KeyError, AttributeError):
        named = None  # a config.yaml that cannot be read names nothing: the checkpoint's list stands
    if kept is None and named is None:
        return None
    return [Path(file) for file in kept or []] + (named or [])


def run_of(checkpoint: Path) -> Path:
    """The run folder a checkpoint lies in (``RUN/checkpoints/last.ckpt``), however it was given."""
    return checkpoint.expanduser().resolve().parent.parent


def record_redrawn_table(out: Path, checkpoint: Path) -> None:
    """After ``sample`` wrote a run's own ``synthetic.csv`` again from one of the run's
    checkpoints (the remedy evaluate gives for a damaged table), ``privacy.json``'s
    ``synthetic_sha256`` names the new table: drawing from the generator is post-processing,
    covered by the same guarantee (an earlier checkpoint's, by less), and evaluate would
    otherwise warn of it as a table from elsewhere."""
    run = run_of(checkpoint)
    report_path = run / "privacy.json"
    if checkpoint.expanduser().resolve().parent.name != "checkpoints" or out.resolve() != run / "synthetic.csv" \
            or not report_path.is_file():
        return
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError):
        return  # a damaged report is evaluate's to refuse, not this command's to rewrite
    if isinstance(report, dict) and "synthetic_sha256" in report:
        write_json(report_path, {**report, "synthetic_sha256": file_sha256(out)})
        print(f"sample: note: {report_path}'s synthetic_sha256 now names the table drawn (the run's own "
              "synthetic.csv, drawn from its checkpoint: the same guarantee)", file=sys.stderr)


def refuse_the_runs_own_data(out: Path, checkpoint: Path, overwrite: bool = False) -> None:
    """``--out`` may not be the file the run trained on, nor its schema file: with
    ``--overwrite`` a slip of the path would replace the private records (or the columns they
    are read with) by synthetic ones, which nothing could undo. Where the run's files cannot be
    told, a CSV run's ``--overwrite`` of an existing file is refused. A built-in dataset's files
    found in the data folder are the run's too (the user's copy may be the only one: King's
    Kaggle original needs a login); its downloads are checksummed and fetched again."""
    target = out.expanduser().resolve()
    files = recorded_data_files(checkpoint)
    if files is None:
        if overwrite and target.is_file() and read_run_info(checkpoint).get("dataset") == "csv":
            raise ValueError(f"--out {out} exists, and which files this run trained on cannot be told (no readable "
                             f"config.yaml in {run_of(checkpoint)}, and the checkpoint is from before it kept them): "
                             "--overwrite might replace its private records. Give another file, or remove "
                             f"{out} yourself if it is not them")
        return
    if any(target == file.resolve() for file in files):
        config = run_of(checkpoint) / "config.yaml"
        named_by = f"its checkpoint or {config}" if config.is_file() else "its checkpoint"
        raise ValueError(f"--out {out} is a file the run trained on ({named_by} names it): give another file")


def check_classes(classes: Sequence[int] | None) -> None:
    """``--classes`` as given: whole numbers >= 0, each once (whether the model has them is
    known once it is loaded, :func:`class_labels`)."""
    if classes is None:
        return
    if len(classes) == 0 or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in classes):
        raise ValueError(f"--classes takes one or more class indices (whole numbers >= 0), got {list(classes)!r}")
    repeated = sorted({c for c in classes if list(classes).count(c) > 1})
    if repeated:
        raise ValueError(f"--classes names class {', '.join(map(str, repeated))} more than once: give each class once")


def class_labels(module: Any, n: int, classes: Sequence[int] | None) -> torch.Tensor | None:
    """The label of each of ``n`` drawn images: the model's balanced classes, or, with
    ``classes``, those classes in turn (an equal share of each, in the order given). Labels are
    the generator's inputs, so choosing them reads no data and costs no privacy."""
    if classes is None:
        return module.balanced_labels(n)
    if module.num_classes is None:
        raise ValueError("--classes is for class-conditional models, and this one draws its images "
                         "without a class: leave --classes out")
    unknown = [c for c in classes if c >= module.num_classes]
    if unknown:
        raise ValueError(f"--classes {', '.join(map(str, unknown))}: this model's classes are 0 to "
                         f"{module.num_classes - 1}")
    return torch.tensor(list(classes))[torch.arange(n) % len(classes)]


def sample_to_file(checkpoint: str | Path, n: int, out: str | Path, seed: int = 0, columns: int | None = None,
                   overwrite: bool = False, classes: Sequence[int] | None = None) -> Path:
    """Draw ``n`` records and write them: ``.csv`` table (decoded with the run's schema),
    ``.png`` image grid (``columns`` to a row; by default a class-conditional model's one column
    per class drawn, else 10) or ``.npz`` image arrays; ``classes`` limits a class-conditional image model to those
    classes. An existing ``out`` (a run's own ``synthetic.csv``, say) is replaced
    only with ``overwrite``."""
    if not str(out).strip():  # Path("") is the current folder: "--out . names a folder" for what was typed as ''
        raise ValueError("--out is empty: give the file to write (a .csv for a table, .png or .npz for images)")
    named_as_folder = str(out).endswith(("/", os.sep))  # Path() drops the slash: x.csv/ would be written as x.csv
    out = Path(out)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"-n must be a whole number >= 1, got {n!r}")
    check_classes(classes)
    if classes is not None and n < len(classes):  # the first n classes alone were drawn, without a word
        raise ValueError(f"-n {n} is fewer than the {len(classes)} --classes: each is drawn in turn, so the last "
                         f"{len(classes) - n} would get no image. Give -n {len(classes)} or more, or fewer --classes")
    if out.exists() and Path(checkpoint).exists() and out.samefile(checkpoint):
        raise ValueError(f"--out {out} is the checkpoint itself: give another file")
    refuse_the_runs_own_data(out, Path(checkpoint), overwrite)
    info = read_run_info(checkpoint)
    schema = info.get("schema")
    allowed = (".csv",) if schema else (".png", ".npz")
    if out.is_dir() or named_as_folder:
        example = out / ("synthetic.csv" if schema else "samples.png")
        raise ValueError(f"--out {out} names a folder: give a file in it (e.g. {example})")
    if out.exists() and not overwrite:
        raise ValueError(f"--out {out} exists: give another file, or --overwrite to replace it")
    suffix = out.suffix.lower()  # samples.PNG is a PNG too
    if suffix not in allowed:
        kind = "a table model" if schema else "an image model"
        named = (f"a name before the extension, e.g. {'synthetic.csv' if schema else 'samples.png'}, not {out.name}"
                 if out.name.startswith(".") and not out.suffix else out.name)  # ".csv" alone has no suffix
        raise ValueError(f"--out for {kind} must end in {' or '.join(allowed)}, got {named}")
    if schema and classes is not None:
        raise ValueError("--classes is for class-conditional image models; a table's rows carry their label "
                         "column, so keep the rows of the classes you want from the drawn table")
    module = load_module(checkpoint)
    torch.manual_seed(seed)
    if schema:
        decoder, labeler = table_decoder(info), table_labeler(info)
        check_room_for_table(out, n, module, decoder, labeler)
        written = write_csv_chunks(out, synthetic_row_chunks(module, decoder, labeler, n))
        record_redrawn_table(written, Path(checkpoint))
        return written
    check_memory_for_images(n, module)
    labels = class_labels(module, n, classes)
    images = images_to_uint8(draw_images(module, n, labels))
    if suffix == ".png":
        if columns is None:  # a class-conditional model's: one column per class drawn, as the labels take turns
            columns = 10 if labels is None else min(n, len(classes) if classes else module.num_classes)
        return write_png(out, image_grid(images, columns))
    arrays = {"images": images}
    if labels is not None:
        arrays["labels"] = labels.cpu().numpy()
    return atomic_write(out, lambda f: np.savez_compressed(f, **arrays))

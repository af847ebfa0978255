"""Command-line entry points of ``python -m lightning_dpgan``: ``train`` (also ``python train.py``),
``sample``, ``evaluate``, ``audit`` and ``benchmark``.

``train`` builds a datamodule, a GAN module and its privacy strategy from the resolved
configuration (see :mod:`lightning_dpgan.config`), fits them with a Lightning ``Trainer``
and writes the run's files into ``--output-dir``:

- ``config.yaml``  the resolved configuration, data paths absolute (rerun it with ``--config``)
- ``checkpoints/last.ckpt``
- ``privacy.json`` mechanism, epsilon, delta, target, steps, what stopped training, accountant and its parameters
- ``metrics.json`` final losses, steps, wall time
- ``samples.png``  one row per class (images); ``synthetic.csv`` the synthetic table (tables)
- ``logs/``        the logger's files

``sample`` draws records from a checkpoint; ``evaluate`` scores a run folder (``evaluation.json``,
``report.md``); ``benchmark`` runs the suites of :mod:`lightning_dpgan.benchmark`.
``audit`` takes the same flags as ``train`` and re-trains the model many times, half of them with a canary
record, to bound its real epsilon from below (``audit.json``; see :mod:`lightning_dpgan.canary_audit`).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from lightning_dpgan import registry
from lightning_dpgan.config import (
    BOOLEAN_SETTINGS,
    CODE_DEFAULTS,
    DEFAULT_QUAIL_SYNTHESIZER,
    FLAG_KEYS,
    MODEL_PROVIDED,
    PRIVACY_PROVIDED,
    QUAIL,
    ConfigError,
    load_yaml,
    parse_value,
    resolve,
)
from lightning_dpgan.data.download import DataIntegrityError
from lightning_dpgan.error_text import first_line
from lightning_dpgan.host_memory import reuse_freed_memory
from lightning_dpgan.option_spelling import BothSpellingsParser, respelled
from lightning_dpgan.versions import version_line
from lightning_dpgan.command_name import command_line, command_prog


class _StoreNotingRepeats(argparse.Action):
    """argparse's plain ``store``, except that an option given twice with different values says so
    on stderr. The last value is used, as argparse does, and as train does for settings other than
    the budget (:func:`settings_given_twice`); the first is no longer dropped in silence."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if option_string is not None and hasattr(self, "given") and self.given != values:
            print(f"{parser.prog}: note: {option_string} given twice ({_shown(self.given)}, then {_shown(values)}): "
                  f"the last, {_shown(values)}, is used", file=sys.stderr)
        self.given = values
        setattr(namespace, self.dest, values)


def _shown(values: Any) -> str:
    return " ".join(map(str, values)) if isinstance(values, list) else str(values)


def command_parser(command: str, description: str, **kwargs: Any) -> argparse.ArgumentParser:
    """The parser of a command other than train (sample, evaluate, audit, benchmark): its options
    are stored as argparse stores them, noting one given twice (:class:`_StoreNotingRepeats`)."""
    parser = BothSpellingsParser(prog=command_prog(command), description=description, **kwargs)
    for name in (None, "store"):
        parser.register("action", name, _StoreNotingRepeats)
    add_version_option(parser)
    return parser


VERSION_HELP = "print this package's version (and commit) and those of the packages its privacy figures rely on"


class _PrintVersion(argparse.Action):
    """``--version``: print :func:`~lightning_dpgan.versions.version_line` and exit, whatever else
    the command line holds, as argparse's version action does; on one line (argparse's wraps it
    to the terminal), and read only when asked for (it runs git in a checkout)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(version_line())
        parser.exit()


def add_version_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action=_PrintVersion, help=VERSION_HELP)


def chosen_settings(argv: list[str]) -> str:
    """For ``train --help``: the dotted overrides of the model and dataset the command line names
    (with ``--model quail``, QUAIL's own ``--quail.*`` and its synthesizer's ``--model.*``), or how
    to have them listed. Every model's would be a page; the privacy strategies' few are listed."""
    scan = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("--model", "--dataset", "--quail-synthesizer"):
        scan.add_argument(flag)
    scan.add_argument("--quail.synthesizer", dest="dotted_synthesizer")
    chosen, _ = scan.parse_known_args(argv)
    lines = []
    model = chosen.model
    if model == QUAIL:
        lines.append(registry.settings_line(QUAIL, registry.MODELS[QUAIL], QUAIL))
        model = chosen.dotted_synthesizer or chosen.quail_synthesizer or DEFAULT_QUAIL_SYNTHESIZER
    if model in registry.MODELS:
        lines.append(registry.settings_line(model, registry.MODELS[model], "model", provided=MODEL_PROVIDED))
    if chosen.dataset in registry.DATASETS:
        lines.append(registry.settings_line(chosen.dataset, registry.DATASETS[chosen.dataset], "data"))
    if not lines:
        return ("settings of a model and dataset: give --model NAME and --dataset NAME with --help to list\n"
                "their --model.* and --data.* settings")
    return ("settings of the model and dataset given (their values: configs/, the precedence below):\n"
            + "\n".join(lines))


def _train_parser(chosen: str = "") -> argparse.ArgumentParser:
    """``train``'s parser; ``chosen``: :func:`chosen_settings`' text for its help (only --help shows it)."""
    epilog = "\n\n".join(
        [
            "models:\n" + registry.describe("model"),
            "datasets:\n" + registry.describe("dataset"),
            "privacy strategies (--privacy):\n" + registry.describe("privacy"),
            "their settings (--epsilon and --delta set the targets; README, \"Training with differential\n"
            "privacy\", says what each does):\n"
            + registry.describe_settings("privacy", "privacy", provided=PRIVACY_PROVIDED),
            "loggers (--logger):\n" + registry.describe("logger"),
            *([chosen] if chosen else []),
            "Any argument of the model, datamodule, privacy strategy, logger or Lightning Trainer\n"
            "can be set with a dotted override, e.g. --model.lr_generator 1e-4 --data.num_workers 2\n"
            "--trainer.log_every_n_steps 10, and so can top-level settings: --sample_every_n_steps 500,\n"
            "--checkpoint_every_n_steps 1000, --sample_columns 10, --num_synthetic 5000 (rows of a table run's\n"
            "synthetic.csv; default as many as training records). Every option takes hyphens or underscores alike.\nPrecedence: configs/<model>.yaml < configs/<model>_<dataset>.yaml\n"
            "< configs/<model>_<dataset>_eps<E>.yaml (when the run's epsilon is E: --epsilon's, else a --config file's,\n"
            "else the presets' own) < --config FILE < flags < dotted overrides.\n"
            "A setting given twice with two values takes the last, with a note; --epsilon, --delta and --privacy\n"
            "given two values, or one setting under two names with two values (--batch-size, --data.batch_size),\n"
            "are refused.",
        ]
    )
    parser = BothSpellingsParser(
        prog=command_prog("train"),
        description="Train a (differentially private) GAN and write its checkpoint, samples, privacy report and metrics.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add_version_option(parser)
    add = parser.add_argument
    add("--model", help="model name (see below)")
    add("--dataset", help="dataset name (see below)")
    add("--privacy", help="privacy strategy; each model has a default, 'none' for the baselines")
    add("--config", help="YAML file of settings (same layout as an output config.yaml)")
    add("--data-dir", dest="data_dir", help="folder with the raw data files (else downloaded to a cache; env LIGHTNING_DPGAN_DATA_DIR)")
    add("--output-dir", dest="output_dir", help="where the run's files go (default outputs/<model>-<dataset>-<timestamp>)")
    add("--epsilon", type=float, help="target epsilon: training stops before the privacy budget would pass it")
    add("--delta", type=float, help="target delta (must be below 1/number of training records)")
    add("--max-steps", dest="max_steps", type=int, help="stop after this many training batches")
    add("--max-epochs", dest="max_epochs", type=int, help="stop after this many epochs")
    add("--batch-size", dest="batch_size", type=int, help="records per training batch")
    add("--seed", type=int, help="random seed (default 0)")
    add("--devices", type=_devices, help="number of devices (or 'auto')")
    add("--accelerator", choices=("cpu", "gpu", "auto"), help="hardware to train on (default auto)")
    add("--strategy", help="Lightning distributed strategy: ddp trains in several processes with the "
                           "single-process privacy guarantee (not the privacy strategy: see --privacy)")
    add("--num-nodes", dest="num_nodes", type=_positive_int,
        help="machines of a --strategy ddp run (each runs the command with its NODE_RANK)")
    add("--logger", help="csv (default), tensorboard or wandb")
    add("--wandb-project", dest="wandb_project", help="W&B project (default lightning-dpgan)")
    add("--wandb-entity", dest="wandb_entity", help="W&B entity (user or team)")
    add("--wandb-name", dest="wandb_name", help="W&B run name (default: the output folder's name)")
    add("--quail-synthesizer", dest="quail_synthesizer",
        help="with --model quail: the private table model that generates the features (default dpctgan)")
    add("--quail-split", dest="quail_split", type=float,
        help="with --model quail: the label model's share of epsilon and delta, in (0, 1) (default 0.5)")
    add("--resume", help="checkpoint to continue training from")
    add("--overwrite", action="store_true", default=None,
        help="train into an --output-dir that holds another run (its outputs are moved to previous/ first)")
    add("--evaluate", action="store_true", default=None,
        help="after training, evaluate the run (writes evaluation.json; see 'python -m lightning_dpgan evaluate')")
    return parser


def _devices(text: str) -> int | str:
    if text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1 or 'auto', got {text!r}")
    return int(text)


def _positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return int(text)


def _seed(text: str) -> int:
    """A seed every library here takes (scikit-learn's are in [0, 2^32))."""
    if not text.strip().isdigit() or int(text) >= 2**32:
        raise argparse.ArgumentTypeError(f"must be a whole number in [0, 2^32), got {text!r}")
    return int(text)


def _torch_device(text: str) -> str:
    """A device torch knows and this machine has, checked before any work."""
    import torch

    try:
        device = torch.device(text)
    except RuntimeError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch device (cpu, cuda, cuda:1, ...)") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: this machine's torch has no CUDA device; use cpu")
    if device.type == "meta":  # holds shapes, not numbers: nothing could be scored on it
        raise argparse.ArgumentTypeError(f"{text!r} holds no data; use cpu or a GPU")
    try:  # a backend torch was not built with (mps, xpu) or a GPU index this machine lacks
        torch.empty(1, device=device)
    except Exception as error:  # each backend fails in its own way: RuntimeError, AssertionError, ...
        reason = first_line(error)
        raise argparse.ArgumentTypeError(f"{text!r} is not usable on this machine ({reason}); use cpu") from error
    return text


def parse_overrides(extra: list[str]) -> dict[str, Any]:
    """Turn ``--section.key value`` / ``--section.key=value`` pairs into a dict.

    Top-level settings without a flag of their own (``--sample_every_n_steps 500``) work too.
    """
    overrides: dict[str, Any] = {}
    index = 0
    while index < len(extra):
        token = extra[index]
        name = token[2:].split("=", 1)[0]
        if not token.startswith("--") or ("." not in name and name not in CODE_DEFAULTS):
            raise ConfigError(f"unrecognized argument {token!r} (see --help; dotted overrides look like "
                              "--model.latent_dim 64)")
        if "=" in token:
            key, text = token[2:].split("=", 1)
            index += 1
        else:
            if index + 1 >= len(extra):
                raise ConfigError(f"{token} needs a value")
            key, text = token[2:], extra[index + 1]
            index += 2
        overrides[key] = parse_value(text)
    return overrides


#: a negative number in any notation (``-1``, ``-.5``, ``-1e-5``, ``-inf``)
NEGATIVE_NUMBER = re.compile(r"-((\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|inf|infinity)", re.IGNORECASE)


def train_argv(argv: list[str]) -> list[str]:
    """A train command line as its parsers read it: each option in the spelling train takes it
    (:func:`~lightning_dpgan.option_spelling.respelled`: ``--data_dir`` as ``--data-dir``,
    ``--num-synthetic`` as ``--num_synthetic``), then :func:`attach_negative_values`."""
    top_level = (f"--{key}" for key, value in CODE_DEFAULTS.items() if not isinstance(value, dict))
    return attach_negative_values(respelled(argv, {*_train_parser()._option_string_actions, *top_level}))


def attach_negative_values(argv: list[str]) -> list[str]:
    """``--delta -1e-5`` as ``--delta=-1e-5``: argparse before Python 3.13 reads a negative number in
    scientific notation as an option, and answers "expected one argument" instead of the
    setting's own check ("--delta must be in (0, 1)")."""
    joined: list[str] = []
    for word in argv:
        previous = joined[-1] if joined else ""
        if NEGATIVE_NUMBER.fullmatch(word) and previous.startswith("--") and "=" not in previous:
            joined[-1] = f"{previous}={word}"
        else:
            joined.append(word)
    return joined


def _setting_of(word: str) -> str | None:
    """The configuration key a command-line word sets (``--batch-size`` and ``--data.batch_size``
    both set ``data.batch_size``), or None for a value or a word train does not read."""
    name = word[2:].split("=", 1)[0] if word.startswith("--") else ""
    if name == "config":
        return name
    dest = name.replace("-", "_")
    if dest in FLAG_KEYS and name == dest.replace("_", "-"):  # a flag, as its option is spelled
        return FLAG_KEYS[dest]
    return name if "." in name or name in CODE_DEFAULTS else None


def settings_in(argv: list[str]) -> Iterator[tuple[str, str, str]]:
    """``(setting, option as typed, value as text)`` for each setting a train command line gives,
    in order (``--epsilon=1`` and ``--epsilon 1`` alike; a switch's value is "true"). Words train
    does not read, and a flag without its value, are left to its parsers."""
    index = 0
    while index < len(argv):
        word, key = argv[index], _setting_of(argv[index])
        index += 1
        if key is None:
            continue
        if "=" in word:
            text = word.split("=", 1)[1]
        elif key in BOOLEAN_SETTINGS:  # --overwrite, --evaluate: no value follows
            text = "true"
        elif index < len(argv):
            text, index = argv[index], index + 1
        else:
            continue
        yield key, word.split("=", 1)[0], text


#: Settings refused when given twice with different values: the budget a run is held to and the
#: mechanism that spends it. Any other setting repeated under one name takes its last value.
BUDGET_SETTINGS = ("epsilon", "delta", "privacy.name")


def settings_given_twice(argv: list[str]) -> list[str]:
    """A note for each setting given twice under one name with different values: the last is used,
    as argparse does (a script may add ``--max-steps 10`` to a longer command), and the note says so.

    Refused instead, naming both: the privacy budget or strategy given twice (a run held to
    whichever ε came last is held to one nobody chose), and a setting under two names
    (``--batch-size 64 ... --data.batch_size 32``: the dotted one would win wherever it stood).
    Read after :func:`train_argv`."""
    given: dict[str, tuple[str, str]] = {}  # setting -> (its option as typed, its value's text), the last given
    notes = []
    for key, option, text in settings_in(argv):
        if key in given and parse_value(given[key][1]) != parse_value(text):
            earlier, earlier_text = given[key]
            if option != earlier or key in BUDGET_SETTINGS:
                why = "under one name" if option != earlier else "(a privacy budget or strategy is never the last of two)"
                raise ConfigError(f"{earlier} {earlier_text} and {option} {text} both set {key}: give it once {why}")
            notes.append(f"{option} given twice ({earlier_text}, then {text}): the last, {text}, is used")
        given[key] = (option, text)
    return notes


def build_config(argv: list[str]) -> dict[str, Any]:
    from lightning_dpgan.launch_env import launched_as_follower

    argv = train_argv(argv)
    notes = settings_given_twice(argv)
    asks_help = any(arg in ("-h", "--help") for arg in argv)
    args, extra = _train_parser(chosen_settings(argv) if asks_help else "").parse_known_args(argv)
    flags = {key: value for key, value in vars(args).items() if key != "config"}
    overrides = parse_overrides(extra)
    config = resolve(flags, overrides, config_file=args.config, notes=notes)
    if config.get("resume") and flags.get("epsilon") is None and not (args.config and "epsilon" in load_yaml(args.config)):
        target = _checkpoints_other_target(config, notes)
        if target is not None:  # resolved again: the presets that apply depend on the target (an _eps0.1 preset)
            config = resolve({**flags, "epsilon": target}, overrides, config_file=args.config, notes=[])
    if config.get("resume") and flags.get("delta") is None and not (args.config and "delta" in load_yaml(args.config)):
        _keep_the_checkpoints_delta(config, notes)
    drop_the_files_schema_estimate(config, overrides, args.config, notes)  # on the configuration as resolved last
    for note in notes:
        if not launched_as_follower():  # each process of a DDP run reads the command line
            print(f"train: note: {note}", file=sys.stderr)
    for kind, section in (("model", "model"), ("dataset", "data")):
        if not config[section]["name"]:
            raise ConfigError(f"--{kind} is required{_resume_hint(config.get('resume'))}. "
                              f"Valid {kind} names: {', '.join(registry.TABLES[kind])}.")
    return config


#: a csv run's settings of the DP estimate of its schema, which a schema file makes void
SCHEMA_ESTIMATE_SETTINGS = ("bounds_epsilon", "bounds_delta", "categorical", "integer", "drop")


def drop_the_files_schema_estimate(config: dict[str, Any], overrides: dict[str, Any], config_file: str | None,
                                   notes: list[str]) -> None:
    """``--data.schema FILE`` over the ``--config`` of a csv run that estimated its schema (the
    README's way to reuse that run's ``released_schema.yaml``): the file's estimate settings are
    dropped, with a note. They were refused, naming flags the user never typed. Given on the
    command line as well, they stay, and the datamodule refuses them by name."""
    if config["data"].get("name") != "csv" or overrides.get("data.schema") is None or not config_file:
        return
    recorded = load_yaml(config_file).get("data") or {}
    dropped = [key for key in SCHEMA_ESTIMATE_SETTINGS
               if recorded.get(key) not in (None, []) and f"data.{key}" not in overrides]
    for key in dropped:
        config["data"][key] = None
    if dropped:
        notes.append(f"--data.schema gives the columns, so {config_file}'s settings of the schema's DP estimate "
                     f"({', '.join('data.' + key for key in dropped)}) are dropped: nothing is estimated or spent")


def _checkpoints_other_target(config: dict[str, Any], notes: list[str]) -> float | None:
    """For a resume given no target (no --epsilon, none in its --config file): the target its
    checkpoint trained under where the presets' differs, with a note; else None. The presets'
    (10 for dpgan) would raise it, and the run go on spending past the target it was started
    with, said only as "of --epsilon 10"."""
    target = checkpoint_target_epsilon(config["resume"])
    if target is None or config.get("epsilon") is None or target == config["epsilon"]:
        return None
    notes.append(f"--resume keeps the checkpoint's target epsilon {target:g} (the presets' {config['epsilon']:g} "
                 "would change it): give --epsilon to change the target")
    return target


def _keep_the_checkpoints_delta(config: dict[str, Any], notes: list[str]) -> None:
    """For a resume given no delta (no --delta, none in its --config file): the delta its
    checkpoint's epsilon is stated at, with a note where the presets' (or the default) differs.
    A larger one loosened the guarantee the run was started under, said only as "at delta
    1e-05" beside an epsilon that fell as the delta rose; a smaller one refused the resume for a
    delta nobody typed. Not for a checkpoint the resume itself will refuse (no note first)."""
    from lightning_dpgan.callbacks.strategy import DEFAULT_DELTA

    spent = _checkpoint_strategy_state(config["resume"]).get("spent")
    delta = _number(spent.get("delta")) if isinstance(spent, dict) else None
    if delta is None or delta == config.get("delta"):
        return
    whose, otherwise = "the presets'", config.get("delta")
    if otherwise is None:  # the dataset's own default (Kaggle credit's 1e-6), else the strategies'
        name = config["data"].get("name")
        dataset = registry.DATASETS.get(name) if isinstance(name, str) else None
        own = getattr(dataset.load(), "default_delta", None) if dataset is not None else None
        whose, otherwise = ("the dataset's default", own) if own is not None else ("the strategies' default", DEFAULT_DELTA)
    if otherwise != delta:
        notes.append(f"--resume keeps the checkpoint's delta {delta:g} ({whose} {otherwise:g} would restate the whole "
                     "run's epsilon at another delta): give --delta to change it")
    config["delta"] = delta


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _checkpoint_strategy_state(path: str) -> dict[str, Any]:
    """The privacy strategy's state in a checkpoint, or {} (not a private run's, or a file the
    resume itself will refuse with its reason)."""
    from lightning_dpgan.modules.base import CHECKPOINT_KEY
    from lightning_dpgan.python_run_info import trained_in_python
    from lightning_dpgan.sampling import read_checkpoint, strategy_state

    try:
        checkpoint = read_checkpoint(Path(path).expanduser())
        if trained_in_python((checkpoint.get(CHECKPOINT_KEY) or {}).get("run") or {}):
            return {}  # refused by the resume's own check, which says why: no note about it first
        return strategy_state(checkpoint)
    except Exception:  # noqa: BLE001 - a damaged or missing file: the run's own checks name it
        return {}


def checkpoint_target_epsilon(path: str) -> float | None:
    """The target epsilon of the checkpoint's last training segment, or None (not a private run's,
    or a file the resume itself will refuse with its reason)."""
    segments = _checkpoint_strategy_state(path).get("segments")
    last = segments[-1] if isinstance(segments, list) and segments else None
    return _number(last.get("target_epsilon")) if isinstance(last, dict) else None


def _resume_hint(resume: str | None) -> str:
    """For a ``--resume`` given alone: a checkpoint holds the networks and the accountant, not the
    run's flags, which its run's ``config.yaml`` does."""
    if not resume:
        return ""
    from lightning_dpgan.run_folder import LAST_CHECKPOINT, continue_command

    run = Path(resume).expanduser().parent.parent
    if (run / "config.yaml").is_file() and run / LAST_CHECKPOINT == Path(resume).expanduser():
        example = continue_command(run)
    else:  # a checkpoint away from its run folder still names its model and dataset
        from lightning_dpgan.sampling import CheckpointError, read_run_info

        try:
            info = read_run_info(resume)
        except CheckpointError:
            info = {}
        model = f"--model quail --quail-synthesizer {info['model']}" if "quail" in info else f"--model {info.get('model')}"
        train = command_line("train")
        example = (f"{train} {model} --dataset {info['dataset']} --resume {resume} and the run's other flags, "
                   "which its config.yaml lists" if info.get("model") and info.get("dataset") else
                   f"{train} --config RUN/config.yaml --resume {resume} --output-dir RUN")
    return f" with --resume too (a checkpoint holds the networks, not the run's flags): give them again, e.g. {example}"


#: the default run folder rank 0 chose, inherited by the processes Lightning's DDP launcher starts
RUN_DIR_ENV = "LIGHTNING_DPGAN_RUN_DIR"


def _output_dir(config: dict[str, Any]) -> Path:
    if config["output_dir"] is not None and not str(config["output_dir"]).strip():
        # an unset shell variable (--output-dir "$OUT"): the run would land in a default folder unnoticed
        raise ConfigError("--output-dir is empty: give a folder, or leave the option out for "
                          "outputs/<model>-<dataset>-<timestamp>")
    if config["output_dir"]:
        return Path(config["output_dir"])
    if why := _processes_started_apart(config):
        raise ConfigError(f"--output-dir is needed {why}: each process would name the default folder "
                          "(outputs/<model>-<dataset>-<timestamp>) by its own clock, so processes started a second "
                          "apart would train into two folders, the others waiting on the first's release. Give "
                          "--output-dir, a folder every process sees")
    from lightning_dpgan.launch_env import launched_as_follower

    if launched_as_follower() and os.environ.get(RUN_DIR_ENV):
        return Path(os.environ[RUN_DIR_ENV])  # rank 0's timestamp, not this process's
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path("outputs") / f"{config['model']['name']}-{config['data']['name']}-{stamp}"
    os.environ[RUN_DIR_ENV] = str(path)
    return path


def _processes_started_apart(config: dict[str, Any]) -> str | None:
    """How this run's processes were started each on its own, which no default folder can be
    shared across, or None. Lightning's launcher starts one machine's processes from the first,
    which hands them its folder (``RUN_DIR_ENV``); torchrun, SLURM's tasks and the machines of
    ``--num-nodes`` each run the command themselves."""
    num_nodes = config["trainer"].get("num_nodes")
    if isinstance(num_nodes, int) and num_nodes > 1:
        return f"with --num-nodes {num_nodes}"
    if os.environ.get("TORCHELASTIC_RUN_ID") is not None and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        return "under torchrun"
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    if SLURMEnvironment.detect() and int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1:
        return "in a SLURM job of several tasks"
    return None


def _first_missing_folder(folder: Path) -> Path | None:
    """The outermost folder of ``folder``'s path that does not exist yet (None: it exists)."""
    missing = None
    for candidate in [folder, *folder.parents]:
        if candidate.exists():
            return missing
        missing = candidate
    return missing


def _remove_made_folder(output_dir: Path, made: Path) -> None:
    """After a refusal before training: remove what this run made, ``output_dir`` holding only
    the logger's ``logs/`` and the empty parents up to ``made``; anything else in it (a data
    folder placed there, another run's files) keeps it."""
    if not output_dir.is_dir() or not {entry.name for entry in output_dir.iterdir()} <= {"logs"}:
        return
    shutil.rmtree(output_dir, ignore_errors=True)
    for parent in output_dir.parents:
        if not parent.is_relative_to(made) or any(parent.iterdir()):
            break
        parent.rmdir()


#: rank 0's settings as it resolved them, inherited by the processes Lightning's DDP launcher
#: starts: they must not read the command line's --config again, a file rank 0 may have set aside
#: by then (a run continued in its own folder has its config.yaml moved to previous/)
RUN_CONFIG_ENV = "LIGHTNING_DPGAN_RUN_CONFIG"


def train(argv: list[str]) -> Path:
    """Run ``train`` and return the output directory."""
    from lightning_dpgan.launch_env import launched_as_follower, quiet_machine_followers

    if launched_as_follower():
        quiet_machine_followers()
        inherited = os.environ.get(RUN_CONFIG_ENV)  # absent under torchrun, which starts every process itself
        return _train(yaml.safe_load(inherited) if inherited else build_config(argv))
    config = build_config(argv)
    try:
        return _train(config, shared=_settings_text(config))  # before Run adds its own entries to config
    finally:
        os.environ.pop(RUN_CONFIG_ENV, None)


def _settings_text(config: dict[str, Any]) -> str | None:
    """``config`` as YAML that reads back to the same values, for :data:`RUN_CONFIG_ENV`; None if
    some value has no such form (the other processes then parse the command line)."""
    try:
        text = yaml.safe_dump(config)
    except yaml.YAMLError:
        return None
    return text if yaml.safe_load(text) == config else None


def _prepend_earlier_steps(run: Any, output_dir: Path, previous: Path | None) -> None:
    """A continued run's step log after ``run`` trained in ``output_dir`` (the earlier one's in
    ``previous``), and its final losses, the earlier run's where it took no step."""
    from lightning_dpgan import run_folder

    took_steps = run.module.train_steps > run.resumed_steps
    run_folder.prepend_earlier_steps(output_dir, previous, took_steps=took_steps)
    if not took_steps:
        run_folder.carry_earlier_losses(output_dir, previous)


def _train(config: dict[str, Any], shared: str | None = None) -> Path:
    """``train`` in this process; ``shared``: rank 0's settings for the processes its trainer starts."""
    from lightning_dpgan.launch_env import launched_as_follower
    from lightning_dpgan.run import Run
    from lightning_dpgan import run_folder

    output_dir, previous, created, run = _output_dir(config), None, None, None
    continued = run_folder.continues_run_in(output_dir, config["resume"])
    if not launched_as_follower():  # a DDP run's other processes share rank 0's folder
        run_folder.check_output_dir(output_dir, config["resume"], config["overwrite"], run_folder.data_inputs(config["data"]))
        previous = run_folder.set_aside_outputs(output_dir, continued) if output_dir.is_dir() else None
        created = _first_missing_folder(output_dir)
        if continued and config["overwrite"]:  # the continuation wins: say that the flag did nothing
            print(f"train: note: --overwrite changes nothing here: the run continues its own checkpoint in {output_dir}, "
                  "whose earlier outputs move to previous/ either way", file=sys.stderr)
    try:
        if created is not None:  # made now, not after the data is read: a folder that cannot be made is named
            try:
                output_dir.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise OSError(f"--output-dir {output_dir} cannot be made ({error.strerror or error}): give a folder "
                              "in a place you can write to") from error
        run = Run(config, output_dir)
        if shared is not None and run.trainer.world_size > 1:
            os.environ[RUN_CONFIG_ENV] = shared  # Lightning's launcher starts the others in run.fit()
        run.fit()
    except BaseException as error:
        if not run_folder.training_started(output_dir):  # refused before training: the folder as it was
            if run is not None and isinstance(error, ValueError):
                run.note_spend_before_refusal(error)
            if previous is not None:
                run_folder.restore_outputs(output_dir, previous)
            elif created is not None:
                _remove_made_folder(output_dir, created)
        elif continued and run is not None and run.trainer.is_global_zero:
            # an interrupted continuation (Ctrl-C, SIGTERM): its step log starts with the earlier
            # run's steps all the same, so that the next continuation carries them on
            with contextlib.suppress(Exception):
                _prepend_earlier_steps(run, output_dir, previous)
        raise
    if continued and run.trainer.is_global_zero:
        _prepend_earlier_steps(run, output_dir, previous)
    if previous is not None and run.trainer.is_global_zero:
        # said once the run has trained: a refused one puts them back. A folder holding only the
        # logs/ of a refused run is taken without --overwrite, so this is the only word of the move
        moved = ", ".join(sorted(entry.name for entry in previous.iterdir()))
        print(f"train: the folder's earlier outputs ({moved}) were moved to {previous}")
    if config["evaluate"] and run.trainer.is_global_zero:
        from lightning_dpgan.evaluate import evaluate_run

        from lightning_dpgan.data.dev_split import scored_split

        split = scored_split(run.datamodule.hparams.get("dev_fraction", 0.0))
        try:
            evaluate_run(run.output_dir, seed=config["seed"], split=split)
        except (ValueError, OSError) as error:  # the run itself is complete: say so, not "refused"
            raise EvaluationFailed(f"training finished and wrote {run.output_dir} (privacy.json included); its "
                                   f"evaluation failed: {error}. Rerun it with: {command_line('evaluate')} "
                                   f"--run {run.output_dir} --split {split}") from error
    return run.output_dir


class EvaluationFailed(ValueError):
    """``train --evaluate``: the run was trained and written, its evaluation was not."""


def sample(argv: list[str]) -> Path:
    """Run ``sample`` and return the file written: drawing from a checkpoint is post-processing,
    so the records carry its spend, which the command states (and warns of an untrained one)."""
    parser = command_parser("sample", "Draw synthetic records from a checkpoint.")
    parser.add_argument("--checkpoint", required=True, help="a checkpoint written by train (checkpoints/last.ckpt)")
    parser.add_argument("-n", type=int, required=True, help="number of records to draw")
    parser.add_argument("--out", required=True, help="output file: .csv (tables), .png grid or .npz (images + labels)")
    parser.add_argument("--seed", type=_seed, default=0,
                        help="seed of the latent and label draws (default 0): one seed, one sample")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists (else refused)")
    parser.add_argument("--classes", type=int, nargs="+", metavar="K",
                        help="class-conditional image models: draw only these classes (indices), an equal "
                             "share of each (default: every class)")
    args = parser.parse_args(argv)
    from lightning_dpgan.sampling import guarantee_note, sample_to_file, untrained_warning  # torch: after --help

    with terminated_as_exit():
        path = sample_to_file(args.checkpoint, args.n, args.out, seed=args.seed, overwrite=args.overwrite,
                              classes=args.classes)
    print(f"sample: {guarantee_note(args.checkpoint)}", file=sys.stderr)
    if (warning := untrained_warning(args.checkpoint)) is not None:
        print(f"sample: warning: {warning}", file=sys.stderr)
    return path


@contextlib.contextmanager
def terminated_as_exit() -> Iterator[None]:
    """Within the block, SIGTERM (``kill``, a scheduler's stop) raises ``SystemExit(143)`` instead of
    ending the process at once, so that the file being written (``outputs.atomic_write``) removes
    its temporary file rather than leave it, possibly gigabytes, beside ``--out``."""
    from lightning_dpgan.sigterm import on_sigterm

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    with on_sigterm(stop):
        yield


def evaluate(argv: list[str]) -> Path:
    """Run ``evaluate`` and return the evaluation file written (``evaluation.json``, or
    ``evaluation-dev.json`` for ``--split dev``)."""
    from lightning_dpgan.data.dev_split import HELD_OUT_SPLITS

    parser = command_parser(
        "evaluate", "Utility, fidelity and membership-inference risk of a finished run (writes evaluation.json).")
    parser.add_argument("--run", required=True, help="the output folder of a train run")
    parser.add_argument("--data-dir", help="folder with the raw data (default: the run's)")
    parser.add_argument("-n", type=_positive_int, help="synthetic images to draw (default: as many as training images)")
    parser.add_argument("--cnn-epochs", type=_positive_int, help="epochs of the evaluation CNN (images; default 10)")
    parser.add_argument("--device", type=_torch_device, help="device of the evaluation CNN (images; default cpu)")
    parser.add_argument("--real-baseline", action="store_true",
                        help="images: also train the evaluation CNN on as many real training images, and report its "
                             "accuracy and the synthetic images' gap to it (utility/difference_cnn_accuracy)")
    parser.add_argument("--seed", type=_seed, default=0,
                        help="seed of what is drawn or fitted: synthetic images, classifiers, the CNN, the membership attack (default 0)")
    parser.add_argument("--split", choices=HELD_OUT_SPLITS, default="test",
                        help="the real records scored on: the test split, or (for a run trained with "
                             "--data.dev_fraction) the dev records it held out of training, to choose settings "
                             "on; writes evaluation-dev.json and no report")
    args = parser.parse_args(argv)
    from lightning_dpgan.evaluate import evaluate_run  # torch and scikit-learn: after --help
    from lightning_dpgan.run_folder import EVALUATION_FILES

    evaluate_run(args.run, args.data_dir, args.n, args.cnn_epochs, args.seed, args.device, args.split,
                 args.real_baseline)
    return Path(args.run) / EVALUATION_FILES[args.split]


def audit(argv: list[str]) -> Path:
    """Empirical privacy audit by re-training with a canary (:mod:`lightning_dpgan.canary_audit`)."""
    from lightning_dpgan.audit_options import audit_parser

    parsed = audit_parser().parse_known_args(argv)  # its --help and its own bad options answer before torch loads
    from lightning_dpgan.canary_audit import audit_command

    return audit_command(argv, parsed)


def benchmark(argv: list[str]) -> Path:
    """The benchmark harness (:mod:`lightning_dpgan.benchmark`). Its refusals (a ``SystemExit``
    with a message) reach the user as every command's do:
    ``error: ...``, exit 2. A suite whose runs failed still exits 1."""
    from lightning_dpgan.benchmark.cli import benchmark as run_benchmark

    try:
        return run_benchmark(argv)
    except SystemExit as stop:
        if isinstance(stop.code, str):
            raise ConfigError(stop.code.removeprefix("benchmark: ")) from None
        raise


COMMANDS = {"train": train, "sample": sample, "evaluate": evaluate, "audit": audit, "benchmark": benchmark}
#: One line per command for ``python -m lightning_dpgan --help``.
COMMAND_HELP = {
    "train": "train a model until --max-steps or the privacy budget; writes a run folder (same as train.py)",
    "sample": "draw synthetic records or images from a run's checkpoint",
    "evaluate": "score a run's synthetic data against the real held-out rows (utility, fidelity, risk)",
    "audit": "re-train with and without a canary record and bound the run's epsilon from below",
    "benchmark": "run a benchmark suite (tables, images, speed, peers) and regenerate RESULTS.md",
}

def usage() -> str:
    """The package's usage line, naming the way it was started (see :func:`command_prog`)."""
    return f"usage: {command_prog('{' + ','.join(COMMANDS) + '}')} [options]  (--help after a command for its options)"


def _loaded(module: str, name: str) -> tuple[type, ...]:
    """Class ``name`` of ``module`` if that module is loaded, else nothing. Lightning's exceptions
    are named this way: one can only have been raised once Lightning was imported, and the
    commands' ``--help`` answers in a fraction of a second because it never imports it."""
    loaded = sys.modules.get(module)
    return (getattr(loaded, name),) if loaded is not None else ()


def _misconfiguration() -> tuple[type, ...]:
    return _loaded("lightning.fabric.utilities.exceptions", "MisconfigurationException")


def _lightning_sigterm() -> tuple[type, ...]:
    return _loaded("lightning.pytorch.utilities.exceptions", "SIGTERMException")


def report_error(error: Exception) -> None:
    """Print a refusal once for each machine of a DDP run. Every process of the run parses the
    same command line, so a refusal drawn from it (a ValueError: a bad option, an incompatible
    model, a privacy setting DDP cannot honour; Lightning's misconfigurations) is the same on every
    rank: each machine's first process prints it (rank 0 without naming itself), for the terminal
    that machine was started from. A file error (missing or damaged data, a full disk) may be one
    process's own, so every other process prints its own too, naming itself."""
    from lightning_dpgan.launch_env import launched_as_follower, launched_as_machine_follower, launched_process_name

    if not launched_as_follower():
        print(f"error: {error}", file=sys.stderr)
    elif not launched_as_machine_follower() or not isinstance(error, (ValueError, *_misconfiguration())):
        print(f"error ({launched_process_name()}): {error}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    reuse_freed_memory()  # before any run: its large CPU tensors then cost no page faults each step
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(usage() + "\n\ncommands:")
        for name, text in COMMAND_HELP.items():
            print(f"  {name:<10} {text}")
        print(f"\noptions:\n  {'--version':<10} {VERSION_HELP}")
        return 0
    if argv[:1] == ["--version"]:  # after a command, that command's parser prints it (add_version_option)
        print(version_line())
        return 0
    if not argv or argv[0] not in COMMANDS:
        print(usage(), file=sys.stderr)
        if argv:  # a typo ('trian') or an option before the command: say which word was not one
            print(f"error: {argv[0]!r} is not a command.{registry.did_you_mean(argv[0], COMMANDS)} Commands: "
                  f"{', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    try:
        path = COMMANDS[command](rest)
    # OSError: missing files, a full disk (outputs.OutputWriteError names the file), permissions.
    # Lightning's MisconfigurationException: --devices 0, --accelerator gpu without one, ...
    # YAMLError: a damaged config.yaml (evaluate reads the run's).
    except (ConfigError, registry.UnknownNameError, ValueError, DataIntegrityError, OSError,
            *_misconfiguration(), yaml.YAMLError) as error:
        if os.environ.get("LIGHTNING_DPGAN_DEBUG"):
            raise
        report_error(error)
        return 2
    except _lightning_sigterm():  # Lightning's stop on SIGTERM (train said what it kept): the shell's status for it
        return 128 + signal.SIGTERM
    except KeyboardInterrupt as interrupt:  # Ctrl-C: the file being written removed its temporary copy
        if os.environ.get("LIGHTNING_DPGAN_DEBUG"):
            raise
        from lightning_dpgan.launch_env import say_once_per_machine

        if str(interrupt):  # train's rank 0 says what its checkpoint kept and how to go on (Run.interrupted_sentence)
            print(f"{command}: {interrupt}", file=sys.stderr)
        else:  # a DDP machine's other processes share its terminal
            say_once_per_machine(f"{command}: interrupted")
        return 130
    from lightning_dpgan.launch_env import launched_as_follower

    if not launched_as_follower():  # a DDP run's files are rank 0's
        print(f"{command}: wrote {path}")
    return 0


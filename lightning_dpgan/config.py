"""Resolving a run's configuration.

Precedence, lowest first: code defaults, ``configs/<model>.yaml``, ``configs/<model>_<dataset>.yaml``
(the papers' hyper-parameters), ``configs/<model>_<dataset>_eps<epsilon>.yaml`` (settings a paper
tunes per privacy level, applied for that ``--epsilon``), the user's ``--config FILE``, the CLI flags, and finally dotted
overrides such as ``--model.lr_generator 1e-4`` or ``--data.batch_size=32``. With ``--model quail`` the
presets of its synthesizer (``--quail-synthesizer``) come first, then QUAIL's own; the ``model``
section then holds the synthesizer's arguments and a ``quail`` section QUAIL's.

A run's length is set as a whole: when the user's ``--config`` or flags give ``max_steps`` or
``max_epochs``, the presets' length settings are dropped, so ``--max-epochs 500`` runs 500 epochs
rather than stopping at a preset's ``max_steps`` (the two limits otherwise both apply, whichever
comes first); flags giving either drop the ``--config`` file's too, so that a run continued with
its ``config.yaml`` and ``--max-epochs 2`` is not held to the ``max_steps`` that file recorded.

The resolved configuration has four sections, each a ``name`` plus the keyword arguments of
the class that name selects -- ``model``, ``data``, ``privacy`` and ``logger`` -- a ``trainer``
section of extra ``lightning.Trainer`` arguments, and a few top-level run settings. Written back
out as ``config.yaml``, it reproduces the run with ``--config``.
"""
from __future__ import annotations

import copy
import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from lightning_dpgan import registry
from lightning_dpgan.argument_types import init_arguments, mismatches
from lightning_dpgan.error_text import named_file_text
from lightning_dpgan.unique_keys import UniqueKeyLoader

SECTIONS = ("model", "data", "privacy", "logger", "trainer")
#: ``--model quail`` composes a label model with this synthesizer unless ``--quail-synthesizer``
#: names another; its ``model`` section then holds the synthesizer's arguments.
QUAIL = "quail"
DEFAULT_QUAIL_SYNTHESIZER = "dpctgan"

CODE_DEFAULTS: dict[str, Any] = {
    "model": {"name": None},
    "data": {"name": None},
    "privacy": {"name": None},  # None: the model's default strategy
    "logger": {"name": "csv"},
    "trainer": {"accelerator": "auto", "devices": 1, "strategy": "auto"},
    "seed": 0,
    "epsilon": None,
    "delta": None,
    "max_steps": None,
    "max_epochs": None,
    "output_dir": None,
    "resume": None,
    "sample_every_n_steps": 0,
    "checkpoint_every_n_steps": 500,
    "sample_columns": 10,
    "num_synthetic": None,  # rows in synthetic.csv (tables); None: as many as training records
    "evaluate": False,  # evaluate the run after training (evaluation.json)
    "overwrite": False,  # replace the run an existing --output-dir holds (its outputs are set aside)
}

#: Top-level settings that are whole numbers: (smallest value allowed, whether None is allowed).
INTEGER_SETTINGS = {"seed": (0, False), "max_steps": (1, True), "max_epochs": (1, True), "num_synthetic": (1, True),
                    "sample_every_n_steps": (0, False), "checkpoint_every_n_steps": (0, True), "sample_columns": (1, False)}
BOOLEAN_SETTINGS = ("evaluate", "overwrite")
#: Settings of one invocation, left out of a run's config.yaml: rerunning it with --config must
#: neither replace that run's folder nor continue its checkpoint.
INVOCATION_ONLY = ("overwrite", "resume")
#: A privacy strategy's arguments that --epsilon and --delta set (not dotted overrides)
PRIVACY_PROVIDED = ("target_epsilon", "delta")
#: A model's arguments that its privacy strategy hands it (``--privacy.<name>``, not ``--model.``):
#: the strategy builds the teachers or critics it aggregates over
STRATEGY_OWNED = ("num_teachers", "num_critics")
#: A model's arguments the run fills in from its datamodule or its strategy (not dotted overrides)
MODEL_PROVIDED = ("data_shape", "num_classes", "table_layout", *STRATEGY_OWNED)

#: Settings that name a file or folder: a run's config.yaml holds them as absolute paths, so that
#: ``--config`` and ``evaluate`` find the same data from any working directory.
PATH_SETTINGS = ("data.data_dir", "data.cache_dir", "data.csv", "data.schema")

#: The settings of a run's length (see the module docstring: the user's replace the presets' as a whole).
RUN_LENGTH = ("max_steps", "max_epochs")

#: CLI flag -> dotted configuration key.
FLAG_KEYS = {
    "model": "model.name",
    "dataset": "data.name",
    "privacy": "privacy.name",
    "data_dir": "data.data_dir",
    "batch_size": "data.batch_size",
    "output_dir": "output_dir",
    "epsilon": "epsilon",
    "delta": "delta",
    "max_steps": "max_steps",
    "max_epochs": "max_epochs",
    "seed": "seed",
    "devices": "trainer.devices",
    "accelerator": "trainer.accelerator",
    "strategy": "trainer.strategy",
    "num_nodes": "trainer.num_nodes",
    "logger": "logger.name",
    "wandb_project": "logger.project",
    "wandb_entity": "logger.entity",
    "wandb_name": "logger.run_name",
    "evaluate": "evaluate",
    "overwrite": "overwrite",
    "resume": "resume",
    "quail_synthesizer": "quail.synthesizer",
    "quail_split": "quail.split",
}


class ConfigError(ValueError):
    """A configuration that cannot be run; the message says which key and what to change."""


class _Loader(UniqueKeyLoader):
    """YAML 1.1 reads ``1e-4`` as a string; scientific notation is common in configs. A key
    given twice in one mapping is refused (YAML keeps the last in silence)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    text = named_file_text(path, "config file", ConfigError)
    try:
        data = yaml.load(text, Loader=_Loader) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"config file {path} is not valid YAML: {error}") from error
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys, not {type(data).__name__}")
    return data


def parse_value(text: str) -> Any:
    """Read a command-line value the way YAML would (numbers, booleans, lists, null)."""
    return yaml.load(text, Loader=_Loader)


#: settings whose value is a mapping that declares a whole (the mixed columns and their special
#: values): a later source's replaces an earlier one's, never merges into it, so ``--data.mixed '{}'``
#: takes back a preset's declaration
WHOLE_MAPPINGS = ("data.mixed",)


def merge(base: dict[str, Any], update: dict[str, Any], settings_whole: bool = False, _path: str = "") -> dict[str, Any]:
    """Recursive dict merge: ``update`` wins; nested sections merge key by key, but for
    :data:`WHOLE_MAPPINGS`, which ``update`` replaces. ``settings_whole``: every setting of a
    section (a key inside it) whose value is a mapping replaces too, as a config file's do: a
    run's config.yaml holds each mapping as the run had it (``teacher_kwargs: {}``)."""
    merged = copy.deepcopy(base)
    for key, value in update.items():
        path = f"{_path}{key}"
        whole = path in WHOLE_MAPPINGS or (settings_whole and "." in path)
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and not whole:
            merged[key] = merge(merged[key], value, settings_whole, f"{path}.")
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def set_dotted(config: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"cannot set '{dotted}': '{part}' is not a section")
    node[leaf] = value


def get_dotted(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def preset_files(model: str | None, dataset: str | None, epsilon: Any = None) -> list[str]:
    """Names of the shipped presets that apply, lowest precedence first.

    Papers tune some settings per privacy level (G-PATE: more teachers and more noise at
    epsilon 1 than at 10); ``<model>_<dataset>_eps<epsilon>.yaml`` holds those, applied when
    the run's ε has that value (``--epsilon``, a ``--config`` file's, else the presets' own:
    :func:`preset_epsilon`).
    """
    names = []
    if model:
        names.append(f"{model}.yaml")
        if dataset:
            names.append(f"{model}_{dataset}.yaml")
            if epsilon is not None:
                names.append(f"{model}_{dataset}_eps{_epsilon_tag(epsilon)}.yaml")
    shipped = resources.files("lightning_dpgan.configs")
    return [name for name in names if shipped.joinpath(name).is_file()]


def _epsilon_tag(epsilon: Any) -> str:
    """``1`` -> ``"1"``, ``0.5`` -> ``"0.5"`` (the form in preset file names)."""
    try:
        return f"{float(epsilon):g}"
    except (TypeError, ValueError):
        return str(epsilon)


def load_preset(name: str) -> dict[str, Any]:
    with resources.as_file(resources.files("lightning_dpgan.configs").joinpath(name)) as path:
        return load_yaml(path)


def preset_epsilon(names: list[str], privacy: str | None) -> Any:
    """The ε the presets ``names`` set (the last one that sets it), or None."""
    epsilon = None
    for name in names:
        epsilon = _preset_for(load_preset(name), privacy).get("epsilon", epsilon)
    return epsilon


def _preset_for(preset: dict[str, Any], privacy: str | None) -> dict[str, Any]:
    """A preset's ``privacy`` section names the strategy it is for; another chosen strategy
    does not inherit its settings (they would be unknown keys to it)."""
    section = preset.get("privacy")
    if privacy and isinstance(section, dict) and section.get("name") not in (None, privacy):
        return {key: value for key, value in preset.items() if key != "privacy"}
    return preset


def resolve(flags: dict[str, Any], overrides: dict[str, Any], config_file: str | None = None,
            notes: list[str] | None = None) -> dict[str, Any]:
    """Build the run configuration from every source (see the module docstring); what the
    command line set aside of the config file is said in ``notes``."""
    user = load_yaml(config_file) if config_file else {}
    if config_file:
        check_config_file(user, config_file)
    cli: dict[str, Any] = {}
    for flag, value in flags.items():
        if value is not None:
            set_dotted(cli, FLAG_KEYS[flag], value)
    for dotted, value in overrides.items():
        if isinstance(value, dict) and isinstance(cli.get(dotted), dict):  # --data '{...}' beside --dataset adult
            value = merge(cli[dotted], value)
        set_dotted(cli, dotted, value)
    user = _without_another_loggers_settings(user, cli, config_file, [] if notes is None else notes)
    model = get_dotted(cli, "model.name") or get_dotted(user, "model.name")
    dataset = get_dotted(cli, "data.name") or get_dotted(user, "data.name")
    privacy = get_dotted(cli, "privacy.name") or get_dotted(user, "privacy.name")
    config = copy.deepcopy(CODE_DEFAULTS)
    # the models whose presets apply: QUAIL's synthesizer's first (its model, data and privacy
    # settings), then QUAIL's own, then those tuned for QUAIL with that synthesizer alone
    # (quail-dpctgan_king_eps1.yaml: DP-CTGAN's histogram settings, which another synthesizer refused)
    models = [model]
    if model == QUAIL:
        if "" in (get_dotted(cli, "quail.synthesizer"), get_dotted(user, "quail.synthesizer")):
            raise ConfigError(f"--quail-synthesizer is empty: name the table model that generates the features, or "
                              f"leave it out for {DEFAULT_QUAIL_SYNTHESIZER}")
        synthesizer = get_dotted(cli, "quail.synthesizer") or get_dotted(user, "quail.synthesizer") or DEFAULT_QUAIL_SYNTHESIZER
        set_dotted(cli, "quail.synthesizer", synthesizer)
        models = [synthesizer, model, f"{QUAIL}-{synthesizer}"]
    epsilon = get_dotted(cli, "epsilon") if get_dotted(cli, "epsilon") is not None else get_dotted(user, "epsilon")
    if epsilon is None:  # the presets' own: the same ε resolves the same settings, typed or not
        epsilon = preset_epsilon([name for each in models for name in preset_files(each, dataset)], privacy)
    presets = [name for each in models for name in preset_files(each, dataset, epsilon)]
    for name in presets:
        config = merge(config, _preset_for(load_preset(name), privacy))
    if notes is not None and config_file and get_dotted(cli, "epsilon") is not None:
        written_for = [name for each in models for name in preset_files(each, dataset, user.get("epsilon"))]
        _note_a_file_of_another_epsilon(user, written_for, config, cli, config_file, notes)
    if any(source.get(key) is not None for source in (user, cli) for key in RUN_LENGTH):
        config.update({key: CODE_DEFAULTS[key] for key in RUN_LENGTH})
    if any(cli.get(key) is not None for key in RUN_LENGTH):  # the flags' length replaces the file's too
        user = {key: value for key, value in user.items() if key not in RUN_LENGTH}
    config = merge(merge(config, user, settings_whole=True), cli)
    for dotted, value in overrides.items():  # a mapping typed whole (--model.teacher_kwargs '{}') is the value,
        if isinstance(value, dict) and "." in dotted:  # not keys to merge into the presets' (its dotted keys, typed
            set_dotted(config, dotted, copy.deepcopy(get_dotted(cli, dotted)))  # too, stay in it); a section merges
    config["presets"] = presets
    check_top_level(config)
    return config


def _leaves(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``config``'s settings by dotted name (a mapping of :data:`WHOLE_MAPPINGS` is one setting)."""
    leaves = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and path not in WHOLE_MAPPINGS:
            leaves.update(_leaves(value, f"{path}."))
        else:
            leaves[path] = value
    return leaves


def _note_a_file_of_another_epsilon(user: dict[str, Any], written_for: list[str], resolved: dict[str, Any],
                                    cli: dict[str, Any], path: str, notes: list[str]) -> None:
    """A run's config.yaml rerun under another ``--epsilon``: the presets of the new ε are resolved,
    but the file's values override them, those its own ε's presets (``written_for``) gave it among
    them. Those the command line does not set itself are said, beside what the new ε's presets (or
    the code) would set."""
    epsilon = cli.get("epsilon")
    if user.get("epsilon") is None or epsilon == user["epsilon"]:
        return
    earlier: dict[str, Any] = {}
    privacy = get_dotted(cli, "privacy.name") or get_dotted(user, "privacy.name")
    for name in written_for:
        earlier = merge(earlier, _preset_for(load_preset(name), privacy))
    earlier, now, typed = _leaves(earlier), _leaves(resolved), _leaves(cli)
    if any(cli.get(key) is not None for key in RUN_LENGTH):  # the flags' length replaces the file's
        typed.update(dict.fromkeys(RUN_LENGTH))
    kept = [f"{key} {value!r} (not {now[key]!r})" if key in now else f"{key} {value!r} (not the code's default)"
            for key, value in _leaves(user).items()
            if key in earlier and value == earlier[key] and key not in typed and key != "epsilon"
            and now.get(key, object()) != value]
    if kept:
        shown = "; ".join(kept[:6]) + (f"; and {len(kept) - 6} more" if len(kept) > 6 else "")
        notes.append(f"--epsilon {epsilon:g} differs from {path}'s epsilon {user['epsilon']:g}: its values, those of "
                     f"the epsilon {user['epsilon']:g} presets among them, override the presets of epsilon {epsilon:g}: "
                     f"{shown}. Leave them out of the file to take the new ones")


def _without_another_loggers_settings(user: dict[str, Any], cli: dict[str, Any], path: str | None,
                                      notes: list[str]) -> dict[str, Any]:
    """A config file's logger settings are its logger's: a run that picks another (``--logger csv``
    over a W&B run's config.yaml, on a machine without wandb) leaves them out, with a note. Kept,
    they were refused as W&B flags the user never typed, and only an edit of the file got past."""
    chosen, section = get_dotted(cli, "logger.name"), user.get("logger")
    # a section naming no logger is settings for whichever is chosen (check_logger_options judges them)
    if not chosen or not isinstance(section, dict) or section.get("name", chosen) == chosen:
        return user
    dropped = [f"logger.{key}" for key in section if key != "name" and get_dotted(cli, f"logger.{key}") is None]
    if dropped:
        notes.append(f"--logger {chosen} replaces the logger {section.get('name')} of {path}: its settings "
                     f"{', '.join(dropped)} are left out")
    return {**user, "logger": {}}


def with_absolute_paths(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` whose :data:`PATH_SETTINGS` given as text are absolute paths
    (``~`` expanded; resolved against the current directory, as the run read them)."""
    config = copy.deepcopy(config)
    for dotted in PATH_SETTINGS:
        value = get_dotted(config, dotted)
        if isinstance(value, (str, Path)) and str(value):
            set_dotted(config, dotted, str(Path(value).expanduser().absolute()))
    return config


def check_top_level(config: dict[str, Any]) -> None:
    known = set(CODE_DEFAULTS) | {"presets", QUAIL}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ConfigError(f"unknown configuration key(s): {', '.join(unknown)}. Valid top-level keys: {', '.join(sorted(known))}.")
    for section in SECTIONS:
        if not isinstance(config.get(section), dict):
            raise ConfigError(f"configuration section '{section}' must be a mapping")
    if QUAIL in config and config["model"].get("name") != QUAIL:
        raise ConfigError(f"QUAIL settings (quail.*, --quail-synthesizer, --quail-split) need --model quail, "
                          f"not --model {config['model'].get('name')}")
    if not isinstance(config.get(QUAIL, {}), dict):
        raise ConfigError("configuration section 'quail' must be a mapping")
    check_setting_values(config)


def check_config_file(user: dict[str, Any], path: str | Path) -> None:
    """Refuse a ``--config`` file's own mistakes naming the file and the key as written there.

    Checked once merged, a file's ``max_steps: abc`` would be blamed on ``--max-steps``, a flag
    the user never typed, and ``dataset: adult`` (the flag's name, not its key ``data.name``)
    would be just an unknown key.
    """
    known = set(CODE_DEFAULTS) | {"presets", QUAIL}
    unknown = [key for key in user if key not in known]  # YAML keys may be numbers too: not sorted
    if unknown:
        key = unknown[0]
        raise ConfigError(f"config file {path}: unknown key '{key}'.{_how_to_write(str(key), user[key], known)}")
    for section in (*SECTIONS, QUAIL):
        if section in user and not isinstance(user[section], dict):
            named_by = {QUAIL: "synthesizer", "trainer": None}.get(section, "name")  # what a bare value names
            example = (f" (e.g. {section}: {{{named_by}: {_as_yaml(user[section])}}})"
                       if named_by and isinstance(user[section], str) else "")
            raise ConfigError(f"config file {path}: '{section}' must be a section of keys{example}, "
                              f"got {user[section]!r}")
    check_setting_values(user, where=f" in {path}")
    for key in ("epsilon", "delta"):
        value = user.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"{key} in {path} must be a number, got {value!r}")


def _how_to_write(key: str, value: Any, known: set[str]) -> str:
    """How a config file writes the setting a flag-like or dotted ``key`` meant, else the closest key."""
    dotted = FLAG_KEYS.get(key.replace("-", "_"), "")
    if "." in dotted:  # --dataset is data.name, --devices is trainer.devices
        section, name = dotted.split(".", 1)
        return f" The --{key.replace('_', '-')} flag's setting is written {section}: {{{name}: {_as_yaml(value)}}}."
    section, _, name = key.partition(".")
    if name and section in (*SECTIONS, QUAIL):  # a dotted override's key, as a flag writes it
        return f" In a config file, {key} is written {section}: {{{name}: {_as_yaml(value)}}}."
    return registry.did_you_mean(key, sorted(known)) or f" Valid top-level keys: {', '.join(sorted(known))}."


def _as_yaml(value: Any) -> str:
    """``value`` as YAML writes it inline (null, not Python's None)."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def check_setting_values(config: dict[str, Any], where: str = "") -> None:
    """Refuse, before anything runs, a top-level value that would be misread: ``max_steps: 0``
    (a falsy "no limit"), a count written as text, "maybe" for a yes/no setting.

    ``where`` names a config file: its values are checked only where it gives them, by their key.
    """
    def named(key: str) -> str:  # as the user gave it: a config file's key, a flag, or a top-level override
        if where:
            return f"{key}{where}"
        return f"--{key.replace('_', '-')}" if key in FLAG_KEYS else f"--{key}"

    for key, (minimum, optional) in INTEGER_SETTINGS.items():
        value = config.get(key)
        if (value is None and optional) or (where and key not in config):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{named(key)} must be a whole number >= {minimum}{' (or left out)' if optional else ''}, got {value!r}")
    if config.get("seed", 0) >= 2**32:  # numpy's and Lightning's seeds; refused after the trainer was built before
        raise ConfigError(f"{named('seed')} must be below 2^32 = {2**32}, got {config['seed']}")
    for key in BOOLEAN_SETTINGS:
        if (not where or key in config) and not isinstance(config.get(key), bool):
            raise ConfigError(f"{key}{where} must be true or false, got {config.get(key)!r}")


def _presets_setting(config: dict[str, Any], section: str, keys: list[str]) -> str:
    """`` (set by the preset configs/x.yaml)`` when a shipped preset the run applied sets one of
    ``keys`` to the value the run has: the user may never have typed it, so the error must say
    where it came from."""
    privacy = config.get("privacy", {}).get("name")
    names = [name for name in config.get("presets", [])
             if isinstance(section_of := _preset_for(load_preset(name), privacy).get(section), dict)
             and any(key in section_of and section_of[key] == config[section].get(key) for key in keys)]
    return f" (set by the preset {', '.join(f'configs/{name}' for name in names)})" if names else ""


def _strategy_owned_hint(section: str, keys: list[str], cls: type) -> str:
    """Where a model setting its privacy strategy owns is set (``--model.num_teachers`` would
    otherwise meet a model whose strategy builds another number of teachers); only for a model
    that takes it (DP-SGD has no --privacy.num_teachers to point a DPGAN at)."""
    owned = [key for key in keys if section == "model" and key in STRATEGY_OWNED and key in init_arguments(cls)]
    if not owned:
        return ""
    return f" ({', '.join(owned)}: the privacy strategy's, set with {', '.join(f'--privacy.{key}' for key in owned)})"


def section_arguments(config: dict[str, Any], section: str, cls: type, provided: tuple[str, ...] = ()) -> dict[str, Any]:
    """The keyword arguments for ``cls`` from ``config[section]``, refusing unknown keys.

    ``provided`` names arguments the framework fills in itself (e.g. ``data_shape``).
    """
    args = {key: value for key, value in config[section].items() if key != "name"}
    valid = [name for name in init_arguments(cls) if name not in provided]
    unknown = sorted(set(args) - set(valid))
    if unknown:
        owner = config[section].get("name") or cls.__name__
        raise ConfigError(
            f"unknown key(s) {', '.join(f'{section}.{key}' for key in unknown)} for {section} '{owner}'"
            f"{_presets_setting(config, section, unknown)}{_strategy_owned_hint(section, unknown, cls)}. "
            f"Valid keys: {', '.join(f'{section}.{name}' for name in valid)}."
        )
    wrong = mismatches(section, args, cls)
    if wrong:
        raise ConfigError("; ".join(wrong))
    return args

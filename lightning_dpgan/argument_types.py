"""Checking a configuration value against the annotation of the argument it fills.

A dotted override arrives as YAML (``--model.latent_dim abc`` is the text "abc"), and a class
that receives the wrong kind of value fails deep inside with a ``TypeError``, or worse, takes it:
"maybe" is a true value for a yes/no setting. :func:`mismatches` compares each value with its
parameter's annotation first, and the configuration refuses it naming the key, the kind it
expects and what it got.
Annotations it cannot judge (a class, a callable) let the value through to the class itself.
"""
from __future__ import annotations

import collections.abc
import datetime
import math
import os
import inspect
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any

_SEQUENCES = (list, tuple, collections.abc.Sequence, collections.abc.MutableSequence)
_MAPPINGS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


def constructor_chain(cls: type) -> Iterator[Callable[..., Any]]:
    """The ``__init__`` s whose arguments ``cls`` takes: its own, then its bases' for as long as
    each one passes ``**kwargs`` on."""
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        yield init
        if not any(p.kind == p.VAR_KEYWORD for p in inspect.signature(init).parameters.values()):
            return


def init_arguments(cls: type) -> dict[str, inspect.Parameter]:
    """Keyword arguments a class takes, following ``**kwargs`` up to its base classes."""
    params: dict[str, inspect.Parameter] = {}
    for init in constructor_chain(cls):
        for name, param in inspect.signature(init).parameters.items():
            if name != "self" and param.kind not in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
                params.setdefault(name, param)
    return params


def annotations_of(cls: type) -> dict[str, Any]:
    """The resolved annotations of the arguments ``cls`` takes (:func:`constructor_chain`; the
    first class to annotate a name wins)."""
    hints: dict[str, Any] = {}
    for init in constructor_chain(cls):
        try:
            found = typing.get_type_hints(init)
        except Exception:  # an annotation that does not resolve here: judge nothing of this class
            found = {}
        for name, hint in found.items():
            if name != "return":
                hints.setdefault(name, hint)
    return hints


def matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` (as YAML gives it) is of the kind ``hint`` describes; True where it cannot tell."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is os.PathLike or origin is os.PathLike:  # a path: YAML gives it as text
        return isinstance(value, (str, os.PathLike))
    if origin is typing.Literal:
        return value in args
    if hint in _SEQUENCES or origin in _SEQUENCES:
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(matches(item, arg) for item, arg in zip(value, args))
        return not args or all(matches(item, args[0]) for item in value)
    if hint in _MAPPINGS or origin in _MAPPINGS:
        return isinstance(value, dict)
    if hint is datetime.timedelta:  # YAML makes none: Lightning's max_time reads 5 as one and fails deep inside
        return isinstance(value, datetime.timedelta)
    return True


def describe(hint: Any) -> str:
    """``hint`` in words, for an error message."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(arg) for arg in args)
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "text", type(None): "null",
             datetime.timedelta: "a duration"}
    if hint in names:
        return names[hint]
    if hint is os.PathLike or origin is os.PathLike:
        return "a path"
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, args))
    if hint in _SEQUENCES or origin in _SEQUENCES:
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)} ({', '.join(describe(arg) for arg in args)})"
        return f"a list (each {describe(args[0])})" if args else "a list"
    if hint in _MAPPINGS or origin in _MAPPINGS:
        return "a mapping"
    return str(hint)


def mismatches(section: str, args: dict[str, Any], cls: type) -> list[str]:
    """One message per value of ``args`` that does not match its parameter's annotation."""
    hints = annotations_of(cls)
    mistyped = [key for key, value in args.items() if key in hints and not matches(value, hints[key])]
    wrong = [f"{section}.{key} must be {describe(hints[key])}, got {args[key]!r}"
             f"{_sexagesimal_note(args[key], hints[key])}{_quoting_note(section, key, args[key], hints[key])}"
             for key in mistyped]
    return wrong + _non_finite(section, {key: value for key, value in args.items() if key not in mistyped})


def _non_finite(section: str, args: dict[str, Any]) -> list[str]:
    """An infinite or NaN setting of this package's classes: no setting means anything at .inf or
    .nan (a NaN weight clip turned clipping off in silence, an infinite learning rate diverged at
    the first step), and config.yaml, written through JSON's rules, could not rerun the run.
    Lightning's Trainer arguments are Lightning's to check."""
    if section == "trainer":
        return []
    return [f"{section}.{key} must be a finite number, got {value!r}" for key, value in args.items()
            if isinstance(value, float) and not math.isfinite(value)]


def _quoting_note(section: str, key: str, value: Any, hint: Any) -> str:
    """A value given on the command line is read as YAML: a column named ``2020``, ``on`` or
    ``1.5`` arrives as a number or a boolean where text was wanted. Say how to keep it text (what
    was typed is gone: ``007`` arrived as 7, so the example is not the user's own)."""
    accepted = typing.get_args(hint) or (hint,)
    if str not in accepted or any(kind in accepted for kind in (bool, int, float, datetime.timedelta)):
        return ""  # a number would do, or text has a format of its own
    if not isinstance(value, (bool, int, float)):
        return ""
    return (f" (a value is read as YAML, where 2020, 1.5, on or yes are a number or a boolean: quote a name written "
            f"so, as it is written, e.g. --{section}.{key} '\"2020\"')")


def _sexagesimal_note(value: Any, hint: Any) -> str:
    """YAML 1.1 reads an unpadded ``1:00:00:00`` as the number 216000 (base 60): where a
    duration was meant, say how to write it so that it stays text."""
    takes_duration = hint is datetime.timedelta or datetime.timedelta in typing.get_args(hint)
    if isinstance(value, int) and not isinstance(value, bool) and takes_duration:
        return " (a duration such as 1:00:00:00 is read as a number: write it zero-padded, 01:00:00:00, or quoted)"
    return ""


def network_settings(setting: str, cls: type, kwargs: dict[str, Any] | None,
                     provided: tuple[str, ...] = ("num_classes",)) -> dict[str, Any]:
    """``kwargs`` for building the network ``cls``, once each key is one of its arguments and each
    value of the kind it annotates. ``setting`` is where they come from (``model.generator_kwargs``);
    ``provided``: the optional arguments the builder sets itself, left out of the ones named.

    A nested override reaches no section check (``--model.generator_kwargs.hidden abc``), and torch
    would answer "empty(): argument 'size' must be tuple of ints" without naming the setting. The
    ``TypeError`` raised here is what the module builder reports as a refused setting."""
    kwargs = dict(kwargs or {})
    arguments = init_arguments(cls)
    unknown = sorted(set(kwargs) - set(arguments), key=str)
    if unknown:
        settable = sorted(name for name, p in arguments.items() if p.default is not p.empty and name not in provided)
        raise TypeError(f"{', '.join(f'{setting}.{key}' for key in unknown)}: not an argument of {cls.__name__} "
                        f"(it takes {', '.join(settable)})")
    problems = mismatches(setting, kwargs, cls)
    if problems:
        raise TypeError("; ".join(problems))
    return kwargs

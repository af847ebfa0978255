"""Both spellings of a long option: ``--data_dir`` is read as ``--data-dir``, ``--num-synthetic``
as ``--num_synthetic``, ``--model.lr-generator`` as ``--model.lr_generator``.

Why: the commands' own options take hyphens (argparse's custom), while settings without a flag
of their own and dotted overrides take their keys' underscores (Lightning's and the YAML files'
spelling). Users type whichever they saw last, and an option refused for its spelling costs a
rerun for nothing: the spelling says nothing about which setting is meant.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Collection, Sequence
from typing import Any


def respelled(argv: Sequence[str], options: Collection[str]) -> list[str]:
    """``argv`` with each long option that is not in ``options``, but whose other spelling
    (hyphens and underscores swapped) is, spelled as ``options`` have it; a dotted override's
    argument (its second word) takes underscores, as every class argument does; a key below it is
    left as typed, since it may name a column (``--data.mixed.capital-gain``). A value
    (``--name=value``'s included) is never changed, and nothing after a bare ``--`` is."""
    words = list(argv)
    for index, word in enumerate(words):
        if word == "--":
            break
        if not word.startswith("--"):
            continue
        name, equals, value = word[2:].partition("=")
        spelled = _other_spelling(name, options)
        if spelled is not None:
            words[index] = f"--{spelled}{equals}{value}"
    return words


def _other_spelling(name: str, options: Collection[str]) -> str | None:
    if f"--{name}" in options:
        return None
    if "." in name:  # a class argument's name; a key below it may be a column's ("capital-gain")
        section, argument, *below = name.split(".")
        return ".".join([section, argument.replace("-", "_"), *below]) if "-" in argument else None
    for spelled in (name.replace("_", "-"), name.replace("-", "_")):
        if spelled != name and f"--{spelled}" in options:
            return spelled
    return None


class BothSpellingsParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that reads each of its long options under either spelling."""

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        argv = sys.argv[1:] if args is None else args
        return super().parse_known_args(respelled(argv, self._option_string_actions), namespace)


__all__ = ["BothSpellingsParser", "respelled"]

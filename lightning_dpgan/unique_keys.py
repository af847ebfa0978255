"""Settings files whose mappings name a key twice are refused.

YAML and JSON parsers keep the last of a repeated key in silence. In a config file that
changes a setting without a word; in a schema file it replaces a column's declared public
bounds or categories. Both loaders of user files (:mod:`lightning_dpgan.config`,
:mod:`lightning_dpgan.data.schema`) refuse them, naming the key (in YAML, with the line it is
first given on and where it is given again). The YAML loader also splices merge keys
(``<<: *defaults``) itself, by YAML's rules, as the PyYAML in use does not always.
"""
from __future__ import annotations

from typing import Any

import yaml

#: the tag of YAML's merge key (``<<: *defaults``), whose merged keys the mapping's own may override
MERGE_TAG = "tag:yaml.org,2002:merge"


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key repeated within one mapping."""

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        """Splice the pairs of a mapping's merge keys (``<<: *defaults``, ``<<: [*a, *b]``) into it,
        as YAML's merge-key rules say: the mapping's own keys win over merged ones, and an earlier
        merged mapping over a later one. Each key is kept once, with the value that wins.

        Written here rather than left to PyYAML, whose 6.0.4 keeps the first of a key merged from a
        mapping that overrides its own merge (``inner: &b {<<: *a, x: 2}``, then ``c: {<<: *b}``
        gave ``c`` the ``x`` of ``a``): a setting changed in silence. The mapping's own pairs are
        kept apart first (``own_pairs``, for :meth:`construct_mapping`'s check of repeated keys): a
        mapping merged into another may be flattened before its own turn to be built."""
        if not hasattr(node, "own_pairs"):
            node.own_pairs = [(key, value) for key, value in node.value if key.tag != MERGE_TAG]
        merged: list[tuple[yaml.Node, yaml.Node]] = []
        own: list[tuple[yaml.Node, yaml.Node]] = []
        for key, value in node.value:
            if key.tag != MERGE_TAG:
                if key.tag == "tag:yaml.org,2002:value":  # the '=' key, read as text (as PyYAML does)
                    key.tag = "tag:yaml.org,2002:str"
                own.append((key, value))
                continue
            for source in self._merged_mappings(node, value):
                self.flatten_mapping(source)
                merged.extend(source.value)
        if merged:  # the merged pairs no own key overrides, each key once, then the mapping's own
            owned = {_key_of(key) for key, _ in own}
            node.value = [*_first_of_each_key([pair for pair in merged if _key_of(pair[0]) not in owned]), *own]

    @staticmethod
    def _merged_mappings(node: yaml.MappingNode, value: yaml.Node) -> list[yaml.MappingNode]:
        """The mappings a merge key names: one, or a list of them (earlier ones win)."""
        sources = value.value if isinstance(value, yaml.SequenceNode) else [value]
        for source in sources:
            if not isinstance(source, yaml.MappingNode):
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"expected a mapping or list of mappings for merging, but found {source.id}", source.start_mark)
        return sources

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_lines: dict[Any, int] = {}
        own_pairs = getattr(node, "own_pairs", None)
        for key_node, _ in node.value if own_pairs is None else own_pairs:
            if key_node.tag == MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                repeated = key in first_lines
            except TypeError:  # an unhashable key: SafeLoader refuses it itself
                continue
            if repeated:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice in one mapping (first on line {first_lines[key]}): "
                    "keep one", key_node.start_mark)
            first_lines[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _key_of(node: yaml.Node) -> Any:
    """What tells two key nodes apart before they are built: a scalar's tag and text, else the node."""
    return (node.tag, node.value) if isinstance(node, yaml.ScalarNode) else id(node)


def _first_of_each_key(pairs: list[tuple[yaml.Node, yaml.Node]]) -> list[tuple[yaml.Node, yaml.Node]]:
    """``pairs`` (in precedence order) with each key kept once: its first, the one that wins."""
    seen: set[Any] = set()
    kept = []
    for key, value in pairs:
        if _key_of(key) not in seen:
            seen.add(_key_of(key))
            kept.append((key, value))
    return kept


class RepeatedKeyError(ValueError):
    """A JSON object names a key twice."""


def refuse_repeated_json_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for :func:`json.loads`: a repeated key is a :class:`RepeatedKeyError`."""
    keys = [key for key, _ in pairs]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise RepeatedKeyError(f"the key(s) {', '.join(map(repr, repeated))} given twice in one object: keep one")
    return dict(pairs)

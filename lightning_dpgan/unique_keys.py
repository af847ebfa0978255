"""Settings files whose mappings name a key twice are refused.

YAML and JSON parsers keep the last of a repeated key in silence. In a config file that
changes a setting without a word; in a schema file it replaces a column's declared public
bounds or categories. Both loaders of user files (:mod:`lightning_dpgan.config`,
:mod:`lightning_dpgan.data.schema`) refuse them, naming the key (in YAML, with the line it is
first given on and where it is given again).
"""
from __future__ import annotations

from typing import Any

import yaml

#: the tag of YAML's merge key (``<<: *defaults``), whose merged keys the mapping's own may override
MERGE_TAG = "tag:yaml.org,2002:merge"


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key repeated within one mapping."""

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        """Keep a mapping's own pairs before PyYAML splices its merge keys' pairs into them: a
        mapping merged into another may be flattened before its own turn to be built."""
        if not hasattr(node, "own_pairs"):
            node.own_pairs = [(key, value) for key, value in node.value if key.tag != MERGE_TAG]
        super().flatten_mapping(node)

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


class RepeatedKeyError(ValueError):
    """A JSON object names a key twice."""


def refuse_repeated_json_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for :func:`json.loads`: a repeated key is a :class:`RepeatedKeyError`."""
    keys = [key for key, _ in pairs]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise RepeatedKeyError(f"the key(s) {', '.join(map(repr, repeated))} given twice in one object: keep one")
    return dict(pairs)

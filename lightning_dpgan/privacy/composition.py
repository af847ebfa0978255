"""Basic composition of privacy costs: (ε1, δ1) then (ε2, δ2) on the same rows is
(ε1 + ε2, δ1 + δ2)-DP (Dwork & Roth 2014, Theorem 3.16). Preprocessing releases (DP bounds,
DP modes) and QUAIL's label model are composed this way before training's own accounting."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The neighbouring relation of the preprocessing releases (a record added or removed), the one
#: their sensitivities are stated for
ADD_REMOVE = "add-remove"

#: What a DP release states to be composed with others (a datamodule's, QUAIL's label model's).
RELEASE_FIELDS = ("epsilon", "delta", "neighbours", "mechanism")


def release_fields(cost: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`RELEASE_FIELDS` of a release's cost; a cost that lacks one is refused by name."""
    missing = [key for key in RELEASE_FIELDS if key not in cost]
    if missing:
        raise ValueError(f"a DP release to compose must state {', '.join(RELEASE_FIELDS)}; this one lacks "
                         f"{', '.join(missing)}")
    return {key: cost[key] for key in RELEASE_FIELDS}


def compose_costs(parts: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Basic composition of preprocessing mechanisms run on the same rows: ε and δ add up.

    All parts that spend anything must hold for the same neighbouring relation (add/remove for
    the preprocessing mechanisms; a strategy under replace-one passes them already restated for
    it, ``callbacks/strategy.py``); ``parts`` keeps each cost as given, so a resume can restore
    them one by one.
    """
    spending = {name: cost for name, cost in parts.items() if cost["epsilon"] or cost["delta"]}
    relations = {cost.get("neighbours", ADD_REMOVE) for cost in spending.values()}
    if len(relations) > 1:
        raise ValueError(f"cannot compose preprocessing costs for different neighbouring relations: {sorted(relations)}")
    mechanisms = "; ".join(f"{name}: {cost['mechanism']}" for name, cost in parts.items())
    return {
        "epsilon": float(sum(cost["epsilon"] for cost in parts.values())),
        "delta": float(sum(cost["delta"] for cost in parts.values())),
        "mechanism": f"basic composition of {mechanisms}",
        "neighbours": relations.pop() if relations else ADD_REMOVE,
        "parts": {name: dict(cost) for name, cost in parts.items()},
    }

"""A run's lineage: the runs its training went through, so that branches can be told apart.

``--resume`` continues a checkpoint, and nothing stops a data holder from resuming the same
checkpoint twice (after a crash, or to try other settings). Each branch's ``privacy.json`` is
right about its own generator: the checkpoint's steps and its own. But both branches trained
through the same first steps, on the same records: publishing the two together releases more
than either report says, and the two folders would not show that they are related.

So every ``train`` gets a random run id, and a run's lineage is its checkpoint's lineage with
one more segment, ``{"run_id", "from_step"}``: the steps from ``from_step`` on were this run's.
Two reports whose lineages hold the same run id trained from a common state up to where they
part; released together, their costs compose (adding both reports' ε and δ is an upper bound,
the shared steps counted twice). The id is drawn from OS entropy, not ``--seed``: two runs with
the same seed are still two runs.
"""
from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

#: the run id of a segment trained before run ids were recorded (an older checkpoint's)
UNRECORDED = "unrecorded"


def new_run_id() -> str:
    return uuid.uuid4().hex


def extended_lineage(parent_info: Mapping[str, Any] | None, resumed_steps: int, run_id: str) -> list[dict[str, Any]]:
    """The lineage of a run that starts from ``parent_info`` (its checkpoint's run information;
    ``None`` for a new run) after ``resumed_steps`` steps, under ``run_id``."""
    earlier: Sequence[Mapping[str, Any]] = []
    if parent_info is not None:
        earlier = parent_info.get("lineage") or [{"run_id": UNRECORDED, "from_step": 0}]
    return [*(dict(segment) for segment in earlier), {"run_id": run_id, "from_step": int(resumed_steps)}]


def of_other_runs(report: Mapping[str, Any], run: Mapping[str, Any]) -> bool:
    """Whether a ``privacy.json`` (``report``) is of another run than a checkpoint's run
    information (``run``): copied in from another folder, or the checkpoint replaced. Told apart
    where both keep a lineage; reports from before it was kept are not."""
    ours, theirs = report.get("lineage"), run.get("lineage")
    return ours is not None and theirs is not None and ours != theirs

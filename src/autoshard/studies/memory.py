"""Placements that failed, per protocol and method: the tight-memory protocol's first result.

A placement fails when the method gave none (it dead-ended or refused the cap) or gave one
that puts more bytes on a device than the cap allows (or is not a device per table). A method
that was not run on a task (the exact search off the small tasks) has not failed there.
The metrics entry is `failed.<protocol>.<method>: int` (`studies.evaluate.FailedPlacements`).
"""

from collections.abc import Sequence

import numpy as np
import pandas as pd

from autoshard.data.tasks import Task


def placement_failed(task: Task, plan: Sequence[int] | None, sizes: np.ndarray) -> bool:
    """True when `plan` (a device per `task.tables` entry, or None) is missing or breaks the cap."""
    if plan is None:
        return True
    plan = np.asarray(plan)
    if plan.shape != (len(task.tables),) or not np.issubdtype(plan.dtype, np.integer):
        return True
    if len(plan) and (plan.min() < 0 or plan.max() >= task.devices):
        return True
    used = np.bincount(plan, weights=sizes[list(task.tables)], minlength=task.devices)
    return bool((used > task.memory_bytes).any())


def failed_counts(tasks: list[Task], plans: dict[str, list[np.ndarray | None]], sizes: np.ndarray,
                  status: pd.DataFrame | None = None) -> dict[str, dict[str, int]]:
    """protocol -> method -> number of the protocol's tasks whose placement failed. `plans` holds
    one entry per task (in `tasks` order) per method; `status` (`evaluate.plan_all`'s frame of
    task, method, status) marks the pairs that were not run, which are not counted."""
    skipped: set[tuple[str, str]] = set()
    if status is not None:
        not_run = status[status["status"].str.startswith("not run")]
        skipped = set(zip(not_run["task"], not_run["method"], strict=True))
    out: dict[str, dict[str, int]] = {}
    for method, per_task in plans.items():
        if len(per_task) != len(tasks):
            raise ValueError(f"method {method}: {len(per_task)} plans for {len(tasks)} tasks")
        for task, plan in zip(tasks, per_task, strict=True):
            counts = out.setdefault(task.protocol, {})
            counts[method] = counts.get(method, 0)
            if (task.name, method) not in skipped and placement_failed(task, plan, sizes):
                counts[method] += 1
    return out

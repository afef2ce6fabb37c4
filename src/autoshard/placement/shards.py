"""Plans as a table -> device map, and their predicted cost under the cost model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from autoshard.data.tasks import Task

if TYPE_CHECKING:  # the cost model needs torch; placing by a heuristic does not
    from autoshard.costmodel.model import CostModel


def device_shards(task: Task, placement: Sequence[int]) -> list[list[int]]:
    """Pool table ids per device; `placement[i]` is the device of `task.tables[i]`."""
    out: list[list[int]] = [[] for _ in range(task.devices)]
    for table, device in zip(task.tables, placement, strict=True):
        out[int(device)].append(int(table))
    return out



def predicted_device_costs(model: CostModel, features: np.ndarray, shards: Sequence[Sequence[int]]) -> np.ndarray:
    """Predicted cost (ms) per device; an empty device costs 0."""
    costs = np.zeros(len(shards))
    busy = [i for i, s in enumerate(shards) if s]
    if busy:
        costs[busy] = model.predict_ms(features, [shards[i] for i in busy])
    return costs



def predicted_bottleneck(model: CostModel, features: np.ndarray, task: Task, placement: Sequence[int]) -> float:
    return float(predicted_device_costs(model, features, device_shards(task, placement)).max())



def memory_ok(task: Task, placement: Sequence[int], sizes: np.ndarray) -> bool:
    """Does every device stay within the task's memory cap?"""
    used = np.bincount(np.asarray(placement), weights=sizes[list(task.tables)], minlength=task.devices)
    return bool((used <= task.memory_bytes).all())



def example_frame(model: CostModel, features: np.ndarray, task: Task, placement: Sequence[int]) -> pd.DataFrame:
    """One row per table: its device, its predicted cost alone, and its device's fused prediction."""
    shards = device_shards(task, placement)
    fused = predicted_device_costs(model, features, shards)
    single = model.predict_ms(features, [[t] for t in task.tables])
    frame = pd.DataFrame({"device": np.asarray(placement), "table": task.tables, "single_ms": single})
    frame["fused_ms"] = fused[frame["device"]]
    return frame.sort_values(["device", "single_ms"], ascending=[True, False]).reset_index(drop=True)



def predicted(model: CostModel, features: np.ndarray, tasks: list[Task], plans: list[np.ndarray]) -> np.ndarray:
    """Predicted bottleneck (ms) of each plan."""
    return np.array([predicted_bottleneck(model, features, t, p) for t, p in zip(tasks, plans, strict=True)])



def predicted_table(model: CostModel, features: np.ndarray, tasks: list[Task],
                    plans: dict[str, list[np.ndarray]]) -> pd.DataFrame:
    """Predicted bottleneck (ms): one row per task, one column per method."""
    return pd.DataFrame({name: predicted(model, features, tasks, p) for name, p in plans.items()})

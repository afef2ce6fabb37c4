"""Plans of the heuristic baselines for many tasks, and their predicted bottlenecks, for
comparing a policy during and after training."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from autoshard.heuristics import HEURISTICS, place
from autoshard.plans import predicted_bottleneck
from autoshard.seeding import rng
from autoshard.tasks import Task

if TYPE_CHECKING:  # placing by a heuristic needs no torch
    from autoshard.costmodel import CostModel


def heuristic_plan(name: str, pool_features: pd.DataFrame, task: Task, seed: int) -> np.ndarray:
    """The named heuristic's placement of `task` (the random one seeded by task name)."""
    return place(name, pool_features.iloc[list(task.tables)], task.devices, task.memory_bytes,
                 rng(seed, "heuristic", name, task.name))


def heuristic_plans(pool_features: pd.DataFrame, tasks: list[Task], seed: int) -> dict[str, list[np.ndarray]]:
    """Every heuristic's placement of every task."""
    return {m: [heuristic_plan(m, pool_features, t, seed) for t in tasks] for m in HEURISTICS}


def predicted(model: CostModel, features: np.ndarray, tasks: list[Task], plans: list[np.ndarray]) -> np.ndarray:
    """Predicted bottleneck (ms) of each plan."""
    return np.array([predicted_bottleneck(model, features, t, p) for t, p in zip(tasks, plans, strict=True)])


def validator(model: CostModel, features: np.ndarray, tasks: list[Task],
              heuristics: dict[str, list[np.ndarray]]) -> Callable:
    """`validate(policy)`: the greedy policy's mean predicted bottleneck over the best heuristic's
    (both under `model`), per task shape and overall (for the training history)."""
    from autoshard.inference import policy_plans

    best_heuristic = predicted_table(model, features, tasks, heuristics).min(axis=1).to_numpy()
    shapes = np.array([f"{len(t.tables)}x{t.devices}" for t in tasks])

    def validate(policy) -> dict[str, float]:
        ratio = predicted(model, features, tasks, policy_plans(policy, model, features, tasks)) / best_heuristic
        out = {f"val_ratio_{s}": float(ratio[shapes == s].mean()) for s in sorted(set(shapes))}
        return out | {"val_ratio": float(ratio.mean())}

    return validate


def predicted_table(model: CostModel, features: np.ndarray, tasks: list[Task],
                    plans: dict[str, list[np.ndarray]]) -> pd.DataFrame:
    """Predicted bottleneck (ms): one row per task, one column per method."""
    return pd.DataFrame({name: predicted(model, features, tasks, p) for name, p in plans.items()})


def ratio_summary(ratios: pd.DataFrame) -> pd.DataFrame:
    """Per method (column of ratios to a reference): mean, median, min, max and win rate (< 1)."""
    return ratios.agg(["mean", "median", "min", "max"]).T.assign(wins=(ratios < 1).mean())

"""The policy's validation during training: its greedy plans' predicted bottleneck over the best heuristic's."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from autoshard.core.schema import TrainRLMetrics
from autoshard.data.tasks import Task
from autoshard.placement.shards import predicted, predicted_table
from autoshard.rl.infer import policy_plans

if TYPE_CHECKING:  # placing by a heuristic needs no torch
    from autoshard.costmodel.model import CostModel


def validator(model: CostModel, features: np.ndarray, tasks: list[Task],
              heuristics: dict[str, list[np.ndarray]]) -> Callable:
    """`validate(policy)`: the greedy policy's mean predicted bottleneck over the best heuristic's
    (both under `model`), per task shape and overall (for the training history)."""
    best_heuristic = predicted_table(model, features, tasks, heuristics).min(axis=1).to_numpy()
    shapes = np.array([f"{len(t.tables)}x{t.devices}" for t in tasks])

    def validate(policy) -> dict[str, float]:
        ratio = predicted(model, features, tasks, policy_plans(policy, model, features, tasks)) / best_heuristic
        out = {f"val_ratio_{s}": float(ratio[shapes == s].mean()) for s in sorted(set(shapes))}
        return out | {"val_ratio": float(ratio.mean())}

    return validate


def ratio_summary(ratios: pd.DataFrame) -> pd.DataFrame:
    """Per method (column of ratios to a reference): mean, median, min, max and win rate (< 1)."""
    return ratios.agg(["mean", "median", "min", "max"]).T.assign(wins=(ratios < 1).mean())



def train_rl_metrics(inference: pd.DataFrame, heuristic_ratio: pd.Series, speed_seconds: dict[str, float],
                     refresh: pd.DataFrame, iterations: int, seconds: float,
                     replicates: dict | None = None) -> TrainRLMetrics:
    """The train_rl stage's metrics: each inference mode's mean predicted ratio to the best
    heuristic and win rate on the validation tasks (`inference` as `ratio_summary` returns it),
    each heuristic's mean ratio to the best, the sharding speed, the refresh rounds' rows and
    the replicates' final validation ratios (`replicates.validation_spread`)."""
    return {
        "validation_ratio_to_best_heuristic": {str(k): float(v) for k, v in inference["mean"].items()},
        "validation_win_rate": {str(k): float(v) for k, v in inference["wins"].items()},
        "heuristics_ratio_to_best": {str(k): float(v) for k, v in heuristic_ratio.items()},
        "speed_seconds": {k: float(v) for k, v in speed_seconds.items()},
        "refresh": refresh.to_dict("records"),
        "iterations": iterations,
        "replicate_val_ratio": replicates or {},
        "seconds": seconds,
    }

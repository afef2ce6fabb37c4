"""The policy's validation during training: its greedy plans' predicted bottleneck over the best heuristic's."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
import pandas as pd

from autoshard.core.schema import Number, StageTime
from autoshard.data.tasks import Task
from autoshard.placement.shards import predicted, predicted_table
from autoshard.rl.infer import policy_plans


class FairSharder(TypedDict):
    """The fair learned sharder on the validation tasks: mean predicted bottleneck over the best
    heuristic's (all under the simulator), beside cost_greedy's and the reproduction's."""

    val_ratio: Number                  # the fair sharder, greedy, after training
    cost_greedy_val_ratio: Number      # its teacher
    reproduction_val_ratio: Number     # rl_greedy: AutoShard's design
    after_imitation_val_ratio: Number  # after cloning cost_greedy, before PPO
    unshaped_val_ratio: Number         # the same training with the terminal reward only (None: not run)
    no_worse_than_greedy: bool         # val_ratio <= cost_greedy_val_ratio (a benchmark, not an assert; with
                                       #   keep_best chosen on these tasks, so evaluate's test tasks are the check)
    kept_iteration: int | None         # the validation point whose weights it ends with (None: the last iterate)
    curves: dict[str, list[list[Number]]]  # run -> [iteration, validation ratio] pairs


class _RLTrainingRequired(StageTime):
    """The keys every train_rl.json holds (`RLTraining` adds the optional one; `NotRequired` is
    lost under this module's postponed annotations, so the optional key sits in a total=False class)."""

    validation_ratio_to_best_heuristic: dict[str, Number]
    validation_win_rate: dict[str, Number]
    heuristics_ratio_to_best: dict[str, Number]
    speed_seconds: dict[str, Number]
    refresh: list[dict[str, Any]]
    iterations: int


class RLTraining(_RLTrainingRequired, total=False):
    """reports/metrics/train_rl.json. Built by `rl.validation.train_rl_metrics`."""

    fair: FairSharder                  # absent where rl.fair_policy is off


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



def fair_summary(curves: dict[str, pd.DataFrame], inference: pd.DataFrame, fair: str, greedy: str,
                 reproduction: str, shaped: str, unshaped: str) -> FairSharder:
    """The fair sharder's `FairSharder` entry: its final, teacher's and reproduction's validation ratios
    from `inference` (rows `fair`, `greedy`, `reproduction`, as `ratio_summary` returns them), and
    from the training histories `curves` (run -> history) the ratio after imitation of the `shaped`
    run and the final one of the `unshaped` run (absent: None)."""
    def points(history: pd.DataFrame) -> pd.DataFrame:
        return history.dropna(subset=["val_ratio"])

    run = points(curves[shaped])
    cloned = run[run["phase"] == "imitation"]
    kept = run[run["kept"].astype(bool)] if "kept" in run else run.iloc[:0]
    ratio = float(inference.loc[fair, "mean"])
    teacher = float(inference.loc[greedy, "mean"])
    return {"val_ratio": ratio, "cost_greedy_val_ratio": teacher,
            "reproduction_val_ratio": float(inference.loc[reproduction, "mean"]),
            "after_imitation_val_ratio": float(cloned["val_ratio"].iloc[-1]) if len(cloned) else None,
            "unshaped_val_ratio": float(points(curves[unshaped])["val_ratio"].iloc[-1]) if unshaped in curves else None,
            "no_worse_than_greedy": bool(ratio <= teacher + 1e-9),
            "kept_iteration": int(kept["iteration"].iloc[0]) if len(kept) else None,
            "curves": {name: points(h)[["iteration", "val_ratio"]].astype(float).values.tolist()
                       for name, h in curves.items()}}


def train_rl_metrics(inference: pd.DataFrame, heuristic_ratio: pd.Series, speed_seconds: dict[str, float],
                     refresh: pd.DataFrame, iterations: int, seconds: float,
                     replicates: dict | None = None, fair: FairSharder | None = None) -> RLTraining:
    """The train_rl stage's metrics: each inference mode's mean predicted ratio to the best
    heuristic and win rate on the validation tasks (`inference` as `ratio_summary` returns it),
    each heuristic's mean ratio to the best, the sharding speed, the refresh rounds' rows, the
    replicates' final validation ratios (`replicates.validation_spread`) and the fair sharder's
    entry (`fair_summary`) where it was trained."""
    return ({"fair": fair} if fair is not None else {}) | {
        "validation_ratio_to_best_heuristic": {str(k): float(v) for k, v in inference["mean"].items()},
        "validation_win_rate": {str(k): float(v) for k, v in inference["wins"].items()},
        "heuristics_ratio_to_best": {str(k): float(v) for k, v in heuristic_ratio.items()},
        "speed_seconds": {k: float(v) for k, v in speed_seconds.items()},
        "refresh": refresh.to_dict("records"),
        "iterations": iterations,
        "replicate_val_ratio": replicates or {},
        "seconds": seconds,
    }

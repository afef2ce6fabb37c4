"""The synchronized-stages planners' inputs and greedy: DreamShard's objective, predicted.

A training step waits at a barrier after each of its four stages (forward compute, forward
all-to-all, backward all-to-all, backward compute), so its cost is the sum of each stage's
slowest device, not the slowest device's sum. Balancing per-device totals (LPT, cost_greedy)
can leave one device slow forward and another slow backward; these planners balance the stages.

Prediction (`objective.Linear.synchronized`, which `sync_greedy`, `sync_local_search` and
`sync_milp` all score plans by): a device's forward (backward) compute is the sum of its tables'
measured single forward (backward) costs from the profile, with no fusion factor; its all-to-all
times are the comm model's (`measure.commmodel`) as lines in its summed embedding width, for the
task's total width (`objective.comm_lines`).
"""

import numpy as np
import pandas as pd

from autoshard.placement.heuristics import objective_greedy
from autoshard.placement.objective import Linear


def stage_singles(profile: pd.DataFrame, num_tables: int) -> tuple[np.ndarray, np.ndarray]:
    """Measured forward and backward ms of each pool table alone (median of its single-table
    measurements), indexed by table id; NaN where a table was not measured alone."""
    singles = profile[profile["num_tables"] == 1]
    ids = [int(t[0]) for t in singles["tables"]]
    out = []
    for column in ("forward_ms", "backward_ms"):
        by_table = pd.Series(singles[column].to_numpy(float), index=ids).groupby(level=0).median()
        out.append(by_table.reindex(range(num_tables)).to_numpy(float))
    return out[0], out[1]


def sync_greedy(forward: np.ndarray, backward: np.ndarray, dims: np.ndarray, sizes: np.ndarray,
                devices: int, capacity: int, lines: np.ndarray) -> np.ndarray:
    """A device per table (arrays over the task's tables): largest measured single cost (forward +
    backward) first, each onto the device that leaves the lowest predicted synchronized cost of
    the tables placed so far, with comm `lines` (`heuristics.objective_greedy`). Raises `Infeasible` when a
    table fits on no device."""
    forward, backward = np.asarray(forward, float), np.asarray(backward, float)
    order = np.argsort(-(forward + backward), kind="stable")
    return objective_greedy(Linear.synchronized(forward, backward, dims, lines), order, np.asarray(sizes, np.int64),
                  devices, capacity)

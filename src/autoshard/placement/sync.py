"""sync_greedy: greedy placement on DreamShard's synchronized-stages objective, predicted; and that
prediction, the one `sync_search` (local search) and `sync_milp` (the exact MILP) score plans by.

A training step waits at a barrier after each of its four stages (forward compute, forward
all-to-all, backward all-to-all, backward compute), so its cost is the sum of each stage's
slowest device, not the slowest device's sum. Balancing per-device totals (LPT, cost_greedy)
can leave one device slow forward and another slow backward; this planner balances the stages.

Prediction: a device's forward (backward) compute is the sum of its tables' measured single
forward (backward) costs from the profile, with no fusion factor; its all-to-all times come
from the comm model (`measure.commmodel`) on the summed embedding widths of all devices.
Tables go largest measured single cost (forward + backward) first, each onto the device, among
those where it fits in memory (with room left for the rest: the heuristics' packing guard),
that gives the lowest predicted synchronized cost of the tables placed so far (ties: lower
max-device cost, less memory used, lower device index).
"""

from collections.abc import Callable

import numpy as np
import pandas as pd

from autoshard.data.packing import PackingGuard
from autoshard.placement.heuristics import Infeasible

CommFn = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


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


def predicted_stages(forward: np.ndarray, backward: np.ndarray, widths: np.ndarray,
                     comm: CommFn) -> np.ndarray:
    """A (..., devices, 4) array: forward compute, forward comm, backward comm, backward compute
    per device, from per-device summed single costs and widths (`comm` on the widths). Leading
    axes are kept: the local search scores a stack of candidate placements at once."""
    f_comm, b_comm = comm(widths)
    return np.stack([forward, f_comm, b_comm, backward], axis=-1)


def synchronized_cost(stages: np.ndarray) -> np.ndarray:
    """Sum over the four stages (last axis) of the slowest device (the axis before) in each: a
    NumPy float for one (devices, 4) array, an array for a stack of them."""
    return stages.max(axis=-2).sum(axis=-1)


def placement_cost(forward: np.ndarray, backward: np.ndarray, dims: np.ndarray, placement: np.ndarray,
                   devices: int, comm: CommFn) -> float:
    """The predicted synchronized cost of a full placement (a device per table; arrays over the
    task's tables)."""
    def load(values: np.ndarray) -> np.ndarray:
        return np.bincount(placement, weights=np.asarray(values, float), minlength=devices)
    return float(synchronized_cost(predicted_stages(load(forward), load(backward), load(dims), comm)))


def sync_greedy(forward: np.ndarray, backward: np.ndarray, dims: np.ndarray, sizes: np.ndarray,
                devices: int, capacity: int, comm: CommFn) -> np.ndarray:
    """A device per table (arrays over the task's tables) minimising, table by table, the
    predicted synchronized cost. Raises `Infeasible` when a table fits on no device."""
    forward, backward = np.asarray(forward, float), np.asarray(backward, float)
    sizes = np.asarray(sizes, np.int64)
    order = np.argsort(-(forward + backward), kind="stable")
    guard = PackingGuard(sizes[order][None, :], np.array([capacity]), devices)
    memory = np.zeros(devices, np.int64)
    fwd, bwd, width = np.zeros(devices), np.zeros(devices), np.zeros(devices)
    placement = np.full(len(sizes), -1, np.int64)
    for step, i in enumerate(order):
        fits = np.flatnonzero(guard.allowed(step, memory[None, :])[0])
        if fits.size == 0:
            raise Infeasible(f"table {i} ({sizes[i]} bytes) fits on no device")
        scores = []
        for d in fits:
            f, b, w = fwd.copy(), bwd.copy(), width.copy()
            f[d] += forward[i]
            b[d] += backward[i]
            w[d] += dims[i]
            stages = predicted_stages(f, b, w, comm)
            scores.append((float(synchronized_cost(stages)), float(stages.sum(axis=1).max()), int(memory[d]), int(d)))
        best = min(scores)[3]
        placement[i] = best
        fwd[best] += forward[i]
        bwd[best] += backward[i]
        width[best] += dims[i]
        memory[best] += sizes[i]
        guard.placed(step, np.array([best]))
    return placement

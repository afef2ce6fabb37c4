"""sync_greedy: greedy placement on DreamShard's synchronized-stages objective, predicted; and the
planners of the three sync methods (`sync_search`: local search, `sync_milp`: the exact MILP).

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

from autoshard.core.errors import ConfigError
from autoshard.data.packing import PackingGuard
from autoshard.data.tasks import Task
from autoshard.measure.commmodel import CommModel
from autoshard.placement.heuristics import Infeasible
from autoshard.placement.milp import MilpResult
from autoshard.placement.surrogate import MilpConfig
from autoshard.placement.sync_milp import solve_sync
from autoshard.placement.sync_search import comm_lines, sync_local_search

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
    """A (devices, 4) array: forward compute, forward comm, backward comm, backward compute."""
    f_comm, b_comm = comm(widths)
    return np.column_stack([forward, f_comm, b_comm, backward])


def synchronized_cost(stages: np.ndarray) -> float:
    """Sum over the four stages (columns) of the slowest device (row) in each."""
    return float(stages.max(axis=0).sum())


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
            scores.append((synchronized_cost(stages), float(stages.sum(axis=1).max()), int(memory[d]), int(d)))
        best = min(scores)[3]
        placement[i] = best
        fwd[best] += forward[i]
        bwd[best] += backward[i]
        width[best] += dims[i]
        memory[best] += sizes[i]
        guard.placed(step, np.array([best]))
    return placement


def planners(forward: np.ndarray, backward: np.ndarray, pool_features: pd.DataFrame, comm_model: CommModel,
             batch_size: int, milp: MilpConfig | None = None, seed: int = 0,
             solves: dict[str, MilpResult] | None = None) -> dict[str, Callable[[Task], np.ndarray]]:
    """`sync_greedy`, `sync_local_search` (from its plan) and, with `milp` (its limits), `sync_milp`
    (bounded by, and never worse than, sync_local_search's plan) over per-pool-table measured single
    forward and backward costs, with the comm model at `batch_size`; a task with a table not
    measured alone gets no plan (a `ConfigError` naming the tables). Each MILP solve is kept in
    `solves` by task name when given."""
    dims = pool_features["dim"].to_numpy(float)
    sizes = pool_features["size_bytes"].to_numpy(np.int64)

    def comm(widths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return comm_model.predict_arrays(widths, batch_size)

    def inputs(t: Task) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        ids = list(t.tables)
        missing = [t.tables[k] for k in np.flatnonzero(np.isnan(forward[ids]) | np.isnan(backward[ids]))]
        if missing:
            raise ConfigError(f"task {t.name}: no single-table measurement of tables {missing}")
        lines = comm_lines(comm_model, t.devices, batch_size, float(dims[ids].sum()))
        return forward[ids], backward[ids], dims[ids], sizes[ids], lines

    def greedy(t: Task) -> np.ndarray:
        f, b, w, s, _ = inputs(t)
        return sync_greedy(f, b, w, s, t.devices, t.memory_bytes, comm)

    def refined(t: Task) -> np.ndarray:
        f, b, w, s, lines = inputs(t)
        return sync_local_search(f, b, w, s, t.devices, t.memory_bytes, lines, greedy(t))

    def exact(t: Task) -> np.ndarray:
        f, b, w, s, lines = inputs(t)
        try:
            start = sync_local_search(f, b, w, s, t.devices, t.memory_bytes, lines, greedy(t))
        except Infeasible:
            start = None
        result = solve_sync(f, b, w, s, t.devices, t.memory_bytes, lines, start, time_limit=milp.time_limit_s,
                            node_limit=milp.node_limit, seed=seed)
        if solves is not None:
            solves[t.name] = result
        return result.placement

    return {"sync_greedy": greedy, "sync_local_search": refined, **({"sync_milp": exact} if milp else {})}

"""Local search: move one table or swap two while the objective improves, for any objective
(`placement.objective`: the cost model's max_device, or a linear one such as the synchronized
stages).

Each round scores every move of a table off a critical device (one that is the slowest, or tied
slowest, in some stage: a candidate that touches none cannot lower any stage's maximum) to
another device, and every swap of such a table with a table of another device, and applies the
one with the lowest cost if it improves. Where the slowest device is a third one, many candidates
cost the same: the tie goes to the one that leaves its own two devices lowest (the sum over stages of
the slower of the two), so the next round starts from the better balance; then moves before swaps,
then the lowest table and device numbers. A device whose memory grows must stay within its cap (one for
every device, or each its own on a mixed cluster, where `placement.objective.Speeds` gives each its
speed). A candidate changes two devices, so it costs two evaluations of `stages`. Deterministic, and
never worse than its start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from autoshard.data.features import FEATURE_COLUMNS
from autoshard.data.tasks import Task
from autoshard.placement.objective import Model, NumpyNetwork, Objective, slowest_others

if TYPE_CHECKING:  # the search itself needs no torch
    from autoshard.costmodel.model import CostModel

CHUNK = 4096  # candidates scored at once (bounds the memory of one round on large tasks)
MARGIN = 1e-6  # a candidate must lower the cost by more than this share of it


def local_search(objective: Objective, sizes: np.ndarray, devices: int, capacity: int | np.ndarray,
                 placement: np.ndarray, max_rounds: int = 1000) -> np.ndarray:
    """An improved copy of `placement` (a device per table) under `objective`, every device
    that gains memory within its `capacity` bytes (one cap for all, or one per device)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    caps = np.broadcast_to(np.asarray(capacity, dtype=np.int64), (devices,))
    place = np.asarray(placement, dtype=np.int64).copy()
    for _ in range(max_rounds):
        state = objective.states(place, devices)
        values = objective.stages(state)
        memory = np.zeros(devices, dtype=np.int64)
        np.add.at(memory, place, sizes)
        critical = np.flatnonzero((values == values.max(axis=0)).any(axis=1))
        candidates = _candidates(place, critical, devices)
        bound, best, best_key = float(values.max(axis=0).sum()) * (1 - MARGIN), None, None
        for start in range(0, len(candidates), CHUNK):
            chunk = candidates[start:start + CHUNK]
            costs, pair = _scores(objective, chunk, place, state, values, memory, sizes, caps)
            i = int(np.lexsort((np.arange(len(chunk)), pair, costs))[0])
            if costs[i] < bound and (best_key is None or (costs[i], pair[i]) < best_key):
                best, best_key = chunk[i], (float(costs[i]), float(pair[i]))
        if best is None:
            break
        table, device, other = (int(v) for v in best)
        if other >= 0:
            place[other] = place[table]
        place[table] = device
    return place


def model_search(model: CostModel | NumpyNetwork, features: np.ndarray, task: Task, placement: np.ndarray,
                 max_rounds: int = 1000) -> np.ndarray:
    """`local_search` of a task's placement (a device per `task.tables` entry) under the cost model
    (a torch `CostModel` or the NumPy planner's copy) on the pool's `features`."""
    tables = list(task.tables)
    rows = np.asarray(features)[tables]
    sizes = rows[:, FEATURE_COLUMNS.index("size_bytes")].astype(np.int64)
    return local_search(Model(model, rows), sizes, task.devices, task.memory_bytes, placement, max_rounds)


def _candidates(place: np.ndarray, critical: np.ndarray, devices: int) -> np.ndarray:
    """(C, 3) rows (table, its new device, the table it swaps with or -1): moves first, then
    swaps, each in table order."""
    tables = np.flatnonzero(np.isin(place, critical))
    t, d = (a.ravel() for a in np.meshgrid(tables, np.arange(devices), indexing="ij"))
    keep = d != place[t]
    moves = np.column_stack([t[keep], d[keep], np.full(keep.sum(), -1)])
    t, o = (a.ravel() for a in np.meshgrid(tables, np.arange(len(place)), indexing="ij"))
    keep = (place[t] != place[o]) & ~(np.isin(o, tables) & (o < t))  # each pair of critical tables once
    swaps = np.column_stack([t[keep], place[o[keep]], o[keep]])
    return np.concatenate([moves, swaps]).astype(np.int64)


def _scores(objective: Objective, moves: np.ndarray, place: np.ndarray, state: np.ndarray, values: np.ndarray,
            memory: np.ndarray, sizes: np.ndarray, caps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cost after each candidate (inf where a device that gains memory overflows), and the
    sum over stages of the slower of its two devices after it (the tie-break)."""
    table, device, other = moves.T
    swap = other >= 0
    partner = np.maximum(other, 0)
    source = place[table]
    gained = objective.share[table] - np.where(swap[:, None], objective.share[partner], 0.0)
    moved = sizes[table] - np.where(swap, sizes[partner], 0)
    over = np.where(moved > 0, memory[device] + moved > caps[device], memory[source] - moved > caps[source])
    pair = np.maximum(objective.stages(state[source] - gained), objective.stages(state[device] + gained))
    after = np.maximum(pair, slowest_others(values, source, device))
    return np.where(over, np.inf, after.sum(axis=-1)), pair.sum(axis=-1)

"""The prototypes' heuristic placements, made to respect memory always, and the one greedy loop.

The greedy loop (`greedy`) takes tables in a given order and puts each on the device, among
those where it still fits, that leaves the lowest cost of the tables placed so far under an
objective (`placement.objective`); ties go to the lower cost of that device itself, then less
memory used, then the lower index. The greedy heuristics are that loop on one linear stage,
their key: largest key first, onto the device with the lowest accumulated key; LPT is it on
measured single costs, `sync_greedy` on the synchronized stages. "Fits" is the RL environment's mask
(`PackingGuard`): room for the table and, after it, for the tables still to place, so a task
first-fit-decreasing can place never dead-ends. Unlike the prototypes, a table that fits
nowhere is an error (`Infeasible`), never silently put on the last device.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from autoshard.core.errors import ConfigError
from autoshard.core.seeding import rng
from autoshard.data.packing import PackingGuard
from autoshard.data.tasks import Task
from autoshard.placement.objective import Linear, Objective, slowest_others


class Infeasible(ConfigError):
    """No device has room for a table: the task cannot be placed by this method."""



def _keys(features: pd.DataFrame) -> dict[str, np.ndarray]:
    dim = features["dim"].to_numpy(dtype=float)
    pf = features["pooling_factor"].to_numpy(dtype=float)
    rows = features["rows"].to_numpy(dtype=float)
    return {
        "dim_greedy": dim,
        "size_greedy": features["size_bytes"].to_numpy(dtype=float),
        "lookup_greedy": dim * pf,
        "size_lookup_greedy": dim * pf * np.log10(np.maximum(rows, 1.0)),
    }



GREEDY = ("dim_greedy", "size_greedy", "lookup_greedy", "size_lookup_greedy")



HEURISTICS = ("random", "naive", *GREEDY)



class _Fitting:
    """The devices a table may go to when the tables are placed in `order` (see the module note)."""

    def __init__(self, sizes: np.ndarray, order: np.ndarray, devices: int, capacity: int):
        self.sizes, self.order, self.step = sizes, order, 0
        self.memory = np.zeros(devices, dtype=np.int64)
        self.guard = PackingGuard(sizes[order][None, :], np.array([capacity]), devices)

    def devices(self) -> np.ndarray:
        """Allowed devices for the next table, in index order; none is an error."""
        fits = np.flatnonzero(self.guard.allowed(self.step, self.memory[None, :])[0])
        if fits.size == 0:
            i = self.order[self.step]
            raise Infeasible(f"table {i} ({self.sizes[i]} bytes) fits on no device")
        return fits

    def put(self, device: int) -> int:
        """Place the next table on `device`; returns the table's index."""
        i = self.order[self.step]
        self.memory[device] += self.sizes[i]
        self.guard.placed(self.step, np.array([device]))
        self.step += 1
        return i


def greedy(objective: Objective, order: np.ndarray, sizes: np.ndarray, devices: int, capacity: int) -> np.ndarray:
    """A device per table: the tables in `order`, each onto the fitting device that leaves the
    lowest cost of the tables placed so far (ties: see the module note)."""
    state = objective.empty(devices)
    values = objective.stages(state)
    placement = np.full(len(sizes), -1, dtype=np.int64)
    fitting = _Fitting(sizes, np.asarray(order), devices, capacity)
    for _ in range(len(sizes)):
        fits = fitting.devices()
        i = fitting.order[fitting.step]
        own = objective.stages(state[fits] + objective.share[i])
        cost = np.maximum(own, slowest_others(values, fits, fits)).sum(axis=-1)
        best = fits[np.lexsort((fits, fitting.memory[fits], own.sum(axis=-1), cost))[0]]
        fitting.put(best)
        placement[i] = best
        state[best] += objective.share[i]
        values[best] = objective.stages(state[best])
    return placement


def key_greedy(keys: np.ndarray, sizes: np.ndarray, devices: int, capacity: int) -> np.ndarray:
    """Largest key first (ties: lower table index), onto the fitting device with the lowest
    accumulated key: `greedy` on the one linear stage of `keys`."""
    keys = np.asarray(keys, dtype=float)
    return greedy(Linear.max_device(keys), np.argsort(-keys, kind="stable"), sizes, devices, capacity)



def naive(sizes: np.ndarray, devices: int, capacity: int) -> np.ndarray:
    """Round-robin in table order, skipping devices that are full."""
    placement = np.full(len(sizes), -1, dtype=np.int64)
    fitting = _Fitting(sizes, np.arange(len(sizes)), devices, capacity)
    for i in range(len(sizes)):
        fits = fitting.devices()
        placement[i] = fits[np.argmin((fits - i) % devices)]  # the first from device i on
        fitting.put(placement[i])
    return placement



def random_placement(sizes: np.ndarray, devices: int, capacity: int,
                     rng: np.random.Generator) -> np.ndarray:
    """A uniformly random device per table among those with room (largest tables first)."""
    placement = np.full(len(sizes), -1, dtype=np.int64)
    fitting = _Fitting(sizes, np.argsort(-sizes, kind="stable"), devices, capacity)
    for _ in range(len(sizes)):
        device = rng.choice(fitting.devices())
        placement[fitting.put(device)] = device
    return placement



def place(method: str, features: pd.DataFrame, devices: int, capacity: int,
          rng: np.random.Generator | None = None) -> np.ndarray:
    """Device per row of `features` (the task's tables) by the named heuristic."""
    sizes = features["size_bytes"].to_numpy(dtype=np.int64)
    if method in GREEDY:
        return key_greedy(_keys(features)[method], sizes, devices, capacity)
    if method == "naive":
        return naive(sizes, devices, capacity)
    if method == "random":
        if rng is None:
            raise ValueError("the random heuristic needs a seeded generator")
        return random_placement(sizes, devices, capacity, rng)
    raise ConfigError(f"method: {method!r} (expected one of {', '.join(HEURISTICS)})")





def heuristic_plan(name: str, pool_features: pd.DataFrame, task: Task, seed: int) -> np.ndarray:
    """The named heuristic's placement of `task` (the random one seeded by task name)."""
    return place(name, pool_features.iloc[list(task.tables)], task.devices, task.memory_bytes,
                 rng(seed, "heuristic", name, task.name))



def heuristic_plans(pool_features: pd.DataFrame, tasks: list[Task], seed: int) -> dict[str, list[np.ndarray]]:
    """Every heuristic's placement of every task."""
    return {m: [heuristic_plan(m, pool_features, t, seed) for t in tasks] for m in HEURISTICS}


def every_plan(pool_features: pd.DataFrame, task: Task, seed: int) -> list[np.ndarray]:
    """Every heuristic's placement of `task`, skipping those that find no room (the shards a
    planner meets, which the profile stage measures)."""
    out = []
    for name in HEURISTICS:
        try:
            out.append(heuristic_plan(name, pool_features, task, seed))
        except Infeasible:
            continue
    return out

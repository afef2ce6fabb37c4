"""The prototypes' heuristic placements, made to respect memory always.

All greedy heuristics share one loop: sort tables by a key, largest first; put each on the
device with the lowest accumulated key among those where it still fits; ties go to the
device with less memory used, then the lower index. Unlike the prototypes, a table that
fits nowhere is an error (`Infeasible`), never silently put on the last device.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from autoshard.core.errors import ConfigError
from autoshard.core.seeding import rng
from autoshard.data.tasks import Task


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



def _fitting(memory: np.ndarray, sizes: np.ndarray, i: int, capacity: int) -> np.ndarray:
    """Devices with room for table `i`; none is an error, never a silent overflow."""
    fits = np.flatnonzero(memory + sizes[i] <= capacity)
    if fits.size == 0:
        raise Infeasible(f"table {i} ({sizes[i]} bytes) fits on no device")
    return fits



def greedy(keys: np.ndarray, sizes: np.ndarray, devices: int, capacity: int) -> np.ndarray:
    """Largest key first, onto the fitting device with the lowest accumulated key."""
    load = np.zeros(devices)
    memory = np.zeros(devices, dtype=np.int64)
    placement = np.full(len(keys), -1, dtype=np.int64)
    for i in np.argsort(-keys, kind="stable"):
        fits = _fitting(memory, sizes, i, capacity)
        best = fits[np.lexsort((fits, memory[fits], load[fits]))[0]]
        placement[i] = best
        load[best] += keys[i]
        memory[best] += sizes[i]
    return placement



def naive(sizes: np.ndarray, devices: int, capacity: int) -> np.ndarray:
    """Round-robin in table order, skipping devices that are full."""
    memory = np.zeros(devices, dtype=np.int64)
    placement = np.full(len(sizes), -1, dtype=np.int64)
    for i in range(len(sizes)):
        for step in range(devices):
            d = (i + step) % devices
            if memory[d] + sizes[i] <= capacity:
                break
        else:
            raise Infeasible(f"table {i} ({sizes[i]} bytes) fits on no device")
        placement[i] = d
        memory[d] += sizes[i]
    return placement



def random_placement(sizes: np.ndarray, devices: int, capacity: int,
                     rng: np.random.Generator) -> np.ndarray:
    """A uniformly random device per table among those with room (largest tables first)."""
    memory = np.zeros(devices, dtype=np.int64)
    placement = np.full(len(sizes), -1, dtype=np.int64)
    for i in np.argsort(-sizes, kind="stable"):
        placement[i] = rng.choice(_fitting(memory, sizes, i, capacity))
        memory[placement[i]] += sizes[i]
    return placement



def place(method: str, features: pd.DataFrame, devices: int, capacity: int,
          rng: np.random.Generator | None = None) -> np.ndarray:
    """Device per row of `features` (the task's tables) by the named heuristic."""
    sizes = features["size_bytes"].to_numpy(dtype=np.int64)
    if method in GREEDY:
        return greedy(_keys(features)[method], sizes, devices, capacity)
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

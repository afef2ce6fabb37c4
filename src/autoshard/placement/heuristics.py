"""The prototypes' heuristic placements, made to respect memory always.

The objective greedy (`objective_greedy`, on `placement.greedy`'s loop with its look-ahead rule)
takes tables in a given order and puts each on the device, among those where it still fits, that
leaves the lowest cost of the tables placed so far under an objective (`placement.objective`);
ties go to the lower cost of that device itself, then less memory used, then the lower index.
The greedy heuristics are it on one linear stage, their key: largest key first, onto the device
with the lowest accumulated key; LPT is it on measured single costs, `sync_greedy` on the
synchronized stages. Unlike the prototypes, a table that fits nowhere is an error
(`Infeasible`), never silently put on the last device.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from autoshard.core.errors import ConfigError
from autoshard.core.seeding import rng
from autoshard.data.tasks import Task
from autoshard.placement.greedy import Infeasible, LookAhead, greedy
from autoshard.placement.objective import Linear, Objective, slowest_others


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



def _rule(sizes: np.ndarray, order: np.ndarray, devices: int, capacity: int) -> LookAhead:
    """The feasibility rule of tables placed in `order` (see the module note)."""
    return LookAhead(np.asarray(sizes)[order], devices, capacity, lambda t: f"table {order[t]}")


def objective_greedy(objective: Objective, order: np.ndarray, sizes: np.ndarray, devices: int,
                     capacity: int) -> np.ndarray:
    """A device per table: the tables in `order`, each onto the fitting device that leaves the
    lowest cost of the tables placed so far (ties: see the module note)."""
    order = np.asarray(order)
    state = objective.empty(devices)
    values = objective.stages(state)
    rule = _rule(sizes, order, devices, capacity)

    def best(t: int, allowed: np.ndarray) -> int:
        fits = np.flatnonzero(allowed)
        own = objective.stages(state[fits] + objective.share[order[t]])
        cost = np.maximum(own, slowest_others(values, fits, fits)).sum(axis=-1)
        return int(fits[np.lexsort((fits, rule.memory[fits], own.sum(axis=-1), cost))[0]])

    def placed(t: int, device: int) -> None:
        state[device] += objective.share[order[t]]
        values[device] = objective.stages(state[device])

    placement = np.full(len(sizes), -1, dtype=np.int64)
    placement[order] = greedy(len(order), rule, best, placed)
    return placement


def key_greedy(keys: np.ndarray, sizes: np.ndarray, devices: int, capacity: int) -> np.ndarray:
    """Largest key first (ties: lower table index), onto the fitting device with the lowest
    accumulated key: `greedy` on the one linear stage of `keys`."""
    keys = np.asarray(keys, dtype=float)
    return objective_greedy(Linear.max_device(keys), np.argsort(-keys, kind="stable"), sizes, devices, capacity)



def naive(sizes: np.ndarray, devices: int, capacity: int) -> np.ndarray:
    """Round-robin in table order, skipping devices that are full."""
    order = np.arange(len(sizes))

    def best(t: int, allowed: np.ndarray) -> int:
        fits = np.flatnonzero(allowed)
        return int(fits[np.argmin((fits - t) % devices)])  # the first from device t on

    return greedy(len(sizes), _rule(sizes, order, devices, capacity), best)


def random_placement(sizes: np.ndarray, devices: int, capacity: int,
                     rng: np.random.Generator) -> np.ndarray:
    """A uniformly random device per table among those with room (largest tables first)."""
    order = np.argsort(-sizes, kind="stable")
    placement = np.full(len(sizes), -1, dtype=np.int64)
    placement[order] = greedy(len(sizes), _rule(sizes, order, devices, capacity),
                              lambda t, allowed: int(rng.choice(np.flatnonzero(allowed))))
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

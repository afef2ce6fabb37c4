"""`autoshard plan --topology FILE --method <heuristic>`: the prototypes' heuristics on devices that
differ in speed and memory, every table whole.

A key heuristic (`placement.heuristics`: dim, size, lookup or size x lookup) is its key as each
table's cost on a device of speed 1, placed by the placement every sharded plan uses
(`placement.sharding.place`: largest first, onto the device where the key over its speed finishes
earliest, each device's own memory, `--constraints` honoured); the key has no unit a comm time
could add to, so no comm is charged. `naive` (round-robin in table order) and `random` (largest
first, a seeded uniform device) use no cost: they skip the devices without room, each device's
memory its own, and are as blind to speed on a topology as they are everywhere.
"""

from __future__ import annotations

import time

import numpy as np

from autoshard.cli.constraints import Constraints
from autoshard.cli.sharding_plan import Result, grouped_place
from autoshard.cli.user_tables import UserTables
from autoshard.core.errors import ConfigError
from autoshard.core.seeding import rng
from autoshard.placement.heuristics import GREEDY as KEYED
from autoshard.placement.heuristics import _keys as heuristic_keys
from autoshard.placement.sharding import Layout, Piece, Placed
from autoshard.placement.topology import Topology

UNKEYED = ("naive", "random")
METHODS = (*UNKEYED, *KEYED)  # the command's heuristics, every one placing on a topology


def plan(method: str, tables: UserTables, topology: Topology, batch: int, constraints: Constraints,
         seed: int) -> Result:
    """Every table whole on `topology` by the heuristic `method` (see the module)."""
    held = tables.memory(batch)  # each table's bytes while training, whole, as every sharded plan counts
    start = time.perf_counter()
    if method in KEYED:
        for t, kinds in constraints.kinds.items():
            if "table_wise" not in kinds:
                raise ConfigError(f"table {tables.names[t]}: --method {method} places every table whole, and its "
                                  f"sharding_types are {list(kinds)} (lpt_measured or cost_greedy split tables)")
        keys = heuristic_keys(tables.features)[method]
        layouts = [[Layout("table_wise", (Piece(0, None, 0, None, float(k), int(m)),))] for k, m in zip(keys, held,
                                                                                                        strict=True)]
        placed = grouped_place(layouts, topology, tables.names, constraints)
        what = f"{method}'s key of each table (placement.heuristics), not a time: no comm is charged beside it"
        return Result(placed, time.perf_counter() - start, {"kind": "heuristic", "key": method, "what": what})
    if constraints.places or constraints.kinds:
        raise ConfigError(f"--constraints: --method {method} places by a rule that takes no pins, groups or sharding "
                          f"types on a topology (the key heuristics, lpt_measured and cost_greedy do)")
    devices = (naive(held, topology.memories, tables.names) if method == "naive" else
               random(held, topology.memories, tables.names, rng(seed, "heuristic", "random", "user")))
    placed = [Placed(Layout("table_wise", (Piece(0, None, 0, None, 0.0, int(m)),)), (int(d),))
              for m, d in zip(held, devices, strict=True)]
    return Result(placed, time.perf_counter() - start,
                  {"kind": "none", "what": f"none: {method} places by its rule, on no cost"})


def naive(held: np.ndarray, caps: np.ndarray, names: list[str]) -> np.ndarray:
    """Round-robin in table order: table t to the first device from t mod D on with room for it."""
    devices = len(caps)
    free, out = caps.astype(np.int64).copy(), np.empty(len(held), dtype=np.int64)
    for t, need in enumerate(held):
        ring = (t + np.arange(devices)) % devices
        fits = ring[free[ring] >= need]
        out[t] = _first(fits, t, need, free, names)
        free[out[t]] -= need
    return out


def random(held: np.ndarray, caps: np.ndarray, names: list[str], generator: np.random.Generator) -> np.ndarray:
    """Largest table first, each to a uniformly drawn device among those with room for it."""
    free, out = caps.astype(np.int64).copy(), np.empty(len(held), dtype=np.int64)
    for t in np.argsort(-held, kind="stable"):
        fits = np.flatnonzero(free >= held[t])
        out[t] = _first(generator.permutation(fits) if len(fits) else fits, t, held[t], free, names)
        free[out[t]] -= held[t]
    return out


def _first(fits: np.ndarray, t: int, need: int, free: np.ndarray, names: list[str]) -> int:
    if not len(fits):
        raise ConfigError(f"table {names[t]}: needs {int(need)} bytes while training, and the freest device has "
                          f"{int(free.max())} left (more memory or devices, or a size-aware heuristic such as "
                          "size_greedy)")
    return int(fits[0])

"""Sharding-time benchmarks: medians of repeated runs, on one CPU thread."""

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from autoshard.core.seeding import one_thread, rng
from autoshard.data.tasks import Task


def median_seconds(run: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time of `run()` over `repeats` runs after `warmup` untimed ones, on one thread."""
    with one_thread():
        for _ in range(warmup):
            run()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
    return float(np.median(times))


def synthetic_task(features: pd.DataFrame, tables: int, devices: int, seed: int) -> Task:
    """A task of `tables` pool tables on `devices` devices with room to spare (for timing only)."""
    ids = np.sort(rng(seed, "speed", tables, devices).choice(len(features), tables, replace=False))
    sizes = features["size_bytes"].to_numpy()[ids]
    memory = int(sizes.max() + 2 * sizes.sum() / devices)
    return Task(name=f"speed/{tables}x{devices}", protocol="speed", split="test",
                tables=tuple(int(t) for t in ids), devices=devices, memory_bytes=memory, unseen_ratio=0.0)


def sharding_speed(place_with_policy: Callable[[list[Task]], object], place_with_torchrec: Callable[[Task], object],
                   tasks: list[Task], large: Task) -> dict[str, float]:
    """Median seconds of greedy policy placement on `tasks` (one at a time) and on `large`, and
    of TorchRec's planner on `tasks`, with the TorchRec / policy ratio."""
    shape = f"{len(tasks[0].tables)}x{tasks[0].devices}"
    policy = float(np.median([median_seconds(lambda t=t: place_with_policy([t])) for t in tasks]))
    torchrec = float(np.median([median_seconds(lambda t=t: place_with_torchrec(t), repeats=2) for t in tasks]))
    return {f"policy greedy, {shape}": policy,
            f"policy greedy, {len(large.tables)}x{large.devices}":
                median_seconds(lambda: place_with_policy([large]), repeats=3),
            f"TorchRec planner, {shape}": torchrec,
            f"TorchRec / policy, {shape}": torchrec / policy}


def scaling(planners: dict[str, Callable[[Task], object]], features: pd.DataFrame, tables: Sequence[int],
            devices: int, seed: int, repeats: int, budget_s: float, progress: bool = True) -> pd.DataFrame:
    """Median sharding time of each planner on a synthetic task of each size in `tables`
    (capped at the pool's size) on `devices` devices. A planner whose median passes
    `budget_s` is not run on larger tasks. Every call gets a task of its own name, so a planner
    that keeps a task's steps (the sync methods) makes its whole chain each time."""
    from tqdm.auto import tqdm

    rows, over = [], set()
    calls = itertools.count()  # every call a task of its own name: no planner's per-task cache serves it
    sizes = sorted({min(int(t), len(features)) for t in tables})
    for k, n in enumerate(tqdm(sizes, desc="sharding time", disable=not progress)):
        task = synthetic_task(features, n, devices, seed)
        for name, planner in planners.items():
            if name in over:
                continue
            seconds = median_seconds(lambda p=planner, t=task: p(replace(t, name=f"{t.name}/{next(calls)}")),
                                     repeats=repeats, warmup=1 if k == 0 else 0)
            rows.append({"method": name, "tables": n, "devices": devices, "seconds": seconds})
            if seconds > budget_s:
                over.add(name)
    return pd.DataFrame(rows)

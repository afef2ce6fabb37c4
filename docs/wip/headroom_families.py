"""Evidence for issue 30 item 2 (exploratory, not a stage): greedy placement's predicted gap to the
best placement found, under a run's cost model (data/rl/cost_model.pt), on candidate task families
of unseen tables (predicted only, nothing measured). Run from the repository root after train_rl:

    .venv/bin/python docs/wip/headroom_families.py data 12    # data folder, tasks per family

Device k of speed s_k takes predicted_ms / s_k. Greedy: largest predicted single cost first onto
the device with the lowest (predicted cost after placing) / speed that has room ("speed-blind":
the same with every speed 1, then scored at the true speeds). Best: the lowest of greedy, every
heuristic, and speed-aware local search (moves and swaps off the bottleneck) from each of them.
"""

import sys
import time

import numpy as np
import torch

from autoshard.costmodel.model import load_model
from autoshard.data.features import feature_matrix
from autoshard.data.packing import memory_bounds
from autoshard.data.pool import load_pool
from autoshard.data.tasks import Task, split_pool
from autoshard.placement.heuristics import HEURISTICS, Infeasible, heuristic_plan
from autoshard.placement.objective import Model


def device_costs(costs: Model, place: np.ndarray, devices: int, speeds: np.ndarray) -> np.ndarray:
    return costs.stages(costs.states(place, devices))[:, 0] / speeds


def greedy(costs: Model, sizes: np.ndarray, cap: int, speeds: np.ndarray) -> np.ndarray:
    devices = len(speeds)
    pre, memory = np.tile(costs.base, (devices, 1)), np.zeros(devices, np.int64)
    place = np.full(len(sizes), -1)
    for t in np.argsort(-costs.stages(costs.base + costs.share)[:, 0], kind="stable"):
        after = costs.stages(pre + costs.share[t])[:, 0] / speeds
        after[memory + sizes[t] > cap] = np.inf
        k = int(np.argmin(after))
        place[t], pre[k], memory[k] = k, pre[k] + costs.share[t], memory[k] + sizes[t]
    return place


def search(costs: Model, sizes: np.ndarray, cap: int, speeds: np.ndarray, place: np.ndarray) -> np.ndarray:
    devices, place = len(speeds), place.copy()
    while True:
        now = device_costs(costs, place, devices, speeds)
        memory = np.bincount(place, weights=sizes, minlength=devices)
        b, best, chosen = int(np.argmax(now)), now.max() * (1 - 1e-7), None
        candidates = []
        for i in np.flatnonzero(place == b):
            candidates += [((i, k),) for k in range(devices) if k != b and memory[k] + sizes[i] <= cap]
            candidates += [((i, place[j]), (j, b)) for j in np.flatnonzero(place != b)
                           if memory[place[j]] - sizes[j] + sizes[i] <= cap and memory[b] - sizes[i] + sizes[j] <= cap]
        for moves in candidates:
            trial = place.copy()
            for table, device in moves:
                trial[table] = device
            value = device_costs(costs, trial, devices, speeds).max()
            if value < best:
                best, chosen = value, trial
        if chosen is None:
            return place
        place = chosen


def family(name: str, tables: int, devices: int, n: int, speeds=None, slack: float | None = None) -> None:
    speeds = np.ones(devices) if speeds is None else np.asarray(speeds, float)
    g = np.random.default_rng([0, tables, devices, int(1000 * (slack or 0))])
    gaps, blind, clock = [], [], time.time()
    for k in range(n):
        ids = np.sort(g.choice(TEST, tables, replace=False))
        sizes = SIZES[ids]
        cap = int(np.ceil(slack * memory_bounds(sizes, devices)[1])) if slack else \
            int(max(sizes.max(), 2.0 * sizes.sum() / devices))
        costs = Model(MODEL, FEATURES[ids])
        task = Task(f"x/{k}", "x", "test", tuple(int(t) for t in ids), devices, cap, 1.0)
        starts = {"greedy": greedy(costs, sizes, cap, speeds), "blind": greedy(costs, sizes, cap, np.ones(devices))}
        for h in HEURISTICS:
            try:
                starts[h] = heuristic_plan(h, POOL, task, 0)
            except Infeasible:
                pass
        known = {m: device_costs(costs, p, devices, speeds).max() for m, p in starts.items()}
        known |= {f"search:{m}": device_costs(costs, search(costs, sizes, cap, speeds, p), devices, speeds).max()
                  for m, p in starts.items()}
        low = min(known.values())
        gaps.append(known["greedy"] / low - 1)
        blind.append(known["blind"] / low - 1)
    print(f"{name:38s} T={tables:3d} D={devices} tasks={n}: greedy gap median {np.median(gaps):6.2%} "
          f"p90 {np.quantile(gaps, .9):6.2%} max {np.max(gaps):6.2%} | speed-blind greedy median "
          f"{np.median(blind):6.2%} ({time.time() - clock:.0f} s)", flush=True)


if __name__ == "__main__":
    data, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 12
    torch.set_num_threads(1)
    MODEL = load_model(f"{data}/rl/cost_model.pt")
    POOL = load_pool(f"{data}/pool").features
    FEATURES, SIZES = feature_matrix(POOL), POOL["size_bytes"].to_numpy(np.int64)
    _, TEST = split_pool(len(POOL), 0.5, 0)
    for per in (10, 4, 3, 2):
        family(f"{per} per device", 8 * per, 8, n)
    family("tight memory, slack 1.02", 40, 4, n, slack=1.02)
    family("tight memory, slack 1.02, 2 per device", 16, 8, n, slack=1.02)
    for per in (10, 4, 2):
        family(f"two generations (1, 0.5), {per} per device", 8 * per, 8, n, speeds=[1] * 4 + [0.5] * 4)
        family(f"shared (1, 0.7, 0.4), {per} per device", 8 * per, 8, n, speeds=[1, 1, 1, .7, .7, .7, .4, .4])

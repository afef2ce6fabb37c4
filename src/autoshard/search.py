"""Local search on the cost model: move one table or swap two while the bottleneck improves.

Each round evaluates every move of a table off the bottleneck device and every swap of such
a table with a table of another device, all at once (the device cost is the cost model's
head on the sum of its tables' encodings), and applies the best one if it lowers the
predicted bottleneck and respects memory.
"""

import numpy as np
import torch

from autoshard.costmodel import CostModel, check_features
from autoshard.tables import FEATURE_COLUMNS
from autoshard.tasks import Task


@torch.no_grad()
def local_search(model: CostModel, features: np.ndarray, task: Task, placement: np.ndarray,
                 max_rounds: int = 1000) -> np.ndarray:
    """An improved copy of `placement` (device per `task.tables` entry)."""
    x = check_features(features)
    tables = list(task.tables)
    enc = model.encode(x[tables])                                        # (T, E)
    sizes = np.asarray(features[tables, FEATURE_COLUMNS.index("size_bytes")], dtype=np.float64)
    place = np.asarray(placement, dtype=np.int64).copy()
    d = task.devices
    for _ in range(max_rounds):
        onehot = torch.nn.functional.one_hot(torch.as_tensor(place), d).float()   # (T, D)
        sums = onehot.T @ enc                                                     # (D, E)
        counts = onehot.sum(0)
        memory = np.bincount(place, weights=sizes, minlength=d)
        costs = torch.where(counts > 0, model.cost_ms(sums), torch.zeros(d))
        bottleneck_device = int(costs.argmax())
        current = float(costs.max())
        best = _best_move(model, enc, sums, counts, costs, memory, sizes, place, bottleneck_device,
                          task.memory_bytes)
        if best is None or best[0] >= current * (1 - 1e-6):
            break
        _, moves = best
        for table, device in moves:
            place[table] = device
    return place


def _best_move(model, enc, sums, counts, costs, memory, sizes, place, b, capacity):
    """(new bottleneck, [(table, device), ...]) of the best move or swap off device `b`, or None."""
    on_b = np.flatnonzero(place == b)
    others = [dev for dev in range(len(costs)) if dev != b]
    candidates = []
    # Moves: table i from b to device d.
    for i in on_b:
        for dev in others:
            if memory[dev] + sizes[i] <= capacity:
                candidates.append(((i, dev),))
    # Swaps: table i on b with table j on another device.
    for j in np.flatnonzero(place != b):
        dev = int(place[j])
        for i in on_b:
            if memory[dev] - sizes[j] + sizes[i] <= capacity and memory[b] - sizes[i] + sizes[j] <= capacity:
                candidates.append(((i, dev), (j, b)))
    if not candidates:
        return None
    new_sums = sums.repeat(len(candidates), 1, 1)                       # (C, D, E)
    new_counts = counts.repeat(len(candidates), 1)
    for c, moves in enumerate(candidates):
        for table, dev in moves:
            src = int(place[table])
            new_sums[c, src] -= enc[table]
            new_sums[c, dev] += enc[table]
            new_counts[c, src] -= 1
            new_counts[c, dev] += 1
    new_costs = torch.where(new_counts > 0, model.cost_ms(new_sums), torch.zeros_like(new_counts))
    bottlenecks = new_costs.max(1).values
    c = int(bottlenecks.argmin())
    return float(bottlenecks[c]), [(int(t), int(dev)) for t, dev in candidates[c]]

"""Local search on the cost model: move one table or swap two while the bottleneck improves.

Each round evaluates every move of a table off the bottleneck device and every swap of such
a table with a table of another device, all at once (the device cost is the cost model's
head on the sum of its tables' encodings), and applies the best one if it lowers the
predicted bottleneck and respects memory.
"""

import numpy as np
import torch

from autoshard.costmodel.model import CostModel, check_features
from autoshard.data.features import FEATURE_COLUMNS
from autoshard.data.tasks import Task


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
    """(new bottleneck, [(table, device), ...]) of the best move or swap off device `b`, or None.

    Candidates are rows (i, dest, j): table i leaves b for dest and, for a swap, table j
    (-1 for a plain move) comes back from dest to b. Moves come first, then swaps; ties go to
    the first candidate."""
    on_b = np.flatnonzero(place == b)
    others = np.array([dev for dev in range(len(costs)) if dev != b], dtype=np.int64)
    mi, md = (a.ravel() for a in np.meshgrid(on_b, others, indexing="ij"))
    ok = memory[md] + sizes[mi] <= capacity
    sj, si = (a.ravel() for a in np.meshgrid(np.flatnonzero(place != b), on_b, indexing="ij"))
    sd = place[sj]
    swap_ok = (memory[sd] - sizes[sj] + sizes[si] <= capacity) & (memory[b] - sizes[si] + sizes[sj] <= capacity)
    i = np.concatenate([mi[ok], si[swap_ok]])
    dest = np.concatenate([md[ok], sd[swap_ok]])
    j = np.concatenate([np.full(int(ok.sum()), -1), sj[swap_ok]])
    if len(i) == 0:
        return None
    padded = torch.cat([enc, enc.new_zeros(1, enc.shape[1])])
    delta = padded[torch.as_tensor(i)] - padded[torch.as_tensor(j)]          # what b loses, dest gains
    moved = torch.as_tensor(j < 0, dtype=counts.dtype)                       # 1: a move, 0: a swap
    rows = torch.arange(len(i))
    dest_t = torch.as_tensor(dest)
    new_sums = sums.repeat(len(i), 1, 1)                                     # (C, D, E)
    new_sums[rows, b] -= delta
    new_sums[rows, dest_t] += delta
    new_counts = counts.repeat(len(i), 1)
    new_counts[rows, b] -= moved
    new_counts[rows, dest_t] += moved
    new_costs = torch.where(new_counts > 0, model.cost_ms(new_sums), torch.zeros_like(new_counts))
    bottlenecks = new_costs.max(1).values
    c = int(bottlenecks.argmin())
    moves = [(int(i[c]), int(dest[c]))] + ([(int(j[c]), b)] if j[c] >= 0 else [])
    return float(bottlenecks[c]), moves

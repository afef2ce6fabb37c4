"""The exact optimum under the cost model for small tasks, by enumerating every placement.

Devices are interchangeable, so placements are enumerated once per partition of the tables
into at most D groups (restricted growth strings: table k goes to a device already used or
to the next unused one). Tables are taken largest first and a partial placement is dropped
as soon as a device exceeds the memory cap, which prunes most of the tree on tight caps.
No bound on the cost is used: the neural cost model need not grow when a table is added,
so only exhaustive evaluation is exact. The survivors are scored in batches: a device's
predicted cost is the model's head on the sum of its tables' encodings.
"""

import numpy as np
import torch

from autoshard.core.errors import ConfigError
from autoshard.costmodel.model import CostModel, check_features
from autoshard.data.features import FEATURE_COLUMNS
from autoshard.data.tasks import Task

MAX_PLACEMENTS = 5_000_000


def partition_count(tables: int, devices: int) -> int:
    """Partitions of `tables` items into at most `devices` non-empty groups (sum of Stirling
    numbers of the second kind): the placements the search evaluates before memory pruning."""
    row = [1] + [0] * devices  # S(0, k)
    for _ in range(tables):
        row = [0] + [k * row[k] + row[k - 1] for k in range(1, devices + 1)]
    return sum(row)


def placements(sizes: np.ndarray, devices: int, capacity: int) -> np.ndarray:
    """Every placement (P, T) of tables with `sizes` on `devices` under `capacity`, one per
    partition: device labels appear in order of first use."""
    sizes = np.asarray(sizes, dtype=np.int64)
    rows = np.zeros((1, 0), dtype=np.int8)
    memory = np.zeros((1, devices), dtype=np.int64)
    used = np.zeros(1, dtype=np.int64)  # devices used so far
    for size in sizes:
        options = np.minimum(used + 1, devices)
        parent = np.repeat(np.arange(len(rows)), options)
        label = np.arange(len(parent)) - np.repeat(np.cumsum(options) - options, options)
        memory = memory[parent]
        memory[np.arange(len(parent)), label] += size
        keep = memory[np.arange(len(parent)), label] <= capacity
        parent, label, memory = parent[keep], label[keep], memory[keep]
        rows = np.concatenate([rows[parent], label[:, None].astype(np.int8)], axis=1)
        used = np.maximum(used[parent], label + 1)
    return rows


@torch.no_grad()
def bottlenecks(model: CostModel, encodings: torch.Tensor, rows: np.ndarray, devices: int,
                chunk: int = 65_536) -> np.ndarray:
    """Predicted bottleneck (ms) of each placement row (P, T) of tables with `encodings` (T, E)."""
    out = np.empty(len(rows))
    for start in range(0, len(rows), chunk):
        onehot = torch.nn.functional.one_hot(torch.as_tensor(rows[start:start + chunk], dtype=torch.long),
                                             devices).float()                  # (C, T, D)
        sums = torch.einsum("ctd,te->cde", onehot, encodings)
        cost = torch.where(onehot.sum(1) > 0, model.cost_ms(sums), torch.zeros(()))
        out[start:start + chunk] = cost.max(-1).values.numpy()
    return out


def exact_plan(model: CostModel, features: np.ndarray, task: Task,
               max_placements: int = MAX_PLACEMENTS) -> np.ndarray:
    """The placement (device per `task.tables` entry) with the lowest predicted bottleneck."""
    count = partition_count(len(task.tables), task.devices)
    if count > max_placements:
        raise ConfigError(f"task {task.name}: {len(task.tables)} tables on {task.devices} devices have "
                          f"{count:,} placements (exact search allows {max_placements:,}); use smaller tasks")
    tables = np.asarray(task.tables)
    sizes = np.asarray(features[tables, FEATURE_COLUMNS.index("size_bytes")], dtype=np.int64)
    order = np.argsort(-sizes, kind="stable")
    rows = placements(sizes[order], task.devices, task.memory_bytes)
    if len(rows) == 0:
        raise ConfigError(f"task {task.name}: no placement fits {task.memory_bytes} bytes per device")
    encodings = model.encode(check_features(features)[tables[order]])
    best = rows[int(np.argmin(bottlenecks(model, encodings, rows, task.devices)))]
    placement = np.empty(len(tables), dtype=np.int64)
    placement[order] = best
    return placement

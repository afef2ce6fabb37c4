"""sync_local_search: local search on the predicted synchronized-stages objective.

Once every table is placed, the total embedding width W of the task is fixed, so each device's
predicted all-to-all time is a line in its own summed width (`comm_lines`, from the comm
model's linear form in MB sent and received; never below 0, as the model clips). A device's
four stages then depend on its own tables only, and a move or a swap changes two devices.

Each round evaluates every move of a table off a critical device (one that is the slowest, or
tied slowest, in some stage: a candidate that touches none cannot lower any stage's maximum) to
another device with room, and every swap of such a table with a table of another device, and
applies the one with the lowest predicted synchronized cost if it improves (ties: moves before
swaps, then the lowest table and device numbers). Deterministic, and never worse than its start.
"""

import numpy as np

from autoshard.measure.commmodel import BYTES_PER_VALUE, MB, CommModel
from autoshard.placement.sync import CommFn, predicted_stages, synchronized_cost

CHUNK = 4096  # candidates scored at once (bounds the memory of one round on large tasks)


def comm_lines(model: CommModel, devices: int, batch_size: int, total_width: float) -> np.ndarray:
    """(2, 2): per direction (forward, backward), the intercept and slope of a device's predicted
    all-to-all ms in its summed width, for a placement of total width `total_width`: the comm
    model's `predict_arrays` rewritten (sent and received MB are linear in the device's width)."""
    scale = (batch_size // devices) * BYTES_PER_VALUE / MB
    a, b, c = model.coefficients(devices, "forward")  # sends (D-1)·scale·w, receives scale·(W-w)
    forward = (a + c * scale * total_width, b * (devices - 1) * scale - c * scale)
    a, b, c = model.coefficients(devices, "backward")  # the two swap
    backward = (a + b * scale * total_width, c * (devices - 1) * scale - b * scale)
    return np.array([forward, backward], dtype=float)


def line_comm(lines: np.ndarray) -> CommFn:
    """The comm of `lines` (`comm_lines`) as `sync.predicted_stages` takes it: per direction, a
    device's ms as the line in its summed width, never below 0; widths of any shape."""
    def comm(width: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return (np.maximum(lines[0, 0] + lines[0, 1] * width, 0.0),
                np.maximum(lines[1, 0] + lines[1, 1] * width, 0.0))
    return comm


def sync_local_search(forward: np.ndarray, backward: np.ndarray, dims: np.ndarray, sizes: np.ndarray,
                      devices: int, capacity: int, lines: np.ndarray, placement: np.ndarray,
                      max_rounds: int = 1000) -> np.ndarray:
    """An improved copy of `placement` (a device per table) under the predicted synchronized
    cost with comm `lines` (`comm_lines`), every device within `capacity` bytes."""
    per_table = np.column_stack([np.asarray(forward, float), np.asarray(backward, float),
                                 np.asarray(dims, float), np.asarray(sizes, float)])  # (T, 4)
    place = np.asarray(placement, np.int64).copy()
    comm = line_comm(lines)
    for _ in range(max_rounds):
        loads = np.zeros((devices, 4))
        np.add.at(loads, place, per_table)  # forward, backward, width, bytes per device
        stages = predicted_stages(loads[:, 0], loads[:, 1], loads[:, 2], comm)
        now = float(synchronized_cost(stages))
        critical = np.flatnonzero((stages == stages.max(axis=0)).any(axis=1))
        moves = _candidates(place, critical, devices)
        best, best_cost = None, now * (1 - 1e-9)
        for start in range(0, len(moves), CHUNK):
            chunk = moves[start:start + CHUNK]
            costs = _scores(chunk, per_table, place, loads, comm, capacity)
            i = int(np.argmin(costs))
            if costs[i] < best_cost:
                best, best_cost = chunk[i], float(costs[i])
        if best is None:
            break
        table, device, other = (int(v) for v in best)
        if other >= 0:
            place[other] = place[table]
        place[table] = device
    return place


def _candidates(place: np.ndarray, critical: np.ndarray, devices: int) -> np.ndarray:
    """(C, 3) rows (table, its new device, the table it swaps with or -1): moves first, then
    swaps, each in table order."""
    tables = np.flatnonzero(np.isin(place, critical))
    t, d = (a.ravel() for a in np.meshgrid(tables, np.arange(devices), indexing="ij"))
    keep = d != place[t]
    moves = np.column_stack([t[keep], d[keep], np.full(keep.sum(), -1)])
    t, o = (a.ravel() for a in np.meshgrid(tables, np.arange(len(place)), indexing="ij"))
    keep = (place[t] != place[o]) & ~((np.isin(o, tables)) & (o < t))  # each pair of critical tables once
    swaps = np.column_stack([t[keep], place[o[keep]], o[keep]])
    return np.concatenate([moves, swaps]).astype(np.int64)


def _scores(moves: np.ndarray, per_table: np.ndarray, place: np.ndarray, loads: np.ndarray,
            comm: CommFn, capacity: int) -> np.ndarray:
    """The predicted synchronized cost after each candidate (inf where a device overflows)."""
    table, device, other = moves.T
    rows = np.arange(len(moves))
    swap = other >= 0
    delta = np.zeros((len(moves), *loads.shape))
    gained = per_table[table] - np.where(swap[:, None], per_table[np.maximum(other, 0)], 0.0)
    np.add.at(delta, (rows, device), gained)
    np.add.at(delta, (rows, place[table]), -gained)
    after = loads + delta
    over = ((after[..., 3] > capacity) & (delta[..., 3] > 0)).any(axis=1)
    costs = synchronized_cost(predicted_stages(after[..., 0], after[..., 1], after[..., 2], comm))
    return np.where(over, np.inf, costs)

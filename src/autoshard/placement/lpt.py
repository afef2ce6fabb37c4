"""LPT (longest processing time first) on a per-table cost vector, under a memory cap.

What an engineer with a profiler would do: measure each table alone, then put the tables,
costliest first, each onto the least-loaded device that still has room. It is the
heuristics' shared greedy loop with measured costs as the key. On identical devices without
a memory cap its bottleneck is at most 4/3 - 1/(3D) of the optimum (Graham, 1969).
"""

import numpy as np

from autoshard.placement.heuristics import key_greedy


def lpt(costs: np.ndarray, sizes: np.ndarray, devices: int, capacity: int) -> np.ndarray:
    """A device per table: costliest table first (ties: lower table index), onto the device
    with the lowest summed cost among those where it fits (ties: less memory used, then the
    lower device index). Raises `Infeasible` when a table fits on no device."""
    costs = np.asarray(costs, dtype=float)
    sizes = np.asarray(sizes, dtype=np.int64)
    if costs.shape != sizes.shape or costs.ndim != 1:
        raise ValueError(f"costs {costs.shape} and sizes {sizes.shape} must be vectors of one length")
    if devices < 1:
        raise ValueError(f"devices: {devices} (need at least one)")
    return key_greedy(costs, sizes, devices, capacity)


def makespan(costs: np.ndarray, placement: np.ndarray, devices: int) -> float:
    """The largest summed cost of a device under `placement` (the linear surrogate's bottleneck)."""
    return float(np.bincount(placement, weights=np.asarray(costs, dtype=float), minlength=devices).max())

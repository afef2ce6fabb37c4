"""LPT (longest processing time first) on a per-table cost vector, under a memory cap.

What an engineer with a profiler would do: measure each table alone, then put the tables,
costliest first, each onto the least-loaded device that still has room. On identical devices
without a memory cap LPT's makespan is at most 4/3 - 1/(3D) of the optimum (Graham, 1969).
"""

import numpy as np

from autoshard.heuristics import Infeasible


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
    load = np.zeros(devices)
    memory = np.zeros(devices, dtype=np.int64)
    placement = np.full(len(costs), -1, dtype=np.int64)
    for i in np.argsort(-costs, kind="stable"):
        fits = np.flatnonzero(memory + sizes[i] <= capacity)
        if fits.size == 0:
            raise Infeasible(f"LPT: table {i} ({sizes[i]} bytes) fits on no device; memory used "
                             f"{memory.tolist()} of {capacity} bytes each")
        best = fits[np.lexsort((fits, memory[fits], load[fits]))[0]]
        placement[i] = best
        load[best] += costs[i]
        memory[best] += sizes[i]
    return placement


def makespan(costs: np.ndarray, placement: np.ndarray, devices: int) -> float:
    """The largest summed cost of a device under `placement` (the linear surrogate's bottleneck)."""
    return float(np.bincount(placement, weights=np.asarray(costs, dtype=float), minlength=devices).max())

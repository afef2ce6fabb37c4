"""The one greedy loop, and the feasibility rules it is given.

Every greedy placement of the study is this loop: tables in a fixed order, each onto the device
its objective ranks best among those its feasibility rule allows. The callers differ only in the
two parameters: the heuristics and LPT rank by an `Objective` (`heuristics.objective_greedy`), the
policy's twin `cost_greedy` and the NumPy planner by the cost model's prediction after the table
(`rl.infer`, `rl.numpy_planner`), the policy by its score, the column planner by the cost model on
column shards (`column_split.place_by_cost`).

The rules:
- `LookAhead`: room for the table and, after it, for the tables still to place (`PackingGuard`,
  the RL environment's mask), so that a task first-fit-decreasing can place never dead-ends;
- `Room`: room for the table alone. The column planner uses it: a split whose greedy placement
  would dead-end is simply not taken (`Infeasible`), so it needs no guard's look-ahead.

A table that fits nowhere is an error (`Infeasible`), never silently put on the last device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from autoshard.core.errors import ConfigError
from autoshard.data.packing import PackingGuard


class Infeasible(ConfigError):
    """No device has room for a table: the task cannot be placed by this method."""


class Rule(Protocol):
    """Which devices may take the table of step `t`; `allowed` raises `Infeasible` when none may."""

    def allowed(self, t: int) -> Any: ...

    def placed(self, t: int, device: Any) -> None: ...


class Room:
    """Room for the table alone: `sizes` in placement order, `capacity` bytes a device. `what`
    names a step's table in the error (default: its step)."""

    def __init__(self, sizes: np.ndarray, devices: int, capacity: float,
                 what: Callable[[int], str] | None = None):
        self.sizes, self.capacity = np.asarray(sizes, dtype=np.float64), float(capacity)
        self.memory = np.zeros(devices, dtype=np.float64)
        self.what = what or (lambda t: f"table at step {t}")

    def _checked(self, t: int, fits: np.ndarray) -> np.ndarray:
        if not fits.any():
            raise Infeasible(f"{self.what(t)} ({self.sizes[t]:.0f} bytes) fits on no device")
        return fits

    def allowed(self, t: int) -> np.ndarray:
        return self._checked(t, self.memory + self.sizes[t] <= self.capacity)

    def placed(self, t: int, device: int) -> None:
        self.memory[device] += self.sizes[t]


class LookAhead(Room):
    """Room for the table and for the tables after it (see the module note)."""

    def __init__(self, sizes: np.ndarray, devices: int, capacity: float,
                 what: Callable[[int], str] | None = None):
        super().__init__(sizes, devices, capacity, what)
        self.guard = PackingGuard(self.sizes[None, :], np.array([self.capacity]), devices)

    def allowed(self, t: int) -> np.ndarray:
        return self._checked(t, self.guard.allowed(t, self.memory[None, :])[0])

    def placed(self, t: int, device: int) -> None:
        super().placed(t, device)
        self.guard.placed(t, np.array([device]))


def greedy(steps: int, rule: Rule, best: Callable[[int, Any], Any],
           placed: Callable[[int, Any], None] | None = None) -> np.ndarray:
    """A device per step (T,), or per task and step (B, T) where the rule places a batch of tasks
    at once (the RL environment): at step `t`, `best(t, allowed)` of the devices `rule` allows (a
    boolean mask), then `rule` and the objective (`placed`) told where the table went."""
    chosen = []
    for t in range(steps):
        device = best(t, rule.allowed(t))
        rule.placed(t, device)
        if placed is not None:
            placed(t, device)
        chosen.append(np.asarray(device, dtype=np.int64))
    return np.stack(chosen, axis=-1) if chosen else np.empty(0, dtype=np.int64)


def lowest(costs: np.ndarray, allowed: np.ndarray) -> int:
    """The allowed device of lowest cost (ties: the lower index)."""
    return int(np.where(allowed, costs, np.inf).argmin())

"""The baselines on measured single-table costs, as evaluate planners (`Task -> placement`).

The per-table cost is the linear surrogate a practitioner has after profiling each table
alone: `lpt_measured` places by LPT on it, `milp` solves the min-max placement on it exactly
(within a time limit).
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from autoshard.core.errors import ConfigError
from autoshard.core.params import bounded
from autoshard.data.tasks import Task
from autoshard.placement.lpt import lpt
from autoshard.placement.milp import MilpResult, solve


@dataclass(frozen=True)
class MilpConfig:
    """Limits of each MILP solve: the node limit makes a solve stop at the same point on any
    machine; the time limit only guards against a pathological instance."""

    node_limit: int
    time_limit_s: float = bounded(lo=0, lo_open=True)


def per_table(singles: pd.Series, num_tables: int) -> np.ndarray:
    """Cost per pool table id (0..num_tables-1): the median of its single-table measurements
    (`singles` is indexed by table id and may repeat one); NaN where none was measured."""
    by_table = singles.groupby(level=0).median()
    return by_table.reindex(range(num_tables)).to_numpy(dtype=float)


def planners(costs: np.ndarray, sizes: np.ndarray, milp: MilpConfig, seed: int = 0,
             solves: dict[str, MilpResult] | None = None) -> dict[str, Callable[[Task], np.ndarray]]:
    """`lpt_measured` and `milp` over per-pool-table `costs` and `sizes` (bytes); a task with
    an unmeasured table gets no plan from either (a `ConfigError` naming the tables). Each MILP
    solve (bound, gap, status) is kept in `solves` by task name when given."""
    def task_costs(t: Task) -> np.ndarray:
        c = costs[list(t.tables)]
        if np.isnan(c).any():
            missing = [t.tables[i] for i in np.flatnonzero(np.isnan(c))]
            raise ConfigError(f"task {t.name}: no single-table measurement of tables {missing}")
        return c

    def exact(t: Task) -> np.ndarray:
        result = solve(task_costs(t), sizes[list(t.tables)], t.devices, t.memory_bytes,
                       time_limit=milp.time_limit_s, seed=seed, node_limit=milp.node_limit)
        if solves is not None:
            solves[t.name] = result
        return result.placement

    return {"lpt_measured": lambda t: lpt(task_costs(t), sizes[list(t.tables)], t.devices, t.memory_bytes),
            "milp": exact}


def solve_table(solves: dict[str, MilpResult]) -> pd.DataFrame:
    """One row per MILP solve: objective, proven lower bound, relative gap, status, seconds."""
    return pd.DataFrame([{"task": name, "objective": r.objective, "lower_bound": r.lower_bound, "gap": r.gap,
                          "status": r.status, "seconds": r.seconds} for name, r in solves.items()])

"""The linear surrogate a practitioner has after profiling each table alone: the per-table cost
that `lpt_measured` places by LPT and `milp` solves exactly (`methods.registry` builds both), the
MILP's limits, and a table of its solves.
"""

from dataclasses import dataclass

import numpy as np
import pandas as pd

from autoshard.core.params import bounded
from autoshard.placement.milp import MilpResult


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


def solve_table(solves: dict[str, MilpResult]) -> pd.DataFrame:
    """One row per MILP solve: objective, proven lower bound, relative gap, status, seconds."""
    return pd.DataFrame([{"task": name, "objective": r.objective, "lower_bound": r.lower_bound, "gap": r.gap,
                          "status": r.status, "seconds": r.seconds} for name, r in solves.items()])

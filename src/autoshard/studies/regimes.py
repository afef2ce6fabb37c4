"""Candidate regimes for headroom (issue 30): task families that might leave cost_greedy far from
the best placement, searched under the cost model before any is made a measured protocol.

Each family draws `tasks` seeded tasks of unseen tables: `per_device` tables on each of `devices`
devices; equal speeds or a speed profile (`generations`: two GPU generations in one cluster;
`shared`: devices shared with other jobs), each device's predicted cost over its speed
(`placement.objective.Speeds`); memory ample (the drawn protocols' cap, 2 x the mean load) or
tight (`tight_slack` x the lowest cap bin packing reaches). Per task, predicted only:

- greedy: largest predicted single cost first, onto the fitting device that leaves the lowest
  predicted cost at the devices' speeds (cost_greedy's rule, told the speeds);
- the same greedy blind to the speeds (every speed 1), scored at the true speeds;
- every heuristic, and local search from each of these plans (`placement.search.local_search`).

`best` is the lowest of them all. `greedy_gap` is greedy over best, less 1; `blind_gap` the
speed-blind greedy's (what not being told the topology costs, which is information, not learning).
`greedy_gap` bounds what any planner could gain there from below (the best is the best known, not
proven). A family whose median `greedy_gap` exceeds the smallest effect of interest
(`primary.sesoi`) leaves room for a "better" verdict against greedy (`exceeds_sesoi`): the
candidate for a measured protocol.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from autoshard.core.errors import invalid
from autoshard.core.metrics import finite
from autoshard.core.params import bounded
from autoshard.core.seeding import rng
from autoshard.data.packing import memory_bounds
from autoshard.data.tasks import Task, first_fit_decreasing
from autoshard.placement.greedy import Infeasible
from autoshard.placement.heuristics import HEURISTICS, heuristic_plan, objective_greedy
from autoshard.placement.objective import Model, NumpyNetwork, Objective, Speeds
from autoshard.placement.search import local_search

if TYPE_CHECKING:
    from autoshard.costmodel.model import CostModel

AMPLE_SLACK = 2.0  # ample memory: the drawn protocols' cap (`evaluate.small.memory_slack`)


@dataclass(frozen=True)
class FamiliesConfig:
    """`evaluate.families`: the candidate regimes, every `per_device` with each memory and speed kind."""

    tasks: int = bounded(lo=0)                            # per family
    devices: int
    per_device: tuple[int, ...]                           # tables per device
    tight_slack: float = bounded(lo=1.0)                  # tight memory: cap = this x the packed maximum
    generations: tuple[float, ...] = bounded(lo=0, lo_open=True)  # a speed per device: two GPU generations
    shared: tuple[float, ...] = bounded(lo=0, lo_open=True)       # a speed per device: shared with other jobs

    def __post_init__(self):
        for name in ("generations", "shared"):
            if len(getattr(self, name)) != self.devices:
                raise invalid(f"evaluate.families.{name}", list(getattr(self, name)),
                              f"expected a speed for each of the {self.devices} devices")

    def families(self) -> list[tuple[str, int, str, str, tuple[float, ...]]]:
        """(name, per_device, memory, speed kind, speeds) of every family, in order."""
        kinds = [("ample", "equal"), ("tight", "equal"), ("ample", "generations"), ("ample", "shared")]
        out = []
        for per in self.per_device:
            for memory, speeds in kinds:
                values = (1.0,) * self.devices if speeds == "equal" else getattr(self, speeds)
                out.append((f"{per} per device, {memory} memory, {speeds} speeds", per, memory, speeds, values))
        return out


Costs = Callable[[np.ndarray], Objective]  # pool table ids -> the cost model's objective on them


def model_costs(model: CostModel | NumpyNetwork, features: np.ndarray) -> Costs:
    """The cost model's predicted device cost (`placement.objective.Model`) on pool tables `ids`."""
    return lambda ids: Model(model, np.asarray(features)[ids])


def family_tasks(sizes: np.ndarray, test_tables: np.ndarray, name: str, tables: int, devices: int, memory: str,
                 cfg: FamiliesConfig, seed: int) -> list[Task]:
    """A family's seeded tasks of `tables` unseen tables on `devices` devices, each placeable under its cap."""
    if tables > len(test_tables):
        raise invalid("evaluate.families.per_device", list(cfg.per_device),
                      f"{tables} tables on {devices} devices: the test pool has {len(test_tables)}")
    out = []
    for k in range(cfg.tasks):
        ids = np.sort(rng(seed, "regimes", name, k).choice(test_tables, tables, replace=False))
        own = sizes[ids]
        if memory == "tight":
            cap = int(np.ceil(cfg.tight_slack * memory_bounds(own, devices)[1]))
        else:
            cap = int(max(own.max(), AMPLE_SLACK * own.sum() / devices))
        while first_fit_decreasing(own, devices, cap) is None:
            cap = int(cap * 1.01) + 1
        out.append(Task(f"{name}/{k:03d}", "regimes", "test", tuple(int(t) for t in ids), devices, cap, 1.0))
    return out


def task_gaps(task: Task, costs: Objective, speeds: np.ndarray, sizes: np.ndarray,
              starts: dict[str, np.ndarray]) -> dict[str, float]:
    """One task's predicted costs at `speeds`: greedy's, the speed-blind greedy's and the best known
    (every plan of `starts`, the two greedies and local search from each)."""
    fast = Speeds(costs, speeds)
    order = np.argsort(-costs.stages(costs.base + costs.share)[:, 0], kind="stable")
    plans = {"greedy": objective_greedy(fast, order, sizes, task.devices, task.memory_bytes),
             "blind": objective_greedy(Speeds(costs, np.ones_like(speeds)), order, sizes, task.devices,
                                       task.memory_bytes),
             **starts}
    known = {m: fast.cost(p, task.devices) for m, p in plans.items()}
    searched = [fast.cost(local_search(fast, sizes, task.devices, task.memory_bytes, p), task.devices)
                for p in plans.values()]
    return {"greedy_ms": known["greedy"], "blind_ms": known["blind"], "best_ms": min(*known.values(), *searched)}


def family_rows(costs: Costs, pool_features: pd.DataFrame, test_tables: np.ndarray, cfg: FamiliesConfig,
                seed: int, progress: bool = True) -> pd.DataFrame:
    """One row per family and task: its predicted greedy, speed-blind greedy and best costs (ms)."""
    from tqdm.auto import tqdm

    sizes = pool_features["size_bytes"].to_numpy(np.int64)
    rows = []
    for name, per, memory, kind, speeds in tqdm(cfg.families(), desc="regimes", disable=not progress):
        for task in family_tasks(sizes, test_tables, name, per * cfg.devices, cfg.devices, memory, cfg, seed):
            ids = np.asarray(task.tables)
            starts = {}
            for h in HEURISTICS:
                try:
                    starts[h] = heuristic_plan(h, pool_features, task, seed)
                except Infeasible:
                    continue
            clock = time.perf_counter()
            gaps = task_gaps(task, costs(ids), np.asarray(speeds), sizes[ids], starts)
            rows.append({"family": name, "per_device": per, "memory": memory, "speeds": kind, "task": task.name,
                         **gaps, "seconds": time.perf_counter() - clock})
    return pd.DataFrame(rows)


def families(rows: pd.DataFrame, cfg: FamiliesConfig, sesoi: float) -> dict:
    """`families` of evaluate.json (`studies.evaluate.Families`): per family, the median, p90 and max of
    greedy's predicted gap to the best known and the speed-blind greedy's median gap; the smallest
    effect of interest they are held to and whether each family's median gap exceeds it."""
    out = []
    for name, g in rows.groupby("family", sort=False):
        gap = g["greedy_ms"] / g["best_ms"] - 1
        blind = g["blind_ms"] / g["best_ms"] - 1
        median = finite(gap.median())
        out.append({"family": str(name), "per_device": int(g["per_device"].iloc[0]), "devices": cfg.devices,
                    "memory": str(g["memory"].iloc[0]), "speeds": str(g["speeds"].iloc[0]), "tasks": len(g),
                    "greedy_gap": median, "greedy_gap_p90": finite(gap.quantile(0.9)),
                    "greedy_gap_max": finite(gap.max()), "blind_gap": finite(blind.median()),
                    "exceeds_sesoi": median is not None and median > sesoi})
    return {"sesoi": sesoi, "seconds": float(rows["seconds"].sum()) if len(rows) else 0.0, "families": out}


def frame(entry: dict) -> pd.DataFrame:
    """The families of `families` as a table, gaps in percent."""
    table = pd.DataFrame(entry["families"])
    gaps = ["greedy_gap", "greedy_gap_p90", "greedy_gap_max", "blind_gap"]
    return table.assign(**{c: (100 * table[c].astype(float)).round(2) for c in gaps}) if len(table) else table

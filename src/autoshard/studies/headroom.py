"""The headroom: what a planner could gain over cost_greedy, per protocol, bounded (issues 30, 48).

Predicted, under the cost model the policy plans on: per task, `best_ms`, the lowest predicted
bottleneck of any placement known for it. Those are every method's plan and, on a task without
the exhaustive optimum (`exact`, which the small tasks have), local search
(`placement.search.model_search`) run to its local optimum from each plan of STARTS (every
heuristic's, lpt_measured's, milp's and cost_greedy's). `greedy_gap` is cost_greedy's predicted
bottleneck over `best_ms`, less 1; `bound` is `best_ms` over cost_greedy's, so 1 - bound is the
most a planner could gain under the model; `captured` is the share of the gap each method's plan
closed. Medians over the tasks where cost_greedy found a plan.

On the measured single costs, the additive surrogate that lpt_measured and milp work on:
`lpt_gap`, LPT's bottleneck over the MILP's proven lower bound, less 1.

Measured, within one pass: `measured_gap`, cost_greedy's measured compute bottleneck over that
of the measured plan with the lowest prediction, less 1. Choosing that plan by prediction keeps
this pass's noise from choosing it. Where the best placement known came from a search, it was
not measured: the plan is then the best measured one by prediction, and `measured_of` counts
whose plan it was, `measured_at_best_share` how often it was the best known.

The bounds: the best placement known is not proven optimal, so `greedy_gap` bounds the true gap
from below (`lower`: at least this much is available under the cost model). An upper bound needs
the optimum or a bound on it: exhaustive search gives the optimum on the small tasks (`upper` =
`lower`); the cost model is a neural network with no dual bound, so elsewhere `upper` is null and
`upper_why` says so (the MILP's proven bound holds for the additive surrogate on measured single
costs: `lpt_gap`). Where `upper` lies below the smallest effect of interest, "better" than
cost_greedy was out of reach there (`better_reachable` False). The headroom is context beside the
verdicts; it decides none of them.

The noise floor beside it is the protocol's compute-bottleneck noise, `noise.noise_sd_max_device`
(`findings.measurement_quality`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import pandas as pd

from autoshard.core.metrics import finite
from autoshard.core.seeding import one_thread
from autoshard.data.tasks import Task
from autoshard.methods.registry import GREEDY, LPT, MILP, OPTIMUM, ids
from autoshard.placement.lpt import makespan
from autoshard.placement.search import model_search
from autoshard.placement.shards import device_shards
from autoshard.studies import paired

STARTS = (*ids(kind="heuristic"), LPT, MILP, GREEDY)  # the plans local search starts from
SEARCH = "local_search:"  # a searched plan's name: SEARCH + its start
TOLERANCE = 1e-6  # relative: predictions closer than this are one cost (float32 sums)
GAP_SHOWN = 0.005  # `greedy_gap_above_share`: tasks where cost_greedy is predicted more than this above the best
MEASURED_COST = "max_device_ms"  # the measured gap's cost: compute only, as the primary endpoints


class Bottlenecks(Protocol):
    def __call__(self, task: Task, placements: Sequence[np.ndarray]) -> np.ndarray: ...


Search = Callable[[Task, np.ndarray], np.ndarray]


class ModelBottlenecks:
    """The predicted bottleneck (ms) of placements of a task: the slowest device's cost under
    `model` (a `CostModel`), on one torch thread as `measured.predict_devices`."""

    def __init__(self, model, features: np.ndarray):
        self.model, self.features = model, features

    def __call__(self, task: Task, placements: Sequence[np.ndarray]) -> np.ndarray:
        shards = [device_shards(task, p) for p in placements]
        busy = [s for plan in shards for s in plan if s]
        with one_thread():
            costs = iter(self.model.predict_ms(self.features, busy).tolist())
        return np.array([max(next(costs) if s else 0.0 for s in plan) for plan in shards])


class ModelSearch:
    """`model_search` under `model` from a start placement."""

    def __init__(self, model, features: np.ndarray):
        self.model, self.features = model, features

    def __call__(self, task: Task, start: np.ndarray) -> np.ndarray:
        return model_search(self.model, self.features, task, start)


def known_placements(tasks: list[Task], plans: dict[str, list[np.ndarray | None]], predict: Bottlenecks,
                     search: Search, starts: tuple[str, ...] = STARTS) -> pd.DataFrame:
    """One row per task and placement known for it: every method's plan (`source` "method") and,
    where the task has no `exact` plan, local search from each of `starts` that has a plan
    (`source` "search", `plan` SEARCH + the start, `seconds` its wall time), with its
    predicted bottleneck. A split of the tables met twice gets one prediction."""
    rows = []
    for i, task in enumerate(tasks):
        found = [(m, "method", np.asarray(p[i]), 0.0) for m, p in plans.items() if p[i] is not None]
        if plans.get(OPTIMUM, [None] * len(tasks))[i] is None:
            for start in (s for s in starts if s in plans and plans[s][i] is not None):
                clock = time.perf_counter()
                placed = search(task, np.asarray(plans[start][i]))
                found.append((SEARCH + start, "search", placed, time.perf_counter() - clock))
        splits = list(dict.fromkeys(paired.canonical(p) for _, _, p, _ in found))
        cost = dict(zip(splits, predict(task, [np.array(s) for s in splits]).tolist(), strict=True))
        rows += [{"task": task.name, "protocol": task.protocol, "plan": name, "source": source,
                  "predicted_ms": cost[paired.canonical(p)], "seconds": seconds} for name, source, p, seconds in found]
    return pd.DataFrame(rows, columns=["task", "protocol", "plan", "source", "predicted_ms", "seconds"])


def lpt_gaps(tasks: list[Task], plans: dict[str, list[np.ndarray | None]], single_costs: np.ndarray | None,
             milp_table: pd.DataFrame) -> pd.DataFrame:
    """Per task with an LPT plan and a MILP solve: LPT's bottleneck on the measured single costs
    (`single_costs`, per pool table id: each device the sum of its tables'), the MILP's proven lower
    bound and whether it proved optimality. Empty without single costs."""
    columns = ["task", "protocol", "lpt_ms", "lower_bound", "optimal"]
    if single_costs is None or LPT not in plans or not len(milp_table):
        return pd.DataFrame(columns=columns)
    solves = milp_table.set_index("task")
    rows = [{"task": t.name, "protocol": t.protocol,
             "lpt_ms": makespan(single_costs[list(t.tables)], plans[LPT][i], t.devices),
             "lower_bound": float(solves.loc[t.name, "lower_bound"]),
             "optimal": solves.loc[t.name, "status"] == "optimal"}
            for i, t in enumerate(tasks) if plans[LPT][i] is not None and t.name in solves.index]
    return pd.DataFrame(rows, columns=columns)


def noise_floor(quality: dict, protocol: str) -> tuple[float | None, str]:
    """The protocol's noise floor and the key of `quality` (`findings.measurement_quality`) it is:
    the compute bottleneck's log sd from plans measured twice; where the protocol had too few of
    them, or they all moved alike (an sd of 0: plans sharing their shards), the run's median
    |change| of a plan measured again."""
    value = (quality.get("noise_sd_max_device") or {}).get(protocol)
    if value is not None and value > 0:
        return float(value), f"noise.noise_sd_max_device.{protocol}"
    return quality.get("plan_repeat_change"), "noise.plan_repeat_change"


def headroom(known: pd.DataFrame, ratios: pd.DataFrame, surrogate: pd.DataFrame, quality: dict,
             sesoi: float) -> dict[str, dict]:
    """`headroom.<protocol>` (`studies.evaluate.Headroom`) from `known_placements`, the measured plans
    (`ratios`: task, protocol, method, MEASURED_COST, pass), `lpt_gaps`, the measurement quality
    and the smallest effect of interest (`primary.sesoi`)."""
    out = {}
    for protocol, rows in known.groupby("protocol", sort=False):
        entry = predicted_gaps(rows)
        entry |= surrogate_gap(surrogate[surrogate["protocol"] == protocol])
        entry |= measured_gap(rows, ratios[ratios["protocol"] == protocol])
        entry |= bounds(entry, sesoi)
        entry["noise_floor"], entry["noise_key"] = noise_floor(quality, str(protocol))
        out[str(protocol)] = entry
    return out


def bounds(entry: dict, sesoi: float) -> dict:
    """`lower`, `upper` (or None) and `upper_why` of one protocol's predicted headroom over
    cost_greedy, and whether a gain of `sesoi` was within reach (`better_reachable`: False only
    where the upper bound proves it was not)."""
    lower = entry["greedy_gap"]
    if entry["how"] == "exhaustive search":
        upper, why = lower, "exhaustive search: the best known is the optimum under the cost model"
    else:
        upper, why = None, ("none: the cost model is a neural network, so no solver bounds its optimum (the MILP's "
                            "proven bound holds for the additive surrogate on measured single costs: lpt_gap)")
    return {"lower": lower, "upper": upper, "upper_why": why,
            "better_reachable": upper is None or upper > sesoi}


def _predicted(rows: pd.DataFrame) -> pd.DataFrame:
    """Task x plan: the predicted bottleneck, and `best_ms`, the lowest of the task's."""
    wide = rows.pivot_table(index="task", columns="plan", values="predicted_ms", aggfunc="first", sort=False)
    return wide.assign(best_ms=wide.min(axis=1))


def _median(values: pd.Series) -> float | None:
    return finite(values.median()) if len(values) else None


def predicted_gaps(rows: pd.DataFrame) -> dict:
    """The predicted part of one protocol's entry, from its rows of `known_placements`."""
    wide = _predicted(rows)
    greedy = wide[GREEDY].dropna() if GREEDY in wide else pd.Series(dtype=float)
    best = wide["best_ms"].reindex(greedy.index)
    gap = greedy / best - 1
    exhaustive = OPTIMUM in wide and bool(wide[OPTIMUM].reindex(greedy.index).notna().all()) and len(greedy) > 0
    searched = rows[rows["source"] == "search"]
    starts = searched["plan"].nunique()
    closable = gap > TOLERANCE
    methods = rows.loc[rows["source"] == "method", "plan"].unique()
    captured = {m: _median(((greedy - wide[m]) / (greedy - best))[closable].dropna()) for m in methods}
    return {"tasks": len(greedy), "tasks_without_greedy": len(wide) - len(greedy),
            "greedy_gap": _median(gap), "greedy_gap_max": finite(gap.max()) if len(gap) else None,
            "greedy_gap_above_share": float((gap > GAP_SHOWN).mean()) if len(gap) else None,
            "bound": _median(best / greedy),
            "how": "exhaustive search" if exhaustive else
            f"best of local search from {starts} starts and every method's plan",
            "starts": 0 if exhaustive else int(starts), "search_seconds": float(searched["seconds"].sum()),
            "captured": captured, "captured_tasks": int(closable.sum())}


def surrogate_gap(gaps: pd.DataFrame) -> dict:
    """One protocol's LPT gap to the MILP's proven lower bound on the measured single costs."""
    gap = gaps["lpt_ms"] / gaps["lower_bound"] - 1
    return {"lpt_gap": _median(gap.astype(float)), "how_lpt": "MILP lower bound",
            "lpt_gap_optimal_share": float(gaps["optimal"].mean()) if len(gaps) else None}


def measured_gap(rows: pd.DataFrame, ratios: pd.DataFrame) -> dict:
    """The measured part of one protocol's entry: per task where cost_greedy's plan was measured,
    its MEASURED_COST over that of the measured plan predicted lowest (cost_greedy's own on a tie),
    less 1, the median; both numbers from one pass (`paired.one_pass` refuses two)."""
    paired.one_pass(ratios)
    wide = _predicted(rows)
    measured = ratios.pivot_table(index="task", columns="method", values=MEASURED_COST, aggfunc="first")
    gaps, chosen, at_best = [], [], []
    for task, row in measured.iterrows():
        row = row.dropna()
        if GREEDY not in row or task not in wide.index:
            continue
        predicted = wide.loc[task].reindex(row.index).astype(float).dropna()
        low = predicted.min()
        winner = GREEDY if predicted[GREEDY] <= low * (1 + TOLERANCE) else str(predicted.idxmin())
        gaps.append(row[GREEDY] / row[winner] - 1)
        chosen.append(winner)
        at_best.append(bool(predicted[winner] <= wide.loc[task, "best_ms"] * (1 + TOLERANCE)))
    return {"measured_gap": _median(pd.Series(gaps, dtype=float)), "measured_cost": MEASURED_COST,
            "measured_tasks": len(gaps), "measured_of": pd.Series(chosen, dtype=object).value_counts().to_dict(),
            "measured_at_best_share": float(np.mean(at_best)) if at_best else None}


def frame(entries: dict[str, dict]) -> pd.DataFrame:
    """The headroom per protocol as a table (the notebook's), `captured` left out."""
    return pd.DataFrame({p: {k: v for k, v in e.items() if k not in ("captured", "measured_of")}
                         for p, e in entries.items()}).T


def captured_frame(entries: dict[str, dict]) -> pd.DataFrame:
    """Method x protocol: the median share of the predicted headroom its plan captured."""
    return pd.DataFrame({p: e["captured"] for p, e in entries.items()})

"""The transfer study: the trained policy, not fine-tuned, on tasks unlike its training tasks.

Three axes, each changing one thing about the task: the number of tables (on a fixed number of
devices), the number of devices (with a fixed number of tables), and the share of tables the
policy never saw (AutoShard's protocol, read from the evaluate stage's measured plans, which
hold exactly those tasks). Tasks are drawn per point (tables, devices) from a seeded stream
keyed by the point, so a point shared by two axes is one set of tasks, measured once. Every
plan is measured with the profile's backend, and each method is compared with the best
heuristic on the same task, as in the evaluate stage.
"""

from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import pandas as pd

from autoshard.core.errors import invalid
from autoshard.core.params import Fields, bounded, read
from autoshard.core.schema import Number, StageTime
from autoshard.core.seeding import rng
from autoshard.data.tasks import GIB, ProtocolConfig, Task, draw_feasible
from autoshard.measure.backends import BackendConfig
from autoshard.methods.registry import GREEDY, POLICY, ids
from autoshard.placement.heuristics import HEURISTICS
from autoshard.studies.evaluate import measuring_backend
from autoshard.studies.stats import bootstrap_median


class TransferPoint(TypedDict):
    """One method at one point of a transfer axis."""

    tasks: int
    bounded_share: Number  # share of tasks whose best heuristic is slowest on a one-table device
    ratio_median: Number
    ratio_lo: Number
    ratio_hi: Number
    win_rate: Number
    predicted_ratio_median: Number
    mean_ms: Number


class TransferWorst(TypedDict):
    axis: str
    value: float
    ratio_median: Number


class Transfer(StageTime):
    """reports/metrics/transfer.json. Built by `studies.transfer.transfer_metrics`. `axes`:
    axis -> method -> point value (as text, e.g. "40") -> scores."""

    axes: dict[str, dict[str, dict[str, TransferPoint]]]
    rl_greedy_worst: TransferWorst | None
    rl_greedy_points_below_1: int
    points: int
    tasks_measured: int
    shards_measured: int


METHODS = ids("transfer")
COMPARED = (POLICY, GREEDY)  # the methods whose ratios the study reports
AXES = ("tables", "devices", "unseen_ratio")


@dataclass(frozen=True)
class TransferConfig:
    """The `transfer` section, with the evaluate stage's timing and the profile's backend."""

    tasks_per_point: int
    memory_bytes: int
    unseen_ratio: float = bounded(lo=0, hi=1)  # share of unseen tables on the tables and devices axes
    tables: tuple[int, ...]       # axis 1 ...
    tables_devices: int           # ... on this many devices
    devices: tuple[int, ...]      # axis 2 ...
    devices_tables: int           # ... with this many tables
    max_draws: int
    bootstrap: int = bounded(lo=100)
    backend: BackendConfig

    @classmethod
    def from_params(cls, transfer: dict, evaluate: dict, profile: dict) -> "TransferConfig":
        """From the `transfer` section (`parse`, the cap given in GiB), `evaluate.timing` and the
        profile's backend settings."""
        f = Fields("transfer", transfer)
        timing = Fields("evaluate", evaluate).sub("timing")
        backend = measuring_backend(Fields("profile", profile), timing)
        memory_bytes = int(f.number("memory_per_device_gib", lo=0, lo_open=True) * GIB)
        cfg = read(cls, f, memory_bytes=memory_bytes, backend=backend)
        f.done()
        return cfg

    def points(self) -> pd.DataFrame:
        """One row per (axis, value) measured here, with the task shape (tables, devices) it uses."""
        rows = [{"axis": "tables", "value": t, "tables": t, "devices": self.tables_devices} for t in self.tables]
        rows += [{"axis": "devices", "value": d, "tables": self.devices_tables, "devices": d} for d in self.devices]
        return pd.DataFrame(rows)


def transfer_tasks(features: pd.DataFrame, train: np.ndarray, test: np.ndarray, cfg: TransferConfig,
                   seed: int) -> tuple[list[Task], pd.DataFrame]:
    """The distinct tasks of all points, and a frame (axis, value, task) saying which axis point
    each belongs to. A shape that cannot be drawn is an error naming the parameter."""
    sizes = features["size_bytes"].to_numpy()
    points = cfg.points()
    tasks: dict[str, Task] = {}
    rows = []
    for point in points.itertuples():
        field = f"transfer.{point.axis}"
        unseen = int(round(cfg.unseen_ratio * point.tables))
        if unseen > len(test) or point.tables - unseen > len(train):
            raise invalid(field, point.value, f"{point.tables} tables ({unseen} unseen) do not fit the pools "
                                              f"of {len(train)} seen and {len(test)} unseen tables")
        if point.devices > point.tables:
            raise invalid(field, point.value, f"more devices than the {point.tables} tables")
        shape = ProtocolConfig(name="transfer", tables=point.tables, devices=point.devices,
                               memory_bytes=cfg.memory_bytes, train_tasks=0, test_tasks=cfg.tasks_per_point,
                               unseen_ratios=(cfg.unseen_ratio,))
        for k in range(cfg.tasks_per_point):
            name = f"transfer/{point.tables}x{point.devices}/{k:03d}"
            if name not in tasks:
                g = rng(seed, "transfer", point.tables, point.devices, f"{cfg.unseen_ratio:.4f}", k)
                tables = draw_feasible(g, shape, train, test, unseen, sizes, cfg.max_draws,
                                       "transfer.memory_per_device_gib")
                tasks[name] = Task(name=name, protocol="transfer", split="test", tables=tables,
                                   devices=point.devices, memory_bytes=cfg.memory_bytes,
                                   unseen_ratio=unseen / point.tables)
            rows.append({"axis": point.axis, "value": point.value, "task": name})
    return list(tasks.values()), pd.DataFrame(rows)


def from_evaluate(plans: pd.DataFrame) -> pd.DataFrame:
    """The unseen-ratio axis: the evaluate stage's measured AutoShard-protocol plans, one row per
    (task, method) with axis `unseen_ratio` and the ratio as value."""
    rows = plans[(plans["protocol"] == "autoshard") & plans["method"].isin(METHODS)].copy()
    rows["axis"], rows["value"] = "unseen_ratio", rows["unseen_ratio"]
    return rows


def bounded_tasks(devices: pd.DataFrame) -> frozenset[str]:
    """Tasks whose best heuristic plan (by measurement) is slowest on a device holding one table:
    its bottleneck is that table alone, which no table-wise placement can go below, so on such
    a task every method that isolates the table ties (within noise) and none can win."""
    heuristic = devices[devices["method"].isin(HEURISTICS)]
    slowest = heuristic.loc[heuristic.groupby(["task", "method"])["compute_ms"].idxmax()]
    best = slowest.loc[slowest.groupby("task")["compute_ms"].idxmin()]
    return frozenset(best.loc[best["tables"] == 1, "task"])


def summary(ratios: pd.DataFrame, resamples: int, seed: int, bounded: frozenset[str] = frozenset()) -> pd.DataFrame:
    """Per (axis, value, compared method): tasks, median measured ratio to the best heuristic
    with its 95% bootstrap interval, win rate, median predicted ratio, mean measured bottleneck;
    `shared_with` names the other axis holding the very same tasks (one point, measured once,
    shown on both axes but counted once), `trivial` marks a point whose tasks put at most
    one table on a device, where every method that fits must tie, and `bounded_share` is the
    share of its tasks in `bounded` (see `bounded_tasks`)."""
    rows = []
    compared = ratios[ratios["method"].isin(COMPARED)]
    task_sets = {key: frozenset(g["task"]) for key, g in ratios.groupby(["axis", "value"])}
    for (axis, value, method), g in compared.groupby(["axis", "value", "method"], sort=True):
        lo, hi = bootstrap_median(g["ratio"].to_numpy(), resamples, seed, "transfer", axis, f"{value:g}", method)
        twins = [a for (a, v), tasks in task_sets.items() if a != axis and tasks == task_sets[axis, value]]
        rows.append({"axis": axis, "value": value, "method": method, "tasks": len(g),
                     "shared_with": twins[0] if twins else None, "trivial": bool(g["task"].map(_at_most_one).all()),
                     "bounded_share": float(g["task"].isin(bounded).mean()),
                     "ratio_median": g["ratio"].median(), "ratio_lo": lo, "ratio_hi": hi,
                     "win_rate": float((g["ratio"] < 1).mean()),
                     "predicted_ratio_median": g["predicted_ratio"].median(),
                     "mean_ms": g["measured_ms"].mean()})
    return pd.DataFrame(rows)


def _at_most_one(task: str) -> bool:
    """A transfer task `transfer/<tables>x<devices>/<k>` with no more tables than devices."""
    shape = task.split("/")[1] if task.startswith("transfer/") else ""
    tables, _, devices = shape.partition("x")
    return bool(tables and devices) and int(tables) <= int(devices)


def best_heuristics(ratios: pd.DataFrame) -> pd.DataFrame:
    """How often each heuristic is the measured best, per axis: which reference the ratios use."""
    heuristic = ratios[ratios["method"].isin(HEURISTICS)]
    best = heuristic.loc[heuristic.groupby(["axis", "task"])["measured_ms"].idxmin()]
    return best.groupby(["axis", "method"]).size().unstack("method", fill_value=0)


def transfer_metrics(table: pd.DataFrame, tasks_measured: int, shards_measured: int,
                     seconds: float) -> Transfer:
    """The transfer stage's metrics from `summary`'s table: every compared method's scores per
    axis point (keyed axis -> method -> value as text), the policy's worst point, and how many
    of its points beat the best heuristic (median ratio below 1)."""
    if table.empty:
        table = pd.DataFrame(columns=["axis", "value", "method", "ratio_median"])
    axes: dict = {}
    for (axis, method), g in table.groupby(["axis", "method"]):
        points = g.set_index("value").drop(columns=["axis", "method"]).rename(index=lambda v: f"{v:g}")
        axes.setdefault(axis, {})[method] = points.to_dict("index")
    rl = table[table["method"] == POLICY]
    scored = rl.dropna(subset=["ratio_median"])
    worst = scored.loc[scored["ratio_median"].idxmax()] if len(scored) else None
    return {
        "axes": axes,
        "rl_greedy_worst": None if worst is None else {"axis": str(worst["axis"]), "value": float(worst["value"]),
                                                      "ratio_median": float(worst["ratio_median"])},
        "rl_greedy_points_below_1": int((scored["ratio_median"] < 1).sum()),
        "points": len(rl),
        "tasks_measured": tasks_measured,
        "shards_measured": int(shards_measured),
        "seconds": seconds,
    }

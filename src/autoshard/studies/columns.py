"""Column-wise against table-wise sharding, measured (issue 17).

Per task, every plan (table-wise ones as one whole column shard per table, column-wise ones as
`placement.columns` split tasks) is turned into device shards of column shards; the distinct
device shards of all plans of a task are measured as one batch in interleaved rounds
(`measure.interleaved`, each column shard at its own width), filed in the study's measurement
store (a tagged space of its own, `columns_store`), so a stopped run resumes. A device shard's
key lists its column shards' keys sorted ("3,17:0-16,40"); a shard of whole tables has the same
key as in `studies.measured` ("3,17,40"). The reference per task is the best table-wise plan
*by measurement*, so the comparison is conservative for column-wise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from autoshard.core.errors import ConfigError
from autoshard.core.params import Fields, Section, bounded, choice, read
from autoshard.core.schema import ColumnsMetrics
from autoshard.core.seeding import rng
from autoshard.data.features import feature_matrix
from autoshard.data.tasks import Task
from autoshard.measure.base import CostBackend
from autoshard.measure.interleaved import measure_batch
from autoshard.measure.store import MeasurementStore, record, values
from autoshard.measure.timing import TimingConfig
from autoshard.methods.registry import METHODS
from autoshard.placement.columns import (
    ColumnShard,
    device_keys,
    expand,
    lpt_split,
    milp_split,
    parse_key,
    shard_features,
    split_then_place,
)
from autoshard.placement.surrogate import MilpConfig
from autoshard.placement.torchrec import torchrec_column_plan
from autoshard.studies.paired import compare

SplitPlacement = tuple[list[ColumnShard], np.ndarray]  # column shards and a device per shard


@dataclass(frozen=True)
class ColumnsConfig(Section):
    """The `columns` section of params.yaml."""

    section = "columns"
    ways: tuple[int, ...]  # sorted, each once
    candidates: int = bounded(lo=0)
    table_methods: tuple[str, ...] = choice(METHODS)
    bootstrap: int
    target: float = bounded(lo=0, lo_open=True)
    task_share: float = bounded(lo=0, hi=1, lo_open=True)  # the first of each evaluate group (the time budget)

    @classmethod
    def from_params(cls, values: dict) -> ColumnsConfig:
        """`parse`, with `ways` sorted and each named once."""
        f = Fields(cls.section, values)
        cfg = read(cls, f, ways=tuple(sorted(set(f.integers("ways")))))
        f.done()
        return cfg


def whole(task: Task, placement: np.ndarray, dims: Sequence[int]) -> SplitPlacement:
    """A table-wise placement as column shards (one whole shard per table)."""
    return expand(task, dims), np.asarray(placement, dtype=np.int64)


def device_key(shards: Sequence[ColumnShard]) -> str:
    """"3,17:0-16,40": the column shards of one device, sorted by table then first column."""
    return ",".join(s.key for s in sorted(shards, key=lambda s: (s.table, s.start)))


def key_shard(key: str, dims: Sequence[int]) -> tuple[list[int], list[int]]:
    """(table ids, widths) of a device key, as a backend measures them."""
    tables, widths = [], []
    for part in key.split(","):
        table, start, end = parse_key(part)
        tables.append(table)
        widths.append(int(dims[table]) if start is None else end - start)
    return tables, widths


def plan_keys(plan: SplitPlacement, devices: int) -> list[str]:
    """The device key of every device of a plan ("" for an empty device)."""
    shards, placement = plan
    return [device_key(s) for s in device_keys(shards, placement, devices)]


def measure_task(backend: CostBackend, task: Task, plans: Sequence[SplitPlacement], dims: Sequence[int],
                 batch_size: int, store: MeasurementStore, known: dict[str, dict], seed: int,
                 timing: TimingConfig) -> dict[str, dict]:
    """Store records of the distinct device shards of `plans` by device key: those in `known`
    (a `read` of `store`, updated here) are reused, the others measured as one batch and added
    to `store`."""
    keys = [k for p in plans for k in plan_keys(p, task.devices) if k]
    todo = sorted(set(keys) - set(known))
    if todo:
        parsed = [key_shard(k, dims) for k in todo]
        calibration = key_shard(keys[0], dims)[0]
        g = rng(seed, "columns", "order", task.name)
        batch = measure_batch(backend, [t for t, _ in parsed], calibration, batch_size, timing, g,
                              dims=[w for _, w in parsed])
        records = {k: record(c, batch.drift, batch.attempts, batch.calibration_ms)
                   for k, c in zip(todo, batch.costs, strict=True)}
        store.write(records, f"columns {task.name}")
        known.update(records)
    return {k: known[k] for k in keys}


def predicted_ms(model, pool_features: pd.DataFrame, plan: SplitPlacement, devices: int) -> float:
    """The cost model's bottleneck (ms) of a plan: column shards are rows of their own features."""
    shards, placement = plan
    x = feature_matrix(shard_features(pool_features, shards))
    on = [np.flatnonzero(placement == d).tolist() for d in range(devices)]
    busy = [s for s in on if s]
    return float(model.predict_ms(x, busy).max())


def plan_rows(backend: CostBackend, pool_features: pd.DataFrame, tasks: list[Task],
              plans: dict[str, list[SplitPlacement | None]], batch_size: int, store: MeasurementStore, seed: int,
              timing: TimingConfig, model=None, progress: bool = True) -> pd.DataFrame:
    """One row per (task, method) with a plan: measured bottleneck (max device forward +
    backward), predicted bottleneck (with `model`), number of split tables and column shards.
    Measurements go through `store`: give it the study's store tagged "columns" (`columns_store`)."""
    from tqdm.auto import tqdm

    dims = pool_features["dim"].to_numpy(dtype=np.int64)
    known = store.read()
    rows = []
    for i, task in enumerate(tqdm(tasks, desc="measuring column plans", disable=not progress)):
        mine = {m: p[i] for m, p in plans.items() if p[i] is not None}
        costs = measure_task(backend, task, list(mine.values()), dims, batch_size, store, known, seed, timing)
        for method, plan in mine.items():
            compute = [sum(values(costs[k])[:2]) if k else 0.0 for k in plan_keys(plan, task.devices)]
            split = {s.table for s in plan[0] if not s.whole}
            rows.append({"task": task.name, "protocol": task.protocol, "unseen_ratio": task.unseen_ratio,
                         "method": method, "measured_ms": float(np.max(compute)), "split_tables": len(split),
                         "column_shards": len(plan[0]),
                         "predicted_ms": (predicted_ms(model, pool_features, plan, task.devices)
                                          if model is not None else float("nan"))})
    return pd.DataFrame(rows)


def columns_store(store: MeasurementStore) -> MeasurementStore:
    """The column study's pass in the study's store: its own tagged space, so each task's
    table-wise and column-wise plans are measured side by side in one batch (a plan measured in
    another pass can differ by more than the effect this study looks for), resumed and kept like
    every other measurement."""
    return store.tagged("columns")


def planners(model, pool_features: pd.DataFrame, single_costs: np.ndarray, cfg: ColumnsConfig, milp: MilpConfig,
             seed: int, batch_size: int) -> dict[str, Callable[[Task], SplitPlacement]]:
    """The column-wise methods: split-then-place on the cost model (`column_greedy`); the
    tables costlier than a balanced device split just enough, then LPT (`column_lpt`) or the
    MILP (`column_milp`) on the measured single costs (ms per pool table) scaled by width; and
    TorchRec's planner with column-wise shards of dim / max(ways) columns allowed (`torchrec_column`).
    Memory: a whole table needs its `size_bytes`, as for the table-wise methods, and a split adds
    one row-wise optimizer state per extra column shard (`shard_sizes`)."""
    costs = dict(enumerate(np.asarray(single_costs, dtype=float)))
    dims = pool_features["dim"].to_numpy(dtype=np.int64)

    def greedy(t: Task) -> SplitPlacement:
        result = split_then_place(model, pool_features, t, cfg.ways, cfg.candidates)
        return result.shards, result.placement

    def torchrec(t: Task) -> SplitPlacement:
        planned = torchrec_column_plan(pool_features, t, batch_size, max(cfg.ways))
        return ([ColumnShard(table, start, width, int(dims[table])) for table, start, width, _ in planned],
                np.array([rank for *_, rank in planned], dtype=np.int64))

    return {"column_greedy": greedy,
            "column_lpt": lambda t: lpt_split(costs, pool_features, t, cfg.ways),
            "column_milp": lambda t: milp_split(costs, pool_features, t, cfg.ways, milp.node_limit, milp.time_limit_s,
                                                seed),
            "torchrec_column": torchrec}


def plan_columns(planner: Callable[[Task], SplitPlacement], tasks: list[Task]) -> list[SplitPlacement | None]:
    """A column-wise planner's plan of each task (None where it finds no room)."""
    out: list[SplitPlacement | None] = []
    for task in tasks:
        try:
            out.append(planner(task))
        except ConfigError:  # Infeasible, or TorchRec's planner finding no plan
            out.append(None)
    return out


def per_task(results: pd.DataFrame, table_methods: Sequence[str], column_methods: Sequence[str]) -> pd.DataFrame:
    """Per task: the best table-wise and the best column-wise plan by measurement, and their ratio."""
    def best(kind: Sequence[str], label: str) -> pd.DataFrame:
        pool = results[results["method"].isin(list(kind))].dropna(subset=["measured_ms"])
        rows = pool.loc[pool.groupby("task", sort=False)["measured_ms"].idxmin()]
        return rows.set_index("task")[["method", "measured_ms", "split_tables"]].add_prefix(f"{label}_")

    info = results.groupby("task", sort=False)[["protocol", "unseen_ratio"]].first()
    out = info.join(best(table_methods, "table"), how="inner").join(best(column_methods, "column"), how="inner")
    out["ratio"] = out["column_measured_ms"] / out["table_measured_ms"]
    return out.reset_index()


def with_table_bound(table: pd.DataFrame, tasks: list[Task], single_costs: np.ndarray) -> pd.DataFrame:
    """`per_task`'s frame plus each task's costliest table measured alone (`largest_single_ms`,
    from the profile) and its share of the best table-wise bottleneck (`bound_share`): near 1,
    the largest table is what bounds every table-wise plan and splitting it is the way to do
    better; well below 1, it is not the limit and splitting can only add work."""
    costs = np.asarray(single_costs, dtype=float)
    largest = {t.name: float(np.nanmax(costs[list(t.tables)])) for t in tasks}
    out = table.copy()
    out["largest_single_ms"] = out["task"].map(largest)
    out["bound_share"] = out["largest_single_ms"] / out["table_measured_ms"]
    return out


def pair_frame(results: pd.DataFrame, table_methods: Sequence[str], column_methods: Sequence[str]) -> pd.DataFrame:
    """Per task and pair (each column-wise method, and the best of them, against the best
    table-wise plan): the measured ratio, as `figures.paired_ratios` draws it."""
    best = per_task(results, table_methods, column_methods)
    reference = best.set_index("task")["table_measured_ms"]
    frames = [best.assign(pair="best column-wise / best table-wise")[["task", "protocol", "pair", "ratio"]]]
    for method in column_methods:
        g = results[(results["method"] == method) & results["task"].isin(reference.index)]
        frames.append(pd.DataFrame({"task": g["task"], "protocol": g["protocol"], "pair": f"{method} / best table-wise",
                                    "ratio": g["measured_ms"].to_numpy() / reference[g["task"]].to_numpy()}))
    return pd.concat(frames, ignore_index=True)


def columns_metrics(table: pd.DataFrame, cfg: ColumnsConfig, seed: int, shards_measured: int,
                    seconds: float) -> ColumnsMetrics:
    """Per protocol: the paired statistics of the best column-wise plan against the best
    table-wise plan (`paired.compare`, strata: the unseen ratio), and whether the target holds
    (the median ratio at most `cfg.target` with the interval's upper end below 1). A best
    column-wise plan that splits no table is a table-wise plan (`unsplit_share` of the tasks)."""
    protocols = {}
    for protocol, frame in table.groupby("protocol", sort=False):
        stats = compare(frame["column_measured_ms"].to_numpy(), frame["table_measured_ms"].to_numpy(),
                        strata=frame["unseen_ratio"].to_numpy(), resamples=cfg.bootstrap, seed=seed,
                        keys=("columns", str(protocol)))
        median, high = stats["median_ratio"], stats["ci_high"]
        protocols[str(protocol)] = {
            **stats, "target": cfg.target,
            "met": bool(median is not None and high is not None and median <= cfg.target and high < 1.0),
            "split_tables_median": float(frame["column_split_tables"].median()),
            "unsplit_share": float((frame["column_split_tables"] == 0).mean()),
            "bound_share_median": (float(frame["bound_share"].median()) if "bound_share" in frame else None),
            "column_wins": float((frame["ratio"] < 1.0).mean())}
    return {"seconds": float(seconds), "protocols": protocols, "ways": list(cfg.ways),
            "table_methods": list(cfg.table_methods), "tasks": int(len(table)),
            "shards_measured": int(shards_measured)}

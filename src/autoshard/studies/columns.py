"""Column-wise against table-wise sharding, measured, like with like (issues 17 and 29).

Each column-wise method is compared with its table-wise twin: the same planner on the same
task with every table kept whole (`TWIN`), so that splitting is the only difference between the
two plans. A twin that is a method of the registry (`lpt_measured`, `milp`, `torchrec`) is that
method; `column_greedy`'s is split-then-place with no split allowed (`column_greedy_unsplit`:
greedy placement on the cost model, without cost_greedy's look-ahead on memory). Where the
planner chooses no split the two plans are one plan and their ratio is exactly 1, so beside
every ratio stands the share of tasks where a split was chosen.

Per task, every plan is turned into device shards of column shards; the distinct device shards
of all plans of a task are measured as one batch in interleaved rounds (`measure.interleaved`,
each column shard at its own width), filed in a pass of its own in the study's measurement store
(`columns_store`, then `pass_name`), so a stopped run resumes and a changed set of plans is
measured afresh. A device shard's key lists its column shards' keys sorted ("3,17:0-16,40"); a
shard of whole tables has the same key as in `studies.measured` ("3,17,40"). The statistics are
exploratory: intervals, unadjusted, and where they lie (`findings.direction`), no verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import zip_longest
from typing import TypedDict

import numpy as np
import pandas as pd

from autoshard.core.digest import value_digest
from autoshard.core.errors import ConfigError
from autoshard.core.params import Fields, Section, bounded, choice, read
from autoshard.core.schema import Number, StageTime
from autoshard.core.seeding import one_thread, rng
from autoshard.data.features import feature_matrix
from autoshard.data.tasks import Task
from autoshard.measure.base import CostBackend
from autoshard.measure.interleaved import measure_batch
from autoshard.measure.store import MeasurementStore, record, values
from autoshard.measure.timing import TimingConfig
from autoshard.methods.artifacts import Artifacts, Settings
from autoshard.methods.registry import COLUMNS, build
from autoshard.placement.column_split import (
    ColumnShard,
    device_keys,
    device_shards,
    parse_key,
    shard_features,
    shard_sizes,
)
from autoshard.placement.types import SplitPlanner
from autoshard.studies.findings import direction
from autoshard.studies.paired import compare, one_pass


class ColumnsPair(TypedDict):
    """One column-wise method against its table-wise twin (the same planner, every table whole),
    paired over one protocol's tasks where both have a plan. Exploratory: no verdict."""

    tasks: int
    twin: str
    median_ratio: Number
    ci_low: Number
    ci_high: Number
    p_value: Number
    identical_share: Number  # tasks where the two are one plan (no split chosen, the same devices)
    direction: str  # where the 95% interval lies: "below 1", "above 1", "spans 1" (or "no tasks")
    split_share: float  # tasks where the column-wise plan split at least one table
    split_tables_median: float
    bound_share_median: float  # the costliest table alone / the twin's bottleneck


class Columns(StageTime):
    """reports/metrics/columns.json. Built by `studies.columns.columns_metrics`."""

    protocols: dict[str, dict[str, ColumnsPair]]  # protocol -> column-wise method -> against its twin
    pairs: dict[str, str]  # column-wise method -> its table-wise twin
    ways: list[int]
    tasks: dict[str, int]  # per protocol
    measuring_pass: str
    shards_measured: int


SplitPlacement = tuple[list[ColumnShard], np.ndarray]  # column shards and a device per shard

# Each column-wise method and its table-wise twin: the same planner with every table whole.
TWIN = {"column_greedy": "column_greedy_unsplit", "column_lpt": "lpt_measured", "column_milp": "milp",
        "torchrec_column": "torchrec"}
WHOLE = (1,)  # the ways of a twin: no table split


@dataclass(frozen=True)
class ColumnsConfig(Section):
    """The `columns` section of params.yaml."""

    section = "columns"
    ways: tuple[int, ...]  # sorted, each once
    candidates: int = bounded(lo=0)
    methods: tuple[str, ...] = choice(COLUMNS)
    tasks_per_protocol: int = bounded(lo=1)
    bootstrap: int

    @classmethod
    def from_params(cls, values: dict) -> ColumnsConfig:
        """`parse`, with `ways` sorted and each named once."""
        f = Fields(cls.section, values)
        cfg = read(cls, f, ways=tuple(sorted(set(f.integers("ways")))))
        f.done()
        return cfg


def study_tasks(tasks: Sequence[Task], per_protocol: int) -> list[Task]:
    """The first `per_protocol` tasks of each protocol, taken in turn from its unseen-ratio groups
    (the first of every group, then the second, ...) so the strata stay balanced; all of a
    protocol's tasks where it has fewer. In the order of `tasks`."""
    groups: dict[str, dict[float, list[Task]]] = {}
    for t in tasks:
        groups.setdefault(t.protocol, {}).setdefault(t.unseen_ratio, []).append(t)
    keep = set()
    for by_ratio in groups.values():
        turns = [t for turn in zip_longest(*by_ratio.values()) for t in turn if t is not None]
        keep |= {t.name for t in turns[:per_protocol]}
    return [t for t in tasks if t.name in keep]


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


def plan_key(plan: SplitPlacement, devices: int) -> str:
    """The plan's device keys, sorted: two plans with one key are one split of the columns (the
    same device shards, so the same measured bottleneck)."""
    return " | ".join(sorted(k for k in plan_keys(plan, devices) if k))


def pass_name(tasks: Sequence[Task], plans: dict[str, list[SplitPlacement | None]]) -> str:
    """The measuring pass of these plans: "columns-" and a digest of every task and plan, so the
    same plans resume one pass and any other set is measured afresh, all of it together."""
    digest = value_digest(*((t.name, m, None if p[i] is None else plan_key(p[i], t.devices))
                            for i, t in enumerate(tasks) for m, p in sorted(plans.items())))
    return f"columns-{digest[:10]}"


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
    backward), predicted bottleneck (with `model`), number of split tables and column shards,
    the plan's `plan_key` and its measuring `pass`. Every plan is measured in one pass
    (`pass_name`) of `store`: give it the study's store tagged "columns" (`columns_store`)."""
    from tqdm.auto import tqdm

    dims = pool_features["dim"].to_numpy(dtype=np.int64)
    name = pass_name(tasks, plans)
    store = store.tagged(name)
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
                         "column_shards": len(plan[0]), "plan": plan_key(plan, task.devices), "pass": name,
                         "predicted_ms": (predicted_ms(model, pool_features, plan, task.devices)
                                          if model is not None else float("nan"))})
    return pd.DataFrame(rows)


def distinct_shards(rows: pd.DataFrame) -> int:
    """The device shards `plan_rows` measured (or read back) for its rows: each distinct key once."""
    return int(rows["plan"].str.split(" | ", regex=False).explode().nunique()) if len(rows) else 0


def columns_store(store: MeasurementStore) -> MeasurementStore:
    """The column study's space in the study's store: its own tagged space, in which each run's
    plans are one pass (`plan_rows`), so each task's table-wise and column-wise plans are measured
    side by side in one batch (a plan measured in another pass can differ by more than the effect
    this study looks for), resumed and kept like every other measurement."""
    return store.tagged("columns")


def planners(artifacts: Artifacts, cfg: ColumnsConfig, settings: Settings) -> dict[str, SplitPlanner]:
    """The column-wise methods of `cfg.methods` (registry entries of kind `column`, splitting into
    `cfg.ways`) and their table-wise twins (`TWIN`: the same entry built with `WHOLE` ways). The
    column-wise methods: split-then-place on the cost model (`column_greedy`); the tables costlier
    than a balanced device split just enough, then LPT (`column_lpt`) or the MILP (`column_milp`) on
    the measured single costs (ms per pool table) scaled by width; and TorchRec's planner with
    column-wise shards of dim / max(ways) columns allowed (`torchrec_column`). Memory: a whole table
    needs its `size_bytes`, as for the table-wise methods, and a split adds one row-wise optimizer
    state per extra column shard (`shard_sizes`). A method whose needs are missing is an error."""
    column = build(cfg.methods, artifacts, replace(settings, ways=cfg.ways, candidates=cfg.candidates))
    whole = build(cfg.methods, artifacts, replace(settings, ways=WHOLE, candidates=0))
    missing = column.left_out | whole.left_out
    if missing:
        raise ConfigError("columns.methods: " + "; ".join(f"{m} {why}" for m, why in missing.items()))
    return {m: column.planners[m] for m in cfg.methods} | {TWIN[m]: whole.planners[m] for m in cfg.methods}


def within_memory(pool_features: pd.DataFrame, task: Task, plan: SplitPlacement) -> bool:
    """True when no device of `plan` holds more than the task's cap (`shard_sizes`)."""
    sizes = shard_sizes(pool_features, plan[0])
    return all(int(sizes[s].sum()) <= task.memory_bytes for s in device_shards(plan[0], plan[1], task.devices))


def plan_columns(planner: Callable[[Task], SplitPlacement], tasks: list[Task],
                 pool_features: pd.DataFrame) -> list[SplitPlacement | None]:
    """A planner's plan of each task, on one thread: None where it finds no room or its plan
    breaks the memory cap (the same rule for column-wise plans and their twins)."""
    out: list[SplitPlacement | None] = []
    with one_thread():
        for task in tasks:
            try:
                plan = planner(task)
            except ConfigError:  # Infeasible, or TorchRec's planner finding no plan
                plan = None
            out.append(plan if plan is not None and within_memory(pool_features, task, plan) else None)
    return out


def pair_frame(results: pd.DataFrame, methods: Sequence[str], tasks: list[Task],
               single_costs: np.ndarray) -> pd.DataFrame:
    """Per task and pair (each column-wise method of `methods` against its `TWIN`) where both
    have a plan, measured in one pass (`paired.one_pass`): both bottlenecks, their ratio, the
    column-wise plan's split tables, whether it split any (`split`) and whether the two are one
    plan (`identical`), and `bound_share`: the task's costliest table measured alone (the profile's
    single costs) over the twin's bottleneck. Near 1, the largest table bounds the table-wise plan
    and splitting it is the way to do better; well below 1, splitting can only add work."""
    one_pass(results)
    costs = np.asarray(single_costs, dtype=float)
    largest = {t.name: float(np.nanmax(costs[list(t.tables)])) for t in tasks}
    frames = []
    for method in methods:
        column = results[results["method"] == method].set_index("task")
        twin = results[results["method"] == TWIN[method]].set_index("task")
        both = column.join(twin[["measured_ms", "plan"]], rsuffix="_twin", how="inner")
        frames.append(pd.DataFrame({
            "task": both.index, "protocol": both["protocol"].to_numpy(),
            "unseen_ratio": both["unseen_ratio"].to_numpy(),
            "method": method, "twin": TWIN[method], "pair": f"{method} / {TWIN[method]}",
            "column_ms": both["measured_ms"].to_numpy(), "table_ms": both["measured_ms_twin"].to_numpy(),
            "ratio": (both["measured_ms"] / both["measured_ms_twin"]).to_numpy(),
            "split_tables": both["split_tables"].to_numpy(), "split": (both["split_tables"] > 0).to_numpy(),
            "identical": (both["plan"] == both["plan_twin"]).to_numpy(),
            "bound_share": (both.index.map(largest).to_numpy() / both["measured_ms_twin"]).to_numpy(),
            "pass": both["pass"].to_numpy()}))
    return pd.concat(frames, ignore_index=True)


def columns_metrics(pairs: pd.DataFrame, cfg: ColumnsConfig, seed: int, shards_measured: int,
                    seconds: float) -> Columns:
    """Per protocol and column-wise method: the paired statistics against its twin over the tasks
    where both have a plan (`paired.compare`, strata: the unseen ratio), where the 95% interval
    lies (`findings.direction`, exploratory: no verdict), the share of those tasks where a split
    was chosen (`split_share`: elsewhere the two are one plan, ratio 1) and the median
    `bound_share`."""
    protocols: dict[str, dict] = {}
    for (protocol, method), g in pairs.groupby(["protocol", "method"], sort=False):
        stats = compare(g["column_ms"].to_numpy(), g["table_ms"].to_numpy(), strata=g["unseen_ratio"].to_numpy(),
                        identical=g["identical"].to_numpy(), resamples=cfg.bootstrap, seed=seed,
                        keys=("columns", str(protocol), str(method)))
        protocols.setdefault(str(protocol), {})[str(method)] = {
            **stats, "twin": TWIN[method],
            "direction": direction(stats) if stats["median_ratio"] is not None else "no tasks",
            "split_share": float(g["split"].mean()), "split_tables_median": float(g["split_tables"].median()),
            "bound_share_median": float(g["bound_share"].median())}
    tasks = pairs.groupby("protocol", sort=False)["task"].nunique()
    return {"seconds": float(seconds), "protocols": protocols, "ways": list(cfg.ways),
            "pairs": {m: TWIN[m] for m in cfg.methods}, "tasks": {str(p): int(n) for p, n in tasks.items()},
            "measuring_pass": str(pairs["pass"].iloc[0]) if len(pairs) else "",
            "shards_measured": int(shards_measured)}

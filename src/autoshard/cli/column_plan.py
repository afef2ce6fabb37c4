"""`autoshard plan --sharding column`: split-then-place on the user's tables, the plan file of a
column-wise plan (each split table's column shards and their devices), and reading any plan
back as column shards (a table-wise plan is the special case of one shard per table)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from autoshard.cli.defaults import study_defaults
from autoshard.cli.user_tables import UserTables
from autoshard.core.errors import ConfigError
from autoshard.core.inputs import PLAN_FORMAT, shown
from autoshard.data.features import feature_matrix
from autoshard.data.tasks import Task
from autoshard.methods.registry import GREEDY
from autoshard.placement.column_split import ColumnShard, SplitPlan, check_split, shard_features


def parse_ways(text: str) -> tuple[int, ...]:
    """`--column-ways 1,2,4`: the numbers of column shards a table may be split into."""
    try:
        ways = tuple(sorted({int(w) for w in text.split(",")}))
    except ValueError:
        raise ConfigError(f"--column-ways: {shown(text)} (expected whole numbers such as 1,2,4)") from None
    if not ways or ways[0] < 1 or ways[-1] > 64:
        raise ConfigError(f"--column-ways: {shown(text)} (each between 1 and 64)")
    return ways


def parse_splits(given: list[str] | None, tables: UserTables) -> dict[int, int]:
    """`--split NAME=K` (repeatable): tables the user wants in K column shards; a dim that does
    not split into multiples of 4 columns is refused naming the table, its dim and K."""
    out: dict[int, int] = {}
    index = {n: i for i, n in enumerate(tables.names)}
    for item in given or []:
        name, _, k = item.partition("=")
        if name not in index:
            raise ConfigError(f"--split: {shown(item)} (no table {shown(name)} in {tables.source})")
        try:
            ways = int(k)
        except ValueError:
            raise ConfigError(f"--split: {shown(item)} (expected NAME=K, K a whole number)") from None
        i = index[name]
        check_split(name, int(tables.features["dim"].iloc[i]), ways)
        out[i] = ways
    return out


def plan(model, tables: UserTables, task: Task, ways: tuple[int, ...], fixed: dict[int, int]) -> SplitPlan:
    """Split-then-place on the cost model (torch), deterministic (one thread)."""
    from autoshard.core.seeding import one_thread
    from autoshard.placement.column_split import split_then_place

    with one_thread():
        return split_then_place(model, tables.features, task, ways, study_defaults()["columns.candidates"], fixed)


def _label(shard: ColumnShard, names: list[str]) -> str:
    return names[shard.table] if shard.whole else f"{names[shard.table]}[{shard.start}:{shard.start + shard.width}]"


def shard_memory(tables: UserTables, shards: list[ColumnShard], batch: int) -> np.ndarray:
    """Bytes each column shard takes while training at a batch of `batch` (`UserTables.memory`)."""
    return tables.memory(batch, [s.table for s in shards], [s.width for s in shards])


def device_table(tables: UserTables, task: Task, result: SplitPlan, model, batch: int) -> pd.DataFrame:
    """Per device: its column shards, their memory while training and the cost model's
    predicted cost (ms)."""
    shards, placement = result.shards, result.placement
    sizes = shard_memory(tables, shards, batch)
    on = [np.flatnonzero(placement == d) for d in range(task.devices)]
    out = pd.DataFrame({"device": range(task.devices), "shards": [len(s) for s in on],
                        "memory_bytes": [int(sizes[s].sum()) for s in on],
                        "memory_share": [float(sizes[s].sum() / task.memory_bytes) for s in on]})
    x = feature_matrix(shard_features(tables.features, shards))
    busy = [d for d in range(task.devices) if len(on[d])]
    predicted = np.zeros(task.devices)
    predicted[busy] = model.predict_ms(x, [on[d].tolist() for d in busy])
    out["predicted_ms"] = predicted
    out["names"] = [[_label(shards[i], tables.names) for i in s] for s in on]
    return out


def document(options: dict, tables: UserTables, task: Task, result: SplitPlan, model, files: dict,
             seconds: float, batch: int) -> dict:
    """A column-wise plan file: `assignment` holds the whole tables, `columns` the split ones."""
    devices = device_table(tables, task, result, model, batch)
    names = tables.names
    assignment, columns = {}, {}
    for shard, d in zip(result.shards, result.placement, strict=True):
        if shard.whole:
            assignment[names[shard.table]] = int(d)
        else:
            columns.setdefault(names[shard.table], []).append(
                {"start": shard.start, "width": shard.width, "device": int(d)})
    return {"format": PLAN_FORMAT, "method": GREEDY, "options": options, "tables_file": tables.source,
            "devices": task.devices, "memory_per_device_bytes": task.memory_bytes, "sharding": "column",
            "assignment": assignment, "columns": columns, "per_device": devices.to_dict("records"),
            "predicted_bottleneck_ms": float(devices["predicted_ms"].max()),
            "predicted": "by the cost model, not measured (measure with `autoshard score`)",
            "sharding_seconds": seconds, "model_files": files, "engine": "torch"}

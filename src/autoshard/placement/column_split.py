"""Column-wise sharding: split tables into column shards, then place the shards like tables.

Representation: a *split task* is a task whose tables were expanded into `ColumnShard`s
(pool table id, first column, width); a placement is then a device per column shard, in the
order of `expand`. Why this and not a per-table "split count" in the placement: every method
that places tables (greedy on the cost model, LPT, the MILP) places column shards unchanged,
since each column shard is one row of a features array (`shard_features`) and one size
(`shard_sizes`); the cost model takes its shards as row indices into that array.

A column shard of a table of dim d split k ways has the table's rows, pooling factor, trace
and reuse histogram and dim d/k, which must be a multiple of 4 (the TBE kernel's rule). Its
memory is its weights plus the row-wise optimizer state, one float per row *per shard*
(`data.sizes.table_bytes`, the accounting of the pool's `size_bytes` and the study's caps),
so splitting a table k ways costs k - 1 more row states.

The planner is split-then-place (NeuroShard): a greedy search over which tables to split,
largest predicted single cost first, each candidate set of splits placed by greedy placement
on the cost model; the split set with the lowest predicted bottleneck wins. Greedy placement
is cost_greedy on column shards: largest predicted single cost first, onto the fitting device
whose predicted cost after adding it is lowest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from autoshard.core.errors import ConfigError
from autoshard.data.features import feature_matrix
from autoshard.data.sizes import ROW_STATE_BYTES
from autoshard.data.tasks import Task
from autoshard.placement.greedy import Infeasible, Room, greedy, lowest
from autoshard.placement.heuristics import key_greedy

if TYPE_CHECKING:  # placing whole tables by a heuristic needs no torch
    from autoshard.costmodel.model import CostModel

ALIGN = 4  # columns of a TBE shard come in multiples of 4


@dataclass(frozen=True)
class ColumnShard:
    """Columns [start, start + width) of pool table `table`, whose full dim is `dim`."""

    table: int
    start: int
    width: int
    dim: int

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.width == self.dim

    @property
    def key(self) -> str:
        """"17" for a whole table, "17:0-16" for its columns 0..15 (end exclusive)."""
        return str(self.table) if self.whole else f"{self.table}:{self.start}-{self.start + self.width}"


def parse_key(key: str) -> tuple[int, int | None, int | None]:
    """(table, start, end) of a shard key; start and end are None for a whole table."""
    try:
        if ":" not in key:
            return int(key), None, None
        table, cols = key.split(":")
        start, end = cols.split("-")
        return int(table), int(start), int(end)
    except ValueError:
        raise ConfigError(f"shard key: {key!r} (expected '17' or '17:0-16')") from None


def check_split(name: str, dim: int, k: int) -> int:
    """The width of each of `k` column shards of a table of `dim`; refused unless it is a
    whole multiple of 4."""
    if type(k) is not int or k < 1:
        raise ConfigError(f"table {name}: split into {k!r} column shards (need a whole number of at least 1)")
    if dim % k or (dim // k) % ALIGN:
        raise ConfigError(f"table {name}: dim {dim} cannot be split into {k} column shards of a multiple of "
                          f"{ALIGN} columns ({dim / k:g} each)")
    return dim // k


def can_split(dim: int, k: int) -> bool:
    return k >= 1 and dim % k == 0 and (dim // k) % ALIGN == 0


def split_table(table: int, dim: int, k: int, name: str | None = None) -> list[ColumnShard]:
    """The `k` equal column shards of a table, left to right."""
    width = check_split(str(table) if name is None else name, int(dim), k)
    return [ColumnShard(int(table), i * width, width, int(dim)) for i in range(k)]


def expand(task: Task, dims: Sequence[int], splits: Mapping[int, int] | None = None) -> list[ColumnShard]:
    """The column shards of a task's tables in task order; `splits` maps a pool table id to its
    number of column shards (absent: 1); `dims` are the pool's dims (indexed by table id)."""
    splits = splits or {}
    unknown = sorted(set(splits) - set(task.tables))
    if unknown:
        raise ConfigError(f"splits: table {unknown[0]} is not a table of task {task.name}")
    return [s for t in task.tables for s in split_table(t, int(dims[t]), int(splits.get(t, 1)))]


def shard_features(pool_features: pd.DataFrame, shards: Sequence[ColumnShard]) -> pd.DataFrame:
    """One row per column shard: its table's features with dim = its width and size_bytes its
    own `table_bytes` (its columns' weights, all of its rows' optimizer state); rows, pooling,
    reuse and the descriptive columns unchanged."""
    rows = pool_features.iloc[[s.table for s in shards]].reset_index(drop=True).copy()
    width = np.array([s.width for s in shards], dtype=np.int64)
    full = rows["dim"].to_numpy(dtype=np.int64)
    if (full != np.array([s.dim for s in shards])).any():
        raise ConfigError("column shards: a shard's dim differs from its table's dim in the pool features")
    state = rows["rows"].to_numpy(dtype=np.int64) * ROW_STATE_BYTES
    rows["size_bytes"] = (rows["size_bytes"].to_numpy(dtype=np.int64) - state) // full * width + state
    rows["dim"] = width
    rows["start"] = [s.start for s in shards]
    rows["key"] = [s.key for s in shards]
    return rows


def shard_sizes(pool_features: pd.DataFrame, shards: Sequence[ColumnShard]) -> np.ndarray:
    """Bytes per column shard: weights plus row-wise optimizer state (one float per row per shard);
    a whole table's are its `size_bytes`, the same caps as the table-wise methods."""
    return shard_features(pool_features, shards)["size_bytes"].to_numpy(dtype=np.int64)


def device_shards(shards: Sequence[ColumnShard], placement: Sequence[int], devices: int) -> list[list[int]]:
    """Indices into `shards` per device."""
    out: list[list[int]] = [[] for _ in range(devices)]
    for i, d in enumerate(placement):
        out[int(d)].append(i)
    return out


def device_keys(shards: Sequence[ColumnShard], placement: Sequence[int], devices: int) -> list[list[ColumnShard]]:
    """The column shards on each device."""
    return [[shards[i] for i in s] for s in device_shards(shards, placement, devices)]


@dataclass
class SplitPlan:
    """A split-then-place result: the column shards, a device per shard and its predicted bottleneck."""

    shards: list[ColumnShard]
    placement: np.ndarray
    predicted_ms: float

    @property
    def splits(self) -> dict[int, int]:
        """Number of column shards per split table (whole tables left out)."""
        out: dict[int, int] = {}
        for s in self.shards:
            if not s.whole:
                out[s.table] = out.get(s.table, 0) + 1
        return out


def place_by_cost(model: CostModel, features: np.ndarray, sizes: np.ndarray, devices: int,
                  capacity: int) -> tuple[np.ndarray, float]:
    """cost_greedy on rows of `features` (`placement.greedy`'s loop): largest predicted single
    cost first, onto the device with room whose predicted cost after adding it is lowest (ties:
    lower device). Room for the shard alone (`Room`): a split whose placement dead-ends is not
    taken. Returns the placement and its predicted bottleneck (ms); `Infeasible` when a row fits
    nowhere."""
    import torch

    from autoshard.costmodel.model import check_features

    with torch.no_grad():
        enc = model.encode(check_features(features))
        order = np.argsort(-model.cost_ms(enc).numpy(), kind="stable")
        device_sum = enc.new_zeros(devices, enc.shape[1])

        def best(t: int, allowed: np.ndarray) -> int:
            return lowest(model.cost_ms(device_sum + enc[order[t]]).numpy(), allowed)

        def placed(t: int, device: int) -> None:
            device_sum[device] += enc[order[t]]

        rule = Room(np.asarray(sizes, dtype=np.int64)[order], devices, capacity,
                    lambda t: f"column shard {order[t]}")
        placement = np.full(len(order), -1, dtype=np.int64)
        placement[order] = greedy(len(order), rule, best, placed)
        busy = np.bincount(placement, minlength=devices) > 0
        bottleneck = float(model.cost_ms(device_sum[torch.from_numpy(busy)]).max())
    return placement, bottleneck


def split_then_place(model: CostModel, pool_features: pd.DataFrame, task: Task, ways: Sequence[int] = (1, 2, 4),
                     candidates: int = 16, fixed: Mapping[int, int] | None = None) -> SplitPlan:
    """Greedy split search: start from whole tables (and the `fixed` splits, kept as they are);
    for each of the `candidates` other tables of largest predicted single cost, try each split
    count of `ways` (ascending, those leaving multiples of 4 columns) and keep it when the
    greedy placement's predicted bottleneck drops. Memory: `shard_sizes`."""
    dims = pool_features["dim"].to_numpy(dtype=np.int64)
    fixed = dict(fixed or {})
    expand(task, dims, fixed)  # refuses a fixed split that is not a multiple of 4 columns
    whole = expand(task, dims)
    x = feature_matrix(shard_features(pool_features, whole))
    single = model.predict_ms(x, [[i] for i in range(len(whole))])
    order = [t for t in (task.tables[i] for i in np.argsort(-single, kind="stable")) if t not in fixed]
    order = order[:max(0, candidates)]

    def placed(splits: dict[int, int]) -> SplitPlan | None:
        shards = expand(task, dims, splits)
        try:
            p, b = place_by_cost(model, feature_matrix(shard_features(pool_features, shards)),
                                shard_sizes(pool_features, shards), task.devices,
                                task.memory_bytes)
        except Infeasible:
            return None
        return SplitPlan(shards, p, b)

    splits: dict[int, int] = fixed
    best = placed(splits)
    if best is None:
        raise Infeasible(f"task {task.name}: greedy placement of whole tables finds no room")
    for table in order:
        for k in sorted(set(int(w) for w in ways)):
            if k <= splits.get(table, 1) or not can_split(int(dims[table]), k):
                continue
            trial = placed(splits | {table: k})
            if trial is not None and trial.predicted_ms < best.predicted_ms * (1 - 1e-9):
                best, splits = trial, splits | {table: k}
    return best


def scaled_costs(table_costs: Mapping[int, float], shards: Sequence[ColumnShard]) -> np.ndarray:
    """A column shard's single cost estimated as its table's scaled by its share of the columns."""
    return np.array([float(table_costs[s.table]) * s.width / s.dim for s in shards])


def lpt_items(costs: np.ndarray, sizes: np.ndarray, devices: int, capacity: int) -> np.ndarray:
    """LPT on column shards: costliest first onto the least-loaded device with room."""
    return key_greedy(np.asarray(costs, dtype=float), np.asarray(sizes, dtype=np.int64), devices, capacity)


def lpt_split(table_costs: Mapping[int, float], pool_features: pd.DataFrame, task: Task,
              ways: Sequence[int] = (1, 2, 4)) -> tuple[list[ColumnShard], np.ndarray]:
    """LPT on split tables: each table costlier than a perfectly balanced device (total / D)
    split into the fewest column shards of `ways` that bring it under that, or as many as its
    dim allows (costs scaled by width); then LPT. The split a profiler-led engineer would try."""
    dims = pool_features["dim"].to_numpy(dtype=np.int64)
    balanced = sum(float(table_costs[t]) for t in task.tables) / task.devices
    splits = {}
    for t in task.tables:
        fits = sorted(int(k) for k in {1, *ways} if can_split(int(dims[t]), int(k)))
        splits[t] = next((k for k in fits if float(table_costs[t]) / k <= balanced), fits[-1])
    shards = expand(task, dims, splits)
    placement = lpt_items(scaled_costs(table_costs, shards), shard_sizes(pool_features, shards),
                          task.devices, task.memory_bytes)
    return shards, placement


def milp_split(table_costs: Mapping[int, float], pool_features: pd.DataFrame, task: Task, ways: Sequence[int],
               node_limit: int, time_limit_s: float, seed: int = 0) -> tuple[list[ColumnShard], np.ndarray]:
    """The MILP (`placement.milp.solve_costs`) on `lpt_split`'s column shards and scaled costs."""
    from autoshard.placement.milp import solve_costs

    shards, _ = lpt_split(table_costs, pool_features, task, ways)
    result = solve_costs(scaled_costs(table_costs, shards), shard_sizes(pool_features, shards),
                   task.devices, task.memory_bytes, time_limit=time_limit_s, seed=seed, node_limit=node_limit)
    return shards, result.placement

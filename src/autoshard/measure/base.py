"""The backend protocol, the cost record, and the shard inputs every backend shares."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from autoshard.core.errors import ConfigError
from autoshard.core.seeding import threads as pinned
from autoshard.data.sizes import table_bytes
from autoshard.data.traces import Traces

if TYPE_CHECKING:  # types only: the portable worker (no pandas) imports this module
    from autoshard.data.pool import Pool
    from autoshard.measure.timing import TimingConfig


@dataclass(frozen=True)
class ShardCost:
    """Compute cost of one shard on one device, in milliseconds (median and IQR over runs)."""

    forward_ms: float
    backward_ms: float
    forward_iqr_ms: float = 0.0
    backward_iqr_ms: float = 0.0

    @property
    def total_ms(self) -> float:
        return self.forward_ms + self.backward_ms


class ShardTooLarge(RuntimeError):
    """The shard does not fit the device's memory: recorded as unmeasurable, not a crash."""


class CostBackend(Protocol):
    """Measures (or estimates) a shard's forward and backward compute on one device."""

    name: str
    device: str

    def measure(self, tables: Sequence[int], batch_size: int, dims: Sequence[int] | None = None) -> ShardCost:
        """`dims`: per listed table, the columns measured (a column shard: same rows and
        trace, fewer columns); None measures every table whole."""
        ...


def check_shard(tables: Sequence[int], num_tables: int) -> list[int]:
    """The shard's table ids as ints; errors name the offending value."""
    ids = [int(t) for t in tables]
    if not ids:
        raise ConfigError("shard: [] (empty: a shard needs at least one table)")
    bad = [t for t in ids if not 0 <= t < num_tables]
    if bad:
        raise ConfigError(f"shard: table {bad[0]} is not in the pool of {num_tables} tables")
    return ids


def table_shapes(features, tables: Sequence[int]) -> tuple[list[int], list[int]]:
    """The rows and dims of the listed tables, from the pool's features (a frame, or a mapping of
    `rows` and `dim` arrays, as the portable worker's pool has: it runs without pandas)."""
    ids = [int(t) for t in tables]
    return ([int(r) for r in np.asarray(features["rows"])[ids]],
            [int(d) for d in np.asarray(features["dim"])[ids]])


def shard_dims(table_dims: Sequence[int], dims: Sequence[int] | None) -> list[int]:
    """The widths measured: the tables' own dims, or `dims` (one per listed table, each at
    least 1 and at most its table's dim: a column shard)."""
    full = [int(d) for d in table_dims]
    if dims is None:
        return full
    widths = [int(d) for d in dims]
    if len(widths) != len(full):
        raise ConfigError(f"shard dims: {len(widths)} values for {len(full)} tables")
    bad = [(w, d) for w, d in zip(widths, full, strict=True) if not 1 <= w <= d]
    if bad:
        raise ConfigError(f"shard dims: {bad[0][0]} columns of a table of dim {bad[0][1]}")
    return widths


def check_batch(batch_size: int, traces: Traces) -> None:
    if not 1 <= batch_size <= traces.batch_size:
        raise ConfigError(f"profile.batch_size: {batch_size} (the traces hold "
                          f"{traces.batch_size} bags per table)")


WINDOWS = 8  # a table's trace is read as a ring of this many windows, one per run in turn


def shard_inputs(traces: Traces, tables: Sequence[int], batch_size: int, window: int = 0
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat indices and table-major offsets (T*B+1) of `batch_size` bags of each table: those
    from bag `window` x (bags in the trace) / WINDOWS on, wrapping round the trace's end."""
    check_batch(batch_size, traces)
    ids = check_shard(tables, traces.num_tables)
    b = traces.batch_size
    start = (window % WINDOWS) * b // WINDOWS
    bags = (start + np.arange(batch_size)) % b
    parts, lengths = [], []
    for t in ids:
        lengths.append(np.asarray(traces.lengths[t, bags]))
        first, end = start, min(start + batch_size, b)
        parts.append(np.asarray(traces.indices[traces.offsets[t * b + first]:traces.offsets[t * b + end]]))
        if start + batch_size > b:  # the wrapped part, from the trace's first bag
            wrap = start + batch_size - b
            parts.append(np.asarray(traces.indices[traces.offsets[t * b]:traces.offsets[t * b + wrap]]))
    flat = np.stack(lengths)
    offsets = np.zeros(flat.size + 1, dtype=np.int64)
    np.cumsum(flat.reshape(-1), out=offsets[1:])
    indices = np.concatenate(parts).astype(np.int64)
    return torch.from_numpy(indices), torch.from_numpy(offsets)


class Feeds:
    """The inputs of a backend's runs: with `rotate`, every run (warm-up included, across all
    the backend's measurements) feeds the next of the trace's WINDOWS windows, as a training
    loop reads the next batch; without it every run feeds the first `batch_size` bags."""

    def __init__(self, rotate: bool):
        self.rotate = rotate
        self.runs = 0  # runs fed so far

    def take(self, traces: Traces, tables: Sequence[int], batch_size: int, count: int
             ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The inputs of the next `count` runs, one (indices, offsets) pair per run."""
        first = self.runs if self.rotate else 0
        self.runs += count if self.rotate else 0
        windows = [(first + i) % WINDOWS for i in range(count)] if self.rotate else [0] * count
        made = {w: shard_inputs(traces, tables, batch_size, w) for w in sorted(set(windows))}
        return [made[w] for w in windows]


def shard_bytes(rows: Sequence[int], dims: Sequence[int], weight_bytes: int) -> int:
    """Weights plus row-wise optimizer state of a shard: the sum of its tables' `table_bytes`."""
    return int(sum(table_bytes(int(r), int(d), weight_bytes) for r, d in zip(rows, dims, strict=True)))


Run = tuple[torch.Tensor, torch.Tensor]  # one run's flat indices and offsets (TBE's layout)


class TorchShards:
    """What the two torch backends share: one `measure` that feeds the next windows of the trace,
    refuses a shard whose `footprint` exceeds the memory limit, times it (`timed`) on the pinned
    thread count (whatever the caller set: the store's key says them) and reports running out of
    memory as ShardTooLarge. Weights are fp16 on CUDA and fp32 on the CPU."""

    name: str

    def __init__(self, pool: Pool, device: torch.device, timing: TimingConfig, memory_limit_bytes: int,
                 threads: int):
        self.pool = pool
        self.torch_device = device
        self.device = device.type
        self.timing = timing
        self.memory_limit_bytes = memory_limit_bytes
        self.threads = threads
        self.weight_dtype = torch.float16 if device.type == "cuda" else torch.float32
        self.feeds = Feeds(timing.rotate)

    def footprint(self, rows: list[int], dims: list[int], runs: list[Run], batch_size: int) -> int:
        """Bytes the backend holds at most while it measures this shard."""
        raise NotImplementedError

    def timed(self, rows: list[int], dims: list[int], runs: list[Run], batch_size: int) -> ShardCost:
        """The shard's forward and backward, timed over `runs` (`timing.time_steps`)."""
        raise NotImplementedError

    def measure(self, tables: Sequence[int], batch_size: int, dims: Sequence[int] | None = None) -> ShardCost:
        """A shard's forward and backward; `dims` measures column shards (see `CostBackend`)."""
        runs = self.feeds.take(self.pool.traces, tables, batch_size, self.timing.warmup + self.timing.runs)
        rows, full = table_shapes(self.pool.features, tables)
        dims = shard_dims(full, dims)
        need = self.footprint(rows, dims, runs, batch_size)
        if need > self.memory_limit_bytes:
            raise ShardTooLarge(f"shard of {len(rows)} tables needs {need / 2**30:.2f} GiB, more than "
                                f"{self.memory_limit_bytes / 2**30:.1f} GiB")
        try:
            with pinned(self.threads):
                return self.timed(rows, dims, runs, batch_size)
        except (torch.OutOfMemoryError, MemoryError) as exc:
            raise ShardTooLarge(str(exc).splitlines()[0]) from None

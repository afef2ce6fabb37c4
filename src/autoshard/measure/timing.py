"""The timing protocol: warm-up runs, then timed runs; median and interquartile range.

Each timed run starts from a cold cache, as a training step does after the rest of the model
ran: on CUDA the L2 cache is flushed by writing a GPU buffer larger than it, on CPU the
last-level cache by writing a buffer twice its size (`llc_bytes`, read from the machine), both
outside the timed span. On CUDA runs are timed with CUDA events, on CPU with `time.perf_counter`.
Which bags each run feeds is the backends' part (`base.feeds`: every run the next window of the
trace, when `rotate`).
"""

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from autoshard.core.params import bounded
from autoshard.measure.base import ShardCost


@dataclass(frozen=True)
class TimingConfig:
    """One measurement: `warmup` untimed runs, then `runs` timed ones (median, IQR). Plans are
    measured in `rounds` interleaved rounds (see `measure.interleaved`): a batch of shards is
    measured again when its rounds drift past `drift_limit` (`interleaved.round_drift`), at
    most `retries` times."""

    warmup: int = bounded(lo=0)
    runs: int
    rounds: int
    drift_limit: float = bounded(lo=0, lo_open=True)
    retries: int = bounded(lo=0)
    # The protocol, not parameters: the profile's timing check turns them off to show what each
    # does to the noise (`measure.protocols.compare_feeds`).
    rotate: bool = True   # each run feeds the next window of the trace (`base.feeds`), not the first bags
    evict: bool = True    # evict the cache before every timed run (CPU: last level; CUDA: L2)
    flush_mb: int = 128   # CUDA: MiB written to evict the L2 cache


def one_round(warmup: int, runs: int) -> TimingConfig:
    """A plain measurement: `warmup` untimed runs, then `runs` timed ones, in a single round that
    is never measured again (so its `drift_limit` is never consulted)."""
    return TimingConfig(warmup=warmup, runs=runs, rounds=1, drift_limit=1.0, retries=0)


FALLBACK_LLC_BYTES = 32 * 2**20  # when the machine does not say (the study's 2-core VMs have 32 MiB)


@functools.cache
def llc_bytes() -> int:
    """The CPU's last-level cache in bytes, from sysfs (the highest cache level of cpu0)."""
    best = (0, 0)
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:].upper(), 1)
        digits = size.rstrip("KkMmGg")
        if digits.isdigit():
            best = max(best, (level, int(digits) * scale))
    if best[1]:
        return best[1]
    size = os.sysconf("SC_LEVEL3_CACHE_SIZE") if "SC_LEVEL3_CACHE_SIZE" in os.sysconf_names else 0
    return int(size) if size and size > 0 else FALLBACK_LLC_BYTES


@functools.cache
def _eviction_buffer() -> torch.Tensor:
    return torch.empty(2 * llc_bytes(), dtype=torch.uint8)


def evict_cpu_cache(run: int) -> None:
    """Write a buffer of twice the last-level cache (a new value each run, so no write is
    skipped), which evicts the shard's weights and inputs left there by the previous run."""
    _eviction_buffer().fill_(run & 0xFF)


def _summary(values: list[float]) -> tuple[float, float]:
    q1, median, q3 = np.percentile(values, [25, 50, 75])
    return float(median), float(q3 - q1)


def time_steps(forward: Callable[[int], torch.Tensor], backward: Callable[[torch.Tensor], None],
               timing: TimingConfig, device: torch.device) -> ShardCost:
    """Time `forward(run)` and `backward(output)` separately over the protocol's runs (`run`
    counts from 0, warm-up included: the backend picks that run's inputs by it)."""
    if device.type == "cuda":
        fwd, bwd = _time_cuda(forward, backward, timing, device)
    else:
        fwd, bwd = _time_cpu(forward, backward, timing)
    (f_med, f_iqr), (b_med, b_iqr) = _summary(fwd), _summary(bwd)
    return ShardCost(forward_ms=f_med, backward_ms=b_med, forward_iqr_ms=f_iqr, backward_iqr_ms=b_iqr)


def _time_cpu(forward, backward, timing: TimingConfig) -> tuple[list[float], list[float]]:
    fwd, bwd = [], []
    for i in range(timing.warmup + timing.runs):
        if timing.evict and i >= timing.warmup:
            evict_cpu_cache(i)
        t0 = time.perf_counter()
        out = forward(i)
        t1 = time.perf_counter()
        backward(out)
        t2 = time.perf_counter()
        if i >= timing.warmup:
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3)
    return fwd, bwd


def _time_cuda(forward, backward, timing: TimingConfig, device: torch.device
               ) -> tuple[list[float], list[float]]:
    flush = torch.empty(timing.flush_mb * 2**20 // 4, dtype=torch.float32, device=device)
    events = []
    for i in range(timing.warmup + timing.runs):
        if timing.evict:
            flush.zero_()
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        marks[0].record()
        out = forward(i)
        marks[1].record()
        backward(out)
        marks[2].record()
        if i >= timing.warmup:
            events.append(marks)
    torch.cuda.synchronize(device)
    fwd = [a.elapsed_time(b) for a, b, _ in events]
    bwd = [b.elapsed_time(c) for _, b, c in events]
    return fwd, bwd

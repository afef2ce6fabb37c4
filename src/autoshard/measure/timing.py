"""The timing protocol: warm-up runs, then timed runs; median and interquartile range.

Each timed forward and each timed backward starts from a cold cache, as in training, where the
dense layers run between them (and as FBGEMM's benchmark flushes before every timed backward):
on CUDA the L2 cache is flushed by writing a GPU buffer twice its size (`l2_flush_bytes`, read
from the device), on CPU the last-level cache by writing a buffer twice its size (`llc_bytes`,
read from the machine), both outside the timed spans. On CUDA runs are timed with CUDA events,
on CPU with `time.perf_counter`.
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
    evict: bool = True    # evict the cache before every timed forward and backward (CPU: last level; CUDA: L2)


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


def evict_cpu_cache(stamp: int) -> None:
    """Write a buffer of twice the last-level cache (a new value each time, so no write is
    skipped), which evicts the shard's weights and inputs left there by the previous step."""
    _eviction_buffer().fill_(stamp & 0xFF)


FALLBACK_L2_BYTES = 128 * 2**20  # where the device reports no L2 size (the 128 MiB the flush once wrote)


def l2_flush_bytes(device: torch.device) -> int:
    """Bytes written to flush a GPU's L2 cache: twice its size as the device reports it
    (`L2_cache_size`), or twice FALLBACK_L2_BYTES where it reports none."""
    l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
    return 2 * (l2 if l2 > 0 else FALLBACK_L2_BYTES)


@functools.cache
def _flush_buffer(device: torch.device) -> torch.Tensor:
    return torch.empty(l2_flush_bytes(device), dtype=torch.uint8, device=device)


def flush_l2(device: torch.device, stamp: int) -> None:
    """Write a device buffer of twice the GPU's L2 cache (`l2_flush_bytes`; a new value each
    time), which evicts what the previous kernels left there."""
    _flush_buffer(device).fill_(stamp & 0xFF)


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
        timed = i >= timing.warmup
        if timing.evict and timed:
            evict_cpu_cache(2 * i)
        t0 = time.perf_counter()
        out = forward(i)
        t1 = time.perf_counter()
        if timing.evict and timed:
            evict_cpu_cache(2 * i + 1)
        t2 = time.perf_counter()
        backward(out)
        t3 = time.perf_counter()
        if timed:
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t3 - t2) * 1e3)
    return fwd, bwd


def _time_cuda(forward, backward, timing: TimingConfig, device: torch.device
               ) -> tuple[list[float], list[float]]:
    """Each run: flush, forward between two events, flush, backward between two more (the
    flushes are queued between the events, so no timed span holds one)."""
    events = []
    for i in range(timing.warmup + timing.runs):
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        if timing.evict:
            flush_l2(device, 2 * i)
        marks[0].record()
        out = forward(i)
        marks[1].record()
        if timing.evict:
            flush_l2(device, 2 * i + 1)
        marks[2].record()
        backward(out)
        marks[3].record()
        if i >= timing.warmup:
            events.append(marks)
    torch.cuda.synchronize(device)
    fwd = [a.elapsed_time(b) for a, b, _, _ in events]
    bwd = [c.elapsed_time(d) for _, _, c, d in events]
    return fwd, bwd

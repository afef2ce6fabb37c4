"""The timing protocol: warm-up runs, then timed runs; median and interquartile range.

On CUDA each run is timed with CUDA events after flushing the L2 cache by writing a GPU
buffer larger than it; on CPU with `time.perf_counter`.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

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
    flush_mb: int = 128  # CUDA only: bytes written between runs to evict the L2 cache (not a parameter)


def one_round(warmup: int, runs: int) -> TimingConfig:
    """A plain measurement: `warmup` untimed runs, then `runs` timed ones, in a single round that
    is never measured again (so its `drift_limit` is never consulted)."""
    return TimingConfig(warmup=warmup, runs=runs, rounds=1, drift_limit=1.0, retries=0)


def _summary(values: list[float]) -> tuple[float, float]:
    q1, median, q3 = np.percentile(values, [25, 50, 75])
    return float(median), float(q3 - q1)


def time_steps(forward: Callable[[], torch.Tensor], backward: Callable[[torch.Tensor], None],
               timing: TimingConfig, device: torch.device) -> ShardCost:
    """Time `forward()` and `backward(output)` separately over the protocol's runs."""
    if device.type == "cuda":
        fwd, bwd = _time_cuda(forward, backward, timing, device)
    else:
        fwd, bwd = _time_cpu(forward, backward, timing)
    (f_med, f_iqr), (b_med, b_iqr) = _summary(fwd), _summary(bwd)
    return ShardCost(forward_ms=f_med, backward_ms=b_med, forward_iqr_ms=f_iqr, backward_iqr_ms=b_iqr)


def _time_cpu(forward, backward, timing: TimingConfig) -> tuple[list[float], list[float]]:
    fwd, bwd = [], []
    for i in range(timing.warmup + timing.runs):
        t0 = time.perf_counter()
        out = forward()
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
        flush.zero_()
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        marks[0].record()
        out = forward()
        marks[1].record()
        backward(out)
        marks[2].record()
        if i >= timing.warmup:
            events.append(marks)
    torch.cuda.synchronize(device)
    fwd = [a.elapsed_time(b) for a, b, _ in events]
    bwd = [b.elapsed_time(c) for _, b, c in events]
    return fwd, bwd

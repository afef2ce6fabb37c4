"""Measuring a batch of shards so that a busy machine cannot bias it silently.

Each shard is measured once per round, in a freshly shuffled order every round, so slow phases
of the machine (another process on the other core, frequency changes) spread over all shards
instead of landing on a few. A shard's cost is the median over rounds of its per-round medians,
and the spread across rounds (coefficient of variation of the total) is recorded with it: that
is the repeatability of every measurement, not of a sample. A calibration shard is timed before
the first round and after each one; when it drifts more than `drift_limit` from its first
timing, the machine changed under the batch and the whole batch is measured again (at most
`retries` times). Of the attempts, the one whose calibration drifted least is kept, and its
drift is reported either way.

The limit sits well above a single calibration reading's own noise: two readings of one shard
differ by about sqrt(2) x a shard's CV across rounds (about 6% on a 2-core laptop-class
machine, so about 8.5%), and the largest of R such differences is larger still. A limit at
that noise level re-measures most batches for nothing (the study's first runs: 64% of tasks at
10%, doubling the measuring time) and is no better for it; the default (params.yaml) catches
the batches where the machine really changed speed.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoshard.measure.base import CostBackend, ShardCost, ShardTooLarge
from autoshard.measure.timing import TimingConfig

FIELDS = ("forward_ms", "backward_ms", "forward_iqr_ms", "backward_iqr_ms")


@dataclass
class Batch:
    """Per shard: the median over rounds of each field of FIELDS, then the CV across rounds
    (NaN with one round; every value NaN for a shard too large to measure)."""

    costs: list[list[float]]
    drift: float     # max |calibration / first calibration - 1| over the kept attempt
    attempts: int    # 1 when the first attempt held
    calibration_ms: float = float("nan")  # the calibration shard's median total over the kept attempt


def _total(cost: ShardCost) -> float:
    return cost.forward_ms + cost.backward_ms


def round_cv(totals: Sequence[float]) -> float:
    """Coefficient of variation of a measurement's totals across rounds (a shard's, a device's
    all-to-all; NaN with one round)."""
    return float(np.std(totals, ddof=1) / np.mean(totals)) if len(totals) > 1 else float("nan")


def _calibrate(backend: CostBackend, calibration: Sequence[int], batch_size: int) -> float:
    """The calibration shard's total (NaN when it does not fit the device: no drift check)."""
    try:
        return _total(backend.measure(list(calibration), batch_size))
    except ShardTooLarge:
        return float("nan")


def measure_batch(backend: CostBackend, shards: Sequence[Sequence[int]], calibration: Sequence[int],
                  batch_size: int, timing: TimingConfig, g: np.random.Generator,
                  dims: Sequence[Sequence[int] | None] | None = None) -> Batch:
    """Measure `shards` in `timing.rounds` interleaved rounds with calibration between them;
    `dims` (per shard, per table: the columns measured, None: whole) measures column shards."""
    dims = dims if dims is not None else [None] * len(shards)
    best = None
    for attempt in range(1, timing.retries + 2):  # noqa: B007 (attempts made, reported)
        reference = _calibrate(backend, calibration, batch_size)
        timings = [reference]
        per_round = np.full((len(shards), timing.rounds, len(FIELDS)), np.nan)
        too_large = np.zeros(len(shards), dtype=bool)
        drift = 0.0
        for r in range(timing.rounds):
            for i in g.permutation(len(shards)):
                if too_large[i]:
                    continue
                try:
                    cost = (backend.measure(list(shards[i]), batch_size) if dims[i] is None
                            else backend.measure(list(shards[i]), batch_size, dims[i]))
                except ShardTooLarge:
                    too_large[i] = True
                    continue
                per_round[i, r] = [getattr(cost, f) for f in FIELDS]
            again = _calibrate(backend, calibration, batch_size)
            timings.append(again)
            if np.isfinite(reference) and reference > 0:
                drift = max(drift, abs(again / reference - 1.0))
        if best is None or drift < best[0]:
            best = (drift, per_round, too_large, timings)
        if drift <= timing.drift_limit:
            break
    drift, per_round, too_large, timings = best
    costs = []
    for i in range(len(shards)):
        if too_large[i]:
            costs.append([float("nan")] * (len(FIELDS) + 1))
            continue
        cv = round_cv(per_round[i, :, 0] + per_round[i, :, 1])
        costs.append([float(v) for v in np.median(per_round[i], axis=0)] + [cv])
    return Batch(costs=costs, drift=float(drift), attempts=attempt, calibration_ms=float(np.median(timings)))

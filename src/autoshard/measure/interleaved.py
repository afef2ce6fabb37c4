"""Measuring a batch of shards so that a busy machine cannot bias it silently.

Each shard is measured once per round, in a freshly shuffled order every round, so slow phases
of the machine (another process on the other core, frequency changes) spread over all shards
instead of landing on a few. A shard's cost is the median over rounds of its per-round medians,
and the spread across rounds (coefficient of variation of the total) is recorded with it: that
is the repeatability of every measurement, not of a sample.

Whether the machine changed speed under the batch is read from all its shards at once: the
batch's drift is the largest, over rounds after the first, |median over shards of (this round's
total / the first round's) - 1|. A median over many shards keeps each shard's own noise out of
it (about 1.8 x a shard's CV / sqrt(shards): under 2% for 80 shards at 8% CV), so a batch
drifting is one the machine really sped up or slowed down under. It is measured again (at most
`retries` times) only where that drift could change a comparison: where its effect on a ratio of
two of the batch's shards (`drift_effect`: the shards' medians over rounds with and without each
round's drift divided out) exceeds `drift_limit`; of the attempts, the one whose drift moves a
ratio least is kept, and its drift is reported either way. The study's first checks compared one calibration shard's
readings instead: two readings of one shard differ by about sqrt(2) x its CV, so on a noisy hour
most batches (68% of the evaluate stage's tasks at 8% CV) were measured again for noise alone,
adding half the measuring time and nothing else. With one round there is nothing to compare
across rounds and the calibration shard's drift is used. The calibration shard is still timed
before the first round and after each one: its median is the batch's `calibration_ms`, which
divides the machine's overall speed out of comparisons between separate passes.
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
    drift: float     # the kept attempt's drift (`round_drift`; with one round, the calibration shard's)
    attempts: int    # 1 when the first attempt held
    calibration_ms: float = float("nan")  # the calibration shard's median total over the kept attempt


def _total(cost: ShardCost) -> float:
    return cost.forward_ms + cost.backward_ms


def round_cv(totals: Sequence[float]) -> float:
    """Coefficient of variation of a measurement's totals across rounds (a shard's, a device's
    all-to-all; NaN with one round)."""
    return float(np.std(totals, ddof=1) / np.mean(totals)) if len(totals) > 1 else float("nan")


def round_drift(per_round: np.ndarray) -> float:
    """The largest shift of a whole round against the first: max over rounds r > 0 of
    |median over shards of (total in round r / total in round 0) - 1|, for `per_round` (shards x
    rounds x FIELDS). NaN with one round or no shard measured in every round."""
    totals = per_round[:, :, 0] + per_round[:, :, 1]
    ok = np.isfinite(totals).all(axis=1) & (totals[:, 0] > 0) if totals.shape[1] > 1 else np.zeros(len(totals), bool)
    if not ok.any():
        return float("nan")
    ratios = totals[ok, 1:] / totals[ok, :1]
    return float(np.max(np.abs(np.median(ratios, axis=0) - 1.0)))


def drift_effect(per_round: np.ndarray) -> float:
    """How far the rounds' drift moves a typical ratio of two of the batch's shards: each round's
    totals divided by its drift factor (median over shards of round r / round 0), every shard's
    median over rounds with and without that correction, q = raw / corrected per shard, and the
    effect sqrt(2) x the standard deviation of log q (the change of a ratio of two shards, whose
    errors add). Every shard is measured in every round, so a drift that moves all shards alike
    cancels in a ratio; what remains is where the median over rounds picked the drifted round for
    one shard and not for the other. NaN where `round_drift` is."""
    totals = per_round[:, :, 0] + per_round[:, :, 1]
    ok = np.isfinite(totals).all(axis=1) & (totals[:, 0] > 0) if totals.shape[1] > 1 else np.zeros(len(totals), bool)
    if not ok.any():
        return float("nan")
    totals = totals[ok]
    factors = np.concatenate([[1.0], np.median(totals[:, 1:] / totals[:, :1], axis=0)])
    q = np.log(np.median(totals, axis=1) / np.median(totals / factors, axis=1))
    return float(np.sqrt(2) * np.std(q)) if len(q) > 1 else 0.0


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
        calibration_drift = 0.0
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
                calibration_drift = max(calibration_drift, abs(again / reference - 1.0))
        drift = round_drift(per_round)
        effect = drift_effect(per_round)
        if not np.isfinite(drift):
            drift = effect = calibration_drift
        if best is None or effect < best[0]:
            best = (effect, drift, per_round, too_large, timings)
        if effect <= timing.drift_limit:
            break
    _, drift, per_round, too_large, timings = best
    costs = []
    for i in range(len(shards)):
        if too_large[i]:
            costs.append([float("nan")] * (len(FIELDS) + 1))
            continue
        cv = round_cv(per_round[i, :, 0] + per_round[i, :, 1])
        costs.append([float(v) for v in np.median(per_round[i], axis=0)] + [cv])
    return Batch(costs=costs, drift=float(drift), attempts=attempt, calibration_ms=float(np.median(timings)))

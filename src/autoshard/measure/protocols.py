"""The evidence for the timing protocol: the same shards timed sequentially and interleaved,
each protocol in independent passes.

`sequential` is what a plain benchmark loop does: a shard's rounds back to back (each round
`warmup` + `runs` as the profile times them), then the next shard, in a fixed order.
`interleaved` is the profile's protocol (`measure.interleaved.measure_batch`: every shard once
a round in a freshly shuffled order, a calibration shard between rounds, a drifting batch
measured again). Both give a shard the same timed runs and take the median over its rounds, so
only the order differs. Per protocol two numbers decide: how far a shard's cost moves from one
pass to the next (what running the stage again would see), and the CV across a shard's rounds
within a pass (the noise a single pass reports about itself). A protocol whose within-pass CV is
small but whose pass-to-pass change is large is hiding its noise.

`compare_feeds` does the same for the timing's two realism changes (issue 29): the same shards
timed feeding the first bags with a warm cache (the former protocol), with rotated bags, with
the cache evicted before each run, and with both (the protocol now), all four interleaved in
one pass (shards and variants shuffled together each round), in independent passes.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypedDict

import numpy as np
import pandas as pd

from autoshard.core.params import bounded
from autoshard.core.schema import Number
from autoshard.core.seeding import rng
from autoshard.measure.base import CostBackend, ShardTooLarge
from autoshard.measure.interleaved import measure_batch, round_cv
from autoshard.measure.timing import TimingConfig


class ProtocolScores(TypedDict):
    """One timing protocol in the profile's protocol check (`measure.protocols.protocol_scores`):
    the median |pass-to-pass change| of a shard's cost and the median CV within a pass (shares)."""

    shards: int
    pass_change_median: Number
    within_pass_cv_median: Number
    seconds: float


class FeedScores(ProtocolScores):
    """One variant of the profile's feeds check (`measure.protocols.feed_scores`): the scores
    above and its cost over the former protocol's (first bags, warm cache), median."""

    cost_ratio_to_former: Number


SEQUENTIAL, INTERLEAVED = "sequential", "interleaved"
FEEDS = {"first_bags_warm_cache": (False, False), "rotated_bags": (True, False),
         "evicted_cache": (False, True), "rotated_evicted": (True, True)}  # name: (rotate, evict)


@dataclass(frozen=True)
class ProtocolCheck:
    """The `profile.protocol_check` section: how many shards (0: no check) and how many
    independent passes of each protocol (at least 2, to compare passes)."""

    shards: int = bounded(lo=0)
    passes: int = bounded(lo=2)


def measure_sequential(backend: CostBackend, shards: Sequence[Sequence[int]], batch_size: int,
                       rounds: int) -> list[tuple[float, float]]:
    """Per shard, its `rounds` measurements back to back: (median forward + median backward in
    ms, CV of the round totals); NaNs for a shard too large to measure."""
    out = []
    for shard in shards:
        try:
            costs = [backend.measure(list(shard), batch_size) for _ in range(rounds)]
        except ShardTooLarge:
            out.append((float("nan"), float("nan")))
            continue
        total = float(np.median([c.forward_ms for c in costs]) + np.median([c.backward_ms for c in costs]))
        out.append((total, round_cv([c.total_ms for c in costs])))
    return out


def measure_interleaved(backend: CostBackend, shards: Sequence[Sequence[int]], batch_size: int,
                        timing: TimingConfig, g: np.random.Generator) -> list[tuple[float, float]]:
    """Per shard, (cost in ms, CV across rounds) from one interleaved batch; the calibration
    shard is the one with the most tables, as the profile chooses it."""
    batch = measure_batch(backend, shards, max(shards, key=len), batch_size, timing, g)
    return [(c[0] + c[1], c[-1]) for c in batch.costs]


def compare_protocols(backend: CostBackend, candidates: Sequence[Sequence[int]], check: ProtocolCheck,
                      batch_size: int, timing: TimingConfig, seed: int) -> pd.DataFrame:
    """One row per pass, protocol and shard: `cost_ms`, `cv` (within the pass) and the pass's
    `seconds`. `check.shards` of `candidates` are drawn (seeded); in each pass both protocols
    run, the first one alternating from pass to pass so that a slow phase of the machine
    does not land on one protocol only."""
    shards = _pick(candidates, check.shards, seed, "protocol_check")
    rows = []
    for k in range(check.passes if shards else 0):
        in_turn = (SEQUENTIAL, INTERLEAVED) if k % 2 == 0 else (INTERLEAVED, SEQUENTIAL)
        for protocol in in_turn:
            start = time.perf_counter()
            if protocol == SEQUENTIAL:
                costs = measure_sequential(backend, shards, batch_size, timing.rounds)
            else:
                order_rng = rng(seed, "profile", "protocol_check", "order", k)
                costs = measure_interleaved(backend, shards, batch_size, timing, order_rng)
            seconds = time.perf_counter() - start
            rows += [{"pass": k, "protocol": protocol, "shard": i, "tables": len(s), "cost_ms": cost, "cv": cv,
                      "seconds": seconds} for i, (s, (cost, cv)) in enumerate(zip(shards, costs, strict=True))]
    return pd.DataFrame(rows, columns=["pass", "protocol", "shard", "tables", "cost_ms", "cv", "seconds"])


def _pick(candidates: Sequence[Sequence[int]], count: int, seed: int, name: str) -> list[tuple[int, ...]]:
    g = rng(seed, "profile", name, "shards")
    picked = sorted(g.choice(len(candidates), size=min(count, len(candidates)), replace=False))
    return [tuple(int(t) for t in candidates[i]) for i in picked]


def compare_feeds(make: Callable[[TimingConfig], CostBackend], candidates: Sequence[Sequence[int]],
                  check: ProtocolCheck, batch_size: int, timing: TimingConfig, seed: int) -> pd.DataFrame:
    """Rows as `compare_protocols`' with `protocol` naming a FEEDS variant: `check.shards` of
    `candidates` (seeded) under each variant's backend (`make(timing)`), `timing.rounds` rounds
    a pass, every (variant, shard) once a round in a shuffled order; `seconds` is the time spent
    measuring that variant in the pass."""
    shards = _pick(candidates, check.shards, seed, "feeds_check")
    backends = {name: make(replace(timing, rotate=rotate, evict=evict)) for name, (rotate, evict) in FEEDS.items()}
    jobs = [(name, i) for name in FEEDS for i in range(len(shards))]
    rows = []
    for k in range(check.passes if shards else 0):
        g = rng(seed, "profile", "feeds_check", "order", k)
        totals = {job: [] for job in jobs}
        seconds = dict.fromkeys(FEEDS, 0.0)
        for _ in range(timing.rounds):
            for j in g.permutation(len(jobs)):
                name, i = jobs[j]
                start = time.perf_counter()
                try:
                    totals[jobs[j]].append(backends[name].measure(list(shards[i]), batch_size).total_ms)
                except ShardTooLarge:
                    totals[jobs[j]].append(float("nan"))
                seconds[name] += time.perf_counter() - start
        rows += [{"pass": k, "protocol": name, "shard": i, "tables": len(shards[i]),
                  "cost_ms": float(np.median(totals[(name, i)])), "cv": round_cv(totals[(name, i)]),
                  "seconds": seconds[name]} for name, i in jobs]
    return pd.DataFrame(rows, columns=["pass", "protocol", "shard", "tables", "cost_ms", "cv", "seconds"])


def protocol_scores(rows: pd.DataFrame, names: Sequence[str] = (SEQUENTIAL, INTERLEAVED)
                    ) -> dict[str, ProtocolScores]:
    """Per protocol of `names` (`compare_protocols`' rows; `compare_feeds`' with FEEDS):
    shards, the median over shards and consecutive passes of |cost in pass k / cost in pass k-1
    - 1|, the median within-pass CV and the seconds spent measuring. The `protocol_check` and
    `feeds_check` entries of reports/metrics/profile.json."""
    out: dict[str, ProtocolScores] = {}
    for protocol in names:
        g = rows[rows["protocol"] == protocol]
        wide = g.pivot(index="shard", columns="pass", values="cost_ms").sort_index(axis=1).to_numpy()
        change = pd.Series((wide[:, 1:] / wide[:, :-1] - 1).ravel()).abs()
        out[protocol] = {"shards": int(g["shard"].nunique()), "pass_change_median": float(change.median()),
                         "within_pass_cv_median": float(g["cv"].median()),
                         "seconds": float(g.groupby("pass")["seconds"].first().sum())}
    return out


def feed_scores(rows: pd.DataFrame) -> dict[str, FeedScores]:
    """`protocol_scores` per FEEDS variant (`compare_feeds`' rows), with the median over shards
    and passes of its cost / the former protocol's (first bags, warm cache) in the same pass:
    the `feeds_check` entry of reports/metrics/profile.json."""
    wide = rows.pivot_table(index=["pass", "shard"], columns="protocol", values="cost_ms")
    former = next(iter(FEEDS))
    out: dict[str, FeedScores] = {}
    for name, scores in protocol_scores(rows, tuple(FEEDS)).items():
        ratio = (wide[name] / wide[former]).median() if name in wide else float("nan")
        out[name] = {**scores, "cost_ratio_to_former": float(ratio)}
    return out

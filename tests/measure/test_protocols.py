"""The timing-protocol check: both protocols on a fake backend, the scores, the parameters."""

import numpy as np
import pandas as pd
import pytest

from autoshard.core.errors import ConfigError
from autoshard.core.params import parse
from autoshard.core.schema import check
from autoshard.measure.base import ShardCost, ShardTooLarge
from autoshard.measure.protocols import (
    FEEDS,
    INTERLEAVED,
    SEQUENTIAL,
    FeedScores,
    ProtocolCheck,
    ProtocolScores,
    compare_feeds,
    compare_protocols,
    feed_scores,
    measure_sequential,
    protocol_scores,
)
from autoshard.measure.timing import TimingConfig

TIMING = TimingConfig(warmup=0, runs=1, rounds=3, drift_limit=0.25, retries=1)


class Clock:
    """Every shard costs its number of tables (ms), split evenly forward and backward; a shard
    of more than 9 tables does not fit. Counts its calls."""

    name, device = "fake", "cpu"

    def __init__(self):
        self.calls = 0

    def measure(self, tables, batch_size, dims=None):
        self.calls += 1
        if len(tables) > 9:
            raise ShardTooLarge("too large")
        return ShardCost(forward_ms=len(tables) / 2, backward_ms=len(tables) / 2)


def test_both_protocols_time_the_same_shards_in_every_pass():
    clock = Clock()
    candidates = [tuple(range(n)) for n in range(1, 8)]
    rows = compare_protocols(clock, candidates, ProtocolCheck(shards=4, passes=2), 8, TIMING, seed=0)
    assert len(rows) == 2 * 2 * 4 and set(rows["protocol"]) == {SEQUENTIAL, INTERLEAVED}
    assert (rows["cost_ms"] == rows["tables"]).all() and (rows["cv"] == 0).all()
    same = rows.pivot_table(index=["pass", "shard"], columns="protocol", values="tables")
    assert (same[SEQUENTIAL] == same[INTERLEAVED]).all(), "both protocols measure the same shards"
    # sequential: 4 shards x 3 rounds; interleaved: the same plus a calibration before and after each round
    assert clock.calls == 2 * (4 * 3 + 4 * 3 + 4)
    scores = protocol_scores(rows)
    for protocol in (SEQUENTIAL, INTERLEAVED):
        assert check(scores[protocol], ProtocolScores, "profile.json") is scores[protocol]
        assert scores[protocol]["shards"] == 4 and scores[protocol]["pass_change_median"] == 0.0
    again = compare_protocols(Clock(), candidates, ProtocolCheck(shards=4, passes=2), 8, TIMING, seed=0)
    assert again["tables"].tolist() == rows["tables"].tolist(), "the shards drawn follow the seed"


class Feeder(Clock):
    """A Clock whose timing says how it feeds: rotating doubles the cost, evicting triples it."""

    def __init__(self, timing: TimingConfig):
        super().__init__()
        self.scale = (2 if timing.rotate else 1) * (3 if timing.evict else 1)

    def measure(self, tables, batch_size, dims=None):
        cost = super().measure(tables, batch_size)
        return ShardCost(forward_ms=cost.forward_ms * self.scale, backward_ms=cost.backward_ms * self.scale)


def test_every_feed_variant_times_the_same_shards_and_is_scored_against_the_former_protocol():
    made = []

    def make(timing):
        made.append(Feeder(timing))
        return made[-1]

    candidates = [tuple(range(n)) for n in range(1, 8)]
    rows = compare_feeds(make, candidates, ProtocolCheck(shards=3, passes=2), 8, TIMING, seed=0)
    assert len(made) == len(FEEDS) and all(m.calls == 2 * 3 * TIMING.rounds for m in made), \
        "each variant: its shards once a round, in every pass"
    assert len(rows) == 2 * len(FEEDS) * 3
    scores = feed_scores(rows)
    assert list(scores) == list(FEEDS)
    ratios = {name: scores[name]["cost_ratio_to_former"] for name in FEEDS}
    assert ratios == {"first_bags_warm_cache": 1.0, "rotated_bags": 2.0, "evicted_cache": 3.0, "rotated_evicted": 6.0}
    assert all(check(v, FeedScores, "profile.json") is v for v in scores.values())
    assert rows.pivot_table(index=["pass", "shard"], columns="protocol", values="tables").nunique(axis=1).eq(1).all()


def test_a_shard_too_large_is_left_out_not_a_crash():
    assert np.isnan(measure_sequential(Clock(), [tuple(range(10))], 8, 3)[0][0])
    assert protocol_scores(compare_protocols(Clock(), [(0,)], ProtocolCheck(shards=0, passes=2), 8, TIMING, 0))[
        SEQUENTIAL]["shards"] == 0, "no shards: no check"


def test_scores_are_the_median_pass_change_and_the_median_within_pass_cv():
    rows = pd.DataFrame({"pass": [0, 0, 1, 1, 2, 2], "protocol": SEQUENTIAL, "shard": [0, 1] * 3,
                         "tables": 1, "cost_ms": [1.0, 2.0, 1.1, 2.0, 1.1, 1.0], "cv": [0.01, 0.03, 0.02, 0.02, 0, 0],
                         "seconds": [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]})
    scores = protocol_scores(rows)[SEQUENTIAL]
    # changes: shard 0: 0.1, 0.0; shard 1: 0.0, 0.5 -> median 0.05
    assert scores["pass_change_median"] == pytest.approx(0.05) and scores["within_pass_cv_median"] == 0.015
    assert scores["seconds"] == 6.0 and scores["shards"] == 2


def test_the_check_needs_two_passes():
    assert parse(ProtocolCheck, "profile.protocol_check", {"shards": 8, "passes": 2}).passes == 2
    with pytest.raises(ConfigError, match=r"profile\.protocol_check\.passes: 1 "):
        parse(ProtocolCheck, "profile.protocol_check", {"shards": 8, "passes": 1})
    with pytest.raises(ConfigError, match=r"profile\.protocol_check\.runs"):
        parse(ProtocolCheck, "profile.protocol_check", {"shards": 8, "passes": 2, "runs": 3})

"""The timing protocol's realism: rotated bags (`base.feeds`), cache eviction, the cache size."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from autoshard.data.pool import build_pool
from autoshard.measure import timing
from autoshard.measure.base import WINDOWS, Feeds, shard_inputs
from autoshard.measure.fbgemm import FbgemmBackend
from autoshard.measure.timing import llc_bytes, one_round, time_steps


@pytest.fixture(scope="module")
def pool(smoke_params):
    return build_pool(smoke_params["dataset"], smoke_params["pool"], seed=0, progress=False)


def bags(traces, table: int, first: int, count: int) -> list[np.ndarray]:
    """The index lists of `count` bags of `table` from bag `first` on, wrapping: by hand."""
    b = traces.batch_size
    out = []
    for j in range(count):
        k = (first + j) % b
        out.append(np.asarray(traces.indices[traces.offsets[table * b + k]:traces.offsets[table * b + k + 1]]))
    return out


@pytest.mark.parametrize("window", [0, 3, WINDOWS - 1, WINDOWS + 2])
def test_a_window_feeds_the_bags_from_its_start_wrapping_round_the_trace(pool, window):
    traces, batch = pool.traces, 3 * pool.traces.batch_size // 4  # most windows wrap
    indices, offsets = shard_inputs(traces, [5, 2], batch, window)
    first = (window % WINDOWS) * traces.batch_size // WINDOWS
    expected = bags(traces, 5, first, batch) + bags(traces, 2, first, batch)
    got = np.split(indices.numpy(), offsets.numpy()[1:-1])
    assert len(got) == 2 * batch and all(np.array_equal(a, e) for a, e in zip(got, expected, strict=True))


def test_rotating_feeds_move_on_every_run_and_fixed_ones_never(pool):
    rotating, fixed = Feeds(rotate=True), Feeds(rotate=False)
    runs = rotating.take(pool.traces, [1], 64, 3) + rotating.take(pool.traces, [1], 64, 2)
    starts = [shard_inputs(pool.traces, [1], 64, w)[0] for w in range(5)]
    assert all(torch.equal(r[0], s) for r, s in zip(runs, starts, strict=True)), "run k feeds window k"
    assert not torch.equal(runs[0][0], runs[1][0])
    assert all(torch.equal(r[0], starts[0]) for r in fixed.take(pool.traces, [1], 64, 4))


def test_the_cache_is_evicted_before_every_timed_run_and_never_inside_it(monkeypatch):
    events = []
    monkeypatch.setattr(timing, "evict_cpu_cache", lambda run: events.append(("evict", run)))
    protocol = one_round(warmup=1, runs=3)

    def forward(run):
        events.append(("forward", run))
        return torch.zeros(1)

    time_steps(forward, lambda out: events.append(("backward",)), protocol, torch.device("cpu"))
    assert events == [("forward", 0), ("backward",)] + [e for r in (1, 2, 3)
                                                         for e in (("evict", r), ("forward", r), ("backward",))]
    events.clear()
    time_steps(forward, lambda out: None, replace(protocol, evict=False), torch.device("cpu"))
    assert all(e[0] == "forward" for e in events)


def test_the_last_level_cache_is_read_from_the_machine():
    size = llc_bytes()
    assert size >= 2**18 and size % 2**10 == 0, "at least 256 KiB, whole KiB (sysfs reports K or M)"
    assert timing._eviction_buffer().numel() == 2 * size


def test_a_backend_feeds_its_runs_in_turn_and_each_measurement_times_the_next_windows(pool):
    backend = FbgemmBackend(pool, torch.device("cpu"), "EXACT_ROWWISE_ADAGRAD", one_round(1, 2), 2**30, 1)
    backend.measure([0, 1], 32)
    backend.measure([2], 32)
    assert backend.feeds.runs == 6, "3 runs a measurement, each its own window"
    still = FbgemmBackend(pool, torch.device("cpu"), "EXACT_ROWWISE_ADAGRAD",
                          replace(one_round(1, 2), rotate=False), 2**30, 1)
    still.measure([0, 1], 32)
    assert still.feeds.runs == 0

"""The timing protocol's realism: rotated bags (`base.feeds`), cache eviction, the cache size."""

import time
from dataclasses import fields, replace
from types import SimpleNamespace

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


def test_the_cache_is_evicted_before_every_timed_forward_and_backward_and_never_inside_them(monkeypatch):
    """On the old protocol the backward ran straight after the forward, from the cache it left warm."""
    events = []
    monkeypatch.setattr(timing, "evict_cpu_cache", lambda stamp: events.append(("evict",)))
    protocol = one_round(warmup=1, runs=3)

    def forward(run):
        events.append(("forward", run))
        return torch.zeros(1)

    time_steps(forward, lambda out: events.append(("backward",)), protocol, torch.device("cpu"))
    timed = [e for r in (1, 2, 3) for e in (("evict",), ("forward", r), ("evict",), ("backward",))]
    assert events == [("forward", 0), ("backward",)] + timed
    events.clear()
    time_steps(forward, lambda out: None, replace(protocol, evict=False), torch.device("cpu"))
    assert all(e[0] == "forward" for e in events)


def test_an_eviction_is_never_timed(monkeypatch):
    """A slow eviction before the backward adds nothing to either span."""
    monkeypatch.setattr(timing, "evict_cpu_cache", lambda stamp: time.sleep(0.02))
    cost = time_steps(lambda run: torch.zeros(1), lambda out: None, one_round(0, 3), torch.device("cpu"))
    assert cost.forward_ms < 10 and cost.backward_ms < 10


class FakeEvent:
    """A CUDA event on a machine without one: `record` notes its place in the log, and the
    elapsed time between two events is the distance of their places."""

    log: list = []

    def __init__(self, enable_timing: bool = False):
        self.at = None

    def record(self):
        self.at = len(FakeEvent.log)
        FakeEvent.log.append("mark")

    def elapsed_time(self, end: "FakeEvent") -> float:
        return float(end.at - self.at)


@pytest.fixture
def fake_cuda(monkeypatch):
    """`torch.cuda` as a GPU with 120 MiB of L2 (more than the former fixed 128 MiB flush
    could evict twice over) that writes its flush buffer in host memory."""
    FakeEvent.log = []
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: SimpleNamespace(L2_cache_size=120 * 2**20, name="fake"))
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(timing, "flush_l2", lambda device, stamp: FakeEvent.log.append("flush"))
    return FakeEvent.log


def test_the_l2_flush_writes_twice_the_cache_the_device_reports(fake_cuda, monkeypatch):
    assert timing.l2_flush_bytes(torch.device("cuda")) == 240 * 2**20
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(name="old"))
    assert timing.l2_flush_bytes(torch.device("cuda")) == 2 * timing.FALLBACK_L2_BYTES
    assert "flush_mb" not in {f.name for f in fields(timing.TimingConfig)}, "no fixed size left to set"


def test_on_cuda_the_l2_is_flushed_before_every_forward_and_backward_outside_the_events(fake_cuda):
    def forward(run):
        fake_cuda.append("forward")
        return torch.zeros(1)

    cost = time_steps(forward, lambda out: fake_cuda.append("backward"), one_round(warmup=1, runs=2),
                      torch.device("cuda"))
    step = ["flush", "mark", "forward", "mark", "flush", "mark", "backward", "mark"]
    assert fake_cuda == step * 3
    assert cost.forward_ms == 2.0 and cost.backward_ms == 2.0, "each span holds its own step and no flush"


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

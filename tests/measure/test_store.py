"""The one measurement store: shared by the profile and the scoring, append-only, resumable,
and the same whichever engine measured into it."""

import json

import numpy as np
import pandas as pd
import pytest

from autoshard.core.compute import LocalEngine, RayEngine
from autoshard.data.pool import build_pool
from autoshard.data.tasks import Task, make_tasks
from autoshard.measure.analytic import AnalyticBackend
from autoshard.measure.collect import ProfileConfig, collect, plan_jobs
from autoshard.measure.store import MeasurementStore, from_worker_rows, record, shard_key
from autoshard.placement.heuristics import every_plan
from autoshard.studies.measured import measurement_store, score


class Counting(AnalyticBackend):
    """Analytic backend that counts its measurements and dies after `limit` of them."""

    def __init__(self, pool, limit=None):
        super().__init__(pool)
        self.calls, self.limit = 0, limit

    def measure(self, tables, batch_size):
        if self.limit is not None and self.calls >= self.limit:
            raise KeyboardInterrupt
        self.calls += 1
        return super().measure(tables, batch_size)


@pytest.fixture(scope="module")
def setup(smoke_params):
    pool = build_pool(smoke_params["dataset"], smoke_params["pool"], seed=0, progress=False)
    tasks, train, test = make_tasks(pool.features, smoke_params["tasks"], seed=0)
    cfg = ProfileConfig.from_params(smoke_params["profile"] | {"backend": "analytic"})
    jobs = plan_jobs(pool, tasks, train, cfg, seed=0, test_tables=test,
                     placements=lambda task: every_plan(pool.features, task, 0))
    source = {"dataset": smoke_params["dataset"], "pool": smoke_params["pool"], "seed": 0}
    return pool, cfg, jobs, source


def test_keys_and_records():
    assert shard_key([40, 3, 17]) == "3,17,40" == shard_key((3, 17, 40))
    assert record([1.0, 2.0, 0.1, 0.2, 0.03], 0.05, 2) == {
        "status": "ok", "forward_ms": 1.0, "backward_ms": 2.0, "forward_iqr_ms": 0.1, "backward_iqr_ms": 0.2,
        "cv": 0.03, "drift": 0.05, "attempts": 2, "calibration_ms": None}
    assert record([1.0, 2.0, 0.1, 0.2, 0.03], 0.05, 2, 4.5)["calibration_ms"] == 4.5
    assert record([float("nan")] * 5, 0.0, 1)["status"] == "too_large"


def test_first_file_wins_a_broken_file_is_set_aside_and_worker_rows_are_read(tmp_path):
    store = MeasurementStore(tmp_path, "space")
    first = store.write({"1,2": record([1.0, 1.0, 0.0, 0.0, 0.0], 0.0, 1)}, "a")
    second = store.write({"1,2": record([5.0, 5.0, 0.0, 0.0, 0.0], 0.0, 1)}, "b")
    winner = min(first, second)
    assert store.read()["1,2"]["forward_ms"] == json.loads(winner.read_text())["records"]["1,2"]["forward_ms"]
    assert store.write({"1,2": record([9.0, 9.0, 0.0, 0.0, 0.0], 0.0, 1)}, "a") == first
    assert json.loads(first.read_text())["records"]["1,2"]["forward_ms"] == 1.0, "a batch file is never rewritten"
    rows = [{"tables": [7, 3], "status": "ok", "forward_ms": 2.0, "backward_ms": 3.0, "forward_iqr_ms": 0.1,
             "backward_iqr_ms": 0.1}, {"tables": [9], "status": "too_large", "forward_ms": None,
                                       "backward_ms": None, "forward_iqr_ms": None, "backward_iqr_ms": None}]
    store.write(from_worker_rows(rows), "worker")
    read = store.read()
    assert read["3,7"]["backward_ms"] == 3.0 and read["9"]["status"] == "too_large"
    first.write_text("{not json")
    assert "1,2" in store.read(), "the other file still holds it"
    second.write_text("")
    assert "1,2" not in store.read() and "3,7" in store.read()
    assert len(list(store.folder.glob(".broken-*"))) == 2


def test_scoring_measures_its_own_pass_even_where_the_profile_measured_the_shards(tmp_path, setup):
    """Plans are compared within one pass: shards the profile measured are measured again with the
    plans they are compared in; the same pass resumed reads its own records; other plans are another pass."""
    pool, cfg, jobs, _ = setup
    collect(pool, jobs, Counting(pool), cfg, tmp_path, progress=False)
    task = Task("x/y", "test", "test", (4, 9), 2, 10**12, 0.0)
    plans = {"split": [np.array([0, 1])], "swapped": [np.array([1, 0])]}
    store = measurement_store(tmp_path, cfg.backend, pool)
    first = Counting(pool)
    devices = score(first, pool.features, [task], plans, cfg.backend, store, 0, progress=False)
    assert first.calls > 0, "measured in this pass, not read from the profile's"
    assert devices["pass"].nunique() == 1 and devices["pass"].iloc[0].startswith("main-")
    resumed = Counting(pool)
    again = score(resumed, pool.features, [task], plans, cfg.backend, store, 0, progress=False)
    assert resumed.calls == 0 and again["pass"].iloc[0] == devices["pass"].iloc[0], "the same pass, resumed"
    fewer = Counting(pool)
    other = score(fewer, pool.features, [task], {"split": plans["split"]}, cfg.backend, store, 0, progress=False)
    assert fewer.calls > 0 and other["pass"].iloc[0] != devices["pass"].iloc[0], "other plans: another pass"
    from dataclasses import replace

    other = replace(cfg.backend, batch_size=cfg.backend.batch_size // 2)
    counted = Counting(pool)
    score(counted, pool.features, [task], plans, other, measurement_store(tmp_path, other, pool), 0, progress=False)
    assert counted.calls > 0, "other settings measure again"


def test_profile_is_the_same_on_every_engine_and_resumes_across_engines(tmp_path, setup):
    pool, cfg, jobs, source = setup
    here = collect(pool, jobs, Counting(pool), cfg, tmp_path / "here", progress=False).drop(columns="host")
    processes = collect(pool, jobs, Counting(pool), cfg, tmp_path / "local", progress=False,
                        engine=LocalEngine(2), pool_source=source).drop(columns="host")
    pd.testing.assert_frame_equal(processes, here)
    pytest.importorskip("ray", reason="Ray is optional (requirements.lock pins ray==2.52.0)")
    with pytest.raises(KeyboardInterrupt):  # a run started here, interrupted after two chunks ...
        collect(pool, jobs, Counting(pool, limit=60), cfg, tmp_path / "moved", progress=False)
    started = len(list((tmp_path / "moved").glob("*/batch-*.json")))
    assert 0 < started < len(list((tmp_path / "here").glob("*/batch-*.json")))
    engine = RayEngine(num_cpus=2)
    try:
        on_ray = collect(pool, jobs, Counting(pool), cfg, tmp_path / "ray", progress=False, engine=engine,
                         pool_source=source).drop(columns="host")
        finished = Counting(pool)  # ... finishes on Ray
        moved = collect(pool, jobs, finished, cfg, tmp_path / "moved", progress=False, engine=engine,
                        pool_source=source).drop(columns="host")
    finally:
        engine.close()
    pd.testing.assert_frame_equal(on_ray, here)
    pd.testing.assert_frame_equal(moved, here)
    assert finished.calls == 0, "the engine's workers measured, not this process"


def test_a_space_key_is_what_its_settings_say(setup):
    from autoshard.measure.store import settings, settings_key, space

    pool, cfg, _, _ = setup
    described = settings(cfg.backend, pool)
    assert settings_key(json.loads(json.dumps(described))) == space(cfg.backend, pool)


FOREIGN = "0123456789abcdef"


def foreign_space(root, pool, cfg, jobs, leave_out: int = 0) -> MeasurementStore:
    """A space of another machine's measurements of every job's shard (but the first `leave_out`)."""
    from autoshard.measure.base import ShardTooLarge
    from autoshard.measure.collect import pass_tag

    backend, base = AnalyticBackend(pool), MeasurementStore(root, FOREIGN)
    for r in sorted({j.round for j in jobs}):
        records = {}
        for job in [j for j in jobs if j.round == r][leave_out if r == 0 else 0:]:
            try:
                c = backend.measure(job.tables, cfg.backend.batch_size)
                records[shard_key(job.tables)] = record([c.forward_ms, c.backward_ms, 0.0, 0.0, float("nan")], 0.0, 1)
            except ShardTooLarge:
                records[shard_key(job.tables)] = record(None, 0.0, 1)
        base.tagged(pass_tag(r)).write(records, "import")
    return base


def test_the_profile_reads_a_named_foreign_space_and_measures_nothing_into_it(tmp_path, setup):
    from dataclasses import replace

    from autoshard.core.errors import ConfigError

    pool, cfg, jobs, _ = setup
    named, counted = replace(cfg, measurements_space=FOREIGN), Counting(pool)
    foreign_space(tmp_path / "whole", pool, cfg, jobs)
    table = collect(pool, jobs, counted, named, tmp_path / "whole", progress=False)
    assert counted.calls == 0 and len(table) == len(jobs) and table["forward_ms"].notna().any()
    assert not MeasurementStore.for_settings(tmp_path / "whole", cfg.backend, pool).folder.exists()
    partial = tmp_path / "partial"
    foreign_space(partial, pool, cfg, jobs, leave_out=2)
    files = sorted(partial.rglob("*"))
    with pytest.raises(ConfigError, match=rf"measurement space {FOREIGN}: \d+ shards of the profile are missing"):
        collect(pool, jobs, counted, named, partial, progress=False)
    task = Task("x/y", "test", "test", (4, 9), 2, 10**12, 0.0)
    store = measurement_store(partial, cfg.backend, pool, FOREIGN)
    missing = r"measurement space [0-9a-f]{16}: 1 shards of the plans of pass main-[0-9a-f]{10} are missing"
    with pytest.raises(ConfigError, match=missing):
        score(counted, pool.features, [task], {"a": [np.array([0, 0])]}, cfg.backend, store, 0, progress=False)
    assert counted.calls == 0 and sorted(partial.rglob("*")) == files, "nothing measured, nothing written"
    with pytest.raises(ConfigError, match=r"profile\.measurements_space: 'fedcba9876543210' \(no such space"):
        measurement_store(tmp_path, cfg.backend, pool, "fedcba9876543210")

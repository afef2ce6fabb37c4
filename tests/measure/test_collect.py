"""The profile data set: the plan of shards, resumable chunked collection, and the key that says
when a measurement may be reused."""

import json

import numpy as np
import pandas as pd
import pytest

from autoshard.data.pool import build_pool
from autoshard.data.tasks import make_tasks
from autoshard.measure.analytic import AnalyticBackend
from autoshard.measure.collect import ProfileConfig, chunks, collect, plan_jobs
from autoshard.measure.store import space

from helpers import batch_files, every


@pytest.fixture(scope="module")
def setup(smoke_params):
    pool = build_pool(smoke_params["dataset"], smoke_params["pool"], seed=0, progress=False)
    tasks, train, test = make_tasks(pool.features, smoke_params["tasks"], seed=0)
    cfg = ProfileConfig.from_params(smoke_params["profile"] | {"backend": "analytic"})
    jobs = plan_jobs(pool, tasks, train, cfg, seed=0, test_tables=test, placements=every(pool))
    return pool, tasks, train, test, cfg, jobs


def test_plan(setup):
    pool, tasks, train, test, cfg, jobs = setup
    kinds = [j.kind for j in jobs]
    assert [j.tables for j in jobs if j.kind == "single"] == [(t,) for t in range(pool.num_tables)]
    train_set = set(train.tolist())
    capacity = max(t.memory_bytes for t in tasks)
    sizes = pool.features["size_bytes"].to_numpy()
    for job in jobs:
        if job.kind in ("random", "heuristic"):
            assert set(job.tables) <= train_set
        if job.kind.startswith("test_"):
            assert set(job.tables) <= set(test.tolist())
        if job.kind != "single":
            assert sizes[list(job.tables)].sum() <= capacity
    first_round = [j.tables for j in jobs if j.round == 0]
    assert len(first_round) == len(set(first_round)), "a shard is planned once per round"
    repeats = [j for j in jobs if j.kind == "repeat"]
    assert len(repeats) == cfg.repeat_shards * cfg.repeat_rounds
    assert {j.tables for j in repeats} <= set(first_round)
    for kind in ("random", "heuristic", "test_random", "test_heuristic"):
        assert kinds.count(kind) > 0, kind
    assert plan_jobs(pool, tasks, train, cfg, seed=0, test_tables=test, placements=every(pool)) == jobs


class Interrupting(AnalyticBackend):
    """Analytic backend that dies after `limit` measurements, counting its calls."""

    def __init__(self, pool, limit=None):
        super().__init__(pool)
        self.limit, self.calls = limit, 0

    def measure(self, tables, batch_size):
        if self.limit is not None and self.calls >= self.limit:
            raise KeyboardInterrupt
        self.calls += 1
        return super().measure(tables, batch_size)


def chunk_calls(cfg, jobs) -> list[int]:
    """Measurements each chunk takes: every shard once a round, the calibration shard before the
    first round and after each (the analytic backend never drifts, so no retry)."""
    rounds = cfg.backend.timing.rounds
    return [len(ids) * rounds + rounds + 1 for ids in chunks(jobs, cfg.chunk_size)]


def test_chunks_are_interleaved_batches_with_their_noise_recorded(tmp_path, setup):
    pool, _, _, _, cfg, jobs = setup
    assert cfg.backend.timing.rounds > 1, "the smoke profile measures in interleaved rounds"
    backend = Interrupting(pool)
    table = collect(pool, jobs, backend, cfg, tmp_path, progress=False)
    assert backend.calls == sum(chunk_calls(cfg, jobs))
    assert table["shard_id"].tolist() == list(range(len(jobs)))
    assert (table["cv"] == 0).all() and (table["drift"] == 0).all() and (table["attempts"] == 1).all()
    assert len(batch_files(tmp_path)) == len(chunks(jobs, cfg.chunk_size))
    for ids in chunks(jobs, cfg.chunk_size):
        assert len({jobs[i].round for i in ids}) == 1, "a chunk holds one round"


def test_resume_after_interrupt_measures_nothing_twice(tmp_path, setup):
    pool, _, _, _, cfg, jobs = setup
    full = collect(pool, jobs, Interrupting(pool), cfg, tmp_path / "a", progress=False)
    per_chunk = chunk_calls(cfg, jobs)
    dying = Interrupting(pool, limit=per_chunk[0] + per_chunk[1] + 3)
    with pytest.raises(KeyboardInterrupt):
        collect(pool, jobs, dying, cfg, tmp_path / "b", progress=False)
    assert len(batch_files(tmp_path / "b")) == 2
    resumed = Interrupting(pool)
    again = collect(pool, jobs, resumed, cfg, tmp_path / "b", progress=False)
    assert resumed.calls == sum(per_chunk[2:])
    pd.testing.assert_frame_equal(again.drop(columns="host"), full.drop(columns="host"))
    assert again["shard_id"].is_unique


def test_half_written_chunk_is_measured_again(tmp_path, setup):
    pool, _, _, _, cfg, jobs = setup
    first = collect(pool, jobs, Interrupting(pool), cfg, tmp_path, progress=False)
    broken = batch_files(tmp_path)[1]
    size = len(json.loads(broken.read_text())["records"])
    broken.write_bytes(broken.read_bytes()[:100])
    counter = Interrupting(pool)
    second = collect(pool, jobs, counter, cfg, tmp_path, progress=False)
    rounds = cfg.backend.timing.rounds
    assert counter.calls == size * rounds + rounds + 1
    pd.testing.assert_frame_equal(first, second)


def test_unmeasurable_shard_is_recorded(tmp_path, setup, smoke_params):
    pool, tasks, train, _, _, _ = setup
    from autoshard.measure.backends import make_backend

    cfg = ProfileConfig.from_params(smoke_params["profile"] | {"memory_limit_gib": 1e-9})
    jobs = plan_jobs(pool, tasks, train, cfg, seed=0)[:3]
    table = collect(pool, jobs, make_backend(pool, cfg.backend), cfg, tmp_path, progress=False)
    assert table["status"].str.startswith("too large").all()
    assert table["total_ms"].isna().all()


def _with_trace_changed(pool, table: int):
    """A copy of `pool` with one index of `table`'s trace moved to another row."""
    from dataclasses import replace

    indices = np.array(pool.traces.indices)
    start, _ = pool.traces.span(table)
    rows = int(pool.features["rows"].iloc[table])
    indices[start] = (indices[start] + 1) % rows
    return replace(pool, traces=replace(pool.traces, indices=indices))


def test_profile_cache_not_reused_after_pool_change(tmp_path, setup, smoke_params):
    """`pool.zipf_alpha_max` changes every trace but no meta field: nothing measured on the old
    pool is reused; one changed index of one table is enough; an unchanged rerun reuses it all."""
    pool, _, _, _, cfg, jobs = setup
    collect(pool, jobs, Interrupting(pool), cfg, tmp_path, progress=False)
    other = build_pool(smoke_params["dataset"], smoke_params["pool"] | {"zipf_alpha_max": 2.0}, seed=0,
                       progress=False)
    assert other.meta == pool.meta, "the old key (pool meta) could not tell these pools apart"
    for changed in (other, _with_trace_changed(pool, 5)):
        counter = Interrupting(changed)
        collect(changed, jobs, counter, cfg, tmp_path, progress=False)
        assert counter.calls == sum(chunk_calls(cfg, jobs)), "measurements of other traces were reused"
        assert space(cfg.backend, changed) != space(cfg.backend, pool)
    unchanged = Interrupting(pool)
    collect(pool, jobs, unchanged, cfg, tmp_path, progress=False)
    assert unchanged.calls == 0, "an unchanged rerun measures nothing"


def test_profile_cache_not_reused_after_settings_code_or_machine_change(setup, monkeypatch):
    """Batch, threads, timing, the measuring code, library versions and the CPU are in the key."""
    from dataclasses import replace

    from autoshard.core import digest
    from autoshard.measure import backends as factory

    pool, _, _, _, cfg, jobs = setup
    base = space(cfg.backend, pool)
    assert space(cfg.backend, pool) == base
    backend = cfg.backend
    for changed in (replace(backend, batch_size=backend.batch_size + 1), replace(backend, threads=backend.threads + 1),
                    replace(backend, timing=replace(backend.timing, runs=backend.timing.runs + 1)),
                    replace(backend, timing=replace(backend.timing, rounds=backend.timing.rounds + 1))):
        assert space(changed, pool) != base
    monkeypatch.setattr(factory, "machine", lambda device: digest.machine(device) | {"cpu": "another CPU"})
    assert space(cfg.backend, pool) != base
    monkeypatch.setattr(factory, "machine", lambda device: digest.machine(device) | {"torch": "torch==0.0"})
    assert space(cfg.backend, pool) != base
    monkeypatch.undo()
    monkeypatch.setattr(factory, "source_digest", lambda *modules: "edited backend code")
    assert space(cfg.backend, pool) != base


def test_the_wide_pools_shards_are_singles_then_random_shards_of_each_half_within_the_limits(params):
    from autoshard.data.wide import build_wide
    from autoshard.measure.collect import wide_jobs

    pool, train, test = build_wide(params["pool"], params["wide"] | {"tables": 30}, seed=0, progress=False)
    sizes = pool.features["size_bytes"].to_numpy()
    capacity = int(np.sort(sizes)[-3:].sum())  # any three of the largest tables fill a shard
    jobs = wide_jobs(pool, train, test, 25, 10, 5, capacity, seed=0)
    assert [j.tables for j in jobs[:30]] == [(t,) for t in range(30)] and jobs[0].kind == "single"
    kinds = [j.kind for j in jobs[30:]]
    assert kinds.count("random") >= 12 and kinds.count("test_random") >= 4, "most draws are new shards"
    for j in jobs[30:]:
        half = set(map(int, train if j.kind == "random" else test))
        assert set(j.tables) <= half and 1 <= len(j.tables) <= 5 and sizes[list(j.tables)].sum() <= capacity
    assert len({j.tables for j in jobs}) == len(jobs), "each shard once"
    assert jobs == wide_jobs(pool, train, test, 25, 10, 5, capacity, seed=0), "deterministic for a seed"


def test_the_wide_pools_data_set_is_measured_and_saved_beside_the_pools(tmp_path, setup, smoke_params):
    from dataclasses import replace

    from autoshard.core.paths import Paths
    from autoshard.data.wide import build_wide, save_wide
    from autoshard.measure.collect import collect_wide, load_profile, save_profile

    pool, _, _, _, cfg, jobs = setup
    paths = Paths(tmp_path / "data", tmp_path / "reports")
    save_wide(paths.wide, *build_wide(smoke_params["pool"], smoke_params["wide"], seed=0, progress=False))
    pool_table = collect(pool, jobs[:4], AnalyticBackend(pool), cfg, paths.measurements, progress=False)
    save_profile(pool_table, paths.profile)
    wide = collect_wide(paths, cfg, smoke_params["wide"], 0)
    assert (wide["status"] == "ok").all() and wide["shard_id"].is_unique
    assert wide["kind"].value_counts()["single"] == smoke_params["wide"]["tables"]
    pd.testing.assert_frame_equal(load_profile(paths.wide_profile), wide)
    pd.testing.assert_frame_equal(load_profile(paths.profile), pool_table)  # the pool's data set kept
    assert collect_wide(paths, replace(cfg, measurements_space="elsewhere"), smoke_params["wide"], 0) is None

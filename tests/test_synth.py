"""The synthetic pool: calibration by construction, layout, and determinism."""

import hashlib

import numpy as np
import pytest

from autoshard.data.pool import build_pool, load_pool, save_pool
from autoshard.data.synth import PoolConfig, scatter, synthesize, zipf_ranks


def test_pool_layout_and_pooling_mean(params):
    cfg = PoolConfig.from_params(params["pool"])
    specs, traces = synthesize(cfg, seed=0, progress=False)
    traces.validate("test")
    assert traces.lengths.shape == (cfg.num_tables, cfg.batch_size)
    assert specs.pooling_factors.mean() == pytest.approx(cfg.pooling_factor_mean)
    assert (specs.rows >= cfg.rows_min).all() and (specs.rows <= cfg.rows_max).all()
    assert set(specs.dims.tolist()) <= set(cfg.dims)
    for t in range(cfg.num_tables):
        assert traces.table(t).max(initial=0) < specs.rows[t]
    assert (traces.lengths == 0).any(), "empty bags must be possible"


def test_zipf_skew_orders_tables():
    g = np.random.default_rng(0)
    uniform = np.bincount(zipf_ranks(g, 200_000, 1000, 0.0), minlength=1000)
    skewed = np.bincount(zipf_ranks(g, 200_000, 1000, 1.2), minlength=1000)
    assert uniform.max() / uniform.mean() < 1.5
    assert skewed[0] > 50 * skewed[500:].mean()


def test_scatter_is_a_bijection():
    g = np.random.default_rng(1)
    ranks = np.arange(997 * 3) % 997
    rows = scatter(g, np.arange(997), 997)
    assert sorted(rows.tolist()) == list(range(997))
    assert len(scatter(g, ranks, 997)) == len(ranks)


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_same_bytes(tmp_path, params):
    for name in ("a", "b"):
        pool = build_pool(params["dataset"], params["pool"], seed=3, progress=False)
        save_pool(pool, tmp_path / name)
    for rel in ("tables.parquet", "traces/indices.npy", "traces/offsets.npy", "traces/lengths.npy"):
        assert _digest(tmp_path / "a" / rel) == _digest(tmp_path / "b" / rel), rel
    other = build_pool(params["dataset"], params["pool"], seed=4, progress=False)
    save_pool(other, tmp_path / "c")
    assert _digest(tmp_path / "a" / "tables.parquet") != _digest(tmp_path / "c" / "tables.parquet")


def test_save_load_round_trip(tmp_path, params):
    pool = build_pool(params["dataset"], params["pool"], seed=0, progress=False)
    save_pool(pool, tmp_path / "pool")
    back = load_pool(tmp_path / "pool")
    assert back.features.equals(pool.features)
    assert np.array_equal(back.traces.indices, pool.traces.indices)
    assert back.meta == pool.meta

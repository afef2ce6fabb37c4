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


def test_command_traces_come_from_the_pool_generator(params, tmp_path, monkeypatch):
    """A user's table with a pool table's drawn spec and that table's random stream gets the
    pool's trace (one generator: gamma-Poisson bags, Zipf, scatter) and, computed without it, the
    reuse histogram that trace has to within sampling noise; with its own stream, its bags are as
    dispersed as the pool's (empty bags occur)."""
    from autoshard.cli import user_tables as usertables
    from autoshard.core.seeding import rng
    from autoshard.data.features import REUSE_COLUMNS
    from autoshard.data.synth import PoolConfig, draw_specs

    pool = build_pool(params["dataset"], params["pool"], seed=0, progress=False)
    cfg = PoolConfig.from_params(params["pool"])
    assert usertables.DEFAULT_BAG_DISPERSION == cfg.bag_dispersion
    specs = draw_specs(cfg, 0)
    t = int(np.argmax(specs.pooling_factors))
    csv = tmp_path / "one.csv"
    csv.write_text("name,rows,dim,pooling_factor,zipf_alpha\n"
                   f"t,{specs.rows[t]},{specs.dims[t]},{float(specs.pooling_factors[t])!r},{float(specs.alphas[t])!r}\n")
    monkeypatch.setattr(usertables, "name_rng", lambda name: rng(0, "pool", "trace", t))
    user = usertables.read_tables(csv, trace_batch=cfg.batch_size)
    assert np.array_equal(user.traces.lengths[0], pool.traces.lengths[t])
    assert np.array_equal(user.traces.indices, pool.traces.table(t))
    closed, drawn = user.features[REUSE_COLUMNS].to_numpy()[0], pool.features[REUSE_COLUMNS].to_numpy()[t]
    assert np.abs(closed - drawn).sum() < 0.05
    monkeypatch.undo()
    lengths, _ = usertables.table_trace("user_table", 5000, 15.8, 1.05, 20000)
    assert abs(lengths.mean() / 15.8 - 1) < 0.05
    assert 0.03 < (lengths == 0).mean() < 0.09, "gamma-Poisson (shape 1): about 1 / (1 + 15.8) empty bags"

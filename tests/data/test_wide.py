"""The wide pool: its dims, hash sizes and split, drawn from streams of its own."""

import numpy as np
import pytest

from autoshard.core.errors import ConfigError
from autoshard.data.pool import build_pool
from autoshard.data.wide import WideConfig, build_wide, load_wide, save_wide


def test_the_wide_pool_spans_its_dims_within_its_table_cap_and_splits_in_two(params):
    wide = params["wide"] | {"tables": 40, "dims": [4, 16, 128, 1024], "table_mib_max": 0.5}
    pool, train, test = build_wide(params["pool"], wide, seed=0, progress=False)
    f = pool.features
    assert len(f) == 40 and set(f["dim"]) == {4, 16, 128, 1024}
    assert (f["size_bytes"] <= 0.5 * 2**20).all(), "every table within table_mib_max"
    assert (f.loc[f["dim"] == 4, "rows"].max() > f.loc[f["dim"] == 1024, "rows"].max()), "the cap binds by dim"
    assert sorted([*train, *test]) == list(range(40)) and len(train) == 20
    again, train2, _ = build_wide(params["pool"], wide, seed=0, progress=False)
    assert again.digest() == pool.digest() and np.array_equal(train, train2), "deterministic for a seed"
    assert build_wide(params["pool"], wide, seed=1, progress=False)[0].digest() != pool.digest()


def test_the_wide_pool_leaves_the_pool_as_it_was(params):
    """The wide pool draws from its own streams: the main pool of a seed is the same with or without it."""
    before = build_pool(params["dataset"], params["pool"], 0, progress=False).digest()
    build_wide(params["pool"], params["wide"], seed=0, progress=False)
    assert build_pool(params["dataset"], params["pool"], 0, progress=False).digest() == before
    from autoshard.data.synth import PoolConfig, draw_specs

    cfg = PoolConfig.from_params(params["pool"])
    own, pools = draw_specs(cfg, 0, stream="wide"), draw_specs(cfg, 0)
    assert not np.array_equal(own.rows, pools.rows) and not np.array_equal(own.alphas, pools.alphas), \
        "the same generator on its own streams draws other tables"


def test_the_wide_pool_round_trips_and_names_bad_values(params, tmp_path):
    pool, train, test = build_wide(params["pool"], params["wide"], seed=0, progress=False)
    save_wide(tmp_path / "wide", pool, train, test)
    loaded, train2, test2 = load_wide(tmp_path / "wide")
    assert loaded.digest() == pool.digest() and np.array_equal(train, train2) and np.array_equal(test, test2)
    with pytest.raises(ConfigError, match=r"wide\.dims\[1\].*6.*multiple of 4"):
        WideConfig.from_params(params["wide"] | {"dims": [4, 6]})
    with pytest.raises(ConfigError, match=r"wide\.pooling_factor_mean"):
        WideConfig.from_params(params["wide"] | {"pooling_factor_mean": 500.0})
    with pytest.raises(ConfigError, match=r"wide\.train_share"):
        build_wide(params["pool"], params["wide"] | {"train_share": 0.01}, seed=0, progress=False)
    (tmp_path / "wide" / "split.json").unlink()
    with pytest.raises(ConfigError, match="no wide split"):
        load_wide(tmp_path / "wide")

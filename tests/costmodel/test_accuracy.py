"""The cost model's accuracy metrics, by hand."""

import numpy as np
import pandas as pd
import pytest

from autoshard.costmodel.accuracy import MIXED, error_by_dim, mape, r2, tau_similar_size


def test_metrics_by_hand():
    measured = np.array([1.0, 2.0, 4.0])
    assert mape(np.array([1.1, 2.0, 3.0]), measured) == pytest.approx((0.1 + 0 + 0.25) / 3)
    assert r2(measured, measured) == 1.0
    # Same-size shards ranked perfectly, another size group ranked backwards.
    pred = np.array([1, 2, 3, 3, 2, 1.0])
    truth = np.array([1, 2, 3, 1, 2, 3.0])
    assert tau_similar_size(pred, truth, np.array([1, 1, 1, 5, 5, 5])) == pytest.approx(0.0)
    assert tau_similar_size(pred, truth, np.array([2, 2, 2, 2, 2, 2])) < 1


def test_the_error_by_dim_groups_shards_by_their_tables_one_dim():
    """Shards of dim-16 tables predicted exactly, of dim-64 tables 50% high, mixed ones 10% low:
    each group's MAPE is its own, and an empty test set has no entry."""
    dims = np.array([16, 16, 64, 64])
    shards = pd.DataFrame({"tables": [(0,), (0, 1), (2,), (2, 3), (1, 2)], "total_ms": [1.0, 2.0, 4.0, 8.0, 10.0]})
    factor = {(0,): 1.0, (0, 1): 1.0, (2,): 1.5, (2, 3): 1.5, (1, 2): 0.9}
    estimate = lambda s: s["total_ms"].to_numpy() * s["tables"].map(factor).to_numpy()  # noqa: E731
    got = error_by_dim(estimate, {"unseen": shards, "seen": shards.iloc[:0]}, dims)
    assert set(got) == {"unseen"}
    assert list(got["unseen"]) == ["16", "64", MIXED]
    assert got["unseen"]["16"] == {"mape": pytest.approx(0.0), "shards": 2}
    assert got["unseen"]["64"] == {"mape": pytest.approx(0.5), "shards": 2}
    assert got["unseen"][MIXED] == {"mape": pytest.approx(0.1), "shards": 1}


def test_the_wide_pools_error_goes_by_each_shards_widest_table():
    """With `widest`, a shard of dims (4, 256) counts for 256; `wide_metrics` gives each estimator's
    MAPE per test set and its error by widest dim, and the split sizes."""
    from autoshard.costmodel.accuracy import wide_metrics

    dims = np.array([4, 256, 4, 256])
    shards = pd.DataFrame({"tables": [(0,), (1,), (0, 1), (2, 3), (0, 2)], "total_ms": [1.0, 2.0, 4.0, 8.0, 10.0]})
    high = {(0,): 1.0, (1,): 1.5, (0, 1): 1.5, (2, 3): 1.5, (0, 2): 1.1}
    estimate = lambda s: s["total_ms"].to_numpy() * s["tables"].map(high).to_numpy()  # noqa: E731
    got = error_by_dim(estimate, {"unseen": shards}, dims, widest=True)["unseen"]
    assert got == {"4": {"mape": pytest.approx(0.05), "shards": 2}, "256": {"mape": pytest.approx(0.5), "shards": 3}}
    exact = lambda s: s["total_ms"].to_numpy()  # noqa: E731
    entry = wide_metrics({"model": estimate, "exact": exact}, {"unseen": shards, "empty": shards.iloc[:0]},
                         {"train": shards, "test_unseen": shards.iloc[:2]}, dims, best_epoch=7)
    assert entry["shards"] == {"train": 5, "test_unseen": 2} and entry["dims"] == [4, 256] and entry["best_epoch"] == 7
    assert entry["mape"]["exact"] == {"unseen": 0.0} and entry["mape"]["model"]["unseen"] == pytest.approx(0.32)
    assert entry["error_by_dim"]["model"]["unseen"] == got

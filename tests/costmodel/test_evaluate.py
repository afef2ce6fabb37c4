"""The cost model's accuracy metrics, by hand."""

import numpy as np
import pandas as pd
import pytest

from autoshard.costmodel.evaluate import MIXED, error_by_dim, mape, r2, tau_similar_size


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

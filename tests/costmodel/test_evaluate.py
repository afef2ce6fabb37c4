"""The cost model's accuracy metrics, by hand."""

import numpy as np
import pytest

from autoshard.costmodel.evaluate import mape, r2, tau_similar_size


def test_metrics_by_hand():
    measured = np.array([1.0, 2.0, 4.0])
    assert mape(np.array([1.1, 2.0, 3.0]), measured) == pytest.approx((0.1 + 0 + 0.25) / 3)
    assert r2(measured, measured) == 1.0
    # Same-size shards ranked perfectly, another size group ranked backwards.
    pred = np.array([1, 2, 3, 3, 2, 1.0])
    truth = np.array([1, 2, 3, 1, 2, 3.0])
    assert tau_similar_size(pred, truth, np.array([1, 1, 1, 5, 5, 5])) == pytest.approx(0.0)
    assert tau_similar_size(pred, truth, np.array([2, 2, 2, 2, 2, 2])) < 1

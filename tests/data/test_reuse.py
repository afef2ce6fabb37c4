"""The reuse histogram computed without a trace (`data.reuse`) agrees with drawn traces' to within
their own sampling noise, and costs the same for 80 million rows as for a hundred."""

import numpy as np
import pytest

from autoshard.data.features import REUSE_BINS, reuse_histogram
from autoshard.data.reuse import expected_histogram, rank_groups
from autoshard.data.synth import bag_trace
from autoshard.data.traces import access_counts

BAGS, DRAWS = 4096, 5


@pytest.mark.parametrize(("rows", "pooling", "alpha"), [
    (1000, 0.5, 0.0), (1000, 3.0, 1.05), (1000, 40.0, 1.6), (100_000, 3.0, 0.0), (100_000, 3.0, 1.05),
    (100_000, 40.0, 1.6), (100_000, 1500.0, 0.0), (10_000_000, 0.5, 1.05), (10_000_000, 40.0, 1.6),
    (10_000_000, 1500.0, 1.05)])
def test_the_expected_histogram_is_as_close_to_the_traces_as_a_drawn_trace(rows, pooling, alpha):
    drawn = np.stack([reuse_histogram(access_counts(bag_trace(np.random.default_rng(s), rows, pooling, alpha,
                                                                BAGS, 1.0)[1], rows)) for s in range(DRAWS)])
    mean = drawn.mean(axis=0)
    spread = np.abs(drawn - mean).sum(axis=1).max()  # the farthest draw from the draws' mean (L1)
    expected = expected_histogram(rows, BAGS * pooling, alpha)
    assert expected.shape == (REUSE_BINS,) and expected.sum() == pytest.approx(1.0)
    assert np.abs(expected - mean).sum() <= spread + 0.02, (np.round(expected, 3), np.round(mean, 3))


def test_the_groups_cover_every_rank_once_and_stay_few():
    for rows in (1, 7, 256, 257, 10**6, 2**31):
        first, sizes = rank_groups(rows)
        assert first[0] == 0 and (sizes > 0).all() and first[-1] + sizes[-1] == rows
        assert np.array_equal(first[1:], first[:-1] + sizes[:-1])
        assert len(first) < 1500
    assert expected_histogram(50, 0.0, 1.0).sum() == 0

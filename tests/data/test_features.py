"""Table features: the reuse histogram by hand, and the 21-feature table."""

import numpy as np
import pytest

from autoshard.data.features import FEATURE_COLUMNS, REUSE_COLUMNS, hot_share, reuse_histogram, table_features
from autoshard.data.traces import access_counts, from_lengths


def test_feature_columns_are_autoshards_21():
    assert len(FEATURE_COLUMNS) == 21
    assert FEATURE_COLUMNS[:4] == ["dim", "rows", "pooling_factor", "size_bytes"]


def test_reuse_histogram_by_hand():
    # Row 7 accessed once, row 3 twice, row 0 three times, row 5 five times, row 9 33000 times.
    indices = np.array([7] + [3] * 2 + [0] * 3 + [5] * 5 + [9] * 33000)
    counts = access_counts(indices, rows=10)
    assert sorted(counts.tolist()) == [1, 2, 3, 5, 33000]
    hist = reuse_histogram(counts)
    expected = np.zeros(17)
    expected[0] = expected[1] = expected[2] = expected[3] = expected[16] = 1 / 5
    np.testing.assert_allclose(hist, expected)


@pytest.mark.parametrize(("count", "bin_"), [(1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (8, 3),
                                             (9, 4), (16384, 14), (16385, 15), (32768, 15),
                                             (32769, 16)])
def test_reuse_bin_edges(count, bin_):
    hist = reuse_histogram(np.array([count]))
    assert hist[bin_] == 1.0 and hist.sum() == 1.0


def test_access_counts_sparse_path_matches_dense():
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 1000, size=500)
    dense = np.sort(access_counts(idx, rows=1000))  # rows <= 8 x size: bincount path
    assert np.array_equal(dense, np.sort(np.unique(idx, return_counts=True)[1]))
    sparse = np.sort(access_counts(idx, rows=100_000))  # rows > 8 x size: np.unique path
    assert np.array_equal(sparse, dense)


def test_hot_share():
    counts = np.array([90] + [1] * 99)  # 100 distinct, hottest 1% = one row
    assert hot_share(counts) == pytest.approx(90 / 189)
    assert hot_share(np.array([], dtype=int)) == 0.0


def test_table_features_on_a_tiny_trace():
    # Two tables, batch of 3 bags. Table 0 bags: [1, 1], [], [2]; table 1: [0], [0], [0, 4].
    lengths = np.array([[2, 0, 1], [1, 1, 2]])
    traces = from_lengths(np.array([1, 1, 2, 0, 0, 0, 4]), lengths)
    f = table_features(traces, rows=np.array([3, 5]), dims=np.array([4, 8]), weight_bytes=4)
    assert f["pooling_factor"].tolist() == pytest.approx([1.0, 4 / 3])
    assert f["size_bytes"].tolist() == [3 * 4 * 4 + 3 * 4, 5 * 8 * 4 + 5 * 4]  # weights + one fp32 state a row
    assert f["empty_bag_share"].tolist() == pytest.approx([1 / 3, 0.0])
    # Table 0: row 1 twice, row 2 once -> half in (0,1], half in (1,2].
    assert f.loc[0, REUSE_COLUMNS[:2]].tolist() == [0.5, 0.5]
    # Table 1: row 0 three times (bin 2), row 4 once (bin 0).
    assert f.loc[1, ["reuse_0", "reuse_2"]].tolist() == [0.5, 0.5]
    assert f["distinct"].tolist() == [2, 2]


def test_table_features_rejects_index_beyond_rows():
    traces = from_lengths(np.array([0, 5]), np.array([[2]]))
    with pytest.raises(ValueError, match="index 5 is out of range for 3 rows"):
        table_features(traces, rows=np.array([3]), dims=np.array([4]), weight_bytes=4)

"""The 21 table features (AutoShard): dim, rows, pooling factor, size and the 17-bin reuse histogram."""

import numpy as np
import pandas as pd

from autoshard.core.errors import ConfigError
from autoshard.data.sizes import table_bytes
from autoshard.data.traces import Traces, access_counts

REUSE_BINS = 17


REUSE_COLUMNS = [f"reuse_{i}" for i in range(REUSE_BINS)]


REUSE_LABELS = ["(0,1]"] + [f"({2 ** (i - 1)},{2 ** i}]" for i in range(1, 16)] + [">32768"]


FEATURE_COLUMNS = ["dim", "rows", "pooling_factor", "size_bytes", *REUSE_COLUMNS]


LOG_COLUMNS = ("rows", "pooling_factor", "size_bytes")  # the models see their log1p: they span decades


def feature_matrix(features: pd.DataFrame) -> np.ndarray:
    """The 21 model features of every table, in FEATURE_COLUMNS order (float64)."""
    missing = [c for c in FEATURE_COLUMNS if c not in features.columns]
    if missing:
        raise ConfigError(f"table features: missing columns {', '.join(missing)}")
    return features[FEATURE_COLUMNS].to_numpy(dtype=np.float64)


def check_features(x) -> np.ndarray:
    """Features as float32 (N, 21), as the models take them; a wrong width or a value that is
    not finite in float32 is an error, not a NaN out."""
    with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes inf, reported below
        x = np.asarray(x, dtype=np.float64).astype(np.float32)
    if x.ndim != 2 or x.shape[1] != len(FEATURE_COLUMNS):
        raise ConfigError(f"table features: expected {len(FEATURE_COLUMNS)} values per table, "
                          f"got shape {tuple(x.shape)}")
    bad = np.argwhere(~np.isfinite(x))
    if len(bad):
        t, c = bad[0]
        raise ConfigError(f"table features: {float(x[t, c])} in table {t}, column {FEATURE_COLUMNS[c]}")
    return x


def reuse_histogram(counts: np.ndarray) -> np.ndarray:
    """AutoShard's 17-bin reuse histogram from a table's access counts.

    Bin k holds the fraction of distinct indices accessed c times with 2**(k-1) < c <= 2**k
    (bin 0: exactly once); bin 16 holds those accessed more than 32768 times.
    """
    if counts.size == 0:
        return np.zeros(REUSE_BINS)
    bins = np.zeros(counts.shape, dtype=np.int64)
    many = counts > 1
    bins[many] = np.floor(np.log2(counts[many] - 1)).astype(np.int64) + 1
    hist = np.bincount(np.minimum(bins, REUSE_BINS - 1), minlength=REUSE_BINS)
    return hist / counts.size


def hot_share(counts: np.ndarray) -> float:
    """Share of lookups that hit the 1% most accessed distinct rows (a skew measure)."""
    if counts.size == 0:
        return 0.0
    top = max(1, int(np.ceil(0.01 * counts.size)))
    return float(np.sort(counts)[::-1][:top].sum() / counts.sum())


def table_features(traces: Traces, rows: np.ndarray, dims: np.ndarray,
                   weight_bytes: int) -> pd.DataFrame:
    """The 21 AutoShard features per table (FEATURE_COLUMNS) plus descriptive columns.

    One function for synthetic and real traces. `rows` is each table's hash size and `dims`
    its embedding dimension; size is `table_bytes` (weights of `weight_bytes` and the optimizer's state).
    """
    rows = np.asarray(rows, dtype=np.int64)
    dims = np.asarray(dims, dtype=np.int64)
    if rows.shape != (traces.num_tables,) or dims.shape != (traces.num_tables,):
        raise ConfigError(
            f"rows/dims: expected {traces.num_tables} values each, got {rows.shape} and {dims.shape}")
    records = []
    for t in range(traces.num_tables):
        idx = traces.table(t)
        if idx.size and idx.max() >= rows[t]:
            raise ConfigError(f"table {t}: index {idx.max()} is out of range for {rows[t]} rows")
        counts = access_counts(idx, int(rows[t]))
        records.append({
            "table": t,
            "dim": int(dims[t]),
            "rows": int(rows[t]),
            "pooling_factor": float(traces.lengths[t].mean()),
            "size_bytes": int(table_bytes(int(rows[t]), int(dims[t]), weight_bytes)),
            **dict(zip(REUSE_COLUMNS, reuse_histogram(counts).tolist(), strict=True)),
            "lookups": int(idx.size),
            "distinct": int(counts.size),
            "empty_bag_share": float((traces.lengths[t] == 0).mean()),
            "hot_share": hot_share(counts),
        })
    return pd.DataFrame.from_records(records)


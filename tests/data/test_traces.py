"""The real-dataset loader: round trips of small files in the dataset's layout, and bad files."""

import gzip

import numpy as np
import pytest
import torch

from autoshard.core.errors import ConfigError
from autoshard.data.pool import build_pool
from autoshard.data.traces import Traces, from_lengths, load_dlrm, load_traces, save_dlrm, save_traces


def small_traces(tables: int = 3, batch: int = 8, rows: int = 50, seed: int = 0) -> Traces:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 4, size=(tables, batch))
    return from_lengths(rng.integers(0, rows, size=int(lengths.sum())), lengths)


@pytest.mark.parametrize("name", ["t.pt", "t.pt.gz"])
def test_dlrm_round_trip(tmp_path, name):
    traces = small_traces()
    save_dlrm(tmp_path / name, traces)
    back = load_dlrm(tmp_path / name)
    for field in ("indices", "offsets", "lengths"):
        assert np.array_equal(getattr(back, field), getattr(traces, field))
    assert back.num_tables == 3 and back.batch_size == 8


def test_npy_round_trip(tmp_path):
    traces = small_traces()
    save_traces(tmp_path / "traces", traces)
    back = load_traces(tmp_path / "traces")
    assert back.indices.dtype == np.int32
    assert np.array_equal(back.indices, traces.indices)
    assert np.array_equal(back.offsets, traces.offsets)


def test_head_keeps_first_bags():
    traces = small_traces(tables=2, batch=6)
    head = traces.head(4)
    assert head.lengths.shape == (2, 4)
    for t in range(2):
        start = traces.offsets[t * 6]
        assert np.array_equal(head.table(t), traces.indices[start:start + traces.lengths[t, :4].sum()])
    with pytest.raises(ConfigError, match="batch_size: 7"):
        traces.head(7)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="dataset.path.*not found"):
        load_dlrm(tmp_path / "nope.pt.gz")


@pytest.mark.parametrize("content", [b"", b"not a torch file at all", b"\x1f\x8b\x08\x00garbage"])
def test_unreadable_file(tmp_path, content):
    path = tmp_path / "bad.pt.gz"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match="bad.pt.gz: not a readable dataset file"):
        load_dlrm(path)


def test_truncated_file(tmp_path):
    save_dlrm(tmp_path / "t.pt.gz", small_traces())
    data = (tmp_path / "t.pt.gz").read_bytes()
    (tmp_path / "cut.pt.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match="cut.pt.gz: not a readable dataset file"):
        load_dlrm(tmp_path / "cut.pt.gz")


def test_wrong_structure(tmp_path):
    torch.save({"indices": torch.zeros(3)}, tmp_path / "dict.pt")
    with pytest.raises(ConfigError, match="dict.pt: expected a tuple"):
        load_dlrm(tmp_path / "dict.pt")


def test_mismatched_layout(tmp_path):
    traces = small_traces()
    bad = (torch.from_numpy(traces.indices), torch.from_numpy(traces.offsets[:-1]),
           torch.from_numpy(traces.lengths))
    with gzip.open(tmp_path / "short.pt.gz", "wb") as fh:
        torch.save(bad, fh)
    with pytest.raises(ConfigError, match="short.pt.gz: offsets has shape"):
        load_dlrm(tmp_path / "short.pt.gz")


def test_build_pool_from_dlrm_file(tmp_path, params):
    traces = small_traces(tables=5, batch=32, rows=400)
    save_dlrm(tmp_path / "d.pt.gz", traces)
    dataset = {"source": "dlrm", "path": str(tmp_path / "d.pt.gz")}
    params["pool"] |= {"num_tables": 4, "batch_size": 16, "rows_max": 300}
    pool = build_pool(dataset, params["pool"], seed=0, progress=False)
    assert pool.num_tables == 4 and pool.traces.batch_size == 16
    assert pool.meta["source"] == "dlrm"
    assert (pool.features["rows"] <= 300).all()
    assert set(pool.features["dim"]) <= set(params["pool"]["dims"])
    expected = traces.head(16).lengths[:4].mean(axis=1)
    np.testing.assert_allclose(pool.features["pooling_factor"], expected)
    params["pool"]["num_tables"] = 6
    with pytest.raises(ConfigError, match="pool.num_tables: 6 .*only 5 tables"):
        build_pool(dataset, params["pool"], seed=0, progress=False)

"""Column-wise sharding: split features and memory, the split-then-place planner, the bad-dim refusal."""

import numpy as np
import pandas as pd
import pytest
import torch

from autoshard.core.errors import ConfigError
from autoshard.data.features import FEATURE_COLUMNS, REUSE_COLUMNS, feature_matrix
from autoshard.data.tasks import Task
from autoshard.measure.base import shard_bytes
from autoshard.placement import columns


def pool(dims, rows=None, pooling=None) -> pd.DataFrame:
    n = len(dims)
    rows = rows or [1000] * n
    pooling = pooling or [2.0] * n
    frame = pd.DataFrame({"table": range(n), "dim": dims, "rows": rows, "pooling_factor": pooling,
                          "size_bytes": [r * d * 4 for r, d in zip(rows, dims, strict=True)]})
    for i, c in enumerate(REUSE_COLUMNS):
        frame[c] = 1.0 if i == 0 else 0.0
    return frame


class LinearModel:
    """A cost model whose device cost is the sum of dim x pooling factor over its shards
    (what the planner sees of a real one: `encode`, `cost_ms`, `predict_ms`)."""

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        dim, pf = FEATURE_COLUMNS.index("dim"), FEATURE_COLUMNS.index("pooling_factor")
        return (x[:, dim] * x[:, pf] / 100).reshape(-1, 1)

    def cost_ms(self, pooled: torch.Tensor) -> torch.Tensor:
        return pooled[..., 0]

    def predict_ms(self, features, shards) -> np.ndarray:
        enc = self.encode(torch.as_tensor(np.asarray(features), dtype=torch.float32))
        return np.array([float(enc[list(s)].sum()) for s in shards])


def task(n: int, devices: int, memory: int = 2**40) -> Task:
    return Task("t", "test", "test", tuple(range(n)), devices, memory, 1.0)


def test_a_column_shard_keeps_its_tables_features_but_dim_and_size():
    f = pool([64, 32], rows=[500, 800], pooling=[3.0, 1.5])
    shards = columns.split_table(0, 64, 4)
    assert [(s.start, s.width) for s in shards] == [(0, 16), (16, 16), (32, 16), (48, 16)]
    out = columns.shard_features(f, shards)
    assert out["dim"].tolist() == [16] * 4
    assert out["size_bytes"].tolist() == [500 * 16 * 4] * 4
    same = [c for c in FEATURE_COLUMNS if c not in ("dim", "size_bytes")]
    assert (out[same].to_numpy() == f.loc[[0] * 4, same].to_numpy()).all()
    assert out["key"].tolist() == ["0:0-16", "0:16-32", "0:32-48", "0:48-64"]
    assert columns.shard_features(f, columns.split_table(1, 32, 1))["key"].tolist() == ["1"]
    assert feature_matrix(out).shape == (4, len(FEATURE_COLUMNS))


def test_memory_counts_weights_and_optimizer_state_per_shard():
    f = pool([64], rows=[500])
    whole = columns.shard_sizes(f, columns.split_table(0, 64, 1))
    split = columns.shard_sizes(f, columns.split_table(0, 64, 2))
    assert whole.tolist() == [shard_bytes([500], [64], 4)]
    assert split.tolist() == [shard_bytes([500], [32], 4)] * 2
    assert split.sum() == whole.sum() + 500 * 4  # one more row-wise optimizer state


@pytest.mark.parametrize("dim,k", [(20, 2), (24, 5), (8, 4)])
def test_a_dim_that_cannot_split_into_multiples_of_4_is_refused(dim, k):
    with pytest.raises(ConfigError, match=rf"table big: dim {dim} cannot be split into {k} column shards"):
        columns.split_table(0, dim, k, name="big")


def test_shard_keys_round_trip():
    assert columns.parse_key("17") == (17, None, None)
    assert columns.parse_key("17:16-32") == (17, 16, 32)
    with pytest.raises(ConfigError, match="shard key"):
        columns.parse_key("17:x")


def test_splitting_is_the_only_way_to_balance_one_dominant_table():
    # One table costs 128 x 4 = 512, the other four 16 x 1 = 16 each; 2 devices.
    f = pool([128, 16, 16, 16, 16], pooling=[4.0, 1.0, 1.0, 1.0, 1.0])
    t = task(5, 2)
    model = LinearModel()
    whole = columns.split_then_place(model, f, t, ways=(1,))
    assert whole.splits == {}
    assert whole.predicted_ms >= 128 * 4 / 100 - 1e-6  # bounded by the big table
    split = columns.split_then_place(model, f, t, ways=(1, 2, 4))
    assert split.splits.get(0, 1) > 1
    assert split.predicted_ms < whole.predicted_ms * 0.7
    loads = np.bincount(split.placement, weights=model.predict_ms(
        feature_matrix(columns.shard_features(f, split.shards)), [[i] for i in range(len(split.shards))]))
    assert loads.max() == pytest.approx(split.predicted_ms, rel=1e-5)
    # Every column of every table is placed exactly once.
    for table in range(5):
        cols = sorted((s.start, s.width) for s in split.shards if s.table == table)
        assert sum(w for _, w in cols) == f["dim"][table] and cols[0][0] == 0


def test_the_planner_respects_memory():
    f = pool([128, 16, 16, 16, 16], pooling=[4.0, 1.0, 1.0, 1.0, 1.0])
    sizes = columns.shard_sizes(f, columns.expand(task(5, 2), f["dim"]))
    cap = int(sizes[0] * 0.6 + sizes[1:].sum())  # the big table must split to fit, and its halves
    plan = columns.split_then_place(LinearModel(), f, task(5, 2, cap), ways=(1, 2))
    used = np.bincount(plan.placement, weights=columns.shard_sizes(f, plan.shards), minlength=2)
    assert (used <= cap).all()


def test_lpt_on_split_tables_balances_scaled_costs():
    f = pool([128, 16, 16, 16, 16])
    costs = {0: 8.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}
    shards, placement = columns.lpt_split(costs, f, task(5, 2), ways=(1, 2, 4))
    loads = np.bincount(placement, weights=columns.scaled_costs(costs, shards), minlength=2)
    assert loads.max() == pytest.approx(6.0)
    assert [s.key for s in shards][:2] == ["0:0-64", "0:64-128"]  # the one table above 12 / 2
    assert len(shards) == 6

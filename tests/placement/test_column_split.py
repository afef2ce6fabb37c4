"""Column-wise sharding: split features and memory, the split-then-place planner, the bad-dim refusal."""

import numpy as np
import pandas as pd
import pytest
import torch

from autoshard.core.errors import ConfigError
from autoshard.data.features import FEATURE_COLUMNS, REUSE_COLUMNS, feature_matrix
from autoshard.data.sizes import table_bytes
from autoshard.data.tasks import Task
from autoshard.measure.base import shard_bytes
from autoshard.placement import column_split as columns

from helpers import LinearModel


def pool(dims, rows=None, pooling=None) -> pd.DataFrame:
    n = len(dims)
    rows = rows or [1000] * n
    pooling = pooling or [2.0] * n
    frame = pd.DataFrame({"table": range(n), "dim": dims, "rows": rows, "pooling_factor": pooling,
                          "size_bytes": [table_bytes(r, d, 4) for r, d in zip(rows, dims, strict=True)]})
    for i, c in enumerate(REUSE_COLUMNS):
        frame[c] = 1.0 if i == 0 else 0.0
    return frame


def task(n: int, devices: int, memory: int = 2**40) -> Task:
    return Task("t", "test", "test", tuple(range(n)), devices, memory, 1.0)


def test_a_column_shard_keeps_its_tables_features_but_dim_and_size():
    f = pool([64, 32], rows=[500, 800], pooling=[3.0, 1.5])
    shards = columns.split_table(0, 64, 4)
    assert [(s.start, s.width) for s in shards] == [(0, 16), (16, 16), (32, 16), (48, 16)]
    out = columns.shard_features(f, shards)
    assert out["dim"].tolist() == [16] * 4
    assert out["size_bytes"].tolist() == [500 * 16 * 4 + 500 * 4] * 4  # its columns, all its rows' state
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
    assert whole.tolist() == f["size_bytes"].tolist()  # a whole table: the size every table-wise method counts
    assert columns.shard_sizes(f, columns.split_table(0, 64, 4)).sum() == whole.sum() + 3 * 500 * 4


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


def test_backends_measure_a_column_shard_at_its_width(user_pool):
    from autoshard.measure.analytic import AnalyticBackend
    from autoshard.measure.fbgemm import FbgemmBackend
    from autoshard.measure.formulas import table_perf
    from autoshard.measure.timing import one_round

    analytic = AnalyticBackend(user_pool)
    half = analytic.measure([0, 1], 64, dims=[32, 16])
    assert half.forward_ms == pytest.approx(table_perf(32, 8.0, 64, 1).fwd_compute
                                            + table_perf(16, 2.0, 64, 1).fwd_compute)
    assert half.forward_ms < analytic.measure([0, 1], 64).forward_ms
    with pytest.raises(ConfigError, match="shard dims: 128 columns of a table of dim 64"):
        analytic.measure([0], 64, dims=[128])
    fbgemm = FbgemmBackend(user_pool, torch.device("cpu"), "EXACT_ROWWISE_ADAGRAD", one_round(0, 1), 2**30, 1)
    assert fbgemm.measure([0, 2], 64, dims=[16, 16]).total_ms > 0


def test_the_milp_on_split_tables_is_no_worse_than_lpt_on_them():
    f = pool([128, 16, 16, 16, 16, 32])
    costs = {0: 8.0, 1: 1.0, 2: 1.5, 3: 1.0, 4: 2.0, 5: 3.0}
    t = task(6, 3)
    shards, placement = columns.milp_split(costs, f, t, (1, 2, 4), node_limit=50, time_limit_s=10)
    lpt_shards, lpt_placement = columns.lpt_split(costs, f, t, (1, 2, 4))
    assert shards == lpt_shards
    load = np.bincount(placement, weights=columns.scaled_costs(costs, shards), minlength=3).max()
    assert load <= np.bincount(lpt_placement, weights=columns.scaled_costs(costs, shards), minlength=3).max() + 1e-9


def test_torchrecs_planner_with_column_wise_allowed_covers_every_column_once():
    from autoshard.placement.torchrec import torchrec_column_plan

    f = pool([32, 16, 16, 32, 16, 20], rows=[100000] * 6, pooling=[40.0, 1, 1, 2, 1, 1])
    planned = torchrec_column_plan(f, task(6, 2), 2048, ways=4)
    for table, dim in enumerate(f["dim"]):
        cols = sorted((start, width) for t, start, width, _ in planned if t == table)
        assert cols[0][0] == 0 and sum(w for _, w in cols) == dim
        assert all(a + w == b for (a, w), (b, _) in zip(cols, cols[1:], strict=False))
        assert all(w % 4 == 0 for _, w in cols)
    assert [w for t, _, w, _ in planned if t == 5] == [20]  # 20 / 4 = 5 columns: table-wise only
    assert {r for *_, r in planned} <= {0, 1}


def _torchrec_doc(widths, ranks, rows=100):
    starts = np.concatenate([[0], np.cumsum(widths)[:-1]]).tolist()
    return {"format": "autoshard-torchrec-plan/1", "world_size": 2, "device_type": "cpu", "modules": {"": {
        "a": {"sharding_type": "column_wise", "compute_kernel": "fused", "ranks": ranks,
              "shards": [{"offsets": [0, s], "sizes": [rows, w], "placement": f"rank:{r}/cpu"}
                         for s, w, r in zip(starts, widths, ranks, strict=True)]}}}}


def test_a_torchrec_plan_of_column_shards_is_read_strictly(tmp_path):
    from autoshard.core.inputs import Block, plan_assignment, plan_blocks

    path = tmp_path / "p.json"
    plan = plan_blocks(_torchrec_doc([16, 16], [1, 0]), path)
    assert plan.blocks == {"a": [Block(0, None, 0, 16, 1), Block(0, None, 16, 16, 0)]} and plan.devices == 2
    assert plan.shapes == {"a": [100, 32]} and plan.kinds == {"a": "column_wise"}
    with pytest.raises(ConfigError, match="column_wise shards"):
        plan_assignment(_torchrec_doc([16, 16], [1, 0]), path)
    with pytest.raises(ConfigError, match="multiples of 4 columns"):
        plan_blocks(_torchrec_doc([10, 22], [0, 1]), path)
    doc = _torchrec_doc([16, 16], [0, 1])
    doc["modules"][""]["a"]["shards"][1]["offsets"] = [0, 8]
    with pytest.raises(ConfigError, match=r"field offsets: \[0, 8\] \(expected \[0, 16\]\)"):
        plan_blocks(doc, path)
    doc = _torchrec_doc([16, 16], [0, 1])
    doc["modules"][""]["a"]["shards"][1]["sizes"] = [99, 16]
    with pytest.raises(ConfigError, match="every shard has the table's 100 rows"):
        plan_blocks(doc, path)


def _split_plan(columns, rows):
    return {"format": "autoshard-plan/1", "method": "m", "options": {}, "tables_file": "t.csv", "devices": 2,
            "memory_per_device_bytes": 1 << 30, "assignment": {"a": 0}, "per_device": [{}, {}],
            "predicted_bottleneck_ms": None, "predicted": "p", "sharding_seconds": 0.0, "model_files": {},
            "engine": "e", "sharding": "auto", "columns": {"c": columns}, "rows": {"r": {"kind": "row_wise",
                                                                                        "shards": rows}}}


def test_a_plan_of_column_and_row_shards_is_read_strictly(tmp_path):
    from autoshard.core.inputs import Block, plan_blocks

    path = tmp_path / "p.json"
    cols = [{"start": 0, "width": 8, "device": 1}, {"start": 8, "width": 24, "device": 0}]
    rows = [{"start": 0, "rows": 60, "device": 0}, {"start": 60, "rows": 40, "device": 1}]
    plan = plan_blocks(_split_plan(cols, rows), path)
    assert plan.blocks["c"] == [Block(0, None, 0, 8, 1), Block(0, None, 8, 24, 0)]
    assert plan.blocks["r"] == [Block(0, 60, 0, None, 0), Block(60, 40, 0, None, 1)]
    assert plan.kinds == {"a": "table_wise", "c": "column_wise", "r": "row_wise"}
    for bad_cols, bad_rows, message in (
            (cols[:1], rows, r"columns\.'c': expected a list of at least two column shards"),
            (cols, rows[:1], r"rows\.'r', field shards: expected a list of at least two row shards"),
            ([cols[0], {**cols[1], "start": 4}], rows, r"columns\.'c', field start: 4 \(expected 8: shards cover "
                                                       r"the columns left to right\)"),
            ([cols[0], {**cols[1], "width": 22}], rows, "field width: 22 \\(column shards are multiples of 4"),
            (cols, [rows[0], {**rows[1], "start": 50}], r"rows\.'r', field start: 50 \(expected 60: shards cover "
                                                       r"the rows top to bottom\)"),
            (cols, [rows[0], {**rows[1], "device": 0}], r"rows\.'r': two row shards on one device"),
            (cols, [rows[0], {**rows[1], "device": 2}], r"rows\.'r', field device: 2"),
            (cols, [rows[0], {"start": 60, "width": 40, "device": 1}], r"rows\.'r'")):
        with pytest.raises(ConfigError, match=message):
            plan_blocks(_split_plan(bad_cols, bad_rows), path)

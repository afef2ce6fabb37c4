"""The neural cost model: shapes, invariances, normalisation, save/load, training, bad input."""

import numpy as np
import pandas as pd
import pytest
import torch
from study_configs import study

from autoshard.core.errors import ConfigError
from autoshard.costmodel.dataset import measured_shards, single_costs, split_shards
from autoshard.costmodel.evaluate import linear_on_summed_features, mape, r2, tau_similar_size
from autoshard.costmodel.model import CostModel, CostModelConfig, load_model, save_model
from autoshard.costmodel.train import CostStageConfig, fit
from autoshard.data.features import FEATURE_COLUMNS, feature_matrix
from autoshard.data.pool import build_pool
from autoshard.data.tasks import make_tasks
from autoshard.measure.analytic import AnalyticBackend

SMALL = study(CostModelConfig, max_epochs=300, patience=60, batch_size=32, learning_rate=3e-3)


def model_for(features, cfg=SMALL):
    torch.manual_seed(0)
    return CostModel.fitted_to(cfg, features)


@pytest.mark.parametrize("heads", ["total", "stages"])
def test_shapes(features, heads):
    model = model_for(features, study(CostModelConfig, heads=heads))
    x = torch.as_tensor(features, dtype=torch.float32)
    index = torch.tensor([[0, 1, 2], [3, -1, -1]])
    out = model(x, index)
    assert out.shape == (2, 1 if heads == "total" else 2)
    assert model.encode(x).shape == (len(features), 32)
    pred = model.predict_ms(features, [[0, 1, 2], [3]])
    assert pred.shape == (2,) and (pred > 0).all()


def test_order_of_tables_does_not_matter(features):
    model = model_for(features)
    a, b = model.predict_ms(features, [[5, 1, 9, 3], [3, 9, 1, 5]])
    assert a == pytest.approx(b, rel=1e-6)


def test_padding_does_not_matter(features):
    model = model_for(features)
    alone = model.predict_ms(features, [[4, 7]])
    with_long = model.predict_ms(features, [[4, 7], list(range(20))])
    assert alone[0] == pytest.approx(with_long[0], rel=1e-6)


def test_constant_feature_is_safe(features):
    constant = features.copy()
    constant[:, FEATURE_COLUMNS.index("dim")] = 16.0
    model = model_for(constant)
    assert torch.isfinite(model.std).all() and (model.std > 0).all()
    assert np.isfinite(model.predict_ms(constant, [[0, 1]])).all()


def test_save_load_predicts_identically(tmp_path, features):
    model = model_for(features, study(CostModelConfig, heads="stages"))
    save_model(model, tmp_path / "m.pt")
    back = load_model(tmp_path / "m.pt")
    shards = [[0, 1, 2], [5], list(range(10, 30))]
    assert np.array_equal(back.predict_ms(features, shards), model.predict_ms(features, shards))
    assert back.cfg == model.cfg


def test_load_refuses_other_files(tmp_path):
    torch.save({"weights": torch.zeros(3)}, tmp_path / "other.pt")
    with pytest.raises(ConfigError, match="other.pt: not an autoshard cost model"):
        load_model(tmp_path / "other.pt")
    (tmp_path / "junk.pt").write_bytes(b"junk")
    with pytest.raises(ConfigError, match="junk.pt: not a cost model file"):
        load_model(tmp_path / "junk.pt")
    with pytest.raises(ConfigError, match="cost model not found"):
        load_model(tmp_path / "missing.pt")


def test_bad_features(features):
    model = model_for(features)
    with pytest.raises(ConfigError, match=r"expected 21 values per table, got shape \(48, 20\)"):
        model.predict_ms(features[:, :20], [[0]])
    nan = features.copy()
    nan[3, FEATURE_COLUMNS.index("pooling_factor")] = np.nan
    with pytest.raises(ConfigError, match="nan in table 3, column pooling_factor"):
        model.predict_ms(nan, [[0]])
    with pytest.raises(ConfigError, match=r"shard 1: table ids must be in \[0, 48\)"):
        model.predict_ms(features, [[0], [48]])


def _profile_table(pool, shards, backend_name="analytic"):
    backend = AnalyticBackend(pool)
    rows = []
    for i, shard in enumerate(shards):
        cost = backend.measure(shard, 256)
        rows.append({"shard_id": i, "tables": list(shard), "kind": "random", "status": "ok",
                     "backend": backend_name, "forward_ms": cost.forward_ms,
                     "backward_ms": cost.backward_ms, "total_ms": cost.total_ms})
    return pd.DataFrame(rows)


def test_bad_profile_tables(pool):
    table = _profile_table(pool, [[0], [1, 2]])
    with pytest.raises(ConfigError, match="missing columns total_ms"):
        measured_shards(table.drop(columns="total_ms"), "analytic")
    with pytest.raises(ConfigError, match=r"no rows for backend 'fbgemm' \(it has: analytic\)"):
        measured_shards(table, "fbgemm")
    table.loc[1, "backward_ms"] = np.nan
    with pytest.raises(ConfigError, match=r"NaN backward_ms for the measured shard of tables \[1, 2\]"):
        measured_shards(table, "analytic")


def test_repeats_are_averaged(pool):
    table = _profile_table(pool, [[0, 1], [1, 0], [2]])
    table.loc[1, "total_ms"] = table.loc[0, "total_ms"] * 3
    shards = measured_shards(table, "analytic")
    assert len(shards) == 2 and shards["rounds"].tolist() == [2, 1]
    assert shards.loc[0, "total_ms"] == pytest.approx(table.loc[0, "total_ms"] * 2)
    assert single_costs(shards).index.tolist() == [2]


def test_training_on_analytic_costs_reaches_low_error(smoke_params):
    """A small synthetic profile (analytic backend): the model learns it to a few percent,
    on shards of seen tables and of tables it never saw."""
    pool = build_pool(smoke_params["dataset"], smoke_params["pool"] | {"num_tables": 200}, seed=0,
                      progress=False)
    features = feature_matrix(pool.features)
    _, train_tables, test_tables = make_tasks(pool.features, smoke_params["tasks"], seed=0)
    g = np.random.default_rng(0)
    shards = [[t] for t in range(pool.num_tables)]
    for tables in (train_tables, test_tables):
        shards += [sorted(g.choice(tables, g.integers(2, 12), replace=False).tolist()) for _ in range(300)]
    data = measured_shards(_profile_table(pool, shards), "analytic")
    splits = split_shards(data, train_tables, test_tables, 0.15, 0.15, seed=0)
    cfg = study(CostModelConfig, max_epochs=600, patience=100, batch_size=32, learning_rate=1e-2)
    fitted = fit(cfg, features, train_tables, splits["train"], splits["val"], seed=0, progress=False)
    for name, bound in (("test_seen", 0.05), ("test_unseen", 0.12)):
        part = splits[name]
        pred = fitted.model.predict_ms(features, part["tables"].tolist())
        measured = part["total_ms"].to_numpy()
        assert mape(pred, measured) < bound, name
        assert tau_similar_size(pred, measured, part["num_tables"].to_numpy()) > 0.8, name
    again = fit(cfg, features, train_tables, splits["train"], splits["val"], seed=0, progress=False)
    shards_seen = splits["test_seen"]["tables"].tolist()
    assert np.array_equal(again.model.predict_ms(features, shards_seen),
                          fitted.model.predict_ms(features, shards_seen)), "seeded training"
    linear = linear_on_summed_features(features, train_tables, splits["train"])(splits["test_seen"])
    assert r2(linear, splits["test_seen"]["total_ms"].to_numpy()) > 0.5


def test_metrics_by_hand():
    measured = np.array([1.0, 2.0, 4.0])
    assert mape(np.array([1.1, 2.0, 3.0]), measured) == pytest.approx((0.1 + 0 + 0.25) / 3)
    assert r2(measured, measured) == 1.0
    # Same-size shards ranked perfectly, another size group ranked backwards.
    pred = np.array([1, 2, 3, 3, 2, 1.0])
    truth = np.array([1, 2, 3, 1, 2, 3.0])
    assert tau_similar_size(pred, truth, np.array([1, 1, 1, 5, 5, 5])) == pytest.approx(0.0)
    assert tau_similar_size(pred, truth, np.array([2, 2, 2, 2, 2, 2])) < 1


def test_stage_config(smoke_params):
    cfg = CostStageConfig.from_params(smoke_params["cost_model"])
    assert cfg.model.heads in ("total", "stages")
    with pytest.raises(ConfigError, match=r"cost_model.loss: 'l1'"):
        CostStageConfig.from_params(smoke_params["cost_model"] | {"loss": "l1"})
    with pytest.raises(ConfigError, match=r"compare_stage_heads: .yes. \(expected true or false\)"):
        CostStageConfig.from_params(smoke_params["cost_model"] | {"compare_stage_heads": "yes"})


def test_the_last_replicate_fits_on_the_remeasured_costs():
    from autoshard.costmodel.dataset import with_costs

    split = pd.DataFrame({"tables": [(1, 2), (3,)], "forward_ms": [1.0, 2.0], "backward_ms": [1.0, 2.0],
                          "total_ms": [2.0, 4.0], "kind": ["random", "single"]})
    again = pd.DataFrame({"tables": [(3,), (1, 2), (5,)], "forward_ms": [2.5, 1.5, 9.0],
                          "backward_ms": [2.5, 1.5, 9.0], "total_ms": [5.0, 3.0, 18.0]})
    out = with_costs(split, again)
    assert out["total_ms"].tolist() == [3.0, 5.0] and out["kind"].tolist() == ["random", "single"]
    with pytest.raises(ConfigError, match=r"shard \[3\] was not measured again"):
        with_costs(split, again.iloc[1:])

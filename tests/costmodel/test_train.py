"""Training the cost model: a small analytic profile learnt to a few percent, seeded; the stage's
parameters."""

import numpy as np
import pytest
from study_configs import study

from autoshard.core.errors import ConfigError
from autoshard.costmodel.accuracy import linear_on_summed_features, mape, r2, tau_similar_size
from autoshard.costmodel.dataset import measured_shards, split_shards
from autoshard.costmodel.model import CostModelConfig
from autoshard.costmodel.train import CostStageConfig, fit
from autoshard.data.features import feature_matrix
from autoshard.data.pool import build_pool
from autoshard.data.tasks import make_tasks

from helpers import _profile_table


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


def test_stage_config(smoke_params):
    cfg = CostStageConfig.from_params(smoke_params["cost_model"])
    assert cfg.model.heads == smoke_params["cost_model"]["heads"], "read from the section"
    with pytest.raises(ConfigError, match=r"cost_model.loss: 'l1'"):
        CostStageConfig.from_params(smoke_params["cost_model"] | {"loss": "l1"})
    with pytest.raises(ConfigError, match=r"compare_stage_heads: .yes. \(expected true or false\)"):
        CostStageConfig.from_params(smoke_params["cost_model"] | {"compare_stage_heads": "yes"})

"""The neural cost model: shapes, invariances, normalisation, save/load, bad input."""

import numpy as np
import pytest
import torch
from study_configs import study

from autoshard.core.errors import ConfigError
from autoshard.costmodel.model import CostModel, CostModelConfig, load_model, save_model
from autoshard.data.features import FEATURE_COLUMNS

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

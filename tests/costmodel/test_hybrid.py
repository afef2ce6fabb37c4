"""The hybrid cost model: measured single costs x a learnt fusion factor, used where the
feature-only model is."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from study_configs import study

from autoshard.core import schema
from autoshard.core.errors import ConfigError
from autoshard.core.metrics import _plain
from autoshard.costmodel import accuracy as cost_eval
from autoshard.costmodel.dataset import SEEN_MULTI, UNSEEN_MULTI, model_test_sets
from autoshard.costmodel.hybrid import HybridConfig, HybridCostModel, load_hybrid, save_hybrid, with_single_costs
from autoshard.costmodel.model import CostModel, CostModelConfig, save_model
from autoshard.costmodel.train import CostStageConfig, fit_hybrid, shard_weights
from autoshard.data.tasks import make_tasks
from autoshard.placement.exact import exact_plan
from autoshard.placement.search import model_search
from autoshard.placement.shards import device_shards, predicted_bottleneck
from autoshard.rl.env import ShardingEnv, make_batch
from autoshard.rl.infer import cost_greedy
from autoshard.rl.policy import Policy, PolicyConfig
from autoshard.rl.ppo import rollout

SMALL = study(HybridConfig, hidden=32, encoding=9, head_hidden=16, max_epochs=300, patience=60, batch_size=32,
              learning_rate=1e-2)


@pytest.fixture(scope="module")
def single_ms(features):
    """A made-up measured single cost per table, in ms."""
    return pd.Series(np.random.default_rng(1).lognormal(0.0, 0.8, len(features)), index=range(len(features)))


@pytest.fixture(scope="module")
def hybrid_features(features, single_ms):
    return with_single_costs(features, single_ms)


def fresh(hybrid_features, cfg=SMALL):
    torch.manual_seed(0)
    return HybridCostModel.fitted_to(cfg, hybrid_features, scale=2.0)


def fused_shards(single_ms: pd.Series, tables: np.ndarray, count: int, seed: int, kind: str) -> pd.DataFrame:
    """Shards of 2-10 `tables` whose cost is the sum of singles times a factor that falls with
    the number of tables (one global factor cannot fit it)."""
    g = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        shard = tuple(sorted(g.choice(tables, g.integers(2, 11), replace=False).tolist()))
        total = float(single_ms.loc[list(shard)].sum()) / (1 + 0.08 * (len(shard) - 1))
        rows.append({"tables": shard, "kind": kind, "num_tables": len(shard), "total_ms": total})
    return pd.DataFrame(rows)


def test_untrained_hybrid_is_the_sum_of_singles(hybrid_features, single_ms):
    model = fresh(hybrid_features)
    shards = [[0], [1, 2, 3], [4, 5]]
    expected = [single_ms.loc[s].sum() for s in shards]
    assert model.predict_ms(hybrid_features, shards) == pytest.approx(expected, rel=1e-5)


def test_hybrid_learns_fusion_and_beats_the_rescaled_sum(hybrid_features, single_ms):
    tables = np.arange(len(single_ms))
    train_tables, test_tables = tables[: len(tables) // 2], tables[len(tables) // 2:]
    train = fused_shards(single_ms, train_tables, 240, seed=0, kind="heuristic")
    val = fused_shards(single_ms, train_tables, 40, seed=1, kind="random")
    unseen = fused_shards(single_ms, test_tables, 60, seed=2, kind="test_random")
    fitted = fit_hybrid(SMALL, hybrid_features, train_tables, train, val, seed=0, progress=False)
    pred = fitted.model.predict_ms(hybrid_features, unseen["tables"].tolist())
    hybrid_mape = cost_eval.mape(pred, unseen["total_ms"].to_numpy())
    rescaled = cost_eval.sum_of_singles(single_ms, train)(unseen)
    assert hybrid_mape < 0.03
    assert hybrid_mape < 0.5 * cost_eval.mape(rescaled, unseen["total_ms"].to_numpy())
    again = fit_hybrid(SMALL, hybrid_features, train_tables, train, val, seed=0, progress=False)
    assert np.array_equal(again.model.predict_ms(hybrid_features, unseen["tables"].tolist()), pred), "seeded"


def test_save_load_round_trip(tmp_path, hybrid_features, features):
    model = fresh(hybrid_features)
    with torch.no_grad():
        model.head[-1].bias.fill_(-0.1)  # a model that is no longer the plain sum
    save_hybrid(model, tmp_path / "hybrid.pt")
    loaded = load_hybrid(tmp_path / "hybrid.pt")
    shards = [[0, 1], [2], [3, 4, 5, 6]]
    assert np.array_equal(loaded.predict_ms(hybrid_features, shards), model.predict_ms(hybrid_features, shards))
    assert loaded.cfg == model.cfg
    save_model(CostModel.fitted_to(study(CostModelConfig), features), tmp_path / "feature_only.pt")
    with pytest.raises(ConfigError, match="not an autoshard hybrid cost model"):
        load_hybrid(tmp_path / "feature_only.pt")


def test_bad_single_costs(features, hybrid_features, single_ms):
    model = fresh(hybrid_features)
    with pytest.raises(ConfigError, match="need the measured single cost as column 'single_ms'"):
        model.predict_ms(features, [[0]])
    bad = hybrid_features.copy()
    bad[5, -1] = 0.0
    with pytest.raises(ConfigError, match="0.0 in table 5, column single_ms"):
        model.predict_ms(bad, [[0]])
    with pytest.raises(ConfigError, match=r"table 3 was not measured alone \(1 of 48"):
        with_single_costs(features, single_ms.drop(3))


def test_feature_only_model_ignores_the_single_cost_column(features, hybrid_features):
    torch.manual_seed(0)
    model = CostModel.fitted_to(study(CostModelConfig), hybrid_features)
    shards = [[0, 1], [2, 7]]
    assert np.array_equal(model.predict_ms(hybrid_features, shards), model.predict_ms(features, shards))


def test_planners_take_the_hybrid(smoke_params, pool, hybrid_features, single_ms):
    """What takes a CostModel takes the hybrid: the predicted bottleneck, the RL environment's
    batch and steps, the policy (either state encoder), cost_greedy and the exact search; summed encodings give
    the same costs as predict_ms."""
    model = fresh(hybrid_features)
    with torch.no_grad():
        model.head[-1].weight.normal_(0, 0.1)
    tasks, _, _ = make_tasks(pool.features, smoke_params["tasks"], seed=0)
    task = tasks[0]
    batch = make_batch(model, hybrid_features, [task])
    assert batch.encodings.shape[-1] == model.cfg.encoding
    assert batch.single_cost[0].numpy() == pytest.approx(
        model.predict_ms(hybrid_features, [[t] for t in batch.tables[0].tolist()]), rel=1e-5)
    env = ShardingEnv(model, batch)
    while not env.done:
        env.step(env.mask().float().argmax(-1))
    placement = [env.pool_placement()[0][t] for t in task.tables]
    shards = device_shards(task, placement)
    busy = [s for s in shards if s]
    assert float(env.bottleneck()[0]) == pytest.approx(model.predict_ms(hybrid_features, busy).max(), rel=1e-5)
    assert predicted_bottleneck(model, hybrid_features, task, placement) == pytest.approx(
        float(env.bottleneck()[0]), rel=1e-5)
    for encoder in ("cost_model", "separate"):
        policy = Policy(study(PolicyConfig, state_encoder=encoder), model)
        traj = rollout(policy, model, batch, "sample", generator=torch.Generator().manual_seed(0))
        assert traj.logp.shape == (1, len(task.tables)) and torch.isfinite(traj.reward).all()
    plan = cost_greedy(model, hybrid_features, [task])[0]
    assert len(plan) == len(task.tables) and set(plan.tolist()) <= set(range(task.devices))
    assert predicted_bottleneck(model, hybrid_features, task, plan) <= predicted_bottleneck(
        model, hybrid_features, task, np.zeros(len(task.tables), dtype=int)) + 1e-9
    with pytest.raises(ConfigError, match="local search: the hybrid cost model"):
        model_search(model, hybrid_features, task, plan)
    best = exact_plan(model, hybrid_features, task)
    assert predicted_bottleneck(model, hybrid_features, task, best) <= predicted_bottleneck(
        model, hybrid_features, task, plan) + 1e-6


def test_heuristic_shards_weigh_more():
    shards = pd.DataFrame({"kind": ["heuristic", "random", "test_heuristic", "single"]})
    assert shard_weights(shards, 3.0).tolist() == [3.0, 1.0, 3.0, 1.0]


def test_comparison_and_metrics(features, hybrid_features, single_ms):
    tables = np.arange(len(single_ms))
    train = fused_shards(single_ms, tables[:24], 30, seed=0, kind="heuristic")
    unseen = pd.concat([fused_shards(single_ms, tables[24:], 5, seed=1, kind="test_random"),
                        fused_shards(single_ms, tables[24:], 4, seed=2, kind="test_heuristic")], ignore_index=True)
    singles = pd.DataFrame({"tables": [(int(t),) for t in tables[24:]], "kind": "single", "num_tables": 1,
                            "total_ms": single_ms.loc[tables[24:]].to_numpy()})
    splits = {"test_seen": fused_shards(single_ms, tables[:24], 6, seed=3, kind="random"),
              "test_unseen": pd.concat([singles, unseen], ignore_index=True)}
    sets = model_test_sets(splits)
    assert list(sets) == [SEEN_MULTI, UNSEEN_MULTI, f"{UNSEEN_MULTI} (test_heuristic)",
                          f"{UNSEEN_MULTI} (test_random)"]
    assert len(sets[UNSEEN_MULTI]) == 9 and len(sets[f"{UNSEEN_MULTI} (test_heuristic)"]) == 4
    torch.manual_seed(0)
    feature_only = CostModel.fitted_to(study(CostModelConfig), features)
    table = cost_eval.compare_models(feature_only, fresh(hybrid_features), features, single_ms, train, sets)
    assert len(table) == 3 * len(sets)
    metrics = cost_eval.hybrid_metrics(table, 0.05, best_epoch=7)
    # The untrained hybrid is the plain sum of singles: its MAPE is the factor's, 8% per extra table.
    unseen_multi = sets[UNSEEN_MULTI]
    raw = cost_eval.mape(cost_eval.sum_of_singles(single_ms)(unseen_multi), unseen_multi["total_ms"].to_numpy())
    assert metrics["mape_unseen"] == pytest.approx(raw)
    assert metrics["targets_met"] == {"seen": False, "unseen": False}
    assert metrics["rescaled_sum_mape_unseen"] < metrics["mape_unseen"]
    assert metrics["beats_rescaled_sum"] == {"seen": False, "unseen": False}
    assert metrics["mape"][f"hybrid | {UNSEEN_MULTI}"] == metrics["mape_unseen"]
    assert metrics["best_epoch"] == 7
    curve = pd.DataFrame({"fraction": [1.0], "train_shards": [30]})
    stage = cost_eval.cost_model_metrics(splits, table, cost_eval.FEATURE_ONLY, {SEEN_MULTI: 0.05}, 0.02, curve,
                                         3, 0.01, 9.0, hybrid=metrics)
    written = json.loads(json.dumps(_plain(stage), allow_nan=False))
    assert schema.check(written, cost_eval.CostModelScores, "cost_model.json")["hybrid"]["mape_target"] == 0.05
    del written["hybrid"]["mape_seen"]
    with pytest.raises(ConfigError, match="mape_seen"):
        schema.check(written, cost_eval.CostModelScores, "cost_model.json")


def test_stage_config(smoke_params):
    values = smoke_params["cost_model"]
    cfg = CostStageConfig.from_params(values)
    assert isinstance(cfg.hybrid, HybridConfig) and cfg.hybrid_mape_target == 0.05
    off = CostStageConfig.from_params(values | {"hybrid": values["hybrid"] | {"enabled": False}})
    assert off.hybrid is None
    with pytest.raises(ConfigError, match="cost_model.hybrid.depth: 3 .*unknown parameter"):
        CostStageConfig.from_params(values | {"hybrid": values["hybrid"] | {"depth": 3}})
    with pytest.raises(ConfigError, match="cost_model.hybrid.heuristic_weight"):
        CostStageConfig.from_params(values | {"hybrid": values["hybrid"] | {"heuristic_weight": 0}})


def test_autoshards_architecture_given_the_single_costs_reads_them_and_is_compared_at_equal_data(
        features, single_ms, hybrid_features, tmp_path):
    """`single_cost_input` makes the feature-only model read the 22nd column (the hybrid's
    information without its form): its predictions follow the single costs, it refuses features
    without them, survives saving, and `compare_architectures` scores it beside the hybrid."""
    from autoshard.costmodel.model import load_model
    from autoshard.costmodel.train import fit

    tables = np.arange(len(single_ms))
    train = fused_shards(single_ms, tables[:24], 40, seed=0, kind="heuristic")
    val = fused_shards(single_ms, tables[:24], 10, seed=4, kind="heuristic")
    cfg = study(CostModelConfig, single_cost_input=True, max_epochs=60, patience=20, hidden=32, encoding=16)
    informed = fit(cfg, hybrid_features, tables[:24], train, val, 0, progress=False).model
    assert informed.mean.shape == (22,) and informed.trained_range["dim"][0] <= informed.trained_range["dim"][1]
    doubled = hybrid_features.copy()
    doubled[:, -1] *= 4
    shards = [[0, 1], [2]]
    assert not np.allclose(informed.predict_ms(hybrid_features, shards), informed.predict_ms(doubled, shards))
    with pytest.raises(ConfigError, match="reads the measured single cost"):
        informed.predict_ms(features, shards)
    save_model(informed, tmp_path / "informed.pt")
    np.testing.assert_allclose(load_model(tmp_path / "informed.pt").predict_ms(hybrid_features, shards),
                               informed.predict_ms(hybrid_features, shards), rtol=1e-6)
    sets = {SEEN_MULTI: fused_shards(single_ms, tables[:24], 6, seed=3, kind="random"),
            UNSEEN_MULTI: fused_shards(single_ms, tables[24:], 6, seed=5, kind="random")}
    table = cost_eval.compare_architectures(fresh(hybrid_features), informed, hybrid_features, sets)
    assert set(table["estimator"]) == {cost_eval.EQUAL_HYBRID, cost_eval.INFORMED} and len(table) == 4
    others = cost_eval.compare_models(CostModel.fitted_to(study(CostModelConfig), features), fresh(hybrid_features),
                                      features, single_ms, train, sets)
    metrics = cost_eval.hybrid_metrics(others, 0.05, 3, table)
    informed_unseen = table.set_index(["estimator", "test set"]).loc[(cost_eval.INFORMED, UNSEEN_MULTI), "mape"]
    assert metrics["informed_mape_unseen"] == pytest.approx(informed_unseen)
    assert metrics["equal_data_hybrid_mape_seen"] == pytest.approx(metrics["mape_seen"]), "the same untrained hybrid"

"""Active selection for the hybrid: candidates, uncertainty, the two arms, measuring through the
store, and the metrics."""

import json

import numpy as np
import pandas as pd
import pytest
from study_configs import study

from autoshard.core import schema
from autoshard.core.metrics import _plain
from autoshard.costmodel import accuracy as cost_eval
from autoshard.costmodel import active as act
from autoshard.costmodel.dataset import SEEN_MULTI, UNSEEN_MULTI, model_test_sets
from autoshard.costmodel.hybrid import ActiveConfig, HybridConfig, with_single_costs
from autoshard.costmodel.train import CostStageConfig
from autoshard.data.tasks import make_tasks
from autoshard.measure.backends import make_backend
from autoshard.measure.collect import ProfileConfig
from autoshard.placement.profile_shards import SOURCES, candidate_shards

SMALL = study(HybridConfig, hidden=16, encoding=5, head_hidden=8, max_epochs=40, patience=10, batch_size=32,
              learning_rate=1e-2)
CFG = ActiveConfig(rounds=2, shards_per_round=5, ensemble=2, candidates=60, seeds=2)


@pytest.fixture(scope="module")
def split_tasks(pool, smoke_params):
    return make_tasks(pool.features, smoke_params["tasks"], seed=0)


@pytest.fixture(scope="module")
def single_ms(features):
    return pd.Series(np.random.default_rng(1).lognormal(0.0, 0.8, len(features)), index=range(len(features)))


def truth(single_ms: pd.Series, shard) -> float:
    """A made-up fused cost: the sum of singles, cheaper per extra table."""
    return float(single_ms.loc[list(shard)].sum()) / (1 + 0.08 * (len(shard) - 1))


def shards_of(single_ms: pd.Series, tables: np.ndarray, count: int, seed: int, kind: str) -> pd.DataFrame:
    g = np.random.default_rng(seed)
    keys = {tuple(sorted(g.choice(tables, int(g.integers(2, 8)), replace=False).tolist())) for _ in range(count)}
    return pd.DataFrame([{"tables": k, "kind": kind, "num_tables": len(k), "total_ms": truth(single_ms, k),
                          "forward_ms": 0.0, "backward_ms": 0.0, "rounds": 1} for k in sorted(keys)])


class FakeMeasure:
    """Prices shards with `truth` and records every call."""

    def __init__(self, single_ms: pd.Series):
        self.single_ms, self.calls = single_ms, []

    def __call__(self, shards, kind):
        self.calls.append(list(shards))
        return pd.DataFrame([{"tables": tuple(s), "kind": kind, "num_tables": len(s),
                              "total_ms": truth(self.single_ms, s), "forward_ms": 0.0, "backward_ms": 0.0,
                              "rounds": 1} for s in shards])


@pytest.fixture(scope="module")
def setting(pool, features, split_tasks, single_ms):
    tasks, train_tables, test_tables = split_tasks
    splits = {"train": shards_of(single_ms, train_tables, 40, 0, "random"),
              "val": shards_of(single_ms, train_tables, 10, 1, "random"),
              "test_seen": shards_of(single_ms, train_tables, 12, 2, "random"),
              "test_unseen": shards_of(single_ms, test_tables, 12, 3, "test_random")}
    measured = set().union(*(set(s["tables"]) for s in splits.values()))
    candidates = candidate_shards(pool, tasks, train_tables, CFG.candidates, 0, measured)
    return with_single_costs(features, single_ms), train_tables, splits, candidates, measured


def test_candidates_are_new_distinct_train_shards(pool, split_tasks, setting):
    tasks, train_tables, _ = split_tasks
    _, _, _, candidates, measured = setting
    keys = list(candidates["tables"])
    assert len(keys) == len(set(keys)) <= CFG.candidates and len(keys) > CFG.candidates // 2
    assert not set(keys) & measured
    assert all(set(k) <= set(map(int, train_tables)) and list(k) == sorted(k) and len(k) > 1 for k in keys)
    assert set(candidates["source"]) <= set(SOURCES)
    sizes = candidates.groupby("source")["tables"].agg(lambda s: sorted({len(k) for k in s}))
    assert sizes["pair"] == [2] and set(sizes["small"]) <= {3, 4, 5, 6}
    again = candidate_shards(pool, tasks, train_tables, CFG.candidates, 0, measured)
    pd.testing.assert_frame_equal(candidates, again)


def test_uncertainty_is_a_deterministic_spread(setting):
    x, train_tables, splits, candidates, _ = setting
    shards = list(candidates["tables"][:10])
    spread = act.uncertainty(SMALL, x, train_tables, splits["train"], splits["val"], shards, 2, seed=0)
    assert spread.shape == (10,) and (spread >= 0).all() and spread.max() > 0
    np.testing.assert_array_equal(spread, act.uncertainty(SMALL, x, train_tables, splits["train"], splits["val"],
                                                          shards, 2, seed=0))


def test_arms_choose_apart_and_measure_once_per_round(setting, single_ms, monkeypatch):
    x, train_tables, splits, candidates, _ = setting
    measure = FakeMeasure(single_ms)
    new = act.choose(CFG, SMALL, x, train_tables, splits, candidates, measure, seed=0, progress=False)
    assert len(measure.calls) == CFG.rounds
    for arm in ("active", "uniform"):
        picked = new[new["arm"] == arm]
        assert len(picked) == CFG.rounds * CFG.shards_per_round
        assert picked["tables"].map(tuple).is_unique  # never the same shard twice in an arm
        assert set(picked["tables"].map(tuple)) <= set(candidates["tables"])
    assert new.loc[new["arm"] == "active", "uncertainty"].notna().all()
    assert new.loc[new["arm"] == "uniform", "uncertainty"].isna().all()
    # Round 1's active picks are the candidates the round-1 ensemble is least sure of.
    spread = act.uncertainty(SMALL, x, train_tables, splits["train"], splits["val"], list(candidates["tables"]),
                             CFG.ensemble, seed=1)
    top = {candidates["tables"][i] for i in np.argsort(-spread, kind="stable")[:CFG.shards_per_round]}
    first = new[(new["arm"] == "active") & (new["round"] == 1)]
    assert set(first["tables"].map(tuple)) == top
    assert (first["uncertainty"].min() >= np.sort(spread)[-CFG.shards_per_round] - 1e-12)


def test_run_compares_arms_and_fits_on_everything(setting, single_ms):
    x, train_tables, splits, candidates, _ = setting
    result = act.run(CFG, SMALL, x, train_tables, splits, model_test_sets(splits), candidates,
                     FakeMeasure(single_ms), seed=0, progress=False)
    assert set(result.errors["arm"]) == set(act.ARMS)
    assert len(result.errors) == len(act.ARMS) * CFG.seeds * 2
    assert set(result.paired["comparison"]) == {"active - uniform", "active - base"}
    row = result.paired.iloc[0]
    assert row["ci_low"] <= row["difference"] <= row["ci_high"]
    assert row["p_value"] > 0 and row["shards"] == len(splits["test_seen"]) or row["test set"] != "test_seen"
    if row["p_value"] < 0.01:
        assert row["ci_low"] > 0 or row["ci_high"] < 0, "a clear test result shows in the interval too"
    assert row["difference"] == pytest.approx(row["mape_active"] - row["mape_other"])
    assert result.rounds["shards"].sum() == len(result.measured)
    test = splits["test_seen"]
    assert (result.final.model.predict_ms(x, test["tables"].tolist()) > 0).all()
    metrics = act.active_metrics(result, CFG, len(candidates))
    assert metrics["shards_measured"] == result.measured["tables"].map(tuple).nunique()
    assert set(metrics["paired"]) == {f"{c} | {k}" for c in ("active - uniform", "active - base")
                                      for k in ("seen", "unseen")}
    stage = cost_eval.cost_model_metrics(splits, pd.DataFrame(columns=["estimator", "test set", "mape"]),
                                         cost_eval.FEATURE_ONLY, {SEEN_MULTI: 0.05, UNSEEN_MULTI: 0.1}, 0.02,
                                         pd.DataFrame({"fraction": [1.0]}), 3, 0.01, 9.0, active=metrics)
    written = json.loads(json.dumps(_plain(stage), allow_nan=False))
    assert schema.check(written, cost_eval.CostModelScores, "cost_model.json")["active"]["rounds"] == CFG.rounds


def test_store_measure_reads_what_it_measured(pool, smoke_params, tmp_path):
    cfg = ProfileConfig.from_params(smoke_params["profile"] | {"backend": "analytic", "device": "cpu"})
    backend = make_backend(pool, cfg.backend)
    measure = act.store_measure(pool, backend, cfg, tmp_path, seed=0)
    shards = [(0, 1), (2, 3, 4), (5,)]
    first = measure(shards, "active_round_1")
    assert sorted(first["tables"].map(tuple)) == sorted(shards) and (first["total_ms"] > 0).all()
    filed = sorted(tmp_path.rglob("batch-*.json"))
    assert filed
    again = measure(shards, "active_round_1")
    assert sorted(tmp_path.rglob("batch-*.json")) == filed  # read, not measured again
    pd.testing.assert_frame_equal(first, again)


def test_stage_config_turns_active_off(smoke_params):
    values = smoke_params["cost_model"]
    assert isinstance(CostStageConfig.from_params(values).active, ActiveConfig)
    off = CostStageConfig.from_params(values | {"active": values["active"] | {"enabled": False}})
    assert off.active is None
    no_hybrid = CostStageConfig.from_params(values | {"hybrid": values["hybrid"] | {"enabled": False}})
    assert no_hybrid.active is None


def test_plan_devices_weigh_as_heuristic_shards(setting, single_ms):
    x, train_tables, splits, candidates, _ = setting
    new = act.choose(CFG, SMALL, x, train_tables, splits, candidates, FakeMeasure(single_ms), seed=0, progress=False)
    planner = new["source"] == "planner"
    assert planner.any() and new.loc[planner, "kind"].str.contains("heuristic").all()
    assert not new.loc[~planner, "kind"].str.contains("heuristic").any()


def test_running_out_of_candidates_stops_the_rounds(setting, single_ms):
    x, train_tables, splits, candidates, _ = setting
    measure = FakeMeasure(single_ms)
    few = candidates.iloc[:7]
    new = act.choose(CFG, SMALL, x, train_tables, splits, few, measure, seed=0, progress=False)
    assert len(measure.calls) == 2 and (new["arm"] == "active").sum() == 7  # 5, then the 2 left
    none = act.choose(CFG, SMALL, x, train_tables, splits, candidates.iloc[:0], measure, seed=0, progress=False)
    assert none.empty and len(measure.calls) == 2


def test_paired_test_on_degenerate_differences():
    g = np.random.default_rng(0)
    assert all(np.isnan(v) for v in act._paired_test(np.array([0.1]), g))
    low, high, p = act._paired_test(np.zeros(5), g)
    assert np.isnan(low) and np.isnan(high) and p == 1.0
    low, high, p = act._paired_test(np.array([-0.1, -0.2, -0.15, -0.05, -0.12, -0.3]), g)
    assert high < 0 and p < 0.05

"""Stage contracts: each stage's metrics builder, on small frames, gives strict JSON that holds its
schema; `check` names the file and the key that breaks one; targets come from the parameters."""

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from study_configs import study

from autoshard.core import schema
from autoshard.core.errors import ConfigError
from autoshard.core.metrics import _plain
from autoshard.core.schema import check
from autoshard.costmodel.accuracy import CostModelScores
from autoshard.data.calibration import Synthesis
from autoshard.measure.analysis import Profile
from autoshard.rl.validation import RLTraining
from autoshard.studies.ablation import Ablation
from autoshard.studies.columns import Columns
from autoshard.studies.transfer import Transfer

# Each stage's contract, in the module of the builder that returns it (module, builder).
CONTRACTS = {
    Synthesis: ("autoshard.data.calibration", "synthesis_metrics"),
    Profile: ("autoshard.measure.analysis", "profile_metrics"),
    CostModelScores: ("autoshard.costmodel.accuracy", "cost_model_metrics"),
    RLTraining: ("autoshard.rl.validation", "train_rl_metrics"),
    Transfer: ("autoshard.studies.transfer", "transfer_metrics"),
    Ablation: ("autoshard.studies.ablation", "ablation_metrics"),
    Columns: ("autoshard.studies.columns", "columns_metrics"),
}


def as_written(metrics: dict, kind: type) -> dict:
    """`metrics` as the metrics file holds them, checked against `kind`."""
    plain = _plain(metrics)
    json.dumps(plain, allow_nan=False)
    return check(plain, kind, "test.json")


def test_each_stage_contract_lives_beside_its_builder_and_core_keeps_none():
    """A contract moved back into core, or a builder that returns something else, breaks this."""
    import importlib
    import typing

    for contract, (module, builder) in CONTRACTS.items():
        assert contract.__module__ == module, contract
        hints = typing.get_type_hints(getattr(importlib.import_module(module), builder))
        assert hints["return"] is contract, (module, builder)
        assert not hasattr(schema, contract.__name__), f"core.schema still holds {contract.__name__}"
        assert issubclass(contract, dict) and "seconds" in typing.get_type_hints(contract)


def test_check_names_the_file_and_the_missing_key(ablation_metrics):
    broken = {k: v for k, v in ablation_metrics.items() if k != "seeds"}
    with pytest.raises(ConfigError, match=r"^reports/metrics/ablation\.json: key 'seeds' is missing$"):
        check(broken, Ablation, "reports/metrics/ablation.json")
    variants = [{k: v for k, v in ablation_metrics["variants"][0].items() if k != "label"}]
    with pytest.raises(ConfigError, match=r"key 'variants\[0\]\.label' is missing"):
        check(ablation_metrics | {"variants": variants}, Ablation, "a.json")


def test_check_names_a_mistyped_key(transfer_metrics):
    with pytest.raises(ConfigError, match=r"a\.json: key 'points' holds '4' \(str\), expected an integer"):
        check(transfer_metrics | {"points": "4"}, Transfer, "a.json")
    axes = {"tables": {"rl_greedy": {"10": {**transfer_metrics["axes"]["tables"]["rl_greedy"]["10"], "tasks": 2.5}}}}
    with pytest.raises(ConfigError, match=r"key 'axes\.tables\.rl_greedy\.10\.tasks' holds 2\.5"):
        check(transfer_metrics | {"axes": axes}, Transfer, "a.json")
    with pytest.raises(ConfigError, match=r"key 'seconds' holds True"):
        check({"seconds": True}, schema.StageTime, "a.json")
    assert check({"seconds": 3, "extra": "kept"}, schema.StageTime, "a.json") == {"seconds": 3, "extra": "kept"}


def test_synthesis_metrics(smoke_params):
    from autoshard.data.calibration import synthesis_metrics
    from autoshard.data.pool import build_pool
    from autoshard.data.tasks import make_tasks

    pool = build_pool(smoke_params["dataset"], smoke_params["pool"], 0, progress=False)
    tasks, _, _ = make_tasks(pool.features, smoke_params["tasks"], 0)
    metrics = as_written(synthesis_metrics(pool, tasks, 1.5), Synthesis)
    assert metrics["tables"] == smoke_params["pool"]["num_tables"] and sum(metrics["tasks"].values()) == len(tasks)


def test_profile_metrics():
    from autoshard.measure.analysis import profile_metrics

    table = pd.DataFrame({
        "shard_id": range(5), "kind": ["single", "single", "heuristic", "repeat", "repeat"],
        "round": [0, 0, 0, 1, 2], "tables": [[0], [1], [0, 1], [0, 1], [0, 1]],
        "num_tables": [1, 1, 2, 2, 2], "status": ["ok"] * 5, "total_ms": [1.0, 2.0, 2.4, 2.6, 2.5],
        "backend": "fbgemm", "device": "cpu", "threads": 1, "batch_size": 256,
        "cv": [0.01, 0.02, 0.03, 0.04, 0.05], "drift": [0.0, 0.0, 0.2, 0.05, 0.05], "attempts": [1, 1, 2, 1, 1]})
    versus = pd.DataFrame({"fbgemm_total_ms": [1.0, 2.0, 3.0], "torch_total_ms": [2.0, 3.0, 7.0]})
    versus["ratio"] = versus["torch_total_ms"] / versus["fbgemm_total_ms"]
    fused = pd.DataFrame({"fbgemm_total_ms": [1.0, 2.0, 3.0], "torch_fused_total_ms": [0.9, 2.4, 2.1]})
    fused["ratio"] = fused["torch_fused_total_ms"] / fused["fbgemm_total_ms"]
    harness = pd.DataFrame({"component": ["forward", "backward"], "fbgemm_harness_ms": [1.0, 2.0],
                            "ours_ms": [1.1, 2.1]})
    comm = {"placements": 4, "device_counts": [2], "batch_size": 256, "heldout_share": 0.25, "mape_heldout": 0.08,
            "mape_heldout_by_world": {"2": 0.08}, "mape_train": 0.05, "mape_heldout_across": 0.1,
            "median_ms_by_world": {"2": 1.0},
            "mape_target": 0.1, "mape_target_met": True}
    protocols = {name: {"shards": 8, "pass_change_median": change, "within_pass_cv_median": 0.02, "seconds": 9.0}
                 for name, change in [("sequential", 0.06), ("interleaved", 0.02)]}
    metrics = as_written(profile_metrics(table, versus, fused, harness, 0.01, 2, 1, 3.0, 0.5, comm, protocols),
                         Profile)
    assert metrics["comm"]["mape_heldout"] == 0.08
    assert metrics["protocol_check"]["interleaved"]["pass_change_median"] == 0.02
    with pytest.raises(ConfigError, match=r"protocol_check\.sequential\.shards"):
        as_written(profile_metrics(table, versus, fused, harness, 0.01, 2, 1, 3.0, 0.5, comm,
                                   {"sequential": protocols["sequential"] | {"shards": "8"}}), Profile)
    assert metrics["cv_target"] == 0.01 and not metrics["cv_target_met"] and metrics["rounds_for_cv_target"] > 1
    assert metrics["torch_fbgemm_kendall_tau"] == 1.0 and metrics["torch_over_fbgemm_median_ratio"] == 2.0
    assert metrics["torch_fused_fbgemm_kendall_tau"] == pytest.approx(1 / 3)
    assert metrics["torch_fused_over_fbgemm_median_ratio"] == pytest.approx(0.9)
    assert metrics["harness_check"]["forward"]["ours_ms"] == 1.1
    assert metrics["noise"] == {"median_cv": 0.03, "round_drift": 0.05, "round_drift_max": 0.2,
                                "remeasured_share": 0.2}


def test_cost_model_metrics(smoke_params):
    from autoshard.costmodel import accuracy as cost_eval
    from autoshard.costmodel.dataset import SEEN_MULTI, UNSEEN_MULTI
    from autoshard.costmodel.train import CostStageConfig

    targets = CostStageConfig.from_params(smoke_params["cost_model"]).mape_targets
    assert targets == {SEEN_MULTI: 0.05, UNSEEN_MULTI: 0.10}
    shards = pd.DataFrame({"tables": [[0, 1], [1, 2], [0, 2], [0, 1, 2]], "num_tables": [2, 2, 2, 3],
                           "total_ms": [1.0, 2.0, 3.0, 4.0]})
    sets = {SEEN_MULTI: shards, UNSEEN_MULTI: shards.iloc[:0]}
    estimators = {"neural (total)": lambda s: s["total_ms"].to_numpy() * 1.01, "sum": lambda s: s["num_tables"] * 1.0}
    comparison = cost_eval.compare(estimators, sets)
    curve = pd.DataFrame({"fraction": [0.5, 1.0], "train_shards": [2, 4], f"{SEEN_MULTI} MAPE": [0.2, 0.1]})
    metrics = as_written(cost_eval.cost_model_metrics({"train": shards, "val": shards.iloc[:1]}, comparison,
                                                      "neural (total)", targets, 0.02, curve, 7, 0.01, 9.0),
                         CostModelScores)
    assert metrics["targets_met"] == {SEEN_MULTI: True, UNSEEN_MULTI: False}, "an empty test set meets no target"
    assert metrics["neural_mape"][UNSEEN_MULTI] is None and metrics["shards"] == {"train": 4, "val": 1}
    table = cost_eval.against_targets(comparison, "neural (total)", targets, 0.02)
    assert table.loc[SEEN_MULTI, "target"] == 0.05 and table.loc[SEEN_MULTI, "MAPE / noise floor (CV)"] > 0


def test_train_rl_metrics():
    from autoshard.rl.validation import ratio_summary, train_rl_metrics

    ratios = pd.DataFrame({"policy, greedy": [0.9, 1.1, 0.95], "cost-model greedy": [1.0, 1.0, 1.2]})
    heuristics = pd.Series({"size_greedy": 1.05, "lookup_greedy": 1.0})
    speed = {"policy greedy, 8x2": 0.01, "TorchRec / policy, 8x2": np.float64(3.0)}
    refresh = pd.DataFrame({"round": [1], "shards_added": [4], "val_ratio": [np.nan]})
    metrics = as_written(train_rl_metrics(ratio_summary(ratios), heuristics, speed, refresh, 6, 2.0),
                         RLTraining)
    assert metrics["validation_win_rate"]["policy, greedy"] == pytest.approx(2 / 3, abs=1e-6)
    assert metrics["refresh"] == [{"round": 1, "shards_added": 4, "val_ratio": None}]


def test_transfer_metrics(transfer_metrics):
    from autoshard.studies.transfer import transfer_metrics as build

    metrics = as_written(transfer_metrics, Transfer)
    assert set(metrics["axes"]["tables"]) == {"rl_greedy", "cost_greedy"}
    assert set(metrics["axes"]["tables"]["rl_greedy"]) == {"10", "320"} and metrics["points"] == 2
    worst = max(metrics["axes"]["tables"]["rl_greedy"].items(), key=lambda kv: kv[1]["ratio_median"])
    assert metrics["rl_greedy_worst"] == {"axis": "tables", "value": float(worst[0]),
                                          "ratio_median": worst[1]["ratio_median"]}
    empty = as_written(build(pd.DataFrame(), 0, 0, 1.0), Transfer)
    assert empty["axes"] == {} and empty["rl_greedy_worst"] is None and empty["points"] == 0


def test_ablation_metrics(ablation_metrics):
    metrics = as_written(ablation_metrics, Ablation)
    assert [v["variant"] for v in metrics["variants"]] == ["full", "no_lstm"]
    assert metrics["seeds"] == [0, 1, 2] and metrics["variants"][1]["vs_full"] == pytest.approx(0.05)


def test_targets_and_sizes_come_from_the_parameters(smoke_params):
    from autoshard.costmodel.train import CostStageConfig
    from autoshard.measure.collect import ProfileConfig
    from autoshard.rl.ppo import RLStageConfig

    assert ProfileConfig.from_params(smoke_params["profile"]).cv_target == 0.03
    rl = RLStageConfig.from_params(smoke_params["rl"])
    assert (rl.speed_tasks, rl.speed_tables, rl.speed_devices) == (3, 856, 128)
    with pytest.raises(ConfigError, match=r"cost_model\.mape_targets\.unseen: -0\.1"):
        CostStageConfig.from_params(smoke_params["cost_model"] | {"mape_targets": {"seen": 0.05, "unseen": -0.1}})
    with pytest.raises(ConfigError, match=r"profile\.cv_target: 0 "):
        ProfileConfig.from_params(smoke_params["profile"] | {"cv_target": 0})
    with pytest.raises(ConfigError, match=r"rl\.speed_devices: 'many'"):
        RLStageConfig.from_params(smoke_params["rl"] | {"speed_devices": "many"})


def test_speed_benchmark_sizes_do_not_change_the_run_key(smoke_params):
    """Resizing the sharding-speed benchmark must not throw away a trained policy."""
    from autoshard.costmodel.model import CostModel, CostModelConfig
    from autoshard.data.features import FEATURE_COLUMNS
    from autoshard.rl.ppo import RLStageConfig, run_key

    x = np.random.default_rng(0).uniform(1, 2, (4, len(FEATURE_COLUMNS)))
    model = CostModel.fitted_to(study(CostModelConfig), x)
    rl = RLStageConfig.from_params(smoke_params["rl"])
    features = np.zeros((4, len(FEATURE_COLUMNS)))
    assert run_key(replace(rl, speed_tables=10, speed_devices=2), model, [], features, 0) == run_key(
        rl, model, [], features, 0)
    assert run_key(replace(rl, best_of=rl.best_of + 1), model, [], features, 0) != run_key(rl, model, [], features, 0)

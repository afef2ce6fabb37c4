"""The ablation study's logic: parameters, variants, feature masking, test tasks, the refit key
and the table it reports; the paper-scale transfer and ablation parameters."""

import numpy as np
import pandas as pd
import pytest

from autoshard.core.errors import ConfigError
from autoshard.core.params import load_params
from autoshard.data.features import FEATURE_COLUMNS, REUSE_COLUMNS
from autoshard.data.tasks import Task
from autoshard.studies import ablation, transfer

from helpers import PROFILE, TIMING, pool_features


def ablation_config(params, **changes):
    return ablation.AblationConfig.from_params(params["ablation"] | changes, params["rl"], PROFILE, TIMING)


def test_ablation_variants_change_one_thing_each(params):
    cfg = ablation_config(params, variants=list(ablation.VARIANTS), iterations=10, refresh_rounds=1,
                          refresh_iterations=4)
    full = cfg.variant("full")
    assert full.rl.iterations == 10 and full.dropped == () and full.refresh_rounds == 0
    assert cfg.variant("no_lstm").rl.policy.use_lstm != full.rl.policy.use_lstm
    assert cfg.variant("no_cost_features").rl.policy.use_cost_features != full.rl.policy.use_cost_features
    assert cfg.variant("other_reward").rl.reward != full.rl.reward
    assert cfg.variant("separate_encoder").rl.policy.state_encoder != full.rl.policy.state_encoder
    assert cfg.variant("no_reuse_histogram").dropped == tuple(REUSE_COLUMNS)
    assert cfg.variant("no_pooling_factor").rl == full.rl
    refresh = cfg.variant("refresh")
    assert refresh.rl.iterations + refresh.refresh_rounds * cfg.refresh_iterations == full.rl.iterations
    assert set(cfg.labels()) == {*ablation.VARIANTS, *ablation.INFERENCE}
    assert cfg.seed_list(7) == [7 + k for k in range(cfg.seeds)]


def test_ablation_parameters_are_checked(params):
    with pytest.raises(ConfigError, match=r"ablation\.variants\[1\]: 'no_attention'"):
        ablation_config(params, variants=["full", "no_attention"])
    with pytest.raises(ConfigError, match=r"ablation\.protocols"):
        ablation_config(params, protocols=["dreamshard", "dreamshard"])
    with pytest.raises(ConfigError, match=r"ablation\.refresh_iterations: 5 "):
        ablation_config(params, variants=["refresh"], iterations=10, refresh_rounds=2, refresh_iterations=5)


def test_masked_features_are_constant_in_the_dropped_columns_only():
    x = pool_features().to_numpy(dtype=float)
    out = ablation.masked(x, ("pooling_factor",))
    i = FEATURE_COLUMNS.index("pooling_factor")
    assert np.ptp(out[:, i]) == 0
    assert np.array_equal(np.delete(out, i, axis=1), np.delete(x, i, axis=1))
    assert np.array_equal(ablation.masked(x, ()), x) and ablation.masked(x, ()) is not x


def test_ablation_test_tasks_cover_every_unseen_ratio(params):
    def task(name, protocol, split, ratio):
        return Task(name, protocol, split, (0, 1), 2, 10, ratio)

    tasks = [task(f"a/{r}/{k}", "autoshard", "test", r) for r in (0.0, 0.5, 1.0) for k in range(3)]
    tasks += [task(f"a/train/{k}", "autoshard", "train", 0.0) for k in range(4)]
    tasks += [task(f"d/train/{k}", "dreamshard", "train", 0.0) for k in range(4)]
    cfg = ablation_config(params, protocols=["autoshard"], test_tasks=4)
    train, test = ablation.split_tasks(tasks, cfg)
    assert [t.name for t in train] == [f"a/train/{k}" for k in range(4)]
    assert [t.unseen_ratio for t in test] == [0.0, 0.5, 1.0, 0.0]
    with pytest.raises(ConfigError, match=r"ablation\.test_tasks: 10 .*only 9"):
        ablation.split_tasks(tasks, ablation_config(params, protocols=["autoshard"], test_tasks=10))


def test_ablation_summary_spread_across_seeds():
    rows = [{"task": f"t{k}", "method": f"{v}|{s}", "measured_ms": base + 0.01 * s + 0.001 * k}
            for v, base in (("full", 0.9), ("no_lstm", 1.0)) for s in (0, 1, 2) for k in range(4)]
    rows += [{"task": f"t{k}", "method": h, "measured_ms": m} for k in range(4) for h, m in (("size_greedy", 1.0),
                                                                                           ("naive", 0.5))]
    predicted = pd.DataFrame(rows).assign(predicted_ms=lambda f: f["method"].map({"size_greedy": 1.0, "naive": 2.0}))
    per_task = ablation.ratios(pd.DataFrame(rows), predicted.set_index(["task", "method"])["predicted_ms"])
    assert per_task["ratio"].min() > 0.85, "the reference is size_greedy (predicted faster), not naive (measured)"
    assert set(per_task["variant"]) == {"full", "no_lstm"} and set(per_task["seed"]) == {0, 1, 2}
    table = ablation.summary(per_task, {"full": "full method", "no_lstm": "MLP"})
    assert list(table.index) == ["full", "no_lstm"]
    assert table.loc["full", "min"] < table.loc["full", "mean"] < table.loc["full", "max"]
    assert table.loc["no_lstm", "vs_full"] == pytest.approx(0.1)
    assert table.loc["full", "std"] == pytest.approx(0.01)


def test_paper_scale_transfer_and_ablation_parameters_are_valid():
    from pathlib import Path

    from autoshard.core.params import merge
    from autoshard.pipeline.stage import select, stage_spec

    root = Path(__file__).resolve().parents[2]
    paper = merge(load_params(root / "params.yaml"), load_params(root / "configs" / "paper.yaml"))
    chosen = select(paper, stage_spec("transfer", root / "dvc.yaml")[1], "paper")
    cfg = transfer.TransferConfig.from_params(chosen["transfer"], chosen["evaluate"],
                                              chosen["profile"] | {"device": "cpu"})
    assert max(cfg.devices) >= 16 and max(cfg.tables) >= 320
    chosen = select(paper, stage_spec("ablation", root / "dvc.yaml")[1], "paper")
    cfg = ablation.AblationConfig.from_params(chosen["ablation"], chosen["rl"], chosen["profile"] | {"device": "cpu"},
                                              chosen["evaluate"])
    assert cfg.seeds >= 3 and set(cfg.protocols) == {"autoshard", "dreamshard"}
    assert all(cfg.variant(v) for v in cfg.variants)


def test_ablation_refit_cost_model_not_reused_after_profile_change(tmp_path):
    """The refitted cost models' cache key reads the profile's and the task split's contents (the
    old key had only file names and sizes): one changed byte, one changed feature or another
    seed is another model; the same inputs find the same one."""
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "shards.parquet").write_bytes(b"measured 1.25 ms")
    (tmp_path / "tasks.json").write_text("{}")
    features = np.arange(12.0).reshape(4, 3)
    base = ablation.refit_key({"epochs": 3}, features, ("pooling_factor",), tmp_path, "fbgemm", 0)
    assert ablation.refit_key({"epochs": 3}, features, ("pooling_factor",), tmp_path, "fbgemm", 0) == base
    other = features.copy()
    other[1, 1] += 1
    assert ablation.refit_key({"epochs": 3}, other, ("pooling_factor",), tmp_path, "fbgemm", 0) != base
    assert ablation.refit_key({"epochs": 3}, features, ("pooling_factor",), tmp_path, "fbgemm", 1) != base
    (tmp_path / "profile" / "shards.parquet").write_bytes(b"measured 1.26 ms")  # same size
    assert ablation.refit_key({"epochs": 3}, features, ("pooling_factor",), tmp_path, "fbgemm", 0) != base

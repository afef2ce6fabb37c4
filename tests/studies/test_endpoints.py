"""The primary endpoints decide as declared: a planted 5% gain is "better", an identical method
"equivalent", noise alone "inconclusive"; Holm widens the family; two passes are refused."""

import numpy as np
import pandas as pd
import pytest

from autoshard.core.errors import ConfigError
from autoshard.studies.endpoints import Endpoint, PrimaryConfig, bca_interval, claim_p_values, primary
from autoshard.studies.paired import holm

TASKS = 40


def measured(gain: float, noise: float = 0.01, seed: int = 0, identical: bool = False) -> pd.DataFrame:
    """A reference and a method on TASKS tasks of two strata: the method `gain` faster (0.05: 5%)."""
    g = np.random.default_rng(seed)
    base = g.uniform(5.0, 20.0, TASKS)
    mine = base if identical else base * (1 - gain) * np.exp(g.normal(0, noise, TASKS))
    rows = [{"task": f"t{i}", "protocol": "autoshard", "method": m, "max_device_ms": v, "unseen_ratio": i % 2 * 0.5,
             "pass": "evaluate"} for i in range(TASKS) for m, v in (("ref", base[i]), ("new", mine[i]))]
    return pd.DataFrame(rows)


def config(*endpoints: Endpoint, sesoi: float = 0.03) -> PrimaryConfig:
    return PrimaryConfig(sesoi=sesoi, alpha=0.05, resamples=999, endpoints=endpoints)


ENDPOINT = Endpoint("new", "ref", "autoshard", "max_device_ms")


def test_a_planted_five_percent_gain_is_better():
    out = primary(measured(0.05), config(ENDPOINT), seed=0)[ENDPOINT.name]
    assert out["verdict"] == "better" and out["p_holm"] < 0.05
    assert out["ci_high"] < 1 - 0.03 and out["median_ratio"] == pytest.approx(0.95, abs=0.01)
    assert out["tasks"] == TASKS and out["pass"] == "evaluate"


def test_a_planted_five_percent_loss_is_worse_and_an_identical_method_is_equivalent():
    assert primary(measured(-0.05), config(ENDPOINT), seed=0)[ENDPOINT.name]["verdict"] == "worse"
    same = primary(measured(0.0, identical=True), config(ENDPOINT), seed=0)[ENDPOINT.name]
    assert same["verdict"] == "equivalent" and same["median_ratio"] == 1.0 and same["identical_share"] == 1.0


def test_a_method_identical_but_for_measurement_noise_is_equivalent():
    """No planted change, 1% noise per task, sesoi 3%: both one-sided tests reject."""
    out = primary(measured(0.0, noise=0.01), config(ENDPOINT), seed=0)[ENDPOINT.name]
    assert out["verdict"] == "equivalent" and 0.97 < out["ci_low"] <= out["ci_high"] < 1.03
    assert out["identical_share"] in (None, 0.0)


def test_a_gain_smaller_than_the_sesoi_is_not_better():
    """2% faster with a 3% smallest effect of interest: neither better nor (with this noise) worse."""
    out = primary(measured(0.02, noise=0.03), config(ENDPOINT), seed=1)[ENDPOINT.name]
    assert out["verdict"] in ("equivalent", "inconclusive") and out["verdict"] != "better"


def test_an_endpoint_without_tasks_is_an_error_and_failures_are_counted():
    with pytest.raises(ConfigError, match="new__vs__gone__autoshard has no task where both arms were measured"):
        primary(measured(0.05), config(Endpoint("new", "gone", "autoshard", "max_device_ms")), seed=0)
    frame = measured(0.05)
    frame.loc[(frame["method"] == "new") & frame["task"].isin(["t0", "t1", "t2"]), "max_device_ms"] = np.nan
    out = primary(frame, config(ENDPOINT), seed=0)[ENDPOINT.name]
    assert out["failed"] == 3 and out["tasks"] == TASKS - 3


def test_one_family_holm_over_every_claim():
    """Seven endpoints: 21 hypotheses adjusted together, so a claim needs more than alone."""
    alone = primary(measured(0.05, noise=0.05, seed=3), config(ENDPOINT), seed=0)[ENDPOINT.name]
    frames = [measured(0.05, noise=0.05, seed=3).assign(protocol=f"p{k}") for k in range(7)]
    many = config(*(Endpoint("new", "ref", f"p{k}", "max_device_ms") for k in range(7)))
    family = primary(pd.concat(frames, ignore_index=True).assign(task=lambda f: f["protocol"] + f["task"]), many, 0)
    assert family["new__vs__ref__p0"]["p_holm"] > alone["p_holm"]


def test_too_few_tasks_are_inconclusive():
    few = measured(0.2)
    few = few[few["task"].isin([f"t{i}" for i in range(4)])]
    out = primary(few, config(ENDPOINT), seed=0)[ENDPOINT.name]
    assert out["verdict"] == "inconclusive" and out["p_holm"] is None


def test_holm_adjusts_across_the_family():
    adjusted = holm([0.01, 0.04, None, 0.03])
    assert adjusted[2] is None and [adjusted[i] for i in (0, 1, 3)] == pytest.approx([0.03, 0.06, 0.06])
    raw = claim_p_values(np.log(np.full(10, 0.9)) + np.linspace(-0.01, 0.01, 10), 0.03)
    assert raw["better"] < 0.01 and raw["worse"] > 0.5


def test_a_ratio_across_two_passes_is_refused():
    mixed = measured(0.05)
    mixed.loc[(mixed["task"] == "t3") & (mixed["method"] == "ref"), "pass"] = "ablation"
    with pytest.raises(ValueError, match="t3 has plans from different passes"):
        primary(mixed, config(ENDPOINT), seed=0)


def test_the_bca_interval_covers_the_median_and_survives_degenerate_data():
    logs = np.random.default_rng(2).normal(-0.05, 0.02, 30)
    lo, hi, how = bca_interval(logs, np.repeat([0, 1, 2], 10), 999, 0, "x")
    assert lo < np.median(logs) < hi and hi - lo < 0.03 and how == "BCa"
    assert bca_interval(np.zeros(8), np.zeros(8), 999, 0, "x") == (0.0, 0.0, "degenerate")
    lo, hi, how = bca_interval(logs[:5], np.array([0, 0, 0, 0, 1]), 999, 0, "x")  # a stratum of one task joins one
    assert lo <= hi and how in ("BCa", "percentile")


def test_the_family_is_read_from_params_and_bad_entries_are_refused():
    section = {"sesoi": 0.05, "alpha": 0.05, "resamples": 999,
               "endpoints": [{"method": "rl_greedy", "reference": "cost_greedy", "protocol": "autoshard",
                              "cost": "max_device_ms"}]}
    cfg = PrimaryConfig.from_params(section, ("rl_greedy", "cost_greedy"), ("autoshard",), 0.04)
    assert cfg.endpoints == (Endpoint("rl_greedy", "cost_greedy", "autoshard", "max_device_ms"),)
    with pytest.raises(ConfigError, match=r"primary.endpoints\[0\].method: 'nope'"):
        PrimaryConfig.from_params({**section, "endpoints": [{**section["endpoints"][0], "method": "nope"}]},
                                  ("rl_greedy", "cost_greedy"), ("autoshard",), 0.04)
    with pytest.raises(ConfigError, match="declared twice"):
        PrimaryConfig.from_params({**section, "endpoints": section["endpoints"] * 2},
                                  ("rl_greedy", "cost_greedy"), ("autoshard",), 0.04)
    with pytest.raises(ConfigError, match=r"evaluate\.timing\.drift_limit: 0\.05 .*below primary\.sesoi"):
        PrimaryConfig.from_params(section, ("rl_greedy", "cost_greedy"), ("autoshard",), 0.05)

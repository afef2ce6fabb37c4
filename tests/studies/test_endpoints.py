"""The primary endpoints decide as declared: a planted 5% gain is "better", an identical method
"equivalent", noise alone "inconclusive"; Holm widens the family; two passes are refused; the
verdict holds across replicates of the chain; a family changed without an amendment is refused."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from autoshard.core.errors import ConfigError
from autoshard.studies.endpoints import (
    Endpoint,
    PrimaryConfig,
    Registration,
    claim_p_values,
    entries,
    family_digest,
    primary,
    replica,
    two_level_interval,
)
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
    assert out["identical_share"] == 0.0 and out["note"] == ""


def test_a_gain_smaller_than_the_sesoi_is_equivalent_not_better():
    """2% faster with a 3% smallest effect of interest, 3% noise on 40 tasks: the interval lies inside
    the band of no interest, so the gain is too small to matter: equivalent, never better."""
    out = primary(measured(0.02, noise=0.03), config(ENDPOINT), seed=1)[ENDPOINT.name]
    assert out["verdict"] == "equivalent" and out["p_claims"]["better"] == 1.0
    assert 0.97 < out["ci_low"] < out["median_ratio"] < 1.0 < out["ci_high"] < 1.03


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


def test_the_two_level_interval_covers_the_median_and_survives_degenerate_data():
    logs = np.random.default_rng(2).normal(-0.05, 0.02, 30)
    lo, hi, mc, how = two_level_interval(logs[None, :], np.repeat([0, 1, 2], 10), 4000, 0, "x")
    assert lo < np.median(logs) < hi and hi - lo < 0.03 and how.startswith("percentile")
    assert 0 <= mc < 0.2 * (hi - lo), "4,000 resamples pin each end to a small part of the width"
    other = two_level_interval(logs[None, :], np.repeat([0, 1, 2], 10), 4000, 1, "x")
    assert abs(other[0] - lo) <= 4 * mc + 1e-12 and abs(other[1] - hi) <= 4 * mc + 1e-12, "another seed: within MC"
    assert two_level_interval(np.zeros((3, 8)), np.zeros(8), 999, 0, "x")[:3] == (0.0, 0.0, 0.0)
    lo, hi, _, _ = two_level_interval(logs[None, :5], np.array([0, 0, 0, 0, 1]), 999, 0, "x")  # a lone stratum joins
    assert logs[:5].min() <= lo <= hi <= logs[:5].max()


def test_the_monte_carlo_error_falls_with_the_resamples():
    logs = np.random.default_rng(4).normal(0.0, 0.05, (5, 40))
    few = two_level_interval(logs, np.zeros(40), 500, 0, "x")[2]
    many = two_level_interval(logs, np.zeros(40), 20000, 0, "x")[2]
    assert many < few / 3, "the error of a quantile falls as 1 / sqrt(resamples): 40x the draws, ~6x smaller"


def replicated(gains: list[float], noise: float = 0.01, seed: int = 0) -> pd.DataFrame:
    """Replicate r's method `gains[r]` faster than the reference on every task, all in one pass;
    the reference (not chained) measured once per task."""
    g = np.random.default_rng(seed)
    base = g.uniform(5.0, 20.0, TASKS)
    rows = [{"task": f"t{i}", "protocol": "autoshard", "method": "ref", "max_device_ms": base[i],
             "unseen_ratio": i % 2 * 0.5, "pass": "evaluate"} for i in range(TASKS)]
    for r, gain in enumerate(gains):
        mine = base * (1 - gain) * np.exp(g.normal(0, noise, TASKS))
        rows += [{**rows[i], "method": replica("new", r), "max_device_ms": mine[i]} for i in range(TASKS)]
    return pd.DataFrame(rows)


def test_the_verdict_is_the_methods_across_replicates():
    """Five chains: the per-task value is their mean log ratio, each replicate's median is
    reported, and one lucky chain cannot carry the verdict alone."""
    cfg = config(ENDPOINT)
    out = primary(replicated([0.08, 0.07, 0.09, 0.08, 0.08]), cfg, 0, replicates=5, chained=frozenset({"new"}))
    e = out[ENDPOINT.name]
    assert e["verdict"] == "better" and e["replicates"] == 5 and len(e["replicate_medians"]) == 5
    assert e["replicate_medians"][2] == pytest.approx(0.91, abs=0.01) and e["interval"].startswith("two-level")
    lucky = primary(replicated([0.08, 0.0, 0.0, 0.0, 0.0]), cfg, 0, replicates=5, chained=frozenset({"new"}))
    one = primary(replicated([0.08]), cfg, 0)
    assert one[ENDPOINT.name]["verdict"] == "better", "the first chain alone looks better"
    assert lucky[ENDPOINT.name]["verdict"] != "better", "across five chains it is not"
    assert lucky[ENDPOINT.name]["median_ratio"] == pytest.approx(np.exp(np.log(0.92) / 5), abs=0.01)


def test_identical_plans_are_counted_and_named_in_the_note():
    frame = measured(0.0, identical=True)
    e = primary(frame, config(ENDPOINT), seed=0)[ENDPOINT.name]
    assert e["identical_share"] == 1.0 and "identity" in e["note"]
    assert primary(measured(0.05), config(ENDPOINT), seed=0)[ENDPOINT.name]["note"] == ""


def test_every_endpoint_gets_one_of_the_four_verdicts_and_the_record_travels():
    cfg = PrimaryConfig(0.03, 0.05, 999, (ENDPOINT,), Registration("abc1234", "2026-12-01", "d", ()))
    out = primary(measured(0.05), cfg, 0)
    assert out["registered"] == {"commit": "abc1234", "date": "2026-12-01", "family": "d"}
    assert out["amendments"] == [] and list(entries(out)) == [ENDPOINT.name]


ONE = (Endpoint("rl_greedy", "cost_greedy", "autoshard", "max_device_ms"),)


def registered(family: str = family_digest(ONE, 0.05, 0.05), amendments: list | None = None) -> dict:
    return {"registered": {"commit": "abc1234", "date": "2026-12-01", "family": family},
            "amendments": amendments or []}


def test_a_family_changed_without_an_amendment_is_refused():
    section = {"sesoi": 0.05, "alpha": 0.05, "resamples": 999, **registered(),
               "endpoints": [{"method": "rl_greedy", "reference": "cost_greedy", "protocol": "autoshard",
                              "cost": "max_device_ms"}]}
    methods = ("rl_greedy", "cost_greedy", "lpt_measured")
    assert PrimaryConfig.from_params(section, methods, ("autoshard",), 0.04).registration.amendments == ()
    grown = {**section, "endpoints": [*section["endpoints"], {**section["endpoints"][0], "reference": "lpt_measured"}]}
    with pytest.raises(ConfigError, match="differs from the one on record"):
        PrimaryConfig.from_params(grown, methods, ("autoshard",), 0.04)
    with pytest.raises(ConfigError, match="differs from the one on record"):
        PrimaryConfig.from_params({**section, "sesoi": 0.03}, methods, ("autoshard",), 0.02)
    two = ONE + (Endpoint("rl_greedy", "lpt_measured", "autoshard", "max_device_ms"),)
    amended = {**grown, **registered(amendments=[{"date": "2026-12-06", "commit": "def5678", "change": "added one",
                                                  "why": "a test", "results_seen": True,
                                                  "family": family_digest(two, 0.05, 0.05)}])}
    cfg = PrimaryConfig.from_params(amended, methods, ("autoshard",), 0.04)
    assert cfg.registration.amendments[0].results_seen and len(cfg.endpoints) == 2


def test_the_study_family_matches_its_record():
    from autoshard.core.params import load_params
    from autoshard.methods.registry import METHODS
    from autoshard.studies.evaluate import PROTOCOLS

    params = load_params(Path(__file__).resolve().parents[2] / "params.yaml")
    cfg = PrimaryConfig.from_params(params["primary"], METHODS, PROTOCOLS, params["evaluate"]["timing"]["drift_limit"])
    assert cfg.registration.commit == "286cb2b" and len(cfg.registration.amendments) >= 4
    assert any("headroom gate removed" in a.change for a in cfg.registration.amendments)


def test_the_family_is_read_from_params_and_bad_entries_are_refused():
    section = {"sesoi": 0.05, "alpha": 0.05, "resamples": 999, **registered(),
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

"""Paired statistics: known answers, determinism, strict JSON."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from autoshard.studies.paired import (
    KEYS,
    all_pairs,
    canonical,
    compare,
    holm,
    minimum_detectable_effect,
    same_split,
    selection_bias,
    wilcoxon_p,
    with_best,
)


def bottlenecks(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(1, 0.5, n)


def test_identical_methods():
    ref = bottlenecks(20)
    out = compare(ref.copy(), ref, identical=np.ones(20, bool), noise_sd=0.02)
    assert out["tasks"] == 20 and out["median_ratio"] == 1.0 and out["p_value"] == 1.0
    assert out["ci_low"] <= 1.0 <= out["ci_high"] and out["identical_share"] == 1.0
    assert list(out) == list(KEYS)


def test_ten_percent_better_everywhere():
    ref = bottlenecks(20)
    out = compare(0.9 * ref, ref)
    assert out["median_ratio"] == pytest.approx(0.9)
    assert out["ci_low"] == pytest.approx(0.9) and out["ci_high"] == pytest.approx(0.9)
    assert out["p_value"] < 1e-4


def test_mixed_effect_has_an_interval_around_its_median():
    ref = bottlenecks(40)
    factor = np.random.default_rng(3).lognormal(np.log(0.95), 0.05, 40)
    out = compare(factor * ref, ref, resamples=500)
    assert out["ci_low"] < out["median_ratio"] < out["ci_high"] < 1.0


def test_stratified_bootstrap_is_deterministic_for_a_seed():
    ref = bottlenecks(30)
    method = ref * np.random.default_rng(1).lognormal(0, 0.1, 30)
    strata = np.repeat([0.0, 0.5, 1.0], 10)
    first, again = (compare(method, ref, strata=strata, seed=7, keys=("p", "m"), resamples=50) for _ in range(2))
    other = compare(method, ref, strata=strata, seed=8, keys=("p", "m"), resamples=50)
    assert first == again
    assert (first["ci_low"], first["ci_high"]) != (other["ci_low"], other["ci_high"])


def test_bootstrap_keeps_each_stratum_s_task_count():
    # 10 tasks at ratio 0.5, 11 at 2: a resample within strata always has 11 at 2, so its median is 2.
    ref = np.ones(21)
    method = np.r_[np.full(10, 0.5), np.full(11, 2.0)]
    strata = np.r_[np.zeros(10), np.ones(11)]
    assert compare(method, ref, strata=strata)["ci_low"] == pytest.approx(2.0)
    assert compare(method, ref)["ci_low"] == pytest.approx(0.5)


def test_one_task_per_stratum_gives_a_point_interval():
    out = compare(np.array([1.0, 2.0]), np.array([2.0, 2.0]), strata=np.array(["a", "b"]))
    assert out["ci_low"] == out["ci_high"] == pytest.approx(np.sqrt(0.5))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(st.floats(0.01, 100), st.just(float("nan")), st.just(0.0)), min_size=0, max_size=6),
       st.integers(0, 3))
def test_never_nan_and_strict_json(values, shift):
    method = np.array(values, dtype=float)
    reference = np.roll(method, shift) if len(method) else method
    out = compare(method, reference, identical=np.zeros(len(method), bool), noise_sd=0.03, resamples=50)
    json.dumps(out, allow_nan=False)
    assert isinstance(out["tasks"], int)
    assert all(v is None or isinstance(v, float) for k, v in out.items() if k != "tasks")


def test_no_usable_task():
    out = compare(np.array([np.nan]), np.array([1.0]), noise_sd=0.02)
    assert out == dict.fromkeys(KEYS) | {"tasks": 0}


def test_canonical_ignores_device_names():
    assert canonical(np.array([2, 2, 0, 1])) == canonical(np.array([1, 1, 3, 0])) == (0, 0, 1, 2)
    assert same_split(np.array([0, 1, 1]), np.array([1, 0, 0]))
    assert not same_split(np.array([0, 1, 1]), np.array([0, 0, 1]))
    assert same_split(None, None) and not same_split(None, np.array([0]))
    assert not same_split(np.array([0, 1]), np.array([0, 1, 1])), "another number of tables is another split"


def test_minimum_detectable_effect_formula():
    assert minimum_detectable_effect(0.05, 50) == pytest.approx(np.expm1(2.8016 * np.sqrt(2) * 0.05 / np.sqrt(50)),
                                                                rel=1e-4)
    assert minimum_detectable_effect(0.02, 200) < minimum_detectable_effect(0.02, 50)


def test_holm():
    assert holm([0.01, 0.04, 0.03, None]) == pytest.approx([0.03, 0.06, 0.06, None])
    assert holm([0.02, 0.9]) == pytest.approx([0.04, 0.9]) and holm([0.5, 0.9]) == [1.0, 1.0]
    assert holm([]) == []


def test_all_pairs_on_a_results_frame():
    tasks = [f"t{i}" for i in range(12)]
    base = bottlenecks(12)
    rows = []
    for i, t in enumerate(tasks):
        split = np.array([0, 1, 0, 1])
        rows += [{"task": t, "protocol": "p", "unseen_ratio": i % 3, "method": "size_greedy",
                  "measured_ms": base[i], "predicted_ms": 1.0, "placement": split},
                 {"task": t, "protocol": "p", "unseen_ratio": i % 3, "method": "dim_greedy",
                  "measured_ms": 1.2 * base[i], "predicted_ms": 2.0, "placement": None if i == 0 else 1 - split},
                 {"task": t, "protocol": "p", "unseen_ratio": i % 3, "method": "rl_greedy",
                  "measured_ms": 0.9 * base[i], "placement": np.array([0, 0, 1, 1])}]
    results = with_best(pd.DataFrame(rows), ["size_greedy", "dim_greedy"], "best_heuristic")
    out = all_pairs(results, ["best_heuristic", "size_greedy"], strata="unseen_ratio", noise_sd={"p": 0.03},
                    resamples=200)
    pairs = out["p"]
    assert set(pairs) == {"size_greedy__vs__best_heuristic", "dim_greedy__vs__best_heuristic",
                          "rl_greedy__vs__best_heuristic", "best_heuristic__vs__size_greedy",
                          "dim_greedy__vs__size_greedy", "rl_greedy__vs__size_greedy"}
    assert pairs["size_greedy__vs__best_heuristic"]["identical_share"] == 1.0
    assert pairs["dim_greedy__vs__size_greedy"]["identical_share"] == pytest.approx(11 / 12)
    assert pairs["rl_greedy__vs__best_heuristic"]["median_ratio"] == pytest.approx(0.9)
    assert pairs["rl_greedy__vs__best_heuristic"]["identical_share"] == 0.0
    json.dumps(out, allow_nan=False)


def test_the_best_heuristic_is_chosen_on_predictions_not_on_the_measurements_that_score_it():
    # size_greedy is predicted faster on every task, dim_greedy measured faster on half of them
    rows = []
    for i in range(6):
        rows += [{"task": f"t{i}", "method": "size_greedy", "measured_ms": 10.0, "predicted_ms": 1.0, "pass": "a"},
                 {"task": f"t{i}", "method": "dim_greedy", "measured_ms": 8.0 if i % 2 else 12.0,
                  "predicted_ms": 2.0, "pass": "a"}]
    frame = pd.DataFrame(rows)
    best = with_best(frame, ["size_greedy", "dim_greedy"], "best_heuristic")
    assert (best.loc[best["method"] == "best_heuristic", "measured_ms"] == 10.0).all(), "chosen by prediction"
    bias = selection_bias(frame, ["size_greedy", "dim_greedy"])
    assert bias["oracle_over_chosen_median"] == pytest.approx(-0.1) and bias["tasks_differing"] == 3
    assert bias["chosen_by"] == "predicted_ms" and bias["tasks"] == 6
    with pytest.raises(ValueError, match="different passes"):
        selection_bias(frame.assign(**{"pass": ["a", "b"] * 6}), ["size_greedy", "dim_greedy"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([-2.0, -1.0, -0.5, 0.0, 0.25, 1.0, 3.0]), min_size=1, max_size=15),
       st.sampled_from([1.0, 1e-3, 0.37]))
def test_wilcoxon_p_equals_scipy_bit_for_bit(values, scale):
    """Ties and zeros on up to 13 tasks take the vectorised sign-flip path; it must match SciPy exactly."""
    d = np.array(values) * scale
    expected = 1.0 if not np.any(d != 0) else stats.wilcoxon(d, zero_method="wilcox").pvalue
    assert wilcoxon_p(d) == (1.0 if math.isnan(expected) else expected)


def test_all_pairs_identical_share_matches_same_split_per_task():
    gen = np.random.default_rng(3)
    rows = [{"protocol": p, "task": f"t{t}", "method": m, "measured_ms": gen.lognormal(),
             "placement": None if gen.random() < 0.2 else gen.integers(0, 2, 4)}
            for p in ("a", "b") for t in range(30) for m in ("x", "y", "z")]
    frame = pd.DataFrame(rows)
    out = all_pairs(frame, ["x"], resamples=50)
    for (protocol, method), g in frame.groupby(["protocol", "method"]):
        if method == "x":
            continue
        ref = frame[(frame["protocol"] == protocol) & (frame["method"] == "x")].set_index("task")["placement"]
        expected = np.mean([same_split(a, ref[t]) for t, a in zip(g["task"], g["placement"], strict=True)])
        assert out[protocol][f"{method}__vs__x"]["identical_share"] == expected

"""The evaluate stage's findings on small frames: quality, paired comparisons, replicates, the answer."""

import json

import numpy as np
import pandas as pd
import pytest

from autoshard.core.metrics import _plain
from autoshard.core.schema import check
from autoshard.data.tasks import Task
from autoshard.studies.endpoints import Endpoint, PrimaryConfig, primary
from autoshard.studies.evaluate import ComputeOnlyPairs, Evaluation, HeadlineObjective, NoiseTargets
from autoshard.studies.findings import (
    direction,
    measurement_quality,
    paired_comparisons,
    paired_frame,
    paired_max_device,
    paired_synchronized,
    per_task_ratios,
    plain_answer,
    repeat_summary,
    replicate_summary,
    synchronized_answer,
)
from autoshard.studies.memory import failed_counts
from autoshard.studies.stats import evaluate_metrics, summary, with_ratios

ENDPOINT = Endpoint("rl_greedy", "cost_greedy", "autoshard", "max_device_ms")
TARGETS = NoiseTargets(median_cv=0.03, plan_repeat_change=0.01)


def devices(cv: float) -> pd.DataFrame:
    return pd.DataFrame({"task": ["a", "a", "b"], "shard": ["1,2", "3", "1,2"], "tables": [2, 1, 2],
                         "cv": [cv, cv, cv], "drift": [0.01, 0.01, 0.2], "remeasured": [False, False, True]})


def repeat(change: float) -> pd.DataFrame:
    return pd.DataFrame({"protocol": ["p"] * 4, "relative_change": [change, -change, change, -change]})


def test_measurement_quality_against_the_targets():
    quiet = measurement_quality(devices(0.01), repeat(0.005), TARGETS)
    assert quiet["met"] and quiet["median_cv"] == 0.01 and quiet["remeasured_share"] == 0.5
    assert quiet["round_drift"] == np.median([0.01, 0.2]) and quiet["noise_sd"]["p"] > 0
    assert not measurement_quality(devices(0.05), repeat(0.005), TARGETS)["met"], "a noisy shard CV fails"
    assert not measurement_quality(devices(0.01), repeat(0.02), TARGETS)["met"], "a moving plan fails"
    json.dumps(_plain(quiet), allow_nan=False)
    measured = devices(0.01).assign(method="m", comm_source="measured", comm_cv=0.2)
    with_comm = measurement_quality(measured, repeat(0.005), TARGETS)
    assert with_comm["comm_round_cv"] == 0.2 and with_comm["comm_plans"] == measured.groupby(["task", "method"]).ngroups
    assert "comm_round_cv" not in quiet, "no measured all-to-all, no comm noise"
    crowded = measurement_quality(measured.assign(comm_source="measured-oversubscribed"), repeat(0.005), TARGETS)
    assert crowded["comm_round_cv"] == 0.2, "an oversubscribed all-to-all was timed too: its noise counts"
    modelled = measurement_quality(measured.assign(comm_source="measured-model"), repeat(0.005), TARGETS)
    assert "comm_round_cv" not in modelled, "a modelled all-to-all has no round noise"
    compute = measurement_quality(devices(0.01), repeat(0.005), TARGETS, repeat(0.02))
    assert compute["noise_sd_max_device"]["p"] > compute["noise_sd"]["p"], "the compute bottleneck's own noise"
    assert "noise_sd_max_device" not in quiet


def ratios_frame(rl_factor: float, tasks: int = 12) -> tuple[pd.DataFrame, dict, list[str]]:
    g = np.random.default_rng(0)
    rows, plans = [], {}
    names = [f"t{i}" for i in range(tasks)]
    base = g.uniform(5, 10, tasks)
    for method, factor in [("size_greedy", 1.0), ("lookup_greedy", 1.05), ("cost_greedy", 0.9),
                           ("lpt_measured", 0.9), ("milp", 0.89), ("torchrec", 0.95), ("rl_greedy", rl_factor)]:
        noise = g.normal(0, 0.002, tasks)
        for i, name in enumerate(names):
            rows.append({"task": name, "protocol": "autoshard", "method": method, "measured_ms": base[i] * factor
                         * (1 + noise[i]), "predicted_ms": base[i] * factor, "unseen_ratio": [0.0, 1.0][i % 2]})
        plans[method] = [np.array([0, 1, int(factor * 100) % 2]) for _ in names]
    return pd.DataFrame(rows), plans, names


def test_paired_comparisons_and_the_answer():
    frame, plans, names = ratios_frame(rl_factor=0.8)
    pairs = paired_comparisons(frame, plans, names, {"autoshard": 0.002}, resamples=200, seed=0)
    s = pairs["autoshard"]["rl_greedy__vs__cost_greedy"]
    assert set(s) == {"tasks", "median_ratio", "ci_low", "ci_high", "p_value", "identical_share", "mde"}
    assert s["tasks"] == 12 and abs(s["median_ratio"] - 0.8 / 0.9) < 0.01 and s["ci_high"] < 1
    assert "rl_greedy__vs__best_heuristic" in pairs["autoshard"] and "milp__vs__lpt_measured" in pairs["autoshard"]
    assert direction(s) == "below 1"
    answer = plain_answer(pairs, {"met": True})
    assert answer and answer[0].startswith("autoshard, rl_greedy: / cost_greedy 0.88")
    assert "(below 1, 12 tasks)" in answer[0] and not any(w in answer[0] for w in ("beats", "ties", "loses"))
    tied = paired_comparisons(*ratios_frame(rl_factor=0.9), {"autoshard": 0.05}, resamples=200, seed=0)
    assert direction(tied["autoshard"]["rl_greedy__vs__cost_greedy"]) == "spans 1"
    assert plain_answer(tied, {"met": False})[0].startswith("The measurements under these results are noisier")
    per_task = per_task_ratios(frame, [("rl_greedy", "cost_greedy"), ("rl_greedy", "best_heuristic")])
    assert len(per_task) == 24 and set(per_task["pair"]) == {"rl_greedy / cost_greedy", "rl_greedy / best_heuristic"}


HEADROOM = {"tasks": 12, "tasks_without_greedy": 0, "greedy_gap": 0.04, "greedy_gap_max": 0.1,
            "greedy_gap_above_share": 0.5, "bound": 0.96, "how": "exhaustive search", "starts": 0,
            "search_seconds": 0.0, "captured": {"rl_greedy": 0.5, "cost_greedy": 0.0}, "captured_tasks": 6,
            "lpt_gap": 0.01, "how_lpt": "MILP lower bound", "lpt_gap_optimal_share": 1.0, "measured_gap": 0.02,
            "measured_cost": "max_device_ms", "measured_tasks": 12, "measured_of": {"rl_greedy": 12},
            "measured_at_best_share": 0.5, "noise_floor": 0.01, "noise_key": "noise.plan_repeat_change",
            "lower": 0.04, "upper": 0.04, "upper_why": "exhaustive search", "better_reachable": False}


FAMILIES = {"sesoi": 0.05, "seconds": 1.0, "families": [
    {"family": "2 per device, ample memory, equal speeds", "per_device": 2, "devices": 8, "memory": "ample",
     "speeds": "equal", "tasks": 4, "greedy_gap": 0.01, "greedy_gap_p90": 0.02, "greedy_gap_max": 0.03,
     "blind_gap": 0.01, "exceeds_sesoi": False}]}


def test_evaluate_metrics_are_strict_json_with_the_contract_keys():
    frame, plans, names = ratios_frame(rl_factor=0.8)
    pairs = paired_comparisons(frame, plans, names, {"autoshard": 0.002}, resamples=200, seed=0)
    quality = measurement_quality(devices(0.01), repeat(0.005), TARGETS)
    table = pd.DataFrame({"protocol": ["autoshard"], "method": ["rl_greedy"], "ratio_median": [0.8]})
    speed = pd.DataFrame({"method": ["rl_greedy"], "tables": [10], "seconds": [0.01]})
    milp = pd.DataFrame({"task": ["t0"], "objective": [1.0], "lower_bound": [1.0], "gap": [0.0], "status": ["optimal"],
                         "seconds": [0.1]})
    tasks = [Task(n, "autoshard", "test", (0, 1, 2), 2, 10**9, 0.0) for n in names]
    measured = devices(0.01).assign(protocol="autoshard", comm_source="measured-model")
    plans["milp"][0] = plans["milp"][1] = None  # no plan on two tasks: a failure on the first
    status = pd.DataFrame({"task": names[1:2], "method": ["milp"], "status": ["not run"]})  # not on the second
    metrics = evaluate_metrics(table, pd.DataFrame(), pd.Series(dtype=float), pd.DataFrame(), speed, {}, tasks,
                               measured, quality, pairs, plain_answer(pairs, quality), milp, 1.0,
                               plans=plans, sizes=np.ones(3), plan_status=status,
                               objective={"autoshard": "max_device", "dreamshard": "synchronized_stages"},
                               paired_synchronized={"autoshard": {}}, paired_max_device=pairs,
                               primary=primary(frame.assign(max_device_ms=frame["measured_ms"], **{"pass": "main"}),
                                               PrimaryConfig(0.05, 0.05, 999, (ENDPOINT,)), 0),
                               headroom={"autoshard": HEADROOM}, families=FAMILIES)
    text = json.dumps(_plain(metrics), allow_nan=False)
    loaded = json.loads(text)
    assert list(loaded)[0] == "primary" and check(loaded, Evaluation, "evaluate.json")
    assert loaded["primary"]["rl_greedy__vs__cost_greedy__autoshard"]["pass"] == "main"
    assert loaded["headroom"]["autoshard"]["greedy_gap"] == HEADROOM["greedy_gap"]
    assert loaded["families"] == FAMILIES
    assert {"failed", "objective", "paired_synchronized", "paired_max_device", "comm_source"} <= set(loaded), \
        "readers rely on these keys"
    assert check(loaded, ComputeOnlyPairs, "evaluate.json")["paired_max_device"] == loaded["paired"]
    assert loaded["failed"]["autoshard"]["milp"] == 1 and loaded["failed"]["autoshard"]["rl_greedy"] == 0
    assert loaded["objective"] == {"autoshard": "max_device", "dreamshard": "synchronized_stages"}
    assert check(loaded, HeadlineObjective, "evaluate.json") and loaded["paired_synchronized"] == {"autoshard": {}}
    assert loaded["comm_source"] == {"autoshard": "measured-model"}
    assert set(loaded["noise"]) >= {"median_cv", "round_drift", "remeasured_share"}
    assert set(loaded["paired"]["autoshard"]["rl_greedy__vs__cost_greedy"]) == {
        "tasks", "median_ratio", "ci_low", "ci_high", "p_value", "identical_share", "mde"}


def with_replicates(frame: pd.DataFrame, factors: tuple[float, ...], tasks: int | None = None) -> pd.DataFrame:
    """`frame` with replicate r (from 1) planning cost_greedy as replicate 0 and rl_greedy `factors[r - 1]`
    times slower, on the first `tasks` tasks (all without), in the same pass."""
    names = sorted(frame["task"].unique())[:tasks]
    base = frame[frame["method"].isin(["cost_greedy", "rl_greedy"]) & frame["task"].isin(names)]
    extra = [base.assign(measured_ms=lambda f, k=k: f["measured_ms"] * np.where(f["method"] == "rl_greedy", k, 1.0),
                         method=lambda f, r=r: f["method"] + f"@{r}")
             for r, k in enumerate(factors, start=1)]
    return pd.concat([frame, *extra], ignore_index=True)


def test_replicate_summary_spreads_the_policy_over_greedy_across_replicates():
    frame, _, _ = ratios_frame(rl_factor=0.8)
    spread = replicate_summary(with_replicates(frame, (1.1, 1.2)), 3)["autoshard"]
    vs = spread["rl_greedy__vs__cost_greedy"]
    assert vs["n"] == 3 and vs["std"] > 0
    assert np.allclose(vs["values"], [0.8 / 0.9 * k for k in (1.0, 1.1, 1.2)], rtol=0.01)
    assert set(spread) == {"rl_greedy__vs__cost_greedy"}, "no ratio to another pass's best heuristic"
    line = plain_answer({"autoshard": {}}, {"met": True}, replicates={"autoshard": spread})[0]
    assert line.startswith("autoshard, across 3 replicates") and "±" in line


def test_replicates_on_a_subset_of_tasks_are_compared_on_that_subset_only():
    frame, _, _ = ratios_frame(rl_factor=0.8)
    half = frame["task"].nunique() // 2
    spread = replicate_summary(with_replicates(frame, (1.0,), half), 2)["autoshard"]
    assert spread["rl_greedy__vs__cost_greedy"]["std"] < 1e-12, "same plans on the same tasks: the same median"


def test_a_replicate_whose_plans_mix_two_passes_is_refused():
    frame = with_replicates(ratios_frame(rl_factor=0.8)[0], (1.0,)).assign(pass_="main")
    frame = frame.rename(columns={"pass_": "pass"})
    frame.loc[frame["method"] == "rl_greedy@1", "pass"] = "replicate-1"
    with pytest.raises(ValueError, match="different passes"):
        replicate_summary(frame, 2)


def test_a_machine_that_slowed_down_between_passes_is_divided_out():
    from autoshard.studies.stats import noise

    first = pd.DataFrame({"task": ["t", "t"], "protocol": ["dreamshard"] * 2, "method": ["rl_greedy", "size_greedy"],
                          "measured_ms": [10.0, 12.0], "calibrated": [2.0, 2.4]})
    again = pd.DataFrame({"task": ["t", "t"], "method": ["rl_greedy", "size_greedy"], "measured_ms": [11.0, 13.2],
                          "calibrated": [2.0, 2.4]})  # everything 10% slower, the calibration shard too
    repeat = noise(first, again)
    assert np.allclose(repeat["relative_change"], 0.1) and np.allclose(repeat["calibrated_change"], 0.0)


def test_paired_max_device_compares_every_protocol_on_its_compute_bottleneck():
    """autoshard's headline is max_device: the block is `paired` there. dreamshard's headline is the
    synchronized cost, on which rl_greedy loses here; on compute alone it beats cost_greedy."""
    frame, plans, names = ratios_frame(rl_factor=0.8)
    dream = frame.assign(protocol="dreamshard", task="d" + frame["task"], max_device_ms=frame["measured_ms"])
    dream["measured_ms"] = dream["max_device_ms"] * np.where(dream["method"] == "rl_greedy", 1.3, 1.0)
    both = pd.concat([frame.assign(max_device_ms=frame["measured_ms"]), dream], ignore_index=True)
    all_names, plans = names + ["d" + n for n in names], {m: p + p for m, p in plans.items()}
    noise = {"autoshard": 0.002, "dreamshard": 0.002}
    headline = paired_comparisons(both, plans, all_names, noise, 200, 0)
    compute = paired_max_device(both, plans, all_names, noise, 200, 0)
    assert compute["autoshard"] == headline["autoshard"], "the same comparisons where the headline is max_device"
    s = compute["dreamshard"]["rl_greedy__vs__cost_greedy"]
    assert direction(s) == "below 1" and abs(s["median_ratio"] - 0.8 / 0.9) < 0.01
    assert direction(headline["dreamshard"]["rl_greedy__vs__cost_greedy"]) == "above 1"


def test_a_method_planned_for_one_protocol_only_is_compared_there_and_absent_elsewhere():
    """The sync_* methods run only where their objective ranks the plans (dreamshard here): every
    reader of the plans takes them where they are and leaves them out elsewhere."""
    frame, plans, names = ratios_frame(rl_factor=0.8)
    dream = frame.assign(protocol="dreamshard", task="d" + frame["task"])
    sync = dream[dream["method"] == "cost_greedy"].assign(method="sync_greedy",
                                                          measured_ms=lambda f: f["measured_ms"] * 0.9)
    both = pd.concat([frame, dream, sync], ignore_index=True)
    both["synchronized_ms"] = both["measured_ms"] * 1.5
    both[["predicted_ms", "with_comm_ms", "memory_share", "seconds"]] = 1.0
    all_names = names + ["d" + n for n in names]
    plans = {m: p + p for m, p in plans.items()} | {"sync_greedy": [None] * len(names) + plans["cost_greedy"]}
    noise = {"autoshard": 0.002, "dreamshard": 0.002}
    for pairs in (paired_comparisons(both, plans, all_names, noise, 200, 0),
                  paired_synchronized(both, plans, all_names, noise, 200, 0)):
        assert "sync_greedy__vs__cost_greedy" in pairs["dreamshard"]
        assert not any(k.startswith("sync_greedy") for k in pairs["autoshard"])
        assert set(paired_frame(pairs, ("sync_greedy",))["protocol"]) == {"dreamshard"}
    per_task = per_task_ratios(both, [("sync_greedy", "cost_greedy")])
    assert len(per_task) == len(names) and set(per_task["protocol"]) == {"dreamshard"}
    table = summary(with_ratios(both), 100, 0)
    assert set(table.loc[table["method"] == "sync_greedy", "protocol"]) == {"dreamshard"}
    tasks = [Task(n, "autoshard" if n.startswith("t") else "dreamshard", "test", (0, 1, 2), 2, 10**9, 0.0)
             for n in all_names]
    status = pd.DataFrame({"task": names, "method": "sync_greedy", "status": "not run (optimises "
                           "synchronized_stages; autoshard is ranked by max_device)"})
    counts = failed_counts(tasks, plans, np.ones(3), status)
    assert counts["autoshard"]["sync_greedy"] == 0 and counts["dreamshard"]["sync_greedy"] == 0, "not run: not failed"


def test_the_synchronized_answer_sets_rl_sync_greedy_against_the_sync_baselines_where_it_ran():
    """rl_sync_greedy and sync_greedy run on dreamshard only: the answer on the synchronized stages
    compares them there, and says nothing about autoshard."""
    frame, plans, names = ratios_frame(rl_factor=0.8)
    dream = frame.assign(protocol="dreamshard", task="d" + frame["task"])
    cost = dream[dream["method"] == "cost_greedy"]
    extra = [cost.assign(method="sync_greedy", measured_ms=lambda f: f["measured_ms"] * 0.95),
             cost.assign(method="rl_sync_greedy", measured_ms=lambda f: f["measured_ms"] * 0.8)]
    both = pd.concat([frame, dream, *extra], ignore_index=True)
    both["synchronized_ms"] = both["measured_ms"]
    all_names = names + ["d" + n for n in names]
    plans = {m: p + p for m, p in plans.items()}
    plans |= {m: [None] * len(names) + [np.array([0, 1, k]) for _ in names] for k, m in
              enumerate(("sync_greedy", "rl_sync_greedy"))}
    pairs = paired_synchronized(both, plans, all_names, {"autoshard": 0.002, "dreamshard": 0.002}, 200, 0)
    assert "rl_sync_greedy__vs__sync_greedy" in pairs["dreamshard"]
    lines = synchronized_answer(pairs, {"met": False})
    assert lines and all(line.startswith("dreamshard (synchronized stages), ") for line in lines)
    assert "rl_sync_greedy: / sync_greedy 0.84" in lines[0] and "(below 1," in lines[0], lines


def test_repeat_summary_sees_a_flattered_best_heuristic():
    # each task: rl_greedy unchanged between passes, the best heuristic 10% slower measured again
    rows = []
    for t in range(4):
        rows += [{"task": f"t{t}", "protocol": "p", "method": "rl_greedy", "measured_ms": 10.0,
                  "measured_ms_again": 10.0},
                 {"task": f"t{t}", "protocol": "p", "method": "lpt_measured", "measured_ms": 9.0,
                  "measured_ms_again": 9.9}]
    frame = pd.DataFrame(rows)
    frame["relative_change"] = frame["measured_ms_again"] / frame["measured_ms"] - 1
    frame["ratio"], frame["ratio_again"] = 10.0 / 9.0, 10.0 / 9.9
    summary = repeat_summary(frame).loc["p"]
    assert summary["selection_flattery"] == pytest.approx(0.1) and summary["tasks"] == 4
    assert summary["plan_change"] == pytest.approx(0.05)
    assert summary["rl_ratio_change"] == pytest.approx(10 / 9 - 10 / 9.9)
    assert repeat_summary(frame.assign(ratio_again=frame["ratio"])).loc["p", "selection_flattery"] == 0

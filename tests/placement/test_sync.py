"""The synchronized-stages objective: scoring hand-made placements, and the sync_greedy planner."""

import time

import numpy as np
import pandas as pd
import pytest

from autoshard.core.errors import ConfigError
from autoshard.data.tasks import Task
from autoshard.measure.comm import STAGES, max_device_ms, synchronized_ms
from autoshard.measure.comm_store import placement_key
from autoshard.measure.commmodel import CommModel
from autoshard.methods.artifacts import Artifacts, Settings
from autoshard.methods.registry import build
from autoshard.placement import search as search_module
from autoshard.placement import sync as sync_module
from autoshard.placement.greedy import Infeasible
from autoshard.placement.lpt import lpt
from autoshard.placement.objective import Linear, comm_lines
from autoshard.placement.surrogate import MilpConfig
from autoshard.placement.sync import stage_singles, sync_greedy
from autoshard.studies.measured import bottlenecks, device_widths, plan_comm, plan_frame, synchronized

# where each step of the sync chain is defined: what a test patches to count or slow it
SOURCE = {"sync_greedy": (sync_module, "sync_greedy"), "sync_local_search": (search_module, "local_search")}


def planners(forward, backward, features, comm, batch_size, milp=None, solves=None, learned=None, monkeypatch=None):
    """The registry's sync methods on these single costs: sync_greedy, sync_local_search and, with
    `milp`, sync_milp (its solves into `solves`); with `learned` (a stand-in for the synchronized
    policy, patched into `policy_plans`), rl_sync_greedy and rl_sync_local_search too."""
    stand_in = object() if learned else None
    if learned:
        monkeypatch.setattr("autoshard.rl.infer.policy_plans", lambda policy, model, x, tasks: [learned(tasks[0])])
    artifacts = Artifacts(pool_features=features, features=np.zeros((len(features), 21)),
                          stage_singles=(forward, backward), comm_model=comm, sync_policy=stand_in,
                          stages_model=stand_in)
    wanted = ("sync_greedy", "sync_local_search", "sync_milp", "rl_sync_greedy", "rl_sync_local_search")
    built = build(wanted, artifacts, Settings(seed=0, batch_size=batch_size, milp=milp))
    if solves is not None:
        built.solves["sync_milp"] = solves
    return built.planners


NO_COMM = CommModel({2: {"forward": [0.0, 0.0, 0.0], "backward": [0.0, 0.0, 0.0]}},
                    {"forward": [0.0] * 4, "backward": [0.0] * 4})


ZERO_LINES = np.zeros((2, 2))  # comm lines of a free all-to-all


def _stages(rows: list[tuple[float, float, float, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=STAGES)


def test_balanced_sums_but_not_stages_scores_worse_synchronized():
    """Both plans' devices sum to 6 ms; only the second balances each stage."""
    sums_only = _stages([(4.0, 0.5, 0.5, 1.0), (1.0, 0.5, 0.5, 4.0)])
    per_stage = _stages([(2.5, 0.5, 0.5, 2.5), (2.5, 0.5, 0.5, 2.5)])
    assert max_device_ms(sums_only) == max_device_ms(per_stage) == 6.0
    assert synchronized_ms(sums_only) == 9.0 and synchronized_ms(per_stage) == 6.0
    assert synchronized_ms(sums_only) > synchronized_ms(per_stage)
    assert Linear(sums_only.to_numpy(), np.zeros(4)).cost(np.array([0, 1]), 2) == 9.0  # one table per device


def _devices(plan_stages: dict[str, pd.DataFrame]) -> pd.DataFrame:
    frames = []
    for method, stages in plan_stages.items():
        frame = stages.assign(task="t", protocol="dreamshard", method=method, device=range(len(stages)),
                              memory_bytes=1, predicted_ms=1.0, comm_source="measured-model")
        frame["compute_ms"] = frame["forward_compute_ms"] + frame["backward_compute_ms"]
        frame["with_comm_ms"] = frame[STAGES].sum(axis=1)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def test_measured_scoring_reports_both_objectives():
    devices = _devices({"sums": _stages([(4.0, 0.5, 0.5, 1.0), (1.0, 0.5, 0.5, 4.0)]),
                        "stages": _stages([(2.5, 0.5, 0.5, 2.5), (2.5, 0.5, 0.5, 2.5)])})
    assert synchronized(devices).to_dict() == {("t", "sums"): 9.0, ("t", "stages"): 6.0}
    assert bottlenecks(devices).set_index("method")["synchronized_ms"].to_dict() == {"sums": 9.0, "stages": 6.0}
    tasks = [Task("t", "dreamshard", "test", (0, 1), 2, 10, 1.0)]
    seconds = pd.DataFrame({"task": "t", "method": ["sums", "stages"], "seconds": 0.1})
    headline = plan_frame(devices, tasks, seconds).set_index("method")
    assert (headline["measured_ms"] == 5.0).all()  # max-device compute: the two tie
    synced = plan_frame(devices, tasks, seconds, objective="synchronized_stages").set_index("method")
    assert synced.loc["sums", "measured_ms"] == 9.0 and synced.loc["stages", "max_device_ms"] == 5.0
    assert (synced["comm_source"] == "measured-model").all()
    with pytest.raises(ValueError, match="objective"):
        plan_frame(devices, tasks, seconds, objective="mean")


def test_each_protocol_is_ranked_by_its_own_objective():
    one = _devices({"sums": _stages([(4.0, 0.5, 0.5, 1.0), (1.0, 0.5, 0.5, 4.0)])})
    devices = pd.concat([one, one.assign(task="u", protocol="autoshard")], ignore_index=True)
    tasks = [Task("t", "dreamshard", "test", (0, 1), 2, 10, 1.0), Task("u", "autoshard", "test", (0, 1), 2, 10, 1.0)]
    seconds = pd.DataFrame({"task": ["t", "u"], "method": "sums", "seconds": 0.1})
    objective = {"dreamshard": "synchronized_stages", "autoshard": "max_device"}
    frame = plan_frame(devices, tasks, seconds, objective).set_index("task")
    assert frame.loc["t", "measured_ms"] == 9.0 and frame.loc["u", "measured_ms"] == 5.0
    assert frame["objective"].to_dict() == {"t": "synchronized_stages", "u": "max_device"}
    assert bottlenecks(devices, objective).set_index("task")["measured_ms"].to_dict() == {"t": 9.0, "u": 5.0}
    with pytest.raises(ValueError, match="objective of autoshard: None"):
        plan_frame(devices, tasks, seconds, {"dreamshard": "max_device"})


def test_comm_source_says_where_comm_comes_from():
    features = pd.DataFrame({"dim": [16, 32, 64, 8], "pooling_factor": [1.0, 2.0, 3.0, 4.0]})
    model = CommModel({2: {"forward": [1.0, 0.0, 0.0], "backward": [2.0, 0.0, 0.0]}},
                      {"forward": [1.0, 0.0, 0.0, 0.5], "backward": [2.0, 0.0, 0.0, 0.5]})
    comm, source = plan_comm(features, [[0, 1], [2, 3]], 64, "cpu", 2, model)
    assert source == "measured-model" and comm == [(1.0, 2.0), (1.0, 2.0)]
    assert plan_comm(features, [[0, 1], [2, 3]], 64, "cpu", 1, model) == (comm, "oversubscribed-model")
    comm, source = plan_comm(features, [[0], [1], [2], [3]], 64, "cpu", 2, model)
    assert source == "extrapolated-model" and comm[0] == (3.0, 4.0)
    _, source = plan_comm(features, [[0, 1], [2, 3]], 64, "cpu", 2)
    assert source == "analytic"
    timed = {placement_key(device_widths(features, [[0, 1], [2, 3]])): [(5.0, 6.0), (7.0, 8.0)]}
    assert plan_comm(features, [[0, 1], [2, 3]], 64, "cpu", 2, model, timed)[1] == "measured"
    assert plan_comm(features, [[0, 1], [2, 3]], 64, "cpu", 1, model, timed)[1] == "measured-oversubscribed"


# --- sync_greedy ------------------------------------------------------------------------------

def test_sync_greedy_beats_max_device_greedy_on_its_objective():
    """Forward-heavy A, D and backward-heavy B, C on 2 devices: LPT on the per-table totals (the
    max-device greedy) pairs B with C and A with D, so one device is slow forward and the other
    backward; sync_greedy puts one of each kind on each device."""
    forward = np.array([5.0, 0.0, 0.0, 4.0])
    backward = np.array([0.0, 4.0, 4.0, 0.0])
    dims = np.ones(4)
    sizes = np.ones(4, np.int64)

    def cost(p: np.ndarray) -> float:
        return Linear.synchronized(forward, backward, dims, ZERO_LINES).cost(p, 2)

    greedy_plan = lpt(forward + backward, sizes, 2, 10)
    placement = sync_greedy(forward, backward, dims, sizes, 2, 10, ZERO_LINES)
    assert cost(greedy_plan) == 17.0 and cost(placement) == 9.0
    assert placement[0] != placement[3] and placement[1] != placement[2]


def test_sync_greedy_respects_memory():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n, devices = int(rng.integers(4, 12)), int(rng.integers(2, 4))
        sizes = rng.integers(1, 10, n).astype(np.int64)
        capacity = int(max(sizes.max(), np.ceil(1.3 * sizes.sum() / devices)))
        try:
            placement = sync_greedy(rng.uniform(0.1, 2, n), rng.uniform(0.1, 2, n), rng.integers(4, 64, n),
                                    sizes, devices, capacity, ZERO_LINES)
        except Infeasible:
            continue
        assert (placement >= 0).all()
        assert np.bincount(placement, sizes, devices).max() <= capacity
    with pytest.raises(Infeasible):
        sync_greedy(np.ones(2), np.ones(2), np.ones(2), np.array([5, 5]), 2, 4, ZERO_LINES)


def test_sync_greedy_weighs_communication():
    """Equal compute; the comm model charges what a device sends: wide tables are spread."""
    model = CommModel({2: {"forward": [0.0, 100.0, 0.0], "backward": [0.0, 0.0, 100.0]}}, {})
    dims = np.array([256, 256, 1, 1])
    lines = comm_lines(model, 2, 64, float(dims.sum()))
    placement = sync_greedy(np.ones(4), np.ones(4), dims, np.ones(4, np.int64), 2, 10, lines)
    assert placement[0] != placement[1]


def test_stage_singles_and_the_task_planner():
    profile = pd.DataFrame({"tables": [[0], [1], [2], [0, 1], [0]], "num_tables": [1, 1, 1, 2, 1],
                            "forward_ms": [1.0, 2.0, 3.0, 9.0, 3.0], "backward_ms": [2.0, 1.0, 1.0, 9.0, 4.0]})
    forward, backward = stage_singles(profile, 4)
    assert forward[:3].tolist() == [2.0, 2.0, 3.0] and backward[:3].tolist() == [3.0, 1.0, 1.0]
    assert np.isnan(forward[3])
    features = pd.DataFrame({"dim": [8, 8, 8, 8], "size_bytes": [1, 1, 1, 1]})
    methods = planners(forward, backward, features, NO_COMM, 64, MilpConfig(1000, 10.0), solves=(solves := {}))
    assert list(methods) == ["sync_greedy", "sync_local_search", "sync_milp"]
    for place in methods.values():
        plan = place(Task("t", "dreamshard", "test", (0, 1, 2), 2, 10, 1.0))
        assert sorted(np.bincount(plan, minlength=2)) == [1, 2]
        with pytest.raises(ConfigError, match=r"no single-table measurement of tables \[3\]"):
            place(Task("u", "dreamshard", "test", (0, 3), 2, 10, 1.0))
    assert solves["t"].status == "optimal" and solves["t"].gap <= 1e-3
    assert "sync_milp" not in planners(forward, backward, features, NO_COMM, 64), "no MILP without its limits"


def test_paired_synchronized_compares_on_the_synchronized_cost():
    from autoshard.studies.findings import paired_synchronized

    names = [f"t{i}" for i in range(8)]
    rows = []
    for i, name in enumerate(names):
        for method, measured, synced in (("naive", 10.0, 12.0), ("random", 10.0, 13.0),
                                         ("cost_greedy", 9.0, 14.0 + 0.1 * i)):
            rows.append({"task": name, "protocol": "dreamshard", "method": method, "measured_ms": measured,
                         "synchronized_ms": synced, "predicted_ms": measured, "unseen_ratio": 1.0})
    ratios = pd.DataFrame(rows)
    plans = {m: [np.array([i % 2, 1 - i % 2, int(m == "cost_greedy")]) for i in range(8)]
             for m in ("naive", "random", "cost_greedy")}
    pairs = paired_synchronized(ratios, plans, names, {"dreamshard": 0.01}, 200, 0)
    entry = pairs["dreamshard"]["cost_greedy__vs__best_heuristic"]
    assert entry["median_ratio"] > 1.1, "slower on the synchronized cost though faster on compute"


def test_bottlenecks_follow_the_objective():
    devices = _devices({"sums": _stages([(4.0, 0.5, 0.5, 1.0), (1.0, 0.5, 0.5, 4.0)])})
    assert bottlenecks(devices)["measured_ms"].tolist() == [5.0]
    assert bottlenecks(devices, "synchronized_stages")["measured_ms"].tolist() == [9.0]
    with pytest.raises(ValueError, match="objective"):
        bottlenecks(devices, "mean")


def test_a_tasks_sync_chain_makes_each_plan_once(monkeypatch):
    """sync_local_search starts from the greedy plan already made, sync_milp from the local search's."""
    calls = {"sync_greedy": 0, "sync_local_search": 0}

    def counted(name):
        plan = getattr(*SOURCE[name])

        def counting(*args, **kwargs):
            calls[name] += 1
            return plan(*args, **kwargs)
        return counting
    for name in calls:
        monkeypatch.setattr(*SOURCE[name], counted(name))
    features = pd.DataFrame({"dim": [8, 8, 8], "size_bytes": [1, 1, 1]})
    methods = planners(np.array([2.0, 1.0, 3.0]), np.array([1.0, 2.0, 1.0]), features, NO_COMM, 64,
                       MilpConfig(1000, 10.0))
    task = Task("t", "dreamshard", "test", (0, 1, 2), 2, 10, 1.0)
    plans = {m: place(task) for m, place in methods.items()}
    assert calls == {"sync_greedy": 1, "sync_local_search": 1}
    assert np.array_equal(methods["sync_greedy"](task), plans["sync_greedy"]) and calls["sync_greedy"] == 1


def test_a_chained_sync_planner_reports_its_whole_chains_time(monkeypatch):
    """A plan made from another method's cached plan still costs that plan's time: `seconds` sums the chain."""
    import time as clock

    def slow(name, pause):
        plan = getattr(*SOURCE[name])

        def waiting(*args, **kwargs):
            clock.sleep(pause)
            return plan(*args, **kwargs)
        return waiting
    monkeypatch.setattr(*SOURCE["sync_greedy"], slow("sync_greedy", 0.05))
    monkeypatch.setattr(*SOURCE["sync_local_search"], slow("sync_local_search", 0.03))
    features = pd.DataFrame({"dim": [8, 8, 8], "size_bytes": [1, 1, 1]})
    methods = planners(np.array([2.0, 1.0, 3.0]), np.array([1.0, 2.0, 1.0]), features, NO_COMM, 64,
                       MilpConfig(1000, 10.0))
    task = Task("t", "dreamshard", "test", (0, 1, 2), 2, 10, 1.0)
    for place in methods.values():
        place(task)
    greedy, refined = (methods[m].seconds(task) for m in ("sync_greedy", "sync_local_search"))
    assert greedy >= 0.05 and refined >= 0.05 + 0.03, "the local search's time left out the greedy plan it reused"


def test_the_speed_benchmark_times_a_cached_sync_planners_whole_chain_every_call(monkeypatch):
    """speed.scaling gives every call a task of its own: neither a planner's own cache nor the greedy
    plan sync_greedy's calls left can make a timed call of sync_local_search cheaper."""
    from autoshard.placement import speed

    calls = []
    plan = sync_module.sync_greedy

    def counted(*args, **kwargs):
        calls.append(1)
        return plan(*args, **kwargs)
    monkeypatch.setattr(sync_module, "sync_greedy", counted)
    features = pd.DataFrame({"dim": [8] * 6, "size_bytes": [1] * 6})
    methods = planners(np.arange(1.0, 7.0), np.ones(6), features, NO_COMM, 64)
    speed.scaling({m: methods[m] for m in ("sync_greedy", "sync_local_search")}, features, [6], 2, seed=0,
                  repeats=3, budget_s=5.0, progress=False)
    assert len(calls) == 2 * (1 + 3), "the warm-up and every timed repeat of both methods make the greedy plan"


def test_the_sync_policys_plan_refined_by_the_sync_search_is_never_predicted_worse(monkeypatch):
    """rl_sync_local_search starts from rl_sync_greedy's plan (made once) and only improves it."""
    rng = np.random.default_rng(3)
    forward, backward = rng.uniform(0.5, 3.0, 12), rng.uniform(0.5, 3.0, 12)
    features = pd.DataFrame({"dim": [8] * 12, "size_bytes": [1] * 12})
    made = []

    def learned(t: Task) -> np.ndarray:  # a poor, slow policy: everything on device 0 but one table
        made.append(t.name)
        time.sleep(0.05)
        return np.array([0] * 11 + [1])
    methods = planners(forward, backward, features, NO_COMM, 64, learned=learned, monkeypatch=monkeypatch)
    task = Task("t", "dreamshard", "test", tuple(range(12)), 2, 100, 1.0)
    start, refined = methods["rl_sync_greedy"](task), methods["rl_sync_local_search"](task)
    assert made == ["t"], "the policy's plan was made more than once"
    cost = [Linear.synchronized(forward, backward, np.full(12, 8.0), ZERO_LINES).cost(p, 2) for p in (start, refined)]
    assert cost[1] < cost[0]
    assert methods["rl_sync_local_search"].seconds(task) >= 0.05, "the reused policy plan's time was left out"

"""The headroom on hand-made tasks: cost_greedy planted 10% above the optimum gives a 10% gap, the
best method captures all of it and cost_greedy none, the measured gap stays within one pass, and
a learned-vs-greedy primary endpoint is decided only where the gap exceeds twice the noise floor."""

import itertools
import json

import numpy as np
import pandas as pd
import pytest

from autoshard.core.metrics import _plain
from autoshard.core.schema import check
from autoshard.data.tasks import Task
from autoshard.studies import headroom as room
from autoshard.studies.endpoints import Endpoint, PrimaryConfig, primary
from autoshard.studies.evaluate import Headroom

WEIGHTS = np.array([6.0, 5.0, 4.0, 3.0, 2.0])  # one task's five tables: the optimum on 2 devices is 10 ({6, 4})
OPTIMUM = np.array([0, 1, 0, 1, 1])
GREEDY = np.array([0, 1, 1, 0, 0])   # {6, 3, 2} = 11: 10% above the optimum
HEURISTIC = np.array([0, 0, 1, 1, 1])  # {6, 5} = 11 as well: the search's start


class Additive:
    """A cost model whose device cost is the sum of its tables' weights."""

    def __call__(self, task, placements):
        return np.array([np.bincount(p, weights=WEIGHTS[list(task.tables)], minlength=task.devices).max()
                         for p in placements])


def exhaustive(task, start):
    """A search that finds the optimum from any start."""
    options = [np.array(p) for p in itertools.product(range(task.devices), repeat=len(task.tables))]
    return options[int(np.argmin(Additive()(task, options)))]


def never(task, start):
    raise AssertionError("a task with the exhaustive optimum is not searched")


def tasks(n=4, protocol="autoshard"):
    return [Task(f"{protocol}/{k}", protocol, "test", tuple(range(5)), 2, 10**9, 0.0) for k in range(n)]


def plans(n=4, rl=OPTIMUM, **more):
    return {"size_greedy": [HEURISTIC] * n, "cost_greedy": [GREEDY] * n, "rl_greedy": [rl] * n,
            **{m: [p] * n for m, p in more.items()}}


def measured(task_list, values, passes=None):
    """`ratios` as the evaluate stage has them: one row per task and method, measured in one pass."""
    return pd.DataFrame([{"task": t.name, "protocol": t.protocol, "method": m, "max_device_ms": v,
                          "pass": (passes or {}).get(m, "main")} for t in task_list for m, v in values.items()])


QUALITY = {"noise_sd_max_device": {"autoshard": 0.02}, "plan_repeat_change": 0.3}


def test_greedy_planted_ten_percent_above_the_optimum_has_a_ten_percent_gap():
    ts = tasks()
    known = room.known_placements(ts, plans(rl=HEURISTIC), Additive(), exhaustive)
    assert set(known["plan"]) == {"size_greedy", "cost_greedy", "rl_greedy", "local_search:size_greedy",
                                  "local_search:cost_greedy"}, "every method's plan, searched from each start"
    out = room.headroom(known, measured(ts, {"cost_greedy": 11.0, "rl_greedy": 11.0, "size_greedy": 11.0}),
                        room.lpt_gaps(ts, plans(), None, pd.DataFrame()), QUALITY, 0.05)["autoshard"]
    assert out["greedy_gap"] == pytest.approx(0.10) and out["greedy_gap_max"] == pytest.approx(0.10)
    assert out["bound"] == pytest.approx(10 / 11) and out["greedy_gap_above_share"] == 1.0
    assert out["starts"] == 2 and out["how"] == "best of local search from 2 starts and every method's plan"
    assert out["captured"]["cost_greedy"] == 0.0 and out["tasks"] == 4
    assert out["noise_floor"] == 0.02 and out["noise_key"] == "noise.noise_sd_max_device.autoshard"
    assert out["lower"] == pytest.approx(0.10) and out["upper"] is None and "neural network" in out["upper_why"]
    assert out["better_reachable"], "no upper bound: nothing proves a gain out of reach"
    assert out["measured_at_best_share"] == 0.0, "the best known is the search's: not measured"
    check(json.loads(json.dumps(_plain(out))), Headroom, "evaluate.json: headroom.autoshard")


def test_a_method_at_the_best_captures_all_of_the_headroom_and_greedy_none():
    ts = tasks()
    known = room.known_placements(ts, plans(rl=OPTIMUM, torchrec=np.array([0, 0, 0, 1, 1])), Additive(), exhaustive)
    out = room.headroom(known, measured(ts, {"cost_greedy": 11.0, "rl_greedy": 10.0}), pd.DataFrame(
        columns=["task", "protocol", "lpt_ms", "lower_bound", "optimal"]), QUALITY, 0.05)["autoshard"]
    assert out["captured"]["rl_greedy"] == 1.0 and out["captured"]["cost_greedy"] == 0.0
    assert out["captured"]["torchrec"] == pytest.approx(-4.0), "{6, 5, 4} = 15: four gaps worse than greedy"
    assert out["measured_gap"] == pytest.approx(0.10) and out["measured_of"] == {"rl_greedy": 4}
    assert out["measured_at_best_share"] == 1.0 and out["lpt_gap"] is None


def test_the_measured_plan_is_chosen_by_prediction_not_by_this_pass():
    """rl_greedy is predicted best; size_greedy measured faster (noise) is not the one compared."""
    ts = tasks()
    known = room.known_placements(ts, plans(rl=OPTIMUM), Additive(), exhaustive)
    out = room.measured_gap(known, measured(ts, {"cost_greedy": 11.0, "rl_greedy": 10.0, "size_greedy": 9.0}))
    assert out["measured_gap"] == pytest.approx(0.10) and out["measured_of"] == {"rl_greedy": 4}


def test_the_measured_gap_refuses_two_passes():
    ts = tasks()
    known = room.known_placements(ts, plans(), Additive(), exhaustive)
    with pytest.raises(ValueError, match="different passes"):
        room.measured_gap(known, measured(ts, {"cost_greedy": 11.0, "rl_greedy": 10.0}, {"rl_greedy": "again"}))


def test_small_tasks_take_the_exhaustive_optimum_and_are_not_searched():
    ts = tasks(3, "small")
    known = room.known_placements(ts, plans(3, rl=GREEDY, exact=OPTIMUM), Additive(), never)
    out = room.predicted_gaps(known)
    assert out["how"] == "exhaustive search" and out["starts"] == 0
    assert out["greedy_gap"] == pytest.approx(0.10) and out["captured"]["exact"] == 1.0


class Counting(Additive):
    def __init__(self):
        self.asked = 0

    def __call__(self, task, placements):
        self.asked += len(placements)
        return super().__call__(task, placements)


def test_identical_splits_get_one_prediction():
    """The same split under other device numbers is one placement (identical devices)."""
    predict = Counting()
    known = room.known_placements(tasks(1), plans(1, rl=1 - OPTIMUM, exact=OPTIMUM), predict, never)
    by = known.set_index("plan")["predicted_ms"]
    assert by["rl_greedy"] == by["exact"] == 10.0 and len(known) == 4 and predict.asked == 3


def test_lpt_against_the_milp_bound_on_measured_single_costs():
    ts = tasks(2)
    singles = np.array([6.0, 5.0, 4.0, 3.0, 2.0])
    milp = pd.DataFrame({"task": [t.name for t in ts], "lower_bound": [10.0, 10.0],
                         "status": ["optimal", "node_limit"]})
    gaps = room.lpt_gaps(ts, plans(2, lpt_measured=GREEDY), singles, milp)
    assert list(gaps["lpt_ms"]) == [11.0, 11.0]
    out = room.surrogate_gap(gaps)
    assert out["lpt_gap"] == pytest.approx(0.10) and out["lpt_gap_optimal_share"] == 0.5
    assert out["how_lpt"] == "MILP lower bound"


def test_the_noise_floor_falls_back_to_the_runs_repeat_change():
    assert room.noise_floor(QUALITY, "tight") == (0.3, "noise.plan_repeat_change")
    assert room.noise_floor({"noise_sd_max_device": {"tight": None}, "plan_repeat_change": 0.3}, "tight")[0] == 0.3
    assert room.noise_floor({"noise_sd_max_device": {"tight": 0.0}, "plan_repeat_change": 0.3}, "tight")[0] == 0.3


def test_exhaustive_search_bounds_the_headroom_from_above_and_can_put_better_out_of_reach():
    entry = {"greedy_gap": 0.02, "how": "exhaustive search"}
    assert room.bounds(entry, 0.05) == {"lower": 0.02, "upper": 0.02, "better_reachable": False,
                                        "upper_why": room.bounds(entry, 0.05)["upper_why"]}
    assert room.bounds({"greedy_gap": 0.08, "how": "exhaustive search"}, 0.05)["better_reachable"]
    searched = room.bounds({"greedy_gap": 0.02, "how": "best of local search from 9 starts"}, 0.05)
    assert searched["upper"] is None and searched["lower"] == 0.02 and searched["better_reachable"]


def endpoint_rows(gain: float, tasks_count: int = 30, seed: int = 0) -> pd.DataFrame:
    """rl_greedy `gain` faster than cost_greedy and than lpt_measured, per task, 1% noise."""
    g = np.random.default_rng(seed)
    base = g.uniform(5.0, 20.0, tasks_count)
    mine = base * (1 - gain) * np.exp(g.normal(0, 0.01, tasks_count))
    return pd.DataFrame([{"task": f"t{i}", "protocol": "autoshard", "method": m, "max_device_ms": v,
                          "unseen_ratio": i % 2 * 0.5, "pass": "main"}
                         for i in range(tasks_count) for m, v in (("cost_greedy", base[i]), ("lpt_measured", base[i]),
                                                                  ("rl_greedy", mine[i]))])


AGAINST_GREEDY = Endpoint("rl_greedy", "cost_greedy", "autoshard", "max_device_ms")
AGAINST_LPT = Endpoint("rl_greedy", "lpt_measured", "autoshard", "max_device_ms")


def test_every_endpoint_is_decided_whatever_the_headroom():
    """No gate: a learned method against cost_greedy joins the Holm family like any other."""
    cfg = PrimaryConfig(sesoi=0.03, alpha=0.05, resamples=999, endpoints=(AGAINST_GREEDY, AGAINST_LPT))
    decided = primary(endpoint_rows(0.08), cfg, 0)
    assert decided[AGAINST_GREEDY.name]["verdict"] == decided[AGAINST_LPT.name]["verdict"] == "better"
    alone = primary(endpoint_rows(0.08), PrimaryConfig(0.03, 0.05, 999, (AGAINST_LPT,)), 0)[AGAINST_LPT.name]
    assert decided[AGAINST_LPT.name]["p_holm"] > alone["p_holm"], "both endpoints share the family"


def test_the_metrics_carry_the_headroom_per_protocol():
    ts = tasks()
    known = room.known_placements(ts, plans(), Additive(), exhaustive)
    entries = room.headroom(known, measured(ts, {"cost_greedy": 11.0, "rl_greedy": 10.0}),
                            room.lpt_gaps(ts, plans(), None, pd.DataFrame()), QUALITY, 0.05)
    metrics = json.loads(json.dumps(_plain({"headroom": entries})))
    assert set(metrics["headroom"]["autoshard"]) >= {"greedy_gap", "bound", "how", "lpt_gap", "measured_gap",
                                                     "captured", "noise_floor", "lower", "upper", "upper_why"}
    check(metrics["headroom"]["autoshard"], Headroom, "evaluate.json: headroom.autoshard")
    assert room.frame(entries).loc["autoshard", "greedy_gap"] == pytest.approx(0.10)
    assert room.captured_frame(entries).loc["cost_greedy", "autoshard"] == 0.0


def test_the_model_search_never_ends_above_its_start(world):
    """The real cost model: local search from each start, and the predictions of `predict_ms`."""
    pool, features, model = world
    sizes = pool.features["size_bytes"].to_numpy()
    task = Task("a/0", "autoshard", "test", tuple(range(12)), 3, int(sizes[:12].sum()), 0.0)
    start = np.arange(12) % 3
    known = room.known_placements([task], {"cost_greedy": [start], "size_greedy": [np.zeros(12, dtype=int) + (
        np.arange(12) >= 6)]}, room.ModelBottlenecks(model, features), room.ModelSearch(model, features))
    by = known.set_index("plan")["predicted_ms"]
    assert by["local_search:cost_greedy"] <= by["cost_greedy"] * (1 + 1e-6)
    shards = [[t for t, d in zip(task.tables, start, strict=True) if d == k] for k in range(3)]
    assert by["cost_greedy"] == pytest.approx(model.predict_ms(features, shards).max(), rel=1e-6)

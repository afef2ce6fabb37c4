"""The one greedy loop, local search and MILP on each objective: the synchronized stages (searched and
solved exactly), one linear stage (the heuristics' and LPT's greedy), and the cost model."""

import itertools

import numpy as np
import pytest

from autoshard.measure.commmodel import CommModel
from autoshard.placement.greedy import Infeasible
from autoshard.placement.heuristics import key_greedy
from autoshard.placement.milp import solve
from autoshard.placement.objective import Linear, comm_lines
from autoshard.placement.search import local_search
from autoshard.placement.sync import sync_greedy

BATCH = 512
# Per direction [a, b, c]: ms = a + b * sent MB + c * received MB; a negative intercept exercises the clip at 0.
MODEL = CommModel({2: {"forward": [0.05, 2.0, 1.0], "backward": [-0.02, 1.5, 3.0]},
                   3: {"forward": [0.1, 1.0, 2.5], "backward": [0.0, 3.0, 0.5]}},
                  {"forward": [0.1, 1.0, 1.0, 0.01], "backward": [0.1, 1.0, 1.0, 0.01]})


def _task(seed: int, n: int | None = None) -> dict:
    g = np.random.default_rng(seed)
    n = n or int(g.integers(5, 13))
    devices = int(g.integers(2, 5))
    sizes = g.integers(1, 10, n).astype(np.int64)
    return {"forward": g.uniform(0.1, 2, n), "backward": g.uniform(0.1, 2, n), "dims": g.integers(4, 256, n),
            "sizes": sizes, "devices": devices,
            "capacity": int(max(sizes.max(), np.ceil(1.4 * sizes.sum() / devices)))}


def _cost(task: dict, placement: np.ndarray) -> float:
    """The synchronized cost of a full placement from the comm model itself on the devices' widths."""
    def load(values):
        return np.bincount(placement, weights=np.asarray(values, float), minlength=task["devices"])
    forward_comm, backward_comm = MODEL.predict_arrays(load(task["dims"]), BATCH)
    return float(load(task["forward"]).max() + forward_comm.max() + backward_comm.max() + load(task["backward"]).max())


def _lines(task: dict) -> np.ndarray:
    return comm_lines(MODEL, task["devices"], BATCH, float(np.sum(task["dims"])))


def _objective(task: dict) -> Linear:
    return Linear.synchronized(task["forward"], task["backward"], task["dims"], _lines(task))


@pytest.mark.parametrize("devices", [2, 3, 4])
def test_comm_lines_are_the_comm_model_on_a_full_placement(devices):
    widths = np.array([64.0, 0.0, 300.0, 17.0])[:devices]
    lines = comm_lines(MODEL, devices, BATCH, float(widths.sum()))
    forward, backward = MODEL.predict_arrays(widths, BATCH)
    assert np.allclose(np.maximum(lines[0, 0] + lines[0, 1] * widths, 0), forward)
    assert np.allclose(np.maximum(lines[1, 0] + lines[1, 1] * widths, 0), backward)


@pytest.mark.parametrize("seed", range(8))
def test_the_synchronized_objective_is_the_comm_model_on_full_placements(seed):
    task = _task(seed)
    placement = np.random.default_rng(seed).integers(0, task["devices"], len(task["sizes"]))
    assert _objective(task).cost(placement, task["devices"]) == pytest.approx(_cost(task, placement), rel=1e-12)


def _old_key_greedy(keys, sizes, devices, capacity):
    """The heuristics' greedy loop as it was written before `greedy` took an objective (memory checked
    on room for the table alone, which these roomy tasks make the same as the packing guard)."""
    load, memory = np.zeros(devices), np.zeros(devices, np.int64)
    placement = np.full(len(keys), -1)
    for i in np.argsort(-keys, kind="stable"):
        fits = np.flatnonzero(memory + sizes[i] <= capacity)
        best = fits[np.lexsort((fits, memory[fits], load[fits]))[0]]
        placement[i], load[best], memory[best] = best, load[best] + keys[i], memory[best] + sizes[i]
    return placement


@pytest.mark.parametrize("seed", range(20))
def test_the_greedy_on_one_linear_stage_is_the_lowest_accumulated_key(seed):
    g = np.random.default_rng(seed)
    n, devices = int(g.integers(3, 40)), int(g.integers(2, 9))
    keys = g.choice([1.0, 2.0, 3.0, 5.0], n) if seed % 2 else g.uniform(0.1, 5.0, n)  # ties, then none
    sizes = g.integers(1, 5, n).astype(np.int64)
    capacity = int(sizes.sum())  # any device holds everything: only the costs and the ties decide
    assert np.array_equal(key_greedy(keys, sizes, devices, capacity), _old_key_greedy(keys, sizes, devices, capacity))


def test_local_search_on_the_synchronized_stages_never_scores_worse_than_sync_greedy_and_respects_memory():
    improved = 0
    for seed in range(25):
        task = _task(seed)
        args = [task[k] for k in ("forward", "backward", "dims", "sizes", "devices", "capacity")]
        try:
            start = sync_greedy(*args, _lines(task))
        except Infeasible:
            continue
        search = [_objective(task), task["sizes"], task["devices"], task["capacity"]]
        refined = local_search(*search, start)
        assert _cost(task, refined) <= _cost(task, start) + 1e-12
        assert np.bincount(refined, task["sizes"], task["devices"]).max() <= task["capacity"]
        assert np.array_equal(refined, local_search(*search, start)), "deterministic"
        improved += _cost(task, refined) < _cost(task, start) - 1e-9
    assert improved > 0, "the search finds something the greedy missed on some task"


def test_local_search_leaves_a_local_optimum_alone_and_fixes_a_bad_start():
    forward, backward = np.array([5.0, 0.0, 0.0, 4.0]), np.array([0.0, 4.0, 4.0, 0.0])
    objective = Linear.synchronized(forward, backward, np.ones(4), np.zeros((2, 2)))
    args = (objective, np.ones(4, np.int64), 2, 10)
    bad = np.array([0, 1, 1, 0])  # both forward-heavy tables together: 9 + 8
    good = local_search(*args, bad)
    assert objective.cost(good, 2) == 9.0
    assert np.array_equal(local_search(*args, good), good)


def _brute_force(task: dict) -> float:
    best = np.inf
    for combo in itertools.product(range(task["devices"]), repeat=len(task["sizes"])):
        placement = np.array(combo)
        if np.bincount(placement, task["sizes"], task["devices"]).max() <= task["capacity"]:
            best = min(best, _cost(task, placement))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_the_milp_on_the_synchronized_stages_matches_brute_force_on_tiny_tasks(seed):
    task = _task(100 + seed, n=int(np.random.default_rng(seed).integers(4, 7)))
    task["devices"] = 2 + seed % 2
    task["capacity"] = int(max(task["sizes"].max(), np.ceil(1.2 * task["sizes"].sum() / task["devices"])))
    result = solve(_objective(task), task["sizes"], task["devices"], task["capacity"], rel_gap=1e-9)
    assert result.status == "optimal"
    assert np.bincount(result.placement, task["sizes"], task["devices"]).max() <= task["capacity"]
    assert result.objective == pytest.approx(_brute_force(task), rel=1e-6)
    assert result.objective == pytest.approx(_cost(task, result.placement), rel=1e-9)
    assert result.lower_bound <= result.objective + 1e-9 and 0 <= result.gap <= 1e-6


def test_the_milp_keeps_its_start_when_the_solver_finds_nothing_better():
    task = _task(7, n=10)
    args = [task[k] for k in ("forward", "backward", "dims", "sizes", "devices", "capacity")]
    start = sync_greedy(*args, _lines(task))
    result = solve(_objective(task), task["sizes"], task["devices"], task["capacity"], start, node_limit=0)
    assert _cost(task, result.placement) <= _cost(task, start) + 1e-12
    assert result.status in {"node_limit", "start"}, "node_limit 0: the solver proves nothing"
    if result.status == "start":  # nothing better found: the start itself, at its own cost
        np.testing.assert_array_equal(result.placement, start)
        assert result.objective == pytest.approx(_cost(task, start), rel=1e-9)
    with pytest.raises(Infeasible):
        solve(Linear.synchronized(np.ones(2), np.ones(2), np.ones(2), np.zeros((2, 2))), np.array([5, 5]), 2, 4)


def test_the_cost_models_objective_is_its_predicted_bottleneck_and_the_search_improves_it():
    """`Model` scores a placement as the cost model does (an empty device costs 0), in float64;
    `model_search` lowers it, keeps memory and stops at a local optimum."""
    import torch
    from study_configs import study

    from autoshard.costmodel.model import CostModel, CostModelConfig
    from autoshard.data.tasks import Task
    from autoshard.placement.objective import Model
    from autoshard.placement.search import model_search
    from autoshard.placement.shards import memory_ok, predicted_bottleneck

    g = np.random.default_rng(1)
    n, devices = 30, 5
    rows, dims = g.integers(100, 10**6, n), g.choice([8, 16, 64], n)
    x = np.column_stack([dims, rows, g.uniform(1, 50, n), rows * dims * 4, g.dirichlet(np.ones(17), n)])
    torch.manual_seed(0)
    model = CostModel.fitted_to(study(CostModelConfig, hidden=32, encoding=16, head_hidden=16), x)
    sizes = x[:, 3]
    task = Task("t", "user", "test", tuple(range(n)), devices, int(sizes.max() + 1.5 * sizes.sum() / devices), 1.0)
    objective = Model(model, x)
    for placement in (g.integers(0, devices - 1, n), np.zeros(n, np.int64)):  # device 4 (and more) left empty
        assert objective.cost(placement, devices) == pytest.approx(
            predicted_bottleneck(model, x, task, placement), rel=1e-5)
    start = np.arange(n) % devices
    refined = model_search(model, x, task, start)
    assert memory_ok(task, refined, sizes)
    assert objective.cost(refined, devices) < objective.cost(start, devices)
    assert np.array_equal(model_search(model, x, task, refined), refined), "a local optimum"


def test_on_a_mixed_cluster_it_keeps_each_devices_own_cap_and_finds_the_optimum_of_a_small_one():
    import itertools

    from autoshard.placement.objective import Linear, Speeds

    g = np.random.default_rng(3)
    for _ in range(30):
        costs, sizes = g.lognormal(0, 1, 7), g.integers(1, 100, 7)
        speeds, caps = np.array([1.0, 1.0, 0.5]), np.array([sizes.sum(), sizes.sum(), sizes.sum() // 3])
        fast = Speeds(Linear.max_device(costs), speeds)
        start = np.zeros(7, dtype=np.int64)  # all on device 0: within every cap
        found = local_search(fast, sizes, 3, caps, start)
        assert (np.bincount(found, weights=sizes, minlength=3) <= caps).all()
        assert fast.cost(found, 3) <= fast.cost(start, 3)
        best = min(fast.cost(np.array(p), 3) for p in itertools.product(range(3), repeat=7)
                   if (np.bincount(p, weights=sizes, minlength=3) <= caps).all())
        assert fast.cost(found, 3) <= 1.35 * best, "a local optimum, near the best on 7 tables"

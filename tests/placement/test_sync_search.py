"""sync_local_search and sync_milp: the predicted synchronized-stages objective, searched and solved."""

import itertools

import numpy as np
import pytest

from autoshard.measure.commmodel import CommModel
from autoshard.placement.heuristics import Infeasible
from autoshard.placement.sync import predicted_stages, sync_greedy, synchronized_cost
from autoshard.placement.sync_milp import predicted_cost, solve_sync
from autoshard.placement.sync_search import comm_lines, sync_local_search

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


def _comm(widths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return MODEL.predict_arrays(np.asarray(widths, float), BATCH)


def _cost(task: dict, placement: np.ndarray) -> float:
    """The synchronized cost as sync_greedy predicts it (the comm model on the devices' widths)."""
    def load(values):
        return np.bincount(placement, weights=np.asarray(values, float), minlength=task["devices"])
    return synchronized_cost(predicted_stages(load(task["forward"]), load(task["backward"]), load(task["dims"]),
                                              _comm))


def _lines(task: dict) -> np.ndarray:
    return comm_lines(MODEL, task["devices"], BATCH, float(np.sum(task["dims"])))


@pytest.mark.parametrize("devices", [2, 3, 4])
def test_comm_lines_are_the_comm_model_on_a_full_placement(devices):
    widths = np.array([64.0, 0.0, 300.0, 17.0])[:devices]
    lines = comm_lines(MODEL, devices, BATCH, float(widths.sum()))
    forward, backward = MODEL.predict_arrays(widths, BATCH)
    assert np.allclose(np.maximum(lines[0, 0] + lines[0, 1] * widths, 0), forward)
    assert np.allclose(np.maximum(lines[1, 0] + lines[1, 1] * widths, 0), backward)


def test_local_search_never_scores_worse_than_sync_greedy_and_respects_memory():
    improved = 0
    for seed in range(25):
        task = _task(seed)
        args = [task[k] for k in ("forward", "backward", "dims", "sizes", "devices", "capacity")]
        try:
            start = sync_greedy(*args, _comm)
        except Infeasible:
            continue
        refined = sync_local_search(*args, _lines(task), start)
        assert _cost(task, refined) <= _cost(task, start) + 1e-12
        assert np.bincount(refined, task["sizes"], task["devices"]).max() <= task["capacity"]
        assert np.array_equal(refined, sync_local_search(*args, _lines(task), start)), "deterministic"
        improved += _cost(task, refined) < _cost(task, start) - 1e-9
    assert improved > 0, "the search finds something the greedy missed on some task"


def test_local_search_leaves_a_local_optimum_alone_and_fixes_a_bad_start():
    forward, backward = np.array([5.0, 0.0, 0.0, 4.0]), np.array([0.0, 4.0, 4.0, 0.0])
    lines = np.zeros((2, 2))
    args = (forward, backward, np.ones(4), np.ones(4, np.int64), 2, 10, lines)
    bad = np.array([0, 1, 1, 0])  # both forward-heavy tables together: 9 + 8
    good = sync_local_search(*args, bad)
    assert predicted_cost(forward, backward, np.ones(4), good, 2, lines) == 9.0
    assert np.array_equal(sync_local_search(*args, good), good)


def _brute_force(task: dict) -> float:
    best = np.inf
    for combo in itertools.product(range(task["devices"]), repeat=len(task["sizes"])):
        placement = np.array(combo)
        if np.bincount(placement, task["sizes"], task["devices"]).max() <= task["capacity"]:
            best = min(best, _cost(task, placement))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_sync_milp_matches_brute_force_on_tiny_tasks(seed):
    task = _task(100 + seed, n=int(np.random.default_rng(seed).integers(4, 7)))
    task["devices"] = 2 + seed % 2
    task["capacity"] = int(max(task["sizes"].max(), np.ceil(1.2 * task["sizes"].sum() / task["devices"])))
    args = [task[k] for k in ("forward", "backward", "dims", "sizes", "devices", "capacity")]
    result = solve_sync(*args, _lines(task), rel_gap=1e-9)
    assert result.status == "optimal"
    assert np.bincount(result.placement, task["sizes"], task["devices"]).max() <= task["capacity"]
    assert result.objective == pytest.approx(_brute_force(task), rel=1e-6)
    assert result.objective == pytest.approx(_cost(task, result.placement), rel=1e-9)
    assert result.lower_bound <= result.objective + 1e-9 and 0 <= result.gap <= 1e-6


def test_sync_milp_keeps_its_start_when_the_solver_finds_nothing_better():
    task = _task(7, n=10)
    args = [task[k] for k in ("forward", "backward", "dims", "sizes", "devices", "capacity")]
    start = sync_greedy(*args, _comm)
    result = solve_sync(*args, _lines(task), start, node_limit=0)
    assert _cost(task, result.placement) <= _cost(task, start) + 1e-12
    assert result.status in {"node_limit", "start"}, "node_limit 0: the solver proves nothing"
    if result.status == "start":  # nothing better found: the start itself, at its own cost
        np.testing.assert_array_equal(result.placement, start)
        assert result.objective == pytest.approx(_cost(task, start), rel=1e-9)
    with pytest.raises(Infeasible):
        solve_sync(np.ones(2), np.ones(2), np.ones(2), np.array([5, 5]), 2, 4, np.zeros((2, 2)))

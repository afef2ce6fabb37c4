"""Devices of different speeds (`Speeds`): each device's cost over its speed, seen by the one
greedy loop and the one local search alike; equal speeds change nothing."""

import numpy as np
import pytest

from autoshard.placement.heuristics import objective_greedy
from autoshard.placement.objective import Linear, Speeds
from autoshard.placement.search import local_search

WEIGHTS = np.array([4.0, 3.0, 1.0])  # on a slow (0.5) and a fast (1) device the optimum is 6: {3} | {4, 1}
SPEEDS = np.array([0.5, 1.0])
ROOM = 10**9
SIZES = np.ones(3, dtype=np.int64)


def test_a_device_costs_its_load_over_its_speed():
    objective = Speeds(Linear.max_device(WEIGHTS), SPEEDS)
    assert objective.cost(np.array([0, 1, 1]), 2) == pytest.approx(max(4 / 0.5, 4 / 1.0))
    assert objective.cost(np.array([1, 0, 1]), 2) == pytest.approx(6.0)


def test_greedy_told_the_speeds_finds_the_optimum_that_the_speed_blind_greedy_misses():
    fast = Speeds(Linear.max_device(WEIGHTS), SPEEDS)
    order = np.argsort(-WEIGHTS, kind="stable")
    told = objective_greedy(fast, order, SIZES, 2, ROOM)
    blind = objective_greedy(Linear.max_device(WEIGHTS), order, SIZES, 2, ROOM)
    assert told.tolist() == [1, 0, 1] and fast.cost(told, 2) == pytest.approx(6.0)
    assert fast.cost(blind, 2) == pytest.approx(8.0)  # the largest table on the slow device
    searched = local_search(fast, SIZES, 2, ROOM, blind)
    assert fast.cost(searched, 2) == pytest.approx(6.0)


def test_equal_speeds_change_no_cost_and_no_plan():
    weights = np.random.default_rng(0).lognormal(size=12)
    plain = Linear.max_device(weights)
    same = Speeds(plain, np.ones(3))
    order = np.argsort(-weights, kind="stable")
    sizes = np.ones(12, dtype=np.int64)
    plan = objective_greedy(plain, order, sizes, 3, ROOM)
    assert objective_greedy(same, order, sizes, 3, ROOM).tolist() == plan.tolist()
    assert same.cost(plan, 3) == plain.cost(plan, 3)
    assert local_search(same, sizes, 3, ROOM, plan).tolist() == local_search(plain, sizes, 3, ROOM, plan).tolist()


def test_speeds_refuse_a_device_count_they_do_not_describe():
    with pytest.raises(ValueError, match="3 devices, 2 speeds"):
        Speeds(Linear.max_device(WEIGHTS), SPEEDS).states(np.array([0, 1, 2]), 3)
    with pytest.raises(ValueError, match="positive speed"):
        Speeds(Linear.max_device(WEIGHTS), np.array([1.0, 0.0]))

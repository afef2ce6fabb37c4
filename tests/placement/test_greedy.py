"""The one greedy loop: its two feasibility rules, and its callers set against each other (the
policy's twin, the column planner, the NumPy planner and the heuristics run the same loop)."""

import numpy as np
import pytest

from autoshard.placement.column_split import place_by_cost
from autoshard.placement.greedy import Infeasible, LookAhead, Room, greedy, lowest
from autoshard.placement.heuristics import key_greedy
from autoshard.rl.infer import cost_greedy

from helpers import tasks_of

SIZES = np.array([2.0, 2.0, 3.0, 3.0])  # two devices of 5: the two small tables must not share one


def first(t: int, allowed: np.ndarray) -> int:
    return int(np.flatnonzero(allowed)[0])


def test_room_dead_ends_where_the_look_ahead_does_not():
    with pytest.raises(Infeasible, match="table at step 3 \\(3 bytes\\) fits on no device"):
        greedy(4, Room(SIZES, 2, 5), first)
    assert greedy(4, LookAhead(SIZES, 2, 5), first).tolist() == [0, 1, 0, 1]


def test_the_loop_tells_the_rule_and_the_objective_in_order():
    seen = []
    rule = Room(SIZES, 3, 5)
    plan = greedy(4, rule, lambda t, allowed: lowest(rule.memory, allowed), lambda t, d: seen.append((t, d)))
    assert plan.tolist() == [0, 1, 2, 0] and seen == list(enumerate(plan.tolist()))
    assert rule.memory.tolist() == [5.0, 2.0, 3.0]


def test_column_planner_and_policy_twin_agree_where_memory_is_loose(world):
    """`place_by_cost` (room alone) and `cost_greedy` (the environment's look-ahead) are the same
    loop on the same objective: where memory never binds they give the same plans."""
    pool, features, model = world
    sizes = pool.features["size_bytes"].to_numpy()
    tasks = tasks_of(pool, 6, 12, 3, memory=int(sizes.sum()))
    for task, twin in zip(tasks, cost_greedy(model, features, tasks), strict=True):
        ids = list(task.tables)
        plan, bottleneck = place_by_cost(model, features[ids], sizes[ids], task.devices, task.memory_bytes)
        assert plan.tolist() == twin.tolist() and bottleneck > 0


def test_key_greedy_is_the_loop_on_accumulated_keys():
    """With distinct keys and loose memory the objective greedy is LPT: each key onto the device of
    lowest accumulated key."""
    keys = np.array([9.0, 7.0, 6.0, 5.0, 4.0, 2.5, 1.0])
    order = np.argsort(-keys, kind="stable")
    load = np.zeros(3)

    def placed(t: int, d: int) -> None:
        load[d] += keys[order[t]]

    lpt = np.empty(len(keys), np.int64)
    lpt[order] = greedy(len(keys), Room(np.ones(len(keys)), 3, 100), lambda t, a: lowest(load, a), placed)
    assert key_greedy(keys, np.ones(len(keys), np.int64), 3, 100).tolist() == lpt.tolist()

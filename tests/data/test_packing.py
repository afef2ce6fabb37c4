"""The tight-memory protocol: caps near the bin-packing bound, the packing guard that keeps every
method from dead-ending, and the papers' tasks unchanged."""

import copy
import hashlib
import itertools
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from study_configs import study

from autoshard.core.errors import ConfigError
from autoshard.core.params import load_params
from autoshard.data.packing import PackingGuard, first_fit_decreasing, memory_bounds
from autoshard.data.pool import build_pool
from autoshard.data.tasks import Task, make_tasks, split_pool, tight_tasks
from autoshard.placement.heuristics import HEURISTICS, heuristic_plan
from autoshard.placement.lpt import lpt
from autoshard.placement.shards import memory_ok
from autoshard.rl.env import ShardingEnv, make_batch
from autoshard.rl.infer import cost_greedy, policy_plans
from autoshard.rl.policy import Policy, PolicyConfig
from autoshard.studies.memory import placement_failed

# make_tasks before the tight protocol existed (commit 72bf472): (config, seed) -> digest
PAPERS_TASKS = {("smoke", 0): "14da66b596f5168ef11229dd97522d68dee7737f8fe5fd953d3c2a9093a12883",
                ("smoke", 7): "e08c41d551ec0d5b34fc65f02d4383891ed80d74e764702a5961a239b8283b1c",
                ("params.yaml", 0): "dd881f68005b58a8375bf2e6430ef2ad0826b0e340d7fecab81b0fcc83601204"}
ROOT = Path(__file__).resolve().parents[2]


def tight_of(pool, n: int, tables: int, devices: int, slack: float, seed: int) -> list[Task]:
    """Random tasks of pool tables with a cap of `slack` x the packing bound, FFD-placeable."""
    g = np.random.default_rng(seed)
    sizes = pool.features["size_bytes"].to_numpy()
    out = []
    while len(out) < n:
        ids = np.sort(g.choice(pool.num_tables, tables, replace=False))
        cap = int(np.ceil(slack * memory_bounds(sizes[ids], devices)[1]))
        if first_fit_decreasing(sizes[ids], devices, cap) is not None:
            out.append(Task(f"tight/{len(out)}", "tight", "test", tuple(int(i) for i in ids), devices, cap, 1.0))
    return out


def test_tight_caps_are_within_the_slack_of_the_packing_bound(world, params):
    pool, _, _ = world
    sizes = pool.features["size_bytes"].to_numpy()
    tasks = tight_tasks(pool.features, params["tasks"], seed=0)
    c = params["tasks"]["tight"]
    _, test = split_pool(len(sizes), params["tasks"]["train_share"], 0)
    assert len(tasks) == c["test_tasks"] and len({t.name for t in tasks}) == len(tasks)
    low, high = c["cap_slack"]
    for t in tasks:
        mine = sizes[list(t.tables)]
        lower, reached = memory_bounds(mine, t.devices)
        assert mine.max() <= lower <= reached
        assert low <= t.memory_bytes / reached <= high + 1 / reached
        assert first_fit_decreasing(mine, t.devices, t.memory_bytes) is not None
        assert (t.protocol, t.split, len(t.tables), t.devices) == ("tight", "test", c["tables"], c["devices"])
        assert set(t.tables) <= set(test.tolist()) and t.unseen_ratio == 1.0  # base: dreamshard
    assert tasks == tight_tasks(pool.features, params["tasks"], seed=0)
    assert tasks != tight_tasks(pool.features, params["tasks"], seed=1)


def test_memory_bounds_bracket_the_optimum():
    g = np.random.default_rng(0)
    for _ in range(60):
        t, d = int(g.integers(2, 8)), int(g.integers(2, 4))
        sizes = g.integers(1, 1000, t)
        maxima = {int(np.bincount(p, weights=sizes, minlength=d).max())
                  for p in map(np.array, itertools.product(range(d), repeat=t))}
        lower, reached = memory_bounds(sizes, d)
        assert lower <= min(maxima) <= reached <= 4 / 3 * min(maxima)  # no worse than LPT's bound
        assert reached in maxima  # reached by a placement
    assert memory_bounds(np.array([5, 5, 4, 3, 3]), 2) == (10, 10)


def test_the_papers_tasks_are_unchanged(world, params):
    pool, _, _ = world
    full = load_params(ROOT / "params.yaml")
    features = {"smoke": pool.features,
                "params.yaml": build_pool(full["dataset"], full["pool"], seed=0, progress=False).features}
    for (config, seed), digest in PAPERS_TASKS.items():
        values = params["tasks"] if config == "smoke" else full["tasks"]
        tasks, train, test = make_tasks(features[config], values, seed=seed)
        doc = json.dumps([asdict(t) for t in tasks] + [train.tolist(), test.tolist()], sort_keys=True)
        assert hashlib.sha256(doc.encode()).hexdigest() == digest, (config, seed)
        assert {t.protocol for t in tasks} == {"autoshard", "dreamshard"}
    other = copy.deepcopy(params["tasks"])
    other["tight"] |= {"tables": 4, "test_tasks": 9, "cap_slack": [1.1, 1.1]}
    assert make_tasks(pool.features, other, seed=0)[0] == make_tasks(pool.features, params["tasks"], seed=0)[0]


@pytest.mark.parametrize("change, message", [
    ({"cap_slack": [1.2, 1.1]}, r"tasks.tight.cap_slack: \[1.2, 1.1\]"),
    ({"cap_slack": [0.9, 1.1]}, r"tasks.tight.cap_slack\[0\]: 0.9"),
    ({"base": "tight"}, r"tasks.tight.base: 'tight'"),
    ({"tables": 10_000}, r"tasks.tight.tables: 10000"),
    ({"spare": 1}, r"tasks.tight.spare: 1"),
])
def test_bad_tight_parameters_are_named(world, params, change, message):
    params["tasks"]["tight"] |= change
    with pytest.raises(ConfigError, match=message):
        tight_tasks(world[0].features, params["tasks"], seed=0)


def place_randomly(sizes: np.ndarray, cap: float, devices: int, g: np.random.Generator,
                   guarded: bool) -> tuple[bool, int]:
    """Tables in the given order, each on a random allowed device: (no dead end, fallbacks)."""
    guard = PackingGuard(sizes[None, :], np.array([cap]), devices)
    memory = np.zeros(devices)
    for t, size in enumerate(sizes):
        allowed = guard.allowed(t, memory[None, :])[0] if guarded else memory + size <= cap
        assert not (allowed & (memory + size > cap)).any()
        if not allowed.any():
            return False, guard.fallbacks
        k = int(g.choice(np.flatnonzero(allowed)))
        memory[k] += size
        guard.placed(t, np.array([k]))
    assert (memory <= cap).all()
    return True, guard.fallbacks


@settings(max_examples=200, deadline=None, derandomize=True)
@given(sizes=st.lists(st.integers(1, 1000), min_size=2, max_size=14), devices=st.integers(2, 5),
       slack=st.floats(1.0, 1.25), seed=st.integers(0, 2**32 - 1))
def test_the_guard_never_dead_ends_where_ffd_places(sizes, devices, slack, seed):
    sizes = np.array(sizes)
    g = np.random.default_rng(seed)
    cap = int(np.ceil(slack * memory_bounds(sizes, devices)[1]))
    if first_fit_decreasing(sizes, devices, cap) is None:
        return
    order = g.permutation(len(sizes))  # the methods place in their own orders, not by size
    assert place_randomly(sizes[order].astype(float), cap, devices, g, guarded=True) == (True, 0)


def test_without_the_guard_random_placements_dead_end():
    """The check above is not vacuous: the plain memory mask dead-ends on such tasks."""
    g = np.random.default_rng(0)
    plain = guarded = tried = 0
    while tried < 200:
        sizes = g.integers(1, 1000, int(g.integers(6, 14))).astype(float)
        devices = int(g.integers(2, 5))
        cap = np.ceil(1.05 * memory_bounds(sizes.astype(np.int64), devices)[1])
        if first_fit_decreasing(sizes, devices, cap) is None:
            continue
        tried += 1
        plain += not place_randomly(sizes, cap, devices, g, guarded=False)[0]
        guarded += not place_randomly(sizes, cap, devices, g, guarded=True)[0]
    assert guarded == 0 and plain > 20


def test_the_guard_falls_back_to_the_memory_mask_and_counts():
    """Where FFD cannot vouch for any device (a task FFD cannot place), any device with room
    is allowed and the step counted; a table with no room is left to the caller."""
    sizes = np.array([[3.0, 3.0, 3.0], [1.0, 1.0, 1.0]])  # 9 bytes on two devices of 4 cannot fit
    guard = PackingGuard(sizes, np.array([4.0, 4.0]), 2)
    assert guard.allowed(0, np.zeros((2, 2))).tolist() == [[True, True], [True, True]]
    assert guard.fallbacks == 1
    assert guard.allowed(1, np.array([[3.0, 3.0], [1.0, 0.0]])).tolist() == [[False, False], [True, True]]
    assert guard.fallbacks == 1


def test_env_and_cost_greedy_place_tight_tasks_within_memory(world):
    pool, features, model = world
    sizes = pool.features["size_bytes"].to_numpy()
    tasks = tight_of(pool, 16, 12, 3, 1.05, seed=0)
    batch = make_batch(model, features, tasks)
    env = ShardingEnv(model, batch)
    g = torch.Generator().manual_seed(0)
    refused = 0
    while not env.done:
        room = env.device_mem + batch.sizes[:, env.t, None] <= batch.capacity[:, None]
        mask = env.mask()
        assert mask.any(1).all() and not (mask & ~room).any()
        refused += int((room & ~mask).sum())
        env.step(torch.multinomial(mask.double(), 1, generator=g).squeeze(1), mask)
    assert env.fallbacks == 0 and refused > 0  # the guard was needed, and enough
    for t, placed in zip(tasks, env.pool_placement(), strict=True):
        assert memory_ok(t, [placed[i] for i in t.tables], sizes)
    torch.manual_seed(0)
    policy = Policy(study(PolicyConfig), model)
    for plans in (cost_greedy(model, features, tasks), policy_plans(policy, model, features, tasks),
                  policy_plans(policy, model, features, tasks[:2], best_of=4, seed=0)):
        assert all(not placement_failed(t, p, sizes) for t, p in zip(tasks, plans, strict=False))


def test_heuristics_and_lpt_place_tight_tasks(world):
    pool, _, _ = world
    sizes = pool.features["size_bytes"].to_numpy()
    g = np.random.default_rng(0)
    for t in tight_of(pool, 12, 12, 3, 1.05, seed=1):
        for name in HEURISTICS:
            assert not placement_failed(t, heuristic_plan(name, pool.features, t, seed=0), sizes)
        plan = lpt(g.uniform(0.1, 1.0, len(t.tables)), sizes[list(t.tables)], t.devices, t.memory_bytes)
        assert not placement_failed(t, plan, sizes)

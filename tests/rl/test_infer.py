"""Inference: the policy's greedy, best-of-n and refined plans and cost-model greedy respect memory,
and local search only improves."""

import numpy as np
import torch
from study_configs import study

from autoshard.placement.search import model_search
from autoshard.placement.shards import memory_ok, predicted_bottleneck
from autoshard.rl.infer import cost_greedy, policy_plans
from autoshard.rl.policy import Policy, PolicyConfig

from helpers import tasks_of


def test_inference_and_search_respect_memory_and_improve(world):
    pool, features, model = world
    sizes = pool.features["size_bytes"].to_numpy()
    tasks = tasks_of(pool, 4, 12, 3)
    torch.manual_seed(0)
    policy = Policy(study(PolicyConfig), model)
    greedy = policy_plans(policy, model, features, tasks)
    best = policy_plans(policy, model, features, tasks, best_of=8, seed=0)
    refined = policy_plans(policy, model, features, tasks, refine=True)
    baseline = cost_greedy(model, features, tasks)
    for plans in (greedy, best, refined, baseline):
        assert all(memory_ok(t, p, sizes) and len(p) == len(t.tables) for t, p in zip(tasks, plans, strict=True))
    for t, g_, r in zip(tasks, greedy, refined, strict=True):
        assert predicted_bottleneck(model, features, t, r) <= predicted_bottleneck(model, features, t, g_) + 1e-6
    again = model_search(model, features, tasks[0], refined[0])
    assert np.array_equal(again, refined[0]), "local search stops at a local optimum"

"""Placing tables with a trained policy (greedy or best of N, optionally refined by local
search), and the cost-model greedy baseline; every plan is a device per `task.tables` entry."""

import numpy as np
import torch

from autoshard.costmodel.model import CostModel
from autoshard.data.tasks import Task
from autoshard.placement.greedy import greedy
from autoshard.placement.search import model_search
from autoshard.rl.env import Batch, ShardingEnv, StageComm, make_batch, synchronized_stages
from autoshard.rl.policy import Policy
from autoshard.rl.ppo import group_by_shape, rollout


def _in_task_order(batch: Batch, placement: torch.Tensor, i: int) -> np.ndarray:
    device_of = dict(zip(batch.tables[i].tolist(), placement[i].tolist(), strict=True))
    return np.array([device_of[t] for t in batch.tasks[i].tables], dtype=np.int64)


@torch.inference_mode()
def policy_plans(policy: Policy, model: CostModel, features: np.ndarray, tasks: list[Task],
                 best_of: int = 1, refine: bool = False, seed: int = 0) -> list[np.ndarray]:
    """Greedy placements (`best_of` 1), or the best of `best_of` sampled ones by predicted bottleneck."""
    generator = torch.Generator().manual_seed(seed)
    plans: dict[str, np.ndarray] = {}
    for group in group_by_shape(tasks):
        if best_of <= 1:
            batch = make_batch(model, features, group)
            traj = rollout(policy, model, batch, "greedy", record=False)
            for i, task in enumerate(group):
                plans[task.name] = _in_task_order(batch, traj.actions, i)
            continue
        for task in group:
            batch = make_batch(model, features, [task] * best_of)
            traj = rollout(policy, model, batch, "sample", generator=generator, record=False)
            best = int(traj.bottleneck.argmin())
            plans[task.name] = _in_task_order(batch, traj.actions, best)
    out = [plans[t.name] for t in tasks]
    if refine:
        out = [model_search(model, features, t, p) for t, p in zip(tasks, out, strict=True)]
    return out


@torch.inference_mode()
def cost_greedy(model: CostModel, features: np.ndarray, tasks: list[Task]) -> list[np.ndarray]:
    """Each table, largest predicted single cost first, to the device whose predicted cost after
    placing it is lowest among those the environment allows (room for the table and for the tables
    after it): the strong baseline a careful engineer would try first. `placement.greedy`'s loop,
    the environment its rule, every task of a shape at once."""
    plans: dict[str, np.ndarray] = {}
    for group in group_by_shape(tasks):
        batch = make_batch(model, features, group)
        env = ShardingEnv(model, batch)
        greedy(batch.steps, env, lambda t, mask, env=env: env.after().masked_fill(~mask, float("inf")).argmin(-1))
        for i, task in enumerate(group):
            plans[task.name] = _in_task_order(batch, env.placement, i)
    return [plans[t.name] for t in tasks]


@torch.inference_mode()
def predicted_synchronized(model: CostModel, comm: StageComm, features: np.ndarray, tasks: list[Task],
                           plans: list[np.ndarray]) -> np.ndarray:
    """Predicted synchronized-stages cost (ms) of each task's placement (a device per `task.tables`
    entry) under a stage-head cost model and `comm`: what the `synchronized` reward scores."""
    out = []
    for task, plan in zip(tasks, plans, strict=True):
        batch = make_batch(model, features, [task])
        device_of = dict(zip(task.tables, np.asarray(plan).tolist(), strict=True))
        placement = torch.tensor([[device_of[t] for t in batch.tables[0].tolist()]])
        out.append(float(synchronized_stages(model, comm, batch, placement).max(1).values.sum()))
    return np.array(out)

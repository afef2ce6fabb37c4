"""The sharding MDP: memory masking, refused and infeasible steps, batched stepping, the rewards,
and the synchronized-stages reward (DreamShard's objective) by hand, with the tasks rl_sync_greedy
is planned for."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from study_configs import study

from autoshard.core.errors import ConfigError
from autoshard.costmodel.model import CostModelConfig
from autoshard.data.features import FEATURE_COLUMNS
from autoshard.data.tasks import Task
from autoshard.measure.commmodel import CommModel
from autoshard.placement.greedy import Infeasible
from autoshard.placement.shards import memory_ok
from autoshard.rl.env import Batch, ShardingEnv, StageComm, make_batch
from autoshard.studies.evaluate import not_run

from helpers import tasks_of


def test_masking_keeps_memory(world):
    pool, features, model = world
    sizes = pool.features["size_bytes"].to_numpy()
    task = tasks_of(pool, 1, 6, 3)[0]
    mine = sizes[list(task.tables)]
    tight = replace(task, memory_bytes=int(mine.max() * 1.01 + mine.sum() / 3))
    batch = make_batch(model, features, [tight])
    env = ShardingEnv(model, batch)
    while not env.done:
        mask = env.mask()
        assert mask.any()
        env.step(mask.float().argmax(-1))  # first allowed device
    placement = [env.pool_placement()[0][t] for t in tight.tables]
    assert memory_ok(tight, placement, sizes)


def test_disallowed_action_is_refused(world):
    pool, features, model = world
    task = tasks_of(pool, 1, 4, 2)[0]
    big = int(pool.features["size_bytes"].to_numpy()[list(task.tables)].max())
    env = ShardingEnv(model, make_batch(model, features, [replace(task, memory_bytes=big)]))
    env.step(torch.tensor([0]))
    with pytest.raises((ValueError, Infeasible)):
        env.step(torch.tensor([0]))


def test_infeasible_task_is_an_error(world):
    pool, features, model = world
    task = tasks_of(pool, 1, 5, 1)[0]
    sizes = pool.features["size_bytes"].to_numpy()[list(task.tables)]
    env = ShardingEnv(model, make_batch(model, features, [replace(task, memory_bytes=int(sizes.max()))]))
    with pytest.raises(Infeasible, match="fits on no device"):
        while not env.done:
            env.step(torch.tensor([0]))


def test_batched_and_single_stepping_agree(world):
    pool, features, model = world
    tasks = tasks_of(pool, 4, 8, 3)
    g = np.random.default_rng(1)
    actions = g.integers(0, 3, size=(4, 8))
    together = ShardingEnv(model, make_batch(model, features, tasks))
    for t in range(8):
        together.step(torch.as_tensor(actions[:, t]))
    for i, task in enumerate(tasks):
        alone = ShardingEnv(model, make_batch(model, features, [task]))
        for t in range(8):
            alone.step(torch.as_tensor(actions[i:i + 1, t]))
        torch.testing.assert_close(alone.device_cost[0], together.device_cost[i])
        assert alone.pool_placement()[0] == together.pool_placement()[i]


def test_rewards(world):
    pool, features, model = world
    env = ShardingEnv(model, make_batch(model, features, tasks_of(pool, 2, 6, 2)))
    while not env.done:
        env.step(torch.tensor([env.t % 2, 0]))
    balance = env.reward("balance")
    assert 0 < balance[0] <= 1
    assert balance[1] == 0  # everything on device 0: the other device costs nothing
    assert (env.reward("bottleneck") < 0).all()


# ms = a + b * sent_mb + c * received_mb; at 2 devices and this batch size one width unit is 1 MB
COMM = StageComm(CommModel({2: {"forward": [1.0, 0.1, 0.05], "backward": [2.0, 0.02, 0.1]}}, {}),
                 batch_size=500_000)


class LinearStages:
    """A stage-head 'cost model' whose two heads are the summed encodings: (forward, backward) ms."""

    cfg = study(CostModelConfig, heads="stages")

    def head_ms(self, pooled: torch.Tensor) -> torch.Tensor:
        return pooled

    def cost_ms(self, pooled: torch.Tensor) -> torch.Tensor:
        return pooled.sum(-1)


def batch_of(forward: list[float], backward: list[float], dims: list[float]) -> Batch:
    """One task of these tables on 2 devices with ample memory, in the given order."""
    t = len(dims)
    features = torch.zeros(1, t, len(FEATURE_COLUMNS))
    features[0, :, FEATURE_COLUMNS.index("dim")] = torch.tensor(dims)
    encodings = torch.tensor([list(zip(forward, backward, strict=True))], dtype=torch.float32)
    task = Task("hand/0", "dreamshard", "train", tuple(range(t)), 2, 10**9, 0.0)
    return Batch(tasks=[task], tables=torch.arange(t)[None], features=features, encodings=encodings,
                 sizes=torch.ones(1, t, dtype=torch.float64), capacity=torch.tensor([1e9], dtype=torch.float64),
                 single_cost=encodings.sum(-1), devices=2)


def placed(batch: Batch, devices: list[int]) -> ShardingEnv:
    env = ShardingEnv(LinearStages(), batch, COMM)
    for d in devices:
        env.step(torch.tensor([d]))
    return env


def test_the_synchronized_reward_is_the_sum_of_stage_maxima_by_hand():
    batch = batch_of([3, 1, 3, 1], [1, 3, 1, 3], [10, 30, 10, 30])
    env = placed(batch, [0, 0, 0, 1])
    # device 0: forward 7, backward 5, width 50; device 1: forward 1, backward 3, width 30; W = 80
    forward_comm = [1 + 0.1 * 50 + 0.05 * 30, 1 + 0.1 * 30 + 0.05 * 50]   # sends its width, receives the rest
    backward_comm = [2 + 0.02 * 30 + 0.1 * 50, 2 + 0.02 * 50 + 0.1 * 30]  # the two swap
    expected = 7 + max(forward_comm) + max(backward_comm) + 5
    assert float(env.synchronized()[0]) == pytest.approx(expected)
    assert float(env.reward("synchronized")[0]) == pytest.approx(-expected / (16 / 2))  # reference: balanced load
    assert env.reward("bottleneck")[0] == pytest.approx(-12 / 8), "the other rewards are unchanged"


def test_balancing_device_totals_but_not_stages_scores_worse():
    batch = batch_of([3, 1, 3, 1], [1, 3, 1, 3], [10, 10, 10, 10])
    stages_balanced, totals_only = placed(batch, [0, 0, 1, 1]), placed(batch, [0, 1, 0, 1])
    assert torch.equal(stages_balanced.bottleneck(), totals_only.bottleneck())  # 8 ms on every device either way
    assert float(stages_balanced.synchronized()[0]) == pytest.approx(4 + 4.0 + 4.4 + 4)
    assert float(totals_only.synchronized()[0]) == pytest.approx(6 + 4.0 + 4.4 + 6)
    assert stages_balanced.reward("synchronized")[0] > totals_only.reward("synchronized")[0]


def test_the_synchronized_reward_needs_stage_heads_and_a_comm_model(world):
    _, _, total_model = world
    batch = batch_of([1, 1], [1, 1], [4, 4])
    without_comm = ShardingEnv(LinearStages(), batch)
    for d in (0, 1):
        without_comm.step(torch.tensor([d]))
    with pytest.raises(ConfigError, match="comm model"):
        without_comm.reward("synchronized")
    with_total = ShardingEnv(total_model, batch, COMM)
    with pytest.raises(ConfigError, match="heads: stages"):
        with_total.stages()


def test_rl_sync_greedy_is_planned_only_where_the_synchronized_stages_rank():
    objective = {"autoshard": "max_device", "dreamshard": "synchronized_stages"}
    autoshard = Task("a/0", "autoshard", "test", (0, 1), 2, 10**9, 0.5)
    dreamshard = Task("d/0", "dreamshard", "test", (0, 1), 2, 10**9, 1.0)
    assert not_run("rl_sync_greedy", autoshard, objective) == \
        "optimises synchronized_stages; autoshard is ranked by max_device"
    assert not_run("rl_sync_greedy", dreamshard, objective) is None

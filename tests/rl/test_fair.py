"""The fair learned sharder's parts: the lookahead features, per-step (shaped) rewards that sum to
the terminal reward, the teacher rollout that is cost_greedy, and an imitation start that places
as its teacher does."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from study_configs import study

from autoshard.core.errors import ConfigError
from autoshard.rl.env import make_batch
from autoshard.rl.infer import cost_greedy, policy_plans
from autoshard.rl.policy import Policy, PolicyConfig
from autoshard.rl.ppo import FairPolicyConfig, RLConfig, advantages, rewards, rollout, train

from helpers import tasks_of

LOOKING = study(PolicyConfig, hidden=32, lstm_layers=1, lookahead=True)


def test_shaped_rewards_sum_to_the_terminal_bottleneck_reward(world):
    """Potential-based shaping with the predicted bottleneck as potential: each step is paid the
    bottleneck's fall (over the reference), so an episode's rewards sum to the terminal reward."""
    pool, features, model = world
    torch.manual_seed(0)
    batch = make_batch(model, features, tasks_of(pool, 4, 12, 3))
    traj = rollout(Policy(LOOKING, model), model, batch, "sample", generator=torch.Generator().manual_seed(0),
                   shaping=True)
    assert traj.step_reward.shape == (4, 12)
    np.testing.assert_allclose(traj.step_reward.sum(1).numpy(), traj.reward.numpy(), rtol=1e-5)
    terminal = rollout(Policy(LOOKING, model), model, batch, "sample", generator=torch.Generator().manual_seed(0))
    assert terminal.step_reward is None and torch.equal(rewards(terminal)[:, :-1], torch.zeros(4, 11))


def test_gae_reads_the_shaped_rewards_hand_computed():
    """Rewards (-0.2, -0.1, 0), values (0.5, 0.2, 0.1), gamma 1, lambda 0.5:
    delta = (-0.2 + 0.2 - 0.5, -0.1 + 0.1 - 0.2, 0 - 0.1) = (-0.5, -0.2, -0.1);
    A2 = -0.1, A1 = -0.2 + 0.5 * -0.1 = -0.25, A0 = -0.5 + 0.5 * -0.25 = -0.625."""
    from types import SimpleNamespace

    from autoshard.rl.ppo import Trajectory

    traj = Trajectory(batch=SimpleNamespace(size=1), actions=torch.zeros(1, 3, dtype=torch.long),
                      reward=torch.tensor([-0.3]), bottleneck=torch.zeros(1), values=torch.tensor([[0.5, 0.2, 0.1]]),
                      step_reward=torch.tensor([[-0.2, -0.1, 0.0]]))
    adv, returns = advantages(traj, gamma=1.0, lam=0.5)
    np.testing.assert_allclose(adv.numpy(), [[-0.625, -0.25, -0.1]], rtol=1e-6)
    np.testing.assert_allclose(returns.numpy(), [[-0.125, -0.05, 0.0]], atol=1e-6)


def test_the_teacher_rollout_is_cost_greedy(world):
    pool, features, model = world
    tasks = tasks_of(pool, 5, 10, 3)
    batch = make_batch(model, features, tasks)
    traj = rollout(Policy(LOOKING, model), model, batch, "teacher")
    teacher = cost_greedy(model, features, tasks)
    for i, (task, plan) in enumerate(zip(tasks, teacher, strict=True)):
        device_of = dict(zip(batch.tables[i].tolist(), traj.actions[i].tolist(), strict=True))
        assert [device_of[t] for t in task.tables] == plan.tolist()
    assert traj.after.shape == (5, 10, 3) and traj.remaining.shape == (5, 10, 2)
    assert torch.equal(traj.remaining[:, -1], torch.zeros(5, 2)), "nothing is left after the last table"


def test_the_imitation_start_places_as_its_teacher(world, tmp_path):
    """A lookahead policy cloned from cost_greedy on a tiny task family (no PPO iterations) takes the
    teacher's decisions and places unseen tasks of that family as cost_greedy does."""
    pool, features, model = world
    train_tasks, test_tasks = tasks_of(pool, 24, 10, 3), tasks_of(pool, 8, 10, 3, seed=5)
    cfg = study(RLConfig, policy=LOOKING, iterations=0, imitation_iterations=60, tasks_per_batch=16,
                learning_rate=3e-3, validate_every=100, checkpoint_every=100)
    policy, history = train(model, features, train_tasks, cfg, 0, tmp_path / "fair.pt", progress=False)
    assert (history["phase"] == "imitation").all() and history["teacher_agreement"].iloc[-1] > 0.95
    same = np.mean([np.array_equal(a, b) for a, b in zip(policy_plans(policy, model, features, test_tasks),
                                                           cost_greedy(model, features, test_tasks), strict=True)])
    assert same >= 7 / 8


def test_shaping_needs_the_bottleneck_reward_and_the_fair_section_sets_it():
    with pytest.raises(ConfigError, match="rl.shaping: true needs reward: bottleneck"):
        replace(study(RLConfig), reward="balance", shaping=True)
    fair = FairPolicyConfig(enabled=True, shaping=True, imitation_iterations=5, iterations=7, unshaped=True,
                            keep_best=True)
    cfg = fair.training(replace(study(RLConfig), reward="balance"))
    assert cfg.policy.lookahead and cfg.shaping and cfg.reward == "bottleneck" and cfg.keep_best
    assert (cfg.imitation_iterations, cfg.iterations) == (5, 7)
    assert not fair.training(study(RLConfig), shaping=False).shaping


def test_keep_best_ends_with_the_earliest_best_validation_points_weights(world, tmp_path):
    """Validation ratios 0.9, 0.8, 0.8, 0.85 at iterations 1, 3, 5, 7: the run ends with the weights it
    had at iteration 3 (the earliest of the two bests), its history marks that row `kept`, the final
    checkpoint holds them, and resuming the finished run changes nothing."""
    from autoshard.rl.ppo import load_policy

    pool, features, model = world
    tasks = tasks_of(pool, 8, 10, 3)
    scripted, seen = iter([0.9, 0.8, 0.8, 0.85]), []

    def validate(policy):
        seen.append({k: v.clone() for k, v in policy.state_dict().items()})
        return {"val_ratio": next(scripted)}
    cfg = study(RLConfig, policy=LOOKING, iterations=6, imitation_iterations=2, tasks_per_batch=4,
                validate_every=2, checkpoint_every=3, keep_best=True)
    policy, history = train(model, features, tasks, cfg, 0, tmp_path / "fair.pt", validate, progress=False)
    assert history.loc[history["kept"], "iteration"].tolist() == [3]
    for name, value in policy.state_dict().items():
        assert torch.equal(value, seen[1][name]), name
    assert not all(torch.equal(v, seen[-1][k]) for k, v in policy.state_dict().items()), "training moved on"
    loaded = load_policy(tmp_path / "fair.pt", model)
    assert all(torch.equal(v, seen[1][k]) for k, v in loaded.state_dict().items())
    again, _ = train(model, features, tasks, cfg, 0, tmp_path / "fair.pt", validate, progress=False)
    assert all(torch.equal(v, seen[1][k]) for k, v in again.state_dict().items())

    interrupted = iter([0.9, 0.8, 0.8])  # the same run stopped at its fourth validation, after the checkpoint at 6

    def until_third(policy):
        ratio = next(interrupted, None)
        if ratio is None:
            raise KeyboardInterrupt
        return {"val_ratio": ratio}
    with pytest.raises(KeyboardInterrupt):
        train(model, features, tasks, cfg, 0, tmp_path / "resumed.pt", until_third, progress=False)
    resumed, history = train(model, features, tasks, cfg, 0, tmp_path / "resumed.pt", lambda p: {"val_ratio": 0.85},
                             progress=False)
    assert history.loc[history["kept"], "iteration"].tolist() == [3], "the best point survives the interruption"
    assert all(torch.equal(v, seen[1][k]) for k, v in resumed.state_dict().items())

    finals = []

    def record(policy):
        finals.append({k: v.clone() for k, v in policy.state_dict().items()})
        return {"val_ratio": 0.5}
    last, last_history = train(model, features, tasks, replace(cfg, keep_best=False), 0, tmp_path / "last.pt",
                               record, progress=False)
    assert "kept" not in last_history, "keep_best off: the last iterate"
    assert all(torch.equal(v, finals[-1][k]) for k, v in last.state_dict().items())


def test_a_lookahead_policy_has_no_numpy_export(world, tmp_path):
    from autoshard.costmodel.model import save_model
    from autoshard.rl import numpy_planner
    from autoshard.rl.ppo import save_checkpoint

    _, _, model = world
    policy = Policy(LOOKING, model)
    save_model(model, tmp_path / "cost_model.pt")
    cfg = study(RLConfig, policy=LOOKING)
    save_checkpoint(tmp_path / "policy.pt", policy, torch.optim.Adam(policy.parameters()), cfg, 0,
                    torch.Generator(), [])
    with pytest.raises(ConfigError, match="lookahead policy"):
        numpy_planner.export(tmp_path / "cost_model.pt", tmp_path / "policy.pt", tmp_path / "planner.npz")

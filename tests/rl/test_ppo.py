"""The policy network and PPO: one policy for any size, rollouts, seeded training that resumes
exactly from its checkpoints (on either reward), and the run key that decides what is resumed."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
from study_configs import study

from autoshard.costmodel.model import CostModel, CostModelConfig
from autoshard.data.tasks import Task
from autoshard.measure.commmodel import CommModel
from autoshard.placement.shards import memory_ok, predicted_bottleneck
from autoshard.rl.env import StageComm, make_batch
from autoshard.rl.infer import policy_plans, predicted_synchronized
from autoshard.rl.policy import Policy, PolicyConfig
from autoshard.rl.ppo import RLConfig, load_checkpoint, load_policy, rollout, stalled, train

from helpers import tasks_of

FAST = study(RLConfig, iterations=6, tasks_per_batch=8, validate_every=3, checkpoint_every=3, epochs=2, minibatches=2)


@pytest.mark.parametrize("cfg", [study(PolicyConfig), study(PolicyConfig, state_encoder="separate", use_lstm=False)])
def test_one_policy_serves_any_size(world, cfg):
    pool, features, model = world
    torch.manual_seed(0)
    policy = Policy(cfg, model)
    for tables, devices in ((4, 2), (10, 3), (40, 16)):
        batch = make_batch(model, features, tasks_of(pool, 3, tables, devices))
        traj = rollout(policy, model, batch, "greedy")
        assert traj.actions.shape == (3, tables) and traj.masks.shape == (3, tables, devices)
        assert (traj.actions < devices).all()


def test_an_unrecorded_rollout_places_the_same(world):
    """Inference keeps no per-step tensors (gigabytes at 10,000 tables) and places the same."""
    pool, features, model = world
    torch.manual_seed(0)
    policy = Policy(study(PolicyConfig), model)
    batch = make_batch(model, features, tasks_of(pool, 3, 30, 4))
    for mode in ("greedy", "sample"):
        full, bare = (rollout(policy, model, batch, mode, generator=torch.Generator().manual_seed(1), record=r)
                      for r in (True, False))
        assert torch.equal(full.actions, bare.actions) and torch.equal(full.bottleneck, bare.bottleneck)
        assert bare.masks is None and bare.costs is None and full.masks.shape == (3, 30, 4)


def test_training_is_seeded_and_resumes_exactly(tmp_path, world):
    pool, features, model = world
    tasks = tasks_of(pool, 6, 8, 2) + tasks_of(pool, 6, 12, 3, seed=1)
    _, full = train(model, features, tasks, FAST, 0, tmp_path / "a.pt", progress=False)
    _, again = train(model, features, tasks, FAST, 0, tmp_path / "b.pt", progress=False)
    assert full.equals(again)
    half = replace(FAST, iterations=3)
    train(model, features, tasks, half, 0, tmp_path / "c.pt", progress=False)  # "interrupted" at 3
    payload = load_checkpoint(tmp_path / "c.pt")
    payload["rl_config"]["iterations"] = FAST.iterations  # the same run, told to go on
    torch.save(payload, tmp_path / "c.pt")
    _, resumed = train(model, features, tasks, FAST, 0, tmp_path / "c.pt", progress=False)
    assert resumed.equals(full)
    a, c = load_policy(tmp_path / "a.pt", model), load_policy(tmp_path / "c.pt", model)
    for x, y in zip(a.state_dict().values(), c.state_dict().values(), strict=True):
        assert torch.equal(x, y)


def test_checkpoint_errors(tmp_path, world):
    from autoshard.core.errors import ConfigError

    _, _, model = world
    torch.save({"format": "something else"}, tmp_path / "x.pt")
    with pytest.raises(ConfigError, match="x.pt: not an autoshard policy checkpoint"):
        load_policy(tmp_path / "x.pt", model)
    with pytest.raises(ConfigError, match="policy checkpoint not found"):
        load_policy(tmp_path / "none.pt", model)


def test_short_training_beats_random_placement(tmp_path, world):
    """A tiny problem with an analytic-cost simulator (a cost model fitted to TorchRec's
    estimates): a short PPO run places tables far better than random devices."""
    from autoshard.costmodel.dataset import measured_shards
    from autoshard.costmodel.train import fit
    from autoshard.measure.analytic import AnalyticBackend

    pool, features, _ = world
    backend, g = AnalyticBackend(pool), np.random.default_rng(0)
    shards = [[t] for t in range(pool.num_tables)]
    shards += [sorted(g.choice(pool.num_tables, g.integers(2, 8), replace=False).tolist()) for _ in range(300)]
    costs = [backend.measure(s, 256) for s in shards]
    profile = pd.DataFrame({"tables": shards, "kind": "random", "status": "ok", "backend": "analytic",
                            "forward_ms": [c.forward_ms for c in costs], "backward_ms": [c.backward_ms for c in costs],
                            "total_ms": [c.total_ms for c in costs]})
    data = measured_shards(profile, "analytic").sample(frac=1.0, random_state=0)
    model = fit(study(CostModelConfig, max_epochs=150, learning_rate=1e-2), features, np.arange(pool.num_tables),
                data.iloc[60:], data.iloc[:60], 0, progress=False).model
    tasks = tasks_of(pool, 24, 10, 4)
    cfg = study(RLConfig, iterations=40, tasks_per_batch=16, learning_rate=3e-3, entropy_coef=0.001,
                validate_every=100, checkpoint_every=100)
    policy, _ = train(model, features, tasks, cfg, 0, tmp_path / "p.pt", progress=False)
    learned = np.mean([predicted_bottleneck(model, features, t, p)
                       for t, p in zip(tasks, policy_plans(policy, model, features, tasks), strict=True)])
    rand = np.mean([predicted_bottleneck(model, features, t, g.integers(0, t.devices, len(t.tables)))
                    for t in tasks for _ in range(5)])
    assert learned < 0.8 * rand


def test_rl_run_not_resumed_after_training_code_change(tmp_path, world, monkeypatch):
    """One line of the GAE code changed (in a copy of the package the digest reads): the run
    gets another key, so the finished checkpoint is not resumed; the unchanged code resumes it."""
    import shutil

    from autoshard.core import digest
    from autoshard.rl.ppo import run_key

    pool, features, model = world
    tasks = tasks_of(pool, 6, 8, 2)
    cfg = replace(FAST, iterations=3)
    before = run_key(cfg, model, tasks, features, 0)
    _, first = train(model, features, tasks, cfg, 0, tmp_path / before / "policy.pt", progress=False)

    copy = tmp_path / "src" / "autoshard"
    shutil.copytree(digest.PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(digest, "PACKAGE_DIR", copy)
    assert run_key(cfg, model, tasks, features, 0) == before, "the same code gives the same key"
    rl_file = copy / "rl" / "ppo.py"
    line = "        last = delta + gamma * lam * last\n"
    assert line in rl_file.read_text()
    rl_file.write_text(rl_file.read_text().replace(line, "        last = delta + gamma * lam * last * 1.0\n"))
    after = run_key(cfg, model, tasks, features, 0)
    assert after != before
    assert not (tmp_path / after / "policy.pt").exists(), "nothing to resume: the run starts over"

    monkeypatch.undo()
    calls = []
    monkeypatch.setattr("autoshard.rl.ppo.update", lambda *a, **k: calls.append(1) or {})
    _, again = train(model, features, tasks, cfg, 0, tmp_path / before / "policy.pt", progress=False)
    assert not calls and again.equals(first), "the unchanged run resumes its finished checkpoint"


def test_rl_run_key_covers_inputs_and_the_whole_training_path(world):
    """Rollout and GAE code, env, policy and cost model sources are all in the key's import
    closure; so are the seed, every task field, the features, the cost model and the start policy."""
    from autoshard.core import digest
    from autoshard.rl.ppo import run_key

    names = {f.relative_to(digest.PACKAGE_DIR).as_posix() for f in digest.source_files(["autoshard.rl.ppo"])}
    assert {"rl/ppo.py", "rl/env.py", "rl/policy.py", "costmodel/model.py", "data/features.py"} <= names
    pool, features, model = world
    tasks = tasks_of(pool, 4, 8, 2)
    base = run_key(FAST, model, tasks, features, 0)
    other_model = CostModel.fitted_to(study(CostModelConfig), features * 1.01, scale=1.0)
    changed_features = features.copy()
    changed_features[3, 2] += 1
    roomier = [replace(tasks[0], memory_bytes=tasks[0].memory_bytes + 1), *tasks[1:]]
    for key in (run_key(replace(FAST, gae_lambda=0.9), model, tasks, features, 0),
                run_key(FAST, model, tasks, features, 1),
                run_key(FAST, model, roomier, features, 0),
                run_key(FAST, model, tasks, changed_features, 0),
                run_key(FAST, other_model, tasks, features, 0),
                run_key(FAST, model, tasks, features, 0, init=Policy(FAST.policy, model))):
        assert key != base
    with pytest.raises(ValueError, match="no such module"):
        digest.source_digest("autoshard.no_such_module")


def test_a_policy_trained_on_the_synchronized_reward_respects_memory(pool, features, tmp_path):
    torch.manual_seed(0)
    model = CostModel.fitted_to(study(CostModelConfig, heads="stages"), features, scale=1.0)
    comm = StageComm(CommModel({}, {"forward": [0.1, 0.01, 0.01, 0.0], "backward": [0.1, 0.01, 0.01, 0.0]}), 256)
    sizes = pool.features["size_bytes"].to_numpy()
    g = np.random.default_rng(0)
    tasks = []
    for k in range(3):
        ids = tuple(sorted(g.choice(pool.num_tables, 6, replace=False).tolist()))
        cap = int(1.3 * sizes[list(ids)].sum() / 2 + sizes[list(ids)].max())
        tasks.append(Task(f"s/{k}", "dreamshard", "train", ids, 2, cap, 0.0))
    cfg = study(RLConfig, reward="synchronized", iterations=3, tasks_per_batch=4, epochs=1, minibatches=2,
                validate_every=3, checkpoint_every=3)
    policy, history = train(model, features, tasks, cfg, 0, tmp_path / "policy.pt", progress=False, comm=comm)
    assert len(history) == 3 and (history["reward"] < 0).all()
    plans = policy_plans(policy, model, features, tasks)
    assert all(memory_ok(t, p, sizes) for t, p in zip(tasks, plans, strict=True))
    assert (predicted_synchronized(model, comm, features, tasks, plans) > 0).all()


def trajectory(values, reward, logp=None):
    """A recorded episode holding only what `advantages` and `update` read (values, reward, logp)."""
    from types import SimpleNamespace

    from autoshard.rl.ppo import Trajectory

    values = torch.tensor(values, dtype=torch.float32)
    return Trajectory(batch=SimpleNamespace(size=len(values)), actions=torch.zeros(values.shape, dtype=torch.long),
                      reward=torch.tensor(reward, dtype=torch.float32), bottleneck=torch.zeros(len(values)),
                      logp=None if logp is None else torch.tensor(logp, dtype=torch.float32), values=values)


def test_gae_matches_a_hand_computed_trajectory():
    """Three steps, terminal reward 1, values 0.5, 0.2, 0.1, gamma 0.9, lambda 0.8:
    delta = (0.9 * 0.2 - 0.5, 0.9 * 0.1 - 0.2, 1 - 0.1) = (-0.32, -0.11, 0.9);
    A2 = 0.9, A1 = -0.11 + 0.72 * 0.9 = 0.538, A0 = -0.32 + 0.72 * 0.538 = 0.06736;
    returns = A + V. With lambda 1 it is the discounted reward less the value: (0.31, 0.7, 0.9)."""
    from autoshard.rl.ppo import advantages

    traj = trajectory([[0.5, 0.2, 0.1]], [1.0])
    adv, returns = advantages(traj, gamma=0.9, lam=0.8)
    np.testing.assert_allclose(adv.numpy(), [[0.06736, 0.538, 0.9]], rtol=1e-6)
    np.testing.assert_allclose(returns.numpy(), [[0.56736, 0.738, 1.0]], rtol=1e-6)
    adv, _ = advantages(traj, gamma=0.9, lam=1.0)
    np.testing.assert_allclose(adv.numpy(), [[0.81 - 0.5, 0.9 - 0.2, 1.0 - 0.1]], rtol=1e-6)


class FixedRatios(torch.nn.Module):
    """A "policy" whose log-probabilities of the recorded actions are its parameter: 0.75 and 0.25
    for two one-step episodes recorded at 0.5, so the probability ratios are 1.5 and 0.5."""

    def __init__(self):
        super().__init__()
        self.logp = torch.nn.Parameter(torch.log(torch.tensor([[0.75], [0.25]])))


@pytest.mark.parametrize(("algorithm", "expected"), [
    # advantages (1, -1) normalised to (+s, -s), s = 1/sqrt(2); clip 0.2:
    # min(1.5 s, 1.2 s) = 1.2 s and min(-0.5 s, -0.8 s) = -0.8 s, mean 0.2 s, loss -0.2 s = -0.1 sqrt(2)
    # (unclipped it would be -0.5 s); A2C: -(s ln 0.75 - s ln 0.25) / 2 = -s ln(3) / 2.
    ("ppo", -0.1 * np.sqrt(2)), ("a2c", -np.log(3) / (2 * np.sqrt(2)))])
def test_the_policy_loss_matches_hand_computed_values(monkeypatch, algorithm, expected):
    from autoshard.rl import ppo

    policy = FixedRatios()
    monkeypatch.setattr(ppo, "evaluate", lambda p, traj, index: (p.logp[index], torch.zeros(len(index), 1),
                                                                 torch.zeros(len(index), 1)))
    cfg = replace(study(RLConfig), algorithm=algorithm, epochs=1, minibatches=1, clip=0.2)
    traj = trajectory([[0.0], [0.0]], [1.0, -1.0], logp=[[np.log(0.5)], [np.log(0.5)]])
    stats = ppo.update(policy, torch.optim.SGD(policy.parameters(), lr=0.0), traj, cfg,
                       torch.Generator().manual_seed(0))
    assert stats["policy_loss"] == pytest.approx(expected, rel=1e-5)
    assert stats["value_loss"] == pytest.approx(0.5 * (1.0 + 1.0) / 2), "returns (1, -1) against values 0"
    kl = ((1.5 - 1) - np.log(1.5) + (0.5 - 1) - np.log(0.5)) / 2
    assert stats["approx_kl"] == pytest.approx(kl, rel=1e-5)


def test_stalled_counts_validation_points_without_a_real_improvement():
    cfg = replace(FAST, patience=2, min_improvement=0.01)
    rows = [{"phase": "imitation", "val_ratio": 0.5}, {"phase": "ppo", "val_ratio": 1.0},
            {"phase": "ppo", "val_ratio": 0.995}]  # imitation rows never count; 0.5% is below the 1% asked for
    assert not stalled(rows, cfg)
    assert stalled([*rows, {"phase": "ppo", "val_ratio": 0.999}], cfg)
    assert not stalled([*rows, {"phase": "ppo", "val_ratio": 0.98}], cfg), "a 2% fall restarts the count"
    assert not stalled([*rows, {"phase": "ppo", "val_ratio": 1.0}], replace(cfg, patience=0)), "0: never stops"


def test_training_stops_where_validation_stops_improving_and_a_rerun_agrees(tmp_path, world):
    pool, features, model = world
    tasks = tasks_of(pool, 6, 8, 2)
    cfg = replace(FAST, iterations=40, validate_every=2, checkpoint_every=2, patience=3, min_improvement=0.01)

    def flat(policy) -> dict:
        return {"val_ratio": 1.0}
    _, history = train(model, features, tasks, cfg, 0, tmp_path / "p.pt", flat, progress=False)
    assert len(history) == 8 and bool(history["stopped"].iloc[-1]), "best at 2, three flat points: stops at 8"
    _, again = train(model, features, tasks, cfg, 0, tmp_path / "p.pt", flat, progress=False)
    assert again.equals(history), "the finished run is read back, not trained on"

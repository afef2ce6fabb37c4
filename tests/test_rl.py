"""The sharding MDP, the policy network, PPO training with checkpoints, inference and search."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
from study_configs import study

from autoshard.costmodel.model import CostModel, CostModelConfig
from autoshard.data.features import feature_matrix
from autoshard.data.pool import build_pool
from autoshard.data.tasks import Task
from autoshard.placement.heuristics import Infeasible
from autoshard.placement.search import local_search
from autoshard.placement.shards import memory_ok, predicted_bottleneck
from autoshard.placement.speed import synthetic_task
from autoshard.rl.env import ShardingEnv, make_batch
from autoshard.rl.infer import cost_greedy, policy_plans
from autoshard.rl.policy import Policy, PolicyConfig
from autoshard.rl.ppo import RLConfig, load_checkpoint, load_policy, rollout, train

FAST = study(RLConfig, iterations=6, tasks_per_batch=8, validate_every=3, checkpoint_every=3, epochs=2, minibatches=2)


def tasks_of(pool, n: int, tables: int, devices: int, memory: int | None = None, seed: int = 0) -> list[Task]:
    g = np.random.default_rng(seed)
    sizes = pool.features["size_bytes"].to_numpy()
    out = []
    for k in range(n):
        ids = tuple(sorted(g.choice(pool.num_tables, tables, replace=False).tolist()))
        cap = memory or int(2 * sizes[list(ids)].sum() / devices + sizes.max())
        out.append(Task(f"t/{k}", "test", "train", ids, devices, cap, 0.0))
    return out


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
    again = local_search(model, features, tasks[0], refined[0])
    assert np.array_equal(again, refined[0]), "local search stops at a local optimum"


def test_large_synthetic_task(world):
    pool, features, model = world
    task = synthetic_task(pool.features, 40, 16, seed=0)
    assert len(task.tables) == 40 and task.devices == 16
    assert task.memory_bytes >= pool.features["size_bytes"].to_numpy()[list(task.tables)].max()


def test_refresh_round_measures_plans_and_refits(tmp_path, smoke_params):
    """One refresh round with the analytic backend: the policy's unmeasured device shards are
    measured, the cost model is refitted on the grown profile, and the policy trains on."""
    from autoshard.costmodel.model import save_model
    from autoshard.data.tasks import make_tasks, save_tasks
    from autoshard.measure.collect import ProfileConfig, collect, plan_jobs, save_profile
    from autoshard.rl.ppo import RLStageConfig, split_validation
    from autoshard.rl.refresh import refresh_rounds

    params = smoke_params | {"profile": smoke_params["profile"] | {"backend": "analytic"}}
    pool = build_pool(params["dataset"], params["pool"], seed=0, progress=False)
    tasks, train_tables, test_tables = make_tasks(pool.features, params["tasks"], seed=0)
    save_tasks(tmp_path / "tasks.json", tasks, train_tables, test_tables, seed=0)
    cfg = ProfileConfig.from_params(params["profile"])
    from autoshard.measure.backends import make_backend
    from autoshard.placement.heuristics import every_plan

    jobs = plan_jobs(pool, tasks, train_tables, cfg, 0, test_tables, lambda task: every_plan(pool.features, task, 0))
    save_profile(collect(pool, jobs, make_backend(pool, cfg.backend), cfg, tmp_path / "w", progress=False),
                 tmp_path / "profile")
    features = feature_matrix(pool.features)
    torch.manual_seed(0)
    model = CostModel.fitted_to(study(CostModelConfig), features)
    rl = RLStageConfig.from_params(params["rl"])
    train_tasks, _ = split_validation(tasks, rl.validation_tasks)
    policy = Policy(rl.train.policy, model)
    new_policy, new_model, summary = refresh_rounds(policy, model, pool, train_tasks, params, rl, tmp_path,
                                                    tmp_path / "refresh", None, seed=0)
    assert summary["round"].tolist() == [1] and summary["shards_measured"].iloc[0] > 0
    assert np.isfinite(summary["model_mape_on_them_before_refit"].iloc[0])
    assert not torch.equal(new_model.head[0].weight, model.head[0].weight)
    assert (tmp_path / "refresh" / "round_1.pt").exists()
    save_model(new_model, tmp_path / "m.pt")
    assert new_policy is not policy
    assert len(list((tmp_path / "refresh").glob("*/round_1.pt"))) == 1, "the round trains in a keyed folder"
    torch.manual_seed(1)
    refresh_rounds(Policy(rl.train.policy, model), model, pool, train_tasks, params, rl, tmp_path,
                   tmp_path / "refresh", None, seed=0)
    assert len(list((tmp_path / "refresh").glob("*/round_1.pt"))) == 2, "another start policy is another run"


def test_refresh_measures_through_the_store(tmp_path, world, smoke_params):
    """The plans' new shards are measured once into the measurement store: the same call again
    measures nothing and returns the same rows, numbered after the profile's last shard."""
    from autoshard.measure.backends import make_backend
    from autoshard.measure.collect import ProfileConfig
    from autoshard.rl.refresh import measure_plans

    pool, _, _ = world
    cfg = ProfileConfig.from_params(smoke_params["profile"] | {"backend": "analytic"})
    backend = make_backend(pool, cfg.backend)
    calls = []
    measure = backend.measure
    backend.measure = lambda *args: calls.append(args) or measure(*args)
    tasks = tasks_of(pool, 3, 6, 2)
    plans = [np.arange(len(t.tables)) % t.devices for t in tasks]
    profile = pd.DataFrame({"shard_id": [0, 7], "tables": [[tasks[0].tables[0]], [tasks[0].tables[1]]]})

    def rows() -> pd.DataFrame:
        return measure_plans(pool, tasks, plans, profile, backend, cfg, tmp_path / "measurements", 1, seed=0)

    first = rows()
    assert calls and len(first) == 6 and first["shard_id"].tolist() == list(range(8, 14))
    assert set(first["status"]) == {"ok"} and np.isfinite(first["total_ms"]).all()
    assert (first["kind"] == "refresh_1").all()
    calls.clear()
    again = rows()
    assert not calls, "a rerun reads the store"
    pd.testing.assert_frame_equal(first, again)
    known = pd.concat([profile, first], ignore_index=True)
    assert measure_plans(pool, tasks, plans, known, backend, cfg, tmp_path / "measurements", 2, seed=0).empty


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

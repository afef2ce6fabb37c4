"""The NumPy planner that `autoshard plan` runs without torch: exported from the torch models,
it places tables as the torch greedy rollout and cost-model greedy do, and it is used only
when it was exported from the very model files in use."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from study_configs import study

from autoshard.core.errors import ConfigError
from autoshard.costmodel import model as costmodel
from autoshard.costmodel.model import CostModel, CostModelConfig, save_model
from autoshard.data.features import FEATURE_COLUMNS, feature_matrix
from autoshard.data.packing import first_fit_decreasing, memory_bounds
from autoshard.data.pool import build_pool
from autoshard.data.tasks import Task
from autoshard.placement.greedy import Infeasible
from autoshard.placement.shards import device_shards, predicted_bottleneck, predicted_device_costs
from autoshard.rl import numpy_planner
from autoshard.rl.env import ShardingEnv, make_batch
from autoshard.rl.infer import cost_greedy, policy_plans
from autoshard.rl.policy import Policy, PolicyConfig
from autoshard.rl.ppo import RLConfig, load_policy, save_checkpoint

SIZE = FEATURE_COLUMNS.index("size_bytes")


@pytest.fixture(scope="module")
def pool_features(smoke_params) -> np.ndarray:
    pool = build_pool(smoke_params["dataset"], smoke_params["pool"], seed=0, progress=False)
    return feature_matrix(pool.features)


def save_models(root, features: np.ndarray, policy_cfg: PolicyConfig, heads: str = "total", seed: int = 0):
    """A randomly initialised cost model and policy, saved as the study saves them."""
    torch.manual_seed(seed)
    cfg = study(CostModelConfig, heads=heads, hidden=32, encoding=16, head_hidden=16)
    model = CostModel.fitted_to(cfg, features, scale=3.0)
    policy = Policy(policy_cfg, model)
    save_model(model, root / "cost_model.pt")
    save_checkpoint(root / "policy.pt", policy, torch.optim.Adam(policy.parameters()),
                    study(RLConfig, policy=policy_cfg), 0, torch.Generator(), [])
    return root / "cost_model.pt", root / "policy.pt"


def task_of(features: np.ndarray, tables: int, devices: int, seed: int) -> tuple[np.ndarray, Task]:
    """`tables` rows drawn with repeats (exactly tied tables), room for 1.5x an even share."""
    x = features[np.random.default_rng(seed).integers(len(features), size=tables)]
    sizes = x[:, SIZE]
    cap = int(sizes.max() + 1.5 * sizes.sum() / devices)
    return x, Task(f"t{seed}", "user", "test", tuple(range(tables)), devices, cap, 1.0)


VARIANTS = {"lstm": study(PolicyConfig, hidden=16, lstm_layers=2),
            "separate encoder": study(PolicyConfig, hidden=16, lstm_layers=1, state_encoder="separate"),
            "no lstm": study(PolicyConfig, hidden=16, use_lstm=False),
            "no cost features": study(PolicyConfig, hidden=16, lstm_layers=1, use_cost_features=False)}


@torch.no_grad()
def torch_scores(policy: Policy, model: CostModel, x: np.ndarray, task: Task, placement: np.ndarray, method: str
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Replay `placement` in torch's environment: every device's score at every step (the policy's
    logits for `rl_greedy`, minus the predicted cost after placing for `cost_greedy`; -inf where the table
    does not fit) and the table placed at each step."""
    batch = make_batch(model, x, [task])
    order = batch.tables[0]
    actions = torch.as_tensor(placement)[order]  # the task's tables are 0..n-1
    env = ShardingEnv(model, batch)
    enc = policy.table_encodings(batch.features, batch.encodings)
    states = policy.states(enc)
    device_enc = torch.zeros(1, batch.devices, enc.shape[-1])
    scores = []
    for t in range(batch.steps):
        mask = env.mask()
        if method == "rl_greedy":
            feats = policy.action_features(device_enc, env.device_cost, env.device_mem, batch.capacity,
                                           batch.reference(), batch.steps / batch.devices)
            step, _ = policy(states[:, t], feats, mask, value=False)
            device_enc[0, actions[t]] += enc[0, t]
        else:
            step = -model.cost_ms(env.device_sum + batch.encodings[:, t, None, :])
        scores.append(step.masked_fill(~mask, -float("inf"))[0])
        env.step(actions[t:t + 1], mask)
    return torch.stack(scores).numpy(), order.numpy()


def assert_same_up_to_ties(planner, mine: np.ndarray, theirs: np.ndarray, policy: Policy, model: CostModel,
                           x: np.ndarray, task: Task, method: str) -> None:
    """What is guaranteed across CPUs (whose BLAS round the last bit differently): step by step,
    the same table (identical tables may swap) on the same device, until two scores tie within a
    relative 1e-5 (two tables' single costs, which set the order, or two devices' scores), where
    either may win; from there on, the same predicted bottleneck within a relative 1e-5."""
    scores, order = torch_scores(policy, model, x, task, theirs, method)
    unique, inverse = np.unique(x, axis=0, return_inverse=True)
    single = planner.cost_ms(planner.encode(unique))[inverse]
    own_order = np.argsort(-single, kind="stable")  # the NumPy planner's step order
    same_table = (x[own_order] == x[order]).all(axis=1)
    steps = np.flatnonzero(~same_table | (mine[own_order] != theirs[order]))
    if len(steps):
        t = steps[0]
        if not same_table[t]:
            a, b = single[own_order[t]], single[order[t]]
            assert abs(a - b) <= 1e-5 * max(abs(a), abs(b)), f"{method}: step {t} placed another table: not a tie"
        else:
            row = scores[t]
            chosen, other = row[theirs[order[t]]], row[mine[own_order[t]]]
            assert np.isfinite(other), f"{method}: step {t} put table {own_order[t]} on a device it does not fit"
            scale = np.abs(row[np.isfinite(row)]).max()
            assert abs(chosen - other) <= 1e-5 * scale, (
                f"{method}: step {t} chose device {mine[own_order[t]]} (score {other}) over torch's "
                f"{theirs[order[t]]} (score {chosen}): not a tie")
    np.testing.assert_allclose(predicted_bottleneck(model, x, task, mine),
                               predicted_bottleneck(model, x, task, theirs), rtol=1e-5)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("heads", ["total", "stages"])
def test_same_placements_and_costs_as_torch(tmp_path, pool_features, variant, heads):
    model_path, policy_path = save_models(tmp_path, pool_features, VARIANTS[variant], heads)
    planner = numpy_planner.load(numpy_planner.export(model_path, policy_path, tmp_path / "planner.npz"),
                                 model_path, policy_path, required=True)
    model = costmodel.load_model(model_path)
    policy = load_policy(policy_path, model)
    for seed, (tables, devices) in enumerate([(12, 3), (60, 8), (150, 16)]):
        x, task = task_of(pool_features, tables, devices, seed)
        sizes = x[:, SIZE]
        mine = planner.place(x, sizes, devices, task.memory_bytes)
        assert_same_up_to_ties(planner, mine, policy_plans(policy, model, x, [task])[0], policy, model, x, task,
                               "rl_greedy")
        greedy = planner.place(x, sizes, devices, task.memory_bytes, policy=False)
        assert_same_up_to_ties(planner, greedy, cost_greedy(model, x, [task])[0], policy, model, x, task,
                               "cost_greedy")
        shards = device_shards(task, mine)
        np.testing.assert_allclose(planner.shard_costs(x, shards), predicted_device_costs(model, x, shards),
                                   rtol=1e-5)


def test_memory_is_respected_and_a_dead_end_is_an_error(tmp_path, pool_features):
    model_path, policy_path = save_models(tmp_path, pool_features, VARIANTS["lstm"])
    planner = numpy_planner.load(numpy_planner.export(model_path, policy_path, tmp_path / "p.npz"),
                                 model_path, policy_path)
    x, task = task_of(pool_features, 40, 4, 7)
    sizes = x[:, SIZE]
    for policy in (True, False):
        placed = planner.place(x, sizes, 4, task.memory_bytes, policy=policy)
        assert (np.bincount(placed, weights=sizes, minlength=4) <= task.memory_bytes).all()
        with pytest.raises(Infeasible, match="fits on no device"):
            planner.place(x, sizes, 4, int(sizes.max()) - 1, policy=policy)
    with pytest.raises(ConfigError, match="column pooling_factor"):
        planner.place(np.where(np.arange(21) == 2, np.nan, x), sizes, 4, task.memory_bytes)


def test_used_only_when_exported_from_these_files(tmp_path, pool_features):
    model_path, policy_path = save_models(tmp_path, pool_features, VARIANTS["lstm"])
    export = numpy_planner.export(model_path, policy_path, tmp_path / "planner.npz")
    assert numpy_planner.load(export, model_path, policy_path) is not None
    assert numpy_planner.load(export, model_path, None) is not None  # cost model only (cost_greedy, heuristics)
    assert numpy_planner.load(tmp_path / "none.npz", model_path, policy_path) is None
    with pytest.raises(ConfigError, match=r"none.npz: NumPy planner not found \(run `dvc repro train_rl`\)"):
        numpy_planner.load(tmp_path / "none.npz", model_path, policy_path, required=True)
    other = tmp_path / "other"
    other.mkdir()
    save_models(other, pool_features, VARIANTS["lstm"], seed=1)
    assert numpy_planner.load(export, model_path, other / "policy.pt") is None
    assert numpy_planner.load(export, other / "cost_model.pt", policy_path) is None
    with pytest.raises(ConfigError, match="exported from other model files than .*other/policy.pt"):
        numpy_planner.load(export, model_path, other / "policy.pt", required=True)
    for garbage in (b"", b"not a zip", export.read_bytes()[:1000]):
        (tmp_path / "bad.npz").write_bytes(garbage)
        with pytest.raises(ConfigError, match="bad.npz: not a NumPy planner file"):
            numpy_planner.load(tmp_path / "bad.npz", model_path, policy_path)
    np.savez(tmp_path / "plain.npz", meta=np.array('{"format": "something else"}'))
    with pytest.raises(ConfigError, match="plain.npz: not a NumPy planner file of this version"):
        numpy_planner.load(tmp_path / "plain.npz", model_path, policy_path)


def test_log_columns_follow_the_cost_model():
    assert numpy_planner.LOG_COLUMNS == costmodel.LOG_COLUMNS


def test_same_placements_as_torch_under_a_tight_cap(tmp_path, pool_features):
    """The NumPy planner masks as the environment does (the packing guard), so the plans agree
    where the cap binds too (here the guard removes devices at some steps), and neither dead-ends."""
    model_path, policy_path = save_models(tmp_path, pool_features, VARIANTS["lstm"])
    planner = numpy_planner.load(numpy_planner.export(model_path, policy_path, tmp_path / "planner.npz"),
                                 model_path, policy_path, required=True)
    model = costmodel.load_model(model_path)
    policy = load_policy(policy_path, model)
    for seed, (tables, devices) in [(1, (12, 3)), (0, (40, 4))]:
        x, task = task_of(pool_features, tables, devices, seed)
        sizes = x[:, SIZE]
        cap = memory_bounds(sizes.astype(np.int64), devices)[1]  # no slack at all
        assert first_fit_decreasing(sizes, devices, cap) is not None
        task = replace(task, memory_bytes=cap)
        for method, theirs in (("rl_greedy", policy_plans(policy, model, x, [task])[0]),
                               ("cost_greedy", cost_greedy(model, x, [task])[0])):
            mine = planner.place(x, sizes, devices, cap, policy=method == "rl_greedy")
            assert (np.bincount(mine, weights=sizes, minlength=devices) <= cap).all()
            assert_same_up_to_ties(planner, mine, theirs, policy, model, x, task, method)
        assert guarded_steps(model, x, task, cost_greedy(model, x, [task])[0]) > 0


def guarded_steps(model: CostModel, x: np.ndarray, task: Task, placement: np.ndarray) -> int:
    """Steps of `placement` replayed in the environment where the mask refused a device with room."""
    env = ShardingEnv(model, make_batch(model, x, [task]))
    refused = 0
    for t in range(env.batch.steps):
        room = env.device_mem + env.batch.sizes[:, t, None] <= env.batch.capacity[:, None]
        mask = env.mask()
        refused += int((room & ~mask).any())
        env.step(torch.as_tensor(placement)[env.batch.tables[:, t]], mask)
    return refused

"""Training the sharding policy with PPO (or A2C) on the estimated MDP, CleanRL style.

Every hyper-parameter is a field of `RLConfig` (the `rl` section of params.yaml). One
iteration: pick a task shape (protocol) in turn, sample a batch of its training tasks,
roll the policy out on all of them at once, score the finished placements with the cost
model (terminal reward), compute GAE advantages, and update the policy for a few epochs
on minibatches of whole episodes. Checkpoints hold everything needed to resume bit-exactly.

Two options make the fair sharder (`rl.fair_policy`), not AutoShard's published design:
`shaping` pays each step the fall of the predicted bottleneck (a potential-based shaping: the
rewards of an episode sum to the terminal bottleneck reward, so the optimum is unchanged, but the
first and largest tables get their credit directly instead of through 0.95^79 of it), and
`imitation_iterations` first clone the cost-model greedy (cross-entropy on its decisions along its
own episodes, the critic fitted to its returns) so that PPO starts from what greedy knows.
"""

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from autoshard.core.checkpoints import load_tagged, save_tagged
from autoshard.core.digest import array_digest, key, source_digest, value_digest
from autoshard.core.errors import ConfigError
from autoshard.core.inputs import check_state
from autoshard.core.params import Section, bounded, choice, inline
from autoshard.core.seeding import one_thread
from autoshard.costmodel.model import CostModel
from autoshard.data.tasks import Task
from autoshard.rl.env import REWARDS, Batch, Lookahead, ShardingEnv, StageComm, make_batch
from autoshard.rl.policy import Policy, PolicyConfig

FORMAT = "autoshard-policy/1"


@dataclass(frozen=True)
class RLConfig:
    policy: PolicyConfig
    reward: str = choice(REWARDS)  # bottleneck (DreamShard) | balance (AutoShard) | synchronized (stages)
    algorithm: str = choice(("ppo", "a2c"))  # a2c: one epoch, no clipping
    iterations: int
    tasks_per_batch: int
    learning_rate: float = bounded(lo=0, lo_open=True)
    epochs: int
    minibatches: int
    clip: float = bounded(lo=0, lo_open=True)
    gamma: float = bounded(lo=0, hi=1)
    gae_lambda: float = bounded(lo=0, hi=1)
    entropy_coef: float = bounded(lo=0)
    value_coef: float = bounded(lo=0)
    max_grad_norm: float = bounded(lo=0, lo_open=True)
    validate_every: int
    checkpoint_every: int
    shaping: bool              # per-step rewards: the fall of the predicted bottleneck (reward bottleneck only)
    imitation_iterations: int = bounded(lo=0)  # iterations cloning cost_greedy before PPO (0: none)
    keep_best: bool            # end with the weights of the best validation point (false: the last iterate)
    patience: int = bounded(lo=0)  # stop after this many validation points without improvement (0: never)
    min_improvement: float = bounded(lo=0, hi=1)  # relative fall of the best validation ratio that counts

    def __post_init__(self) -> None:
        if self.shaping and self.reward != "bottleneck":
            raise ConfigError(f"rl.shaping: true needs reward: bottleneck (got {self.reward}): the shaping "
                              f"potential is the predicted bottleneck")


@dataclass
class Trajectory:
    """One batched episode: what the update needs to re-evaluate every decision."""

    batch: Batch
    actions: torch.Tensor   # (B, T)
    reward: torch.Tensor    # (B,)
    bottleneck: torch.Tensor  # (B,) predicted bottleneck (ms)
    # what the update re-evaluates; None when the rollout was not recorded (inference)
    logp: torch.Tensor | None = None      # (B, T)
    values: torch.Tensor | None = None    # (B, T)
    masks: torch.Tensor | None = None     # (B, T, D)
    costs: torch.Tensor | None = None     # (B, T, D) predicted device costs before each step
    memory: torch.Tensor | None = None    # (B, T, D) device memory before each step
    after: torch.Tensor | None = None     # (B, T, D) lookahead: device costs after placing (lookahead policies)
    remaining: torch.Tensor | None = None  # (B, T, 2) lookahead: the tables still to come
    step_reward: torch.Tensor | None = None  # (B, T) shaped rewards (None: the terminal reward only)


@torch.no_grad()
def rollout(policy: Policy, model: CostModel, batch: Batch, mode: str = "sample",
            reward: str = "bottleneck", generator: torch.Generator | None = None, record: bool = True,
            comm: StageComm | None = None, shaping: bool = False) -> Trajectory:
    """Place every table of every task in the batch; `mode` is `sample`, `greedy` or `teacher`
    (the cost-model greedy's decisions, `infer.cost_greedy`, with the policy's view of them
    recorded for imitation). Without `record` only the placements and their scores are kept: the
    per-step (B, T, D) tensors the update needs take gigabytes at 10,000 tables on 1,024 devices.
    `comm`: for the `synchronized` reward; `shaping`: record the per-step shaped rewards."""
    env = ShardingEnv(model, batch, comm)
    enc = policy.table_encodings(batch.features, batch.encodings)
    states = policy.states(enc)
    b, t, d = batch.size, batch.steps, batch.devices
    rows = torch.arange(b)
    device_enc = torch.zeros(b, d, enc.shape[-1])
    reference, per_device = batch.reference(), t / d
    steps: dict[str, list[torch.Tensor]] = {k: [] for k in ("logp", "values", "masks", "costs", "memory", "after",
                                                            "remaining", "step_reward")}
    for step in range(t):
        mask = env.mask()
        ahead = env.lookahead() if policy.cfg.lookahead or mode == "teacher" else None
        feats = policy.action_features(device_enc, env.device_cost, env.device_mem, batch.capacity,
                                       reference, per_device, ahead)
        logits, value = policy(states[:, step], feats, mask, value=mode != "greedy")
        if mode == "greedy":
            action, value = logits.argmax(-1), torch.zeros(b)
        elif mode == "teacher":
            action = ahead.after.masked_fill(~mask, float("inf")).argmin(-1)
        else:
            action = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(-1)
        before = env.bottleneck() if record and shaping else None
        if record:
            logp = torch.log_softmax(logits, -1)[rows, action]
            for k, v in (("logp", logp), ("values", value), ("masks", mask),
                         ("costs", env.device_cost.clone()), ("memory", env.device_mem.clone())):
                steps[k].append(v)
            if policy.cfg.lookahead:
                steps["after"].append(ahead.after)
                steps["remaining"].append(ahead.remaining)
        device_enc[rows, action] += enc[:, step]
        env.step(action, mask)
        if record and shaping:
            steps["step_reward"].append(-(env.bottleneck() - before) / reference)
    stacked = {k: torch.stack(v, dim=1) for k, v in steps.items() if v}
    return Trajectory(batch=batch, actions=env.placement.clone(), reward=env.reward(reward),
                      bottleneck=env.bottleneck(), **stacked)


def evaluate(policy: Policy, traj: Trajectory, index: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probabilities, entropies and values (B', T) of the recorded decisions, with gradients."""
    logp_all, values = decisions(policy, traj, index)
    logp = logp_all.gather(-1, traj.actions[index][..., None]).squeeze(-1)
    probs = logp_all.exp()
    entropy = -(probs * logp_all.masked_fill(~traj.masks[index], 0.0)).sum(-1)
    return logp, entropy, values


def decisions(policy: Policy, traj: Trajectory, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of every device (B', T, D) and values (B', T) at the recorded steps."""
    batch = traj.batch
    enc = policy.table_encodings(batch.features[index], batch.encodings[index])
    states = policy.states(enc)
    actions = traj.actions[index]
    onehot = torch.nn.functional.one_hot(actions, batch.devices).to(enc.dtype)   # (B', T, D)
    placed = onehot[..., None] * enc[:, :, None, :]                              # (B', T, D, E)
    device_enc = placed.cumsum(dim=1) - placed                                   # before each step
    ahead = Lookahead(traj.after[index], traj.remaining[index]) if policy.cfg.lookahead else None
    feats = policy.action_features(device_enc, traj.costs[index], traj.memory[index],
                                   batch.capacity[index, None], batch.reference()[index, None],
                                   batch.steps / batch.devices, ahead)
    logits, values = policy(states, feats, traj.masks[index])
    return torch.log_softmax(logits, -1), values


def rewards(traj: Trajectory) -> torch.Tensor:
    """(B, T) each step's reward: the shaped ones where recorded, else the terminal reward at the end."""
    if traj.step_reward is not None:
        return traj.step_reward.float()
    out = torch.zeros(traj.actions.shape)
    out[:, -1] = traj.reward
    return out


def advantages(traj: Trajectory, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over `rewards(traj)`; returns (advantages, returns), both (B, T)."""
    b, t = traj.values.shape
    rewards_ = rewards(traj)
    adv = torch.zeros(b, t)
    last = torch.zeros(b)
    for step in reversed(range(t)):
        next_value = traj.values[:, step + 1] if step + 1 < t else torch.zeros(b)
        delta = rewards_[:, step] + gamma * next_value - traj.values[:, step]
        last = delta + gamma * lam * last
        adv[:, step] = last
    return adv, adv + traj.values


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, algorithm: str,
                clip: float) -> torch.Tensor:
    """PPO's clipped surrogate (minus the mean of min(r A, clip(r, 1 - clip, 1 + clip) A), r the
    probability ratio), or A2C's minus the mean of log p A."""
    if algorithm != "ppo":
        return -(logp * adv).mean()
    ratio = torch.exp(logp - old_logp)
    return -torch.min(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv).mean()


def update(policy: Policy, optimizer: torch.optim.Optimizer, traj: Trajectory, cfg: RLConfig,
           generator: torch.Generator) -> dict[str, float]:
    """PPO (clipped) or A2C update on one batch of episodes; returns mean losses."""
    adv, returns = advantages(traj, cfg.gamma, cfg.gae_lambda)
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    epochs = cfg.epochs if cfg.algorithm == "ppo" else 1
    stats = {"policy_loss": [], "value_loss": [], "entropy": [], "approx_kl": []}
    for _ in range(epochs):
        order = torch.randperm(traj.batch.size, generator=generator)
        for index in order.chunk(min(cfg.minibatches, traj.batch.size)):
            logp, entropy, values = evaluate(policy, traj, index)
            ratio = torch.exp(logp - traj.logp[index])
            loss_pi = policy_loss(logp, traj.logp[index], adv[index], cfg.algorithm, cfg.clip)
            value_loss = 0.5 * ((values - returns[index]) ** 2).mean()
            loss = loss_pi + cfg.value_coef * value_loss - cfg.entropy_coef * entropy.mean()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
            optimizer.step()
            stats["policy_loss"].append(loss_pi.item())
            stats["value_loss"].append(value_loss.item())
            stats["entropy"].append(entropy.mean().item())
            stats["approx_kl"].append(((ratio - 1) - torch.log(ratio)).mean().item())
    return {k: float(np.mean(v)) for k, v in stats.items()}


def imitate(policy: Policy, optimizer: torch.optim.Optimizer, traj: Trajectory, cfg: RLConfig,
            generator: torch.Generator) -> dict[str, float]:
    """One behaviour-cloning update on a `teacher` rollout: the cross-entropy of the teacher's
    decisions, plus the critic fitted to the teacher's returns (gamma 1); returns mean losses and the
    share of decisions the greedy policy already takes as the teacher does (its most likely device;
    identical devices tie, and greedy placement then takes the first, as the teacher does)."""
    returns = rewards(traj).flip(1).cumsum(1).flip(1)
    stats = {"imitation_loss": [], "value_loss": [], "teacher_agreement": []}
    for _ in range(cfg.epochs):
        order = torch.randperm(traj.batch.size, generator=generator)
        for index in order.chunk(min(cfg.minibatches, traj.batch.size)):
            logp_all, values = decisions(policy, traj, index)
            chosen = traj.actions[index][..., None]
            logp = logp_all.gather(-1, chosen).squeeze(-1)
            clone = -logp.mean()
            value_loss = 0.5 * ((values - returns[index]) ** 2).mean()
            optimizer.zero_grad()
            (clone + cfg.value_coef * value_loss).backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
            optimizer.step()
            stats["imitation_loss"].append(clone.item())
            stats["value_loss"].append(value_loss.item())
            stats["teacher_agreement"].append(float((logp_all.detach().argmax(-1, keepdim=True) == chosen)
                                                    .float().mean()))
    return {k: float(np.mean(v)) for k, v in stats.items()}


def group_by_shape(tasks: list[Task]) -> list[list[Task]]:
    """Tasks grouped by (tables, devices), in a fixed order, for batching."""
    groups: dict[tuple[int, int], list[Task]] = {}
    for task in tasks:
        groups.setdefault((len(task.tables), task.devices), []).append(task)
    return [groups[k] for k in sorted(groups)]


def save_checkpoint(path: str | Path, policy: Policy, optimizer: torch.optim.Optimizer, cfg: RLConfig,
                    iteration: int, generator: torch.Generator, history: list[dict], best: dict | None = None) -> None:
    """The run's state; `best` is the best validation point so far (`keep_best`: its iteration, validation
    ratio and weights), kept across a resume."""
    save_tagged(path, FORMAT, {"rl_config": asdict(cfg), "state_dict": policy.state_dict(),
                               "optimizer": optimizer.state_dict(), "iteration": iteration,
                               "generator": generator.get_state(), "history": history, "best": best})


def load_checkpoint(path: str | Path) -> dict:
    """A checkpoint written by `save_checkpoint` (weights_only=True), checked."""
    return load_tagged(path, FORMAT, "policy checkpoint", "train_rl")


def config_from_checkpoint(payload: dict) -> RLConfig:
    values = dict(payload["rl_config"])
    values["policy"] = PolicyConfig(**values["policy"])
    return RLConfig(**values)


def load_policy(path: str | Path, cost_model: CostModel) -> Policy:
    """The trained policy of a checkpoint, ready for inference."""
    payload = load_checkpoint(path)
    policy = Policy(config_from_checkpoint(payload).policy, cost_model)
    check_state(path, "policy checkpoint", policy.state_dict(), payload["state_dict"])
    policy.load_state_dict(payload["state_dict"])
    return policy.eval()


def train(cost_model: CostModel, features: np.ndarray, train_tasks: list[Task], cfg: RLConfig,
          seed: int, checkpoint: str | Path, validate=None, progress: bool = True,
          init: Policy | None = None, comm: StageComm | None = None) -> tuple[Policy, pd.DataFrame]:
    """Train (or resume from `checkpoint`) for `cfg.iterations`; returns the policy and history.

    `validate(policy) -> dict` is called every `cfg.validate_every` iterations (and after the last
    imitation iteration); its values join the history rows. With `cfg.keep_best` the run ends with the
    weights of the validation point with the lowest `val_ratio` (the earliest of equals, so a policy
    that cloned its teacher keeps the clone unless training strictly improves on it), and its history
    row says `kept`; the final checkpoint holds those weights. `init` is a policy to continue from
    (a refresh round) instead of fresh weights. `comm` (the comm model) is what the `synchronized`
    reward needs besides a stage-head cost model. Runs on one thread, so a seed gives the same policy every time.
    """
    with one_thread():
        return _train(cost_model, features, train_tasks, cfg, seed, checkpoint, validate, progress, init, comm)


def stalled(history: list[dict], cfg: RLConfig) -> bool:
    """Whether the last `cfg.patience` validation points of the policy-gradient phase each failed
    to lower the best validation ratio so far by `cfg.min_improvement` (relative): training stops
    there. Computed from the history alone, so a resumed run stops where an uninterrupted one does."""
    if cfg.patience == 0:
        return False
    best, since = math.inf, 0
    for row in history:
        ratio = row.get("val_ratio")
        if row.get("phase") == "imitation" or ratio is None or not math.isfinite(ratio):
            continue
        if ratio < best * (1 - cfg.min_improvement):
            best, since = ratio, 0
        else:
            since += 1
    return since >= cfg.patience


def _train(cost_model: CostModel, features: np.ndarray, train_tasks: list[Task], cfg: RLConfig, seed: int,
           checkpoint: str | Path, validate, progress: bool, init: Policy | None,
           comm: StageComm | None) -> tuple[Policy, pd.DataFrame]:
    torch.manual_seed(seed)
    policy = Policy(cfg.policy, cost_model)
    if init is not None:
        policy.load_state_dict(init.state_dict())
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.learning_rate, eps=1e-5)
    generator = torch.Generator().manual_seed(seed)
    history: list[dict] = []
    start, best = 0, None
    checkpoint = Path(checkpoint)
    if checkpoint.exists():
        payload = load_checkpoint(checkpoint)
        if payload["rl_config"] != asdict(cfg):
            raise ConfigError(f"{checkpoint}: written with other rl parameters; delete it to start over")
        policy.load_state_dict(payload["state_dict"])
        optimizer.load_state_dict(payload["optimizer"])
        generator.set_state(payload["generator"])
        history, start, best = list(payload["history"]), int(payload["iteration"]), payload.get("best")
    groups = group_by_shape(train_tasks)
    batches = [make_batch(cost_model, features, g) for g in groups]
    total = cfg.imitation_iterations + cfg.iterations
    for it in tqdm(range(start, total), desc="train policy", initial=start, total=total, disable=not progress):
        full = batches[it % len(batches)]
        pick = torch.randint(full.size, (cfg.tasks_per_batch,), generator=generator)
        batch = _subset(full, pick)
        cloning = it < cfg.imitation_iterations
        policy.eval()
        traj = rollout(policy, cost_model, batch, "teacher" if cloning else "sample", cfg.reward, generator,
                       comm=comm, shaping=cfg.shaping)
        policy.train()
        step = imitate if cloning else update
        row = {"iteration": it, "phase": "imitation" if cloning else cfg.algorithm,
               "shape": f"{batch.steps}x{batch.devices}", "reward": float(traj.reward.mean()),
               "bottleneck_over_reference": float((traj.bottleneck / batch.reference()).mean()),
               **step(policy, optimizer, traj, cfg, generator)}
        last_clone = it + 1 == cfg.imitation_iterations
        if validate is not None and ((it + 1) % cfg.validate_every == 0 or it + 1 == total or last_clone):
            policy.eval()
            row |= validate(policy)
            ratio = float(row["val_ratio"])
            if cfg.keep_best and np.isfinite(ratio) and (best is None or ratio < best["val_ratio"]):
                best = {"iteration": it, "val_ratio": ratio,
                        "state_dict": {k: v.detach().clone() for k, v in policy.state_dict().items()}}
        history.append({k: v.item() if isinstance(v, np.generic) else v for k, v in row.items()})
        if not cloning and "val_ratio" in row and stalled(history, cfg):
            history[-1]["stopped"] = True  # validation stopped improving: the rest of the iterations are not run
            if best is not None:
                policy.load_state_dict(best["state_dict"])
            save_checkpoint(checkpoint, policy, optimizer, cfg, total, generator, history, best)
            break
        if (it + 1) % cfg.checkpoint_every == 0 or it + 1 == total:
            if it + 1 == total and best is not None:
                policy.load_state_dict(best["state_dict"])  # the run is over: its checkpoint holds the kept weights
            save_checkpoint(checkpoint, policy, optimizer, cfg, it + 1, generator, history, best)
    frame = pd.DataFrame(history)
    if best is not None:
        frame["kept"] = frame["iteration"] == best["iteration"]
    return policy.eval(), frame


def _subset(batch: Batch, index: torch.Tensor) -> Batch:
    return Batch(tasks=[batch.tasks[i] for i in index.tolist()], tables=batch.tables[index],
                 features=batch.features[index], encodings=batch.encodings[index],
                 sizes=batch.sizes[index], capacity=batch.capacity[index],
                 single_cost=batch.single_cost[index], devices=batch.devices)


@dataclass(frozen=True)
class SyncPolicyConfig:
    """The `rl.sync_policy` section: one more policy, trained with the `synchronized` reward on one
    protocol's training tasks (every other hyper-parameter as `rl`'s)."""

    enabled: bool
    protocol: str = choice(("autoshard", "dreamshard"))
    iterations: int

    def training(self, base: RLConfig) -> RLConfig:
        """`base` with the synchronized reward and this section's iterations."""
        return replace(base, reward="synchronized", iterations=self.iterations)


@dataclass(frozen=True)
class FairPolicyConfig:
    """The `rl.fair_policy` section: the fair learned sharder, trained beside the reproduction on
    the same tasks and simulator. It sees what the cost-model greedy sees (`PolicyConfig.lookahead`),
    is paid per step (`shaping`), starts by cloning the greedy (`imitation_iterations`) and ends with
    the weights of its best validation point (`keep_best`), so training can only add to its teacher; every
    other hyper-parameter is `rl`'s. `unshaped`: train it once more with the terminal reward only,
    for the training-curve comparison of credit assignment."""

    enabled: bool
    shaping: bool
    imitation_iterations: int = bounded(lo=0)
    iterations: int
    unshaped: bool
    keep_best: bool

    def training(self, base: RLConfig, shaping: bool | None = None) -> RLConfig:
        """`base` with this section's settings (`shaping` overriding its own, for the comparison)."""
        return replace(base, policy=replace(base.policy, lookahead=True), reward="bottleneck",
                       shaping=self.shaping if shaping is None else shaping,
                       imitation_iterations=self.imitation_iterations, iterations=self.iterations,
                       keep_best=self.keep_best)


@dataclass(frozen=True)
class RLStageConfig(Section):
    """The `rl` section: training hyper-parameters plus the stage's evaluation settings and the
    sizes of its sharding-speed benchmark (which do not change training)."""

    section = "rl"
    train: RLConfig = inline()
    validation_tasks: int
    best_of: int
    refresh_rounds: int = bounded(lo=0)
    refresh_iterations: int
    speed_tasks: int    # validation tasks of the largest shape timed one by one
    speed_tables: int   # one large task of this many tables (at most the pool's) ...
    speed_devices: int  # ... on this many devices
    sync_policy: SyncPolicyConfig
    fair_policy: FairPolicyConfig


def split_validation(tasks: list[Task], per_shape: int) -> tuple[list[Task], list[Task]]:
    """Training tasks minus the last `per_shape` of each shape, and those held out for validation."""
    train, val = [], []
    for group in group_by_shape([t for t in tasks if t.split == "train"]):
        if len(group) <= per_shape:
            raise ConfigError(f"rl.validation_tasks: {per_shape} (leaves no training task of "
                              f"{len(group[0].tables)} tables on {group[0].devices} devices)")
        train += group[:-per_shape]
        val += group[-per_shape:]
    return train, val


def run_key(cfg: RLStageConfig | RLConfig, cost_model: CostModel, tasks: list[Task], features: np.ndarray,
            seed: int, init: Policy | None = None, comm: StageComm | None = None) -> str:
    """Identifies a training run by content, so a checkpoint is only ever resumed by the same run:
    its parameters (not the speed benchmark's sizes nor the other policies' sections) and seed, the
    cost model (configuration and weights), the training tasks (every field), the feature matrix,
    the starting policy's weights (`init`) and the training code (every package source file in the
    static import closure of this module), and `comm` (the synchronized reward's comm model and
    batch size) when given."""
    params = {k: v for k, v in asdict(cfg).items()  # not a benchmark's sizes, nor the other policy's
              if not k.startswith("speed_") and k not in ("sync_policy", "fair_policy")}
    return key(params, seed, _state_digest(cost_model), asdict(cost_model.cfg), [asdict(t) for t in tasks],
               array_digest(features), _state_digest(init) if init is not None else None, source_digest(__name__),
               *(() if comm is None else (comm.model.to_json(), comm.batch_size)))


def _state_digest(module: torch.nn.Module) -> str:
    state = module.state_dict()
    return value_digest(list(state), [array_digest(v.detach().cpu().numpy()) for v in state.values()])

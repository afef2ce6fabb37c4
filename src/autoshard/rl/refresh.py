"""Refresh rounds (AutoShard's and DreamShard's outer loop): measure the policy's plans on the
training tasks, add the measurements to the profile data, refit the cost model on it, and go
on training the policy on the refitted model.

Each round trains into a folder keyed by its inputs (`rl.run_key`: the refitted cost model's
weights and the policy it starts from among them), and its result is copied to `round_<r>.pt`."""

import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from autoshard.core.atomic import atomic_file
from autoshard.costmodel.dataset import measured_shards, split_shards
from autoshard.costmodel.model import CostModel
from autoshard.costmodel.train import CostStageConfig, fit
from autoshard.data.features import feature_matrix
from autoshard.data.pool import Pool
from autoshard.data.tasks import Task, load_tasks
from autoshard.measure.backends import make_backend
from autoshard.measure.base import CostBackend
from autoshard.measure.collect import Job, ProfileConfig, collect, load_profile
from autoshard.placement.shards import device_shards
from autoshard.rl.infer import policy_plans
from autoshard.rl.policy import Policy
from autoshard.rl.ppo import RLStageConfig, run_key, train


def measure_plans(pool: Pool, tasks: list[Task], plans: list[np.ndarray], profile: pd.DataFrame,
                  backend: CostBackend, profile_cfg: ProfileConfig, store_root: str | Path, round_: int,
                  seed: int) -> pd.DataFrame:
    """Profile rows for the plans' device shards that the profile does not hold yet, numbered
    after its last shard. They go through the measurement store under `store_root` (`collect`),
    so a rerun reads what an earlier one measured and an interrupted one resumes."""
    known = set(profile["tables"].map(lambda t: tuple(sorted(int(x) for x in t))))
    jobs = []
    for task, plan in zip(tasks, plans, strict=True):
        for shard in device_shards(task, plan):
            key = tuple(sorted(shard))
            if key and key not in known:
                known.add(key)
                jobs.append(Job(f"refresh_{round_}", key))
    if not jobs:
        return pd.DataFrame()
    rows = collect(pool, jobs, backend, profile_cfg, store_root, progress=False, seed=seed,
                   what=f"refresh round {round_}")
    return rows.assign(shard_id=rows["shard_id"] + int(profile["shard_id"].max()) + 1)


def refresh_rounds(policy: Policy, cost_model: CostModel, pool: Pool, train_tasks: list[Task],
                   params: dict, rl: RLStageConfig, data_dir: str | Path, folder: str | Path,
                   make_validate: Callable[[CostModel], Callable] | None, seed: int,
                   measure_tasks: list[Task] | None = None) -> tuple[Policy, CostModel, pd.DataFrame]:
    """`rl.refresh_rounds` rounds of: measure the policy's plans of `train_tasks` with the
    profile's backend (`params["profile"]`, through the measurement store in `data_dir`), refit
    the cost model (`params["cost_model"]`) on the grown profile, train the policy
    `rl.refresh_iterations` more iterations on it.
    `measure_tasks` (default: `train_tasks`) are the tasks whose plans each round measures.
    Returns the policy, the cost model and one summary row per round."""
    profile_cfg = ProfileConfig.from_params(params["profile"])
    cost_cfg = CostStageConfig.from_params(params["cost_model"])
    backend = make_backend(pool, profile_cfg.backend)
    profile = load_profile(Path(data_dir) / "profile")
    _, train_tables, test_tables = load_tasks(Path(data_dir) / "tasks.json")
    features = feature_matrix(pool.features)
    summary = []
    for r in range(1, rl.refresh_rounds + 1):
        measured_tasks = train_tasks if measure_tasks is None else measure_tasks
        plans = policy_plans(policy, cost_model, features, measured_tasks)
        new = measure_plans(pool, measured_tasks, plans, profile, backend, profile_cfg,
                            Path(data_dir) / "measurements", r, seed)
        ok = new[new["status"] == "ok"] if len(new) else new
        before = cost_model.predict_ms(features, ok["tables"].tolist()) if len(ok) else np.array([])
        profile = pd.concat([profile, new], ignore_index=True)
        splits = split_shards(measured_shards(profile, backend.name), train_tables, test_tables,
                              cost_cfg.val_share, cost_cfg.test_share, seed)
        cost_model = fit(cost_cfg.model, features, train_tables, splits["train"], splits["val"], seed,
                         progress=False).model
        validate = make_validate(cost_model) if make_validate is not None else None
        more = replace(rl.train, iterations=rl.refresh_iterations)
        round_file = Path(folder) / f"round_{r}.pt"
        run = run_key(more, cost_model, train_tasks, features, seed, init=policy)
        checkpoint = Path(folder) / run / round_file.name
        policy, history = train(cost_model, features, train_tasks, more, seed, checkpoint, validate, progress=False,
                                init=policy)
        with atomic_file(round_file) as tmp:
            shutil.copyfile(checkpoint, tmp)
        measured = ok["total_ms"].to_numpy() if len(ok) else np.array([])
        row = {"round": r, "shards_measured": len(new),
               "model_mape_on_them_before_refit": float(np.mean(np.abs(before - measured) / measured))
               if len(ok) else float("nan")}
        if validate is not None:
            row |= history.dropna(subset=["val_ratio"]).iloc[-1].filter(like="val_ratio").to_dict()
        summary.append(row)
    return policy, cost_model, pd.DataFrame(summary)

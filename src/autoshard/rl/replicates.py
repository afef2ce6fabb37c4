"""Replicates of the stochastic chain: the policy (and the fair sharder, where the stage trains one)
trained again from other seeds, each on the cost model fitted from the same seed offset, so the
spread of a result across replicates says how much of it is luck. Replicate 0 is the stage's own
run. The replicates are independent training runs: jobs of the `compute` engine."""

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from autoshard.core.compute import Engine, LocalEngine
from autoshard.costmodel.model import load_model, save_model
from autoshard.data.tasks import Task
from autoshard.rl.ppo import RLConfig, RLStageConfig, run_key, train
from autoshard.rl.validation import validator


@dataclass(frozen=True)
class ReplicateJob:
    """One replicate's training run, everything a worker needs (paths absolute: a job's working
    folder is not this process's on every engine)."""

    model_path: str
    features: np.ndarray
    train_tasks: tuple[Task, ...]
    val_tasks: tuple[Task, ...]
    heuristics: dict[str, list[np.ndarray]]
    train: RLConfig
    seed: int
    checkpoint: str
    fair: RLConfig | None = None  # the fair sharder's training, as the stage's (None: none)
    fair_checkpoint: str | None = None


def run_replicate(job: ReplicateJob) -> list[dict]:
    """Train (or resume) one replicate's policy and fair sharder, validated as the stage's own
    runs; the policy's history rows."""
    model = load_model(job.model_path)
    validate = validator(model, job.features, list(job.val_tasks), job.heuristics)
    _, history = train(model, job.features, list(job.train_tasks), job.train, job.seed, job.checkpoint, validate,
                       progress=False)
    if job.fair is not None and job.fair_checkpoint is not None:
        train(model, job.features, list(job.train_tasks), job.fair, job.seed, job.fair_checkpoint, validate,
              progress=False)
    return history.to_dict("records")


def train_replicates(model_paths: list[Path], features: np.ndarray, train_tasks: list[Task], val_tasks: list[Task],
                     heuristics: dict[str, list[np.ndarray]], cfg: RLStageConfig, seed: int, work: Path,
                     folders: list[Path], engine: Engine | None = None,
                     fair_file: str = "") -> list[pd.DataFrame]:
    """Replicate r (from 1) trains on the cost model at `model_paths[r - 1]` from seed `seed + r`
    its policy and, where `cfg.fair_policy` is enabled, its fair sharder (its shaped run only),
    resumable under `work/<run key>/` like the stage's own runs, as a job of `engine` (default:
    this process), and lands as policy.pt, `fair_file` and cost_model.pt in `folders[r - 1]`.
    Returns each replicate's policy training history."""
    models = [load_model(path) for path in model_paths]
    fair = cfg.fair_policy.training(cfg.train) if cfg.fair_policy.enabled and fair_file else None

    def checkpoint(run: RLConfig, model, r: int) -> str:
        return str((work / run_key(run, model, train_tasks, features, seed + r) / "policy.pt").resolve())

    jobs = [ReplicateJob(str(Path(path).resolve()), features, tuple(train_tasks), tuple(val_tasks), heuristics,
                         cfg.train, seed + r, checkpoint(cfg.train, model, r), fair,
                         None if fair is None else checkpoint(fair, model, r))
            for r, (path, model) in enumerate(zip(model_paths, models, strict=True), start=1)]
    histories = (engine or LocalEngine(1)).map(run_replicate, jobs)
    for job, model, folder in zip(jobs, models, folders, strict=True):
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(job.checkpoint, folder / "policy.pt")
        if job.fair_checkpoint is not None:
            shutil.copyfile(job.fair_checkpoint, folder / fair_file)
        save_model(model, folder / "cost_model.pt")
    return [pd.DataFrame(rows) for rows in histories]


def validation_spread(histories: list[pd.DataFrame]) -> dict[str, float | int | list[float]]:
    """The last validation ratio of each replicate (the greedy policy's predicted bottleneck over
    the best heuristic's), with their mean, standard deviation and count."""
    values = [float(h["val_ratio"].dropna().iloc[-1]) for h in histories]
    return {"values": values, "mean": float(np.mean(values)),
            "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0, "n": len(values)}

"""Replicates of the stochastic chain: the policy trained again from other seeds, each on the
cost model fitted from the same seed offset, so the spread of a result across replicates says
how much of it is luck. Replicate 0 is the stage's own run."""

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from autoshard.costmodel.model import CostModel, save_model
from autoshard.data.tasks import Task
from autoshard.rl.ppo import RLStageConfig, run_key, train


def train_replicates(cost_models: list[CostModel], features: np.ndarray, train_tasks: list[Task],
                     cfg: RLStageConfig, seed: int, work: Path, validator_for: Callable[[CostModel], Callable],
                     folders: list[Path]) -> list[pd.DataFrame]:
    """Replicate r (from 1) trains on `cost_models[r - 1]` from seed `seed + r`, resumable under
    `work/<run key>/` like the stage's own run, and lands as policy.pt and cost_model.pt in
    `folders[r - 1]`. Returns each replicate's training history."""
    histories = []
    for r, (model, folder) in enumerate(zip(cost_models, folders, strict=True), start=1):
        checkpoint = work / run_key(cfg, model, train_tasks, features, seed + r) / "policy.pt"
        _, history = train(model, features, train_tasks, cfg.train, seed + r, checkpoint, validator_for(model),
                           progress=False)
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(checkpoint, folder / "policy.pt")
        save_model(model, folder / "cost_model.pt")
        histories.append(history)
    return histories


def validation_spread(histories: list[pd.DataFrame]) -> dict[str, float | int | list[float]]:
    """The last validation ratio of each replicate (the greedy policy's predicted bottleneck over
    the best heuristic's), with their mean, standard deviation and count."""
    values = [float(h["val_ratio"].dropna().iloc[-1]) for h in histories]
    return {"values": values, "mean": float(np.mean(values)),
            "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0, "n": len(values)}

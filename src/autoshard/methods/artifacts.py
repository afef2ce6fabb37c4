"""What methods are built from: one typed bundle of tables, trained files and measurements,
loaded once from the stage paths (or, in the command, from the user's tables and model files),
and the settings every build shares."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from autoshard.core.paths import Paths
from autoshard.core.seeding import rng
from autoshard.data.tasks import Task

if TYPE_CHECKING:  # torch (and SciPy, under the MILP) only where they are used: the command starts fast
    from autoshard.costmodel.model import CostModel
    from autoshard.measure.commmodel import CommModel
    from autoshard.placement.surrogate import MilpConfig
    from autoshard.rl.numpy_planner import NumpyModels
    from autoshard.rl.policy import Policy


@dataclass(frozen=True)
class Artifacts:
    """Everything a method may need; a field is None where this run has not got it, and a method
    that needs it is then left out (`registry.build` says why). Table ids index `pool_features`."""

    pool_features: pd.DataFrame               # per-table features: heuristics, TorchRec, memory
    features: np.ndarray                      # their feature matrix, what the cost models read
    cost_model: CostModel | None = None       # the simulator the policy was trained on
    policy: Policy | None = None
    numpy: NumpyModels | None = None          # cost model and policy exported to NumPy: no torch needed
    single_costs: np.ndarray | None = None    # ms per table measured alone (NaN: not measured)
    hybrid: CostModel | None = None           # measured single costs x a learnt fusion factor
    hybrid_features: np.ndarray | None = None  # `features` with the single costs, what the hybrid reads
    stage_singles: tuple[np.ndarray, np.ndarray] | None = None  # forward, backward ms per table alone
    comm_model: CommModel | None = None
    sync_policy: Policy | None = None         # the policy trained on the synchronized-stages reward
    stages_model: CostModel | None = None     # the stage-head cost model it was trained on
    fair_policy: Policy | None = None         # the fair learned sharder, trained on `cost_model`

    @property
    def sizes(self) -> np.ndarray:
        return self.pool_features["size_bytes"].to_numpy(np.int64)

    def missing(self, needs: tuple[str, ...]) -> tuple[str, ...]:
        """The fields of `needs` this bundle has not got."""
        return tuple(n for n in needs if getattr(self, n) is None)


NEEDS = tuple(f.name for f in fields(Artifacts))


@dataclass(frozen=True)
class Settings:
    """What every build shares: the study's seed, the training batch size TorchRec plans for, N of
    best-of-N, and the MILP's limits; `sample_seed` seeds a task's sampled placements; `device`
    the kind of device that measures the plans (TorchRec's topology is of that device); `ways`,
    the column shards a column-wise method may split a table into (1: none, its table-wise twin),
    and `candidates`, the tables `column_greedy` tries splitting."""

    seed: int
    batch_size: int
    best_of: int = 1
    milp: MilpConfig | None = None
    sample_seed: Callable[[Task], int] | None = None
    device: str = "cpu"
    ways: tuple[int, ...] = (1,)
    candidates: int = 0

    def seed_for(self, task: Task) -> int:
        if self.sample_seed is not None:
            return self.sample_seed(task)
        return int(rng(self.seed, "evaluate", "best_of", task.name).integers(2**31))


def load(paths: Paths, pool_features: pd.DataFrame, needs: Iterable[str]) -> Artifacts:
    """The artifacts among `needs` (field names) that the stages under `paths` made: the train_rl
    stage's simulator and policy, the profile's single costs, the comm model, the hybrid, the
    synchronized policy. Only what is asked for is read, so a stage depends on no file it does
    not use. The simulator and policy must exist when asked for (a missing one is an error); the
    profile's, the comm model's, the hybrid's and the synchronized policy's files stay None when
    their stage did not make them, and the methods that need them are then left out (so is the
    fair sharder's, `rl.fair_policy`)."""
    from autoshard.costmodel.model import load_model
    from autoshard.data.features import feature_matrix
    from autoshard.rl.ppo import load_policy

    needs = set(needs)
    features = feature_matrix(pool_features)
    found: dict[str, object] = {}
    if needs & {"cost_model", "policy", "fair_policy"}:
        found["cost_model"] = load_model(paths.simulator)
        if "policy" in needs:
            found["policy"] = load_policy(paths.policy, found["cost_model"])
        if "fair_policy" in needs and paths.fair_policy.exists():
            found["fair_policy"] = load_policy(paths.fair_policy, found["cost_model"])
    if needs & {"single_costs", "stage_singles", "hybrid", "hybrid_features"} and paths.profile.exists():
        found |= _profiled(paths, features, needs)
    if "comm_model" in needs and paths.comm_model.exists():
        from autoshard.measure.commmodel import CommModel

        found["comm_model"] = CommModel.load(paths.comm_model)
    if needs & {"sync_policy", "stages_model"} and paths.sync_policy.exists():
        found["stages_model"] = load_model(paths.sync_simulator)
        found["sync_policy"] = load_policy(paths.sync_policy, found["stages_model"])
    return Artifacts(pool_features=pool_features, features=features, **found)


def _profiled(paths: Paths, features: np.ndarray, needs: set[str]) -> dict[str, object]:
    """The profile's single costs (total, and forward and backward) and the hybrid that reads them."""
    from autoshard.costmodel.dataset import single_costs
    from autoshard.measure.collect import load_profile
    from autoshard.placement.surrogate import per_table
    from autoshard.placement.sync import stage_singles

    profile = load_profile(paths.profile)
    measured = single_costs(profile)
    out: dict[str, object] = {"single_costs": per_table(measured, len(features))}
    if "stage_singles" in needs:
        out["stage_singles"] = stage_singles(profile, len(features))
    if needs & {"hybrid", "hybrid_features"} and paths.hybrid_cost_model.exists():
        from autoshard.costmodel.hybrid import load_hybrid, with_single_costs

        out |= {"hybrid": load_hybrid(paths.hybrid_cost_model),
                "hybrid_features": with_single_costs(features, measured)}
    return out


def replicate(artifacts: Artifacts, paths: Paths, r: int) -> Artifacts:
    """`artifacts` with replicate `r`'s simulator, policy and fair sharder (the same data, other
    seeds; no fair sharder where the replicate trained none)."""
    from autoshard.costmodel.model import load_model
    from autoshard.rl.ppo import load_policy

    folder = paths.rl_replicate(r)
    model = load_model(folder / paths.simulator.name)
    fair = folder / paths.fair_policy.name
    return replace(artifacts, cost_model=model, policy=load_policy(folder / paths.policy.name, model), numpy=None,
                   fair_policy=load_policy(fair, model) if fair.exists() else None)


def exported(artifacts: Artifacts, numpy: NumpyModels) -> Artifacts:
    """`artifacts` with the NumPy export standing in for the torch simulator and policy."""
    return replace(artifacts, cost_model=None, policy=None, numpy=numpy, fair_policy=None)

"""Sharding a user's own tables: the methods of the study on one task, the plan document the
`autoshard` command writes, and reading plans back (ours, or TorchRec plans we exported)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from autoshard.cli.user_tables import UserTables
from autoshard.core.errors import ConfigError
from autoshard.core.seeding import rng
from autoshard.data.features import feature_matrix
from autoshard.data.tasks import Task
from autoshard.placement.heuristics import HEURISTICS
from autoshard.rl import numpy_planner

if TYPE_CHECKING:  # torch is imported only when a method needs it
    from autoshard.costmodel.model import CostModel
    from autoshard.rl.policy import Policy

METHODS = ("rl", "cost-greedy", "torchrec", *HEURISTICS)
LEARNED = ("rl", "cost-greedy")  # need the cost model (and rl the policy)
DEFAULT_POLICY = Path("data/rl/policy.pt")
DEFAULT_COST_MODEL = Path("data/rl/cost_model.pt")
FORMAT = "autoshard-plan/1"


@dataclass
class Models:
    """The files a plan came from, loaded either as torch modules or, for greedy placement and
    predicted costs, as the NumPy planner exported from exactly those files (`numpy`)."""

    cost_model: CostModel | None
    policy: Policy | None
    files: dict[str, dict[str, str]]
    numpy: numpy_planner.Planner | None = None

    @property
    def engine(self) -> str:
        if self.numpy is not None:
            return "numpy"
        return "torch" if self.cost_model is not None else "none"

    def shard_costs(self, features: np.ndarray, shards: list[list[int]]) -> np.ndarray | None:
        """Predicted cost (ms) per shard, or None without a cost model."""
        if self.numpy is not None:
            return self.numpy.shard_costs(features, shards)
        if self.cost_model is None:
            return None
        from autoshard.placement.shards import predicted_device_costs

        return predicted_device_costs(self.cost_model, features, shards)


def _file_version(path: Path) -> dict[str, str]:
    return {"path": str(path), "sha256": numpy_planner.sha256(path)[:16]}


def _existing(path: Path | None, default: Path, what: str, option: str) -> Path:
    path = path or default
    if not path.is_file():
        made_by = f"run `dvc repro train_rl`, which writes it, or pass {option}" if path == default else "no such file"
        raise ConfigError(f"{path}: {what} not found ({made_by})")
    return path


def load_models(method: str, policy_path: Path | None, model_path: Path | None, need_torch: bool = False) -> Models:
    """The cost model and policy `method` needs. A heuristic or TorchRec plan works without
    them (predicted costs are then left out) unless a path was given explicitly. Unless
    `need_torch` (sampling, local search), the NumPy planner next to the policy (or the cost
    model) stands in for both when it was exported from these very files."""
    model_path = (_existing(model_path, DEFAULT_COST_MODEL, "cost model", "--cost-model")
                  if method in LEARNED or model_path is not None or DEFAULT_COST_MODEL.is_file() else None)
    policy_path = _existing(policy_path, DEFAULT_POLICY, "policy checkpoint", "--policy") if method == "rl" else None
    if model_path is None:
        return Models(cost_model=None, policy=None, files={})
    files = {"cost_model": _file_version(model_path)} | ({"policy": _file_version(policy_path)} if policy_path else {})
    if not need_torch:
        export = (policy_path or model_path).parent / numpy_planner.FILE_NAME
        planner = numpy_planner.load(export, model_path, policy_path)
        if planner is not None:
            return Models(cost_model=None, policy=None, files=files, numpy=planner)
    from autoshard.costmodel.model import load_model
    from autoshard.rl.ppo import load_policy

    model = load_model(model_path)
    policy = load_policy(policy_path, model) if policy_path else None
    return Models(cost_model=model, policy=policy, files=files)


def make_task(tables: UserTables, devices: int, memory_bytes: int) -> Task:
    """The task of placing every table on `devices` devices of `memory_bytes` each; refused when
    a table cannot fit one device or all of them cannot fit the devices together."""
    if devices < 1:
        raise ConfigError(f"--devices: {devices} (must be at least 1)")
    sizes = tables.features["size_bytes"].to_numpy()
    too_big = np.flatnonzero(sizes > memory_bytes)
    if len(too_big):
        i = int(too_big[0])
        raise ConfigError(f"{tables.source}: row {i + 1} ({tables.names[i]}): {int(sizes[i])} bytes do not fit one "
                          f"device's memory ({memory_bytes} bytes, --memory-per-device)")
    if sizes.sum() > devices * memory_bytes:
        raise ConfigError(f"{tables.source}: the tables need {int(sizes.sum())} bytes, more than the {devices} devices "
                          f"hold together ({devices * memory_bytes} bytes)")
    return Task(name="user", protocol="user", split="test", tables=tuple(range(len(sizes))), devices=devices,
                memory_bytes=int(memory_bytes), unseen_ratio=1.0)


def place(method: str, tables: UserTables, task: Task, models: Models, best_of: int = 1, refine: bool = False,
          seed: int = 0, batch_size: int = 2048) -> np.ndarray:
    """A device per table by the named method (`best_of`/`refine` apply to rl)."""
    from autoshard.placement.heuristics import heuristic_plan

    if method not in METHODS:
        raise ConfigError(f"--method: {method!r} (expected one of {', '.join(METHODS)})")
    try:
        if method in LEARNED:
            return _learned(method, tables, task, models, best_of, refine, seed)
    except ConfigError as exc:  # a learned placement can paint itself into a corner under a tight cap
        raise ConfigError(f"--method {method}: no placement under --memory-per-device {task.memory_bytes} bytes "
                          f"({exc}; tables go largest predicted cost first, not largest size first: try more "
                          "memory or a size-aware heuristic such as size_lookup_greedy)") from None
    if method == "torchrec":
        from autoshard.placement.torchrec import torchrec_plan

        return torchrec_plan(tables.features, task, batch_size)
    return heuristic_plan(method, tables.features, task, seed)


def _learned(method: str, tables: UserTables, task: Task, models: Models, best_of: int, refine: bool,
             seed: int) -> np.ndarray:
    features = feature_matrix(tables.features)
    if models.numpy is not None and best_of == 1 and not refine:
        return models.numpy.place(method, features, tables.features["size_bytes"].to_numpy(), task.devices,
                                  task.memory_bytes, task.name)
    if models.cost_model is None:
        raise ValueError("torch models are needed for sampling and local search: load_models(need_torch=True)")
    from autoshard.rl.infer import cost_greedy, policy_plans

    if method == "rl":
        return policy_plans(models.policy, models.cost_model, features, [task], best_of, refine, seed)[0]
    return cost_greedy(models.cost_model, features, [task])[0]


def timed_place(method: str, tables: UserTables, task: Task, models: Models, **options) -> tuple[np.ndarray, float]:
    """`place` and the seconds it took."""
    start = time.perf_counter()
    placement = place(method, tables, task, models, **options)
    return placement, time.perf_counter() - start


def device_table(tables: UserTables, task: Task, placement: np.ndarray, models: Models) -> pd.DataFrame:
    """Per device: its tables, the memory they use, and the cost model's predicted cost (ms)."""
    from autoshard.placement.shards import device_shards

    shards = device_shards(task, placement)
    sizes = tables.features["size_bytes"].to_numpy()
    out = pd.DataFrame({"device": range(task.devices), "tables": [len(s) for s in shards],
                        "memory_bytes": [int(sizes[s].sum()) for s in shards],
                        "memory_share": [float(sizes[s].sum() / task.memory_bytes) for s in shards]})
    predicted = models.shard_costs(feature_matrix(tables.features), shards)
    if predicted is not None:
        out["predicted_ms"] = predicted
    names = tables.names
    out["names"] = [[names[t] for t in s] for s in shards]
    return out


def plan_document(method: str, options: dict, tables: UserTables, task: Task, placement: np.ndarray,
                  models: Models, seconds: float) -> dict:
    """Everything a plan file holds: how it was made, the assignment, and per-device detail."""
    devices = device_table(tables, task, placement, models)
    predicted = float(devices["predicted_ms"].max()) if "predicted_ms" in devices else None
    return {"format": FORMAT, "method": method, "options": options, "tables_file": tables.source,
            "devices": task.devices, "memory_per_device_bytes": task.memory_bytes,
            "assignment": {name: int(d) for name, d in zip(tables.names, placement, strict=True)},
            "per_device": devices.to_dict("records"), "predicted_bottleneck_ms": predicted,
            "predicted": "by the cost model, not measured (measure with `autoshard score`)",
            "sharding_seconds": seconds, "model_files": models.files, "engine": models.engine}


def read_plan(path: str | Path, tables: UserTables) -> tuple[np.ndarray, int]:
    """(device per table in file order, devices) from a plan file of ours or a TorchRec plan
    written by `--torchrec`; every table must be assigned, and nothing else."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not a plan file (not JSON: {exc.__class__.__name__})") from None
    if not isinstance(doc, dict) or doc.get("format") not in (FORMAT, "autoshard-torchrec-plan/1"):
        raise ConfigError(f"{path}: not a plan written by `autoshard plan` (no format {FORMAT!r})")
    if doc["format"] == FORMAT:
        assignment, devices = doc["assignment"], int(doc["devices"])
    else:
        params = doc["modules"][""]
        assignment = {name: p["ranks"][0] for name, p in params.items()}
        devices = int(doc["world_size"])
    names = tables.names
    unknown = sorted(set(assignment) - set(names))
    if unknown:
        raise ConfigError(f"{path}: table {unknown[0]!r} is not in {tables.source}")
    absent = [n for n in names if n not in assignment]
    if absent:
        raise ConfigError(f"{path}: table {absent[0]!r} of {tables.source} has no device")
    placement = np.array([assignment[n] for n in names], dtype=np.int64)
    if placement.min() < 0 or placement.max() >= devices:
        bad = names[int(np.flatnonzero((placement < 0) | (placement >= devices))[0])]
        raise ConfigError(f"{path}: table {bad!r} is on device {assignment[bad]} of {devices}")
    return placement, devices


def seed_for(tables: UserTables, seed: int) -> int:
    """A seed for sampling (best-of-N, the random heuristic) tied to the table list."""
    return int(rng(seed, "plan", *tables.names[:8], len(tables.names)).integers(2**31))

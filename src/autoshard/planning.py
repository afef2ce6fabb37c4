"""Sharding a user's own tables: the methods of the study on one task, the plan document the
`autoshard` command writes, and reading plans back (ours, or TorchRec plans we exported)."""

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from autoshard.costmodel import CostModel, feature_matrix, load_model
from autoshard.errors import ConfigError
from autoshard.heuristics import HEURISTICS
from autoshard.policy import Policy
from autoshard.seeding import rng
from autoshard.tasks import Task
from autoshard.usertables import UserTables

METHODS = ("rl", "cost-greedy", "torchrec", *HEURISTICS)
LEARNED = ("rl", "cost-greedy")  # need the cost model (and rl the policy)
DEFAULT_POLICY = Path("data/rl/policy.pt")
DEFAULT_COST_MODEL = Path("data/rl/cost_model.pt")
FORMAT = "autoshard-plan/1"


@dataclass
class Models:
    """The files a plan came from: the cost model (None if unavailable) and the policy."""

    cost_model: CostModel | None
    policy: Policy | None
    files: dict[str, dict[str, str]]


def _file_version(path: Path) -> dict[str, str]:
    return {"path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:16]}


def _existing(path: Path | None, default: Path, what: str, option: str) -> Path:
    path = path or default
    if not path.is_file():
        made_by = f"run `dvc repro train_rl`, which writes it, or pass {option}" if path == default else "no such file"
        raise ConfigError(f"{path}: {what} not found ({made_by})")
    return path


def load_models(method: str, policy_path: Path | None, model_path: Path | None) -> Models:
    """The cost model and policy `method` needs. A heuristic or TorchRec plan works without
    them (predicted costs are then left out) unless a path was given explicitly."""
    from autoshard.rl import load_policy

    model, policy, files = None, None, {}
    if method in LEARNED or model_path is not None or DEFAULT_COST_MODEL.is_file():
        model_path = _existing(model_path, DEFAULT_COST_MODEL, "cost model", "--cost-model")
        model = load_model(model_path)
        files["cost_model"] = _file_version(model_path)
    if method == "rl":
        policy_path = _existing(policy_path, DEFAULT_POLICY, "policy checkpoint", "--policy")
        policy = load_policy(policy_path, model)
        files["policy"] = _file_version(policy_path)
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
    from autoshard.inference import cost_greedy, policy_plans
    from autoshard.methods import heuristic_plan
    from autoshard.torchrec_io import torchrec_plan

    if method not in METHODS:
        raise ConfigError(f"--method: {method!r} (expected one of {', '.join(METHODS)})")
    try:
        if method == "rl":
            return policy_plans(models.policy, models.cost_model, feature_matrix(tables.features), [task], best_of,
                                refine, seed)[0]
        if method == "cost-greedy":
            return cost_greedy(models.cost_model, feature_matrix(tables.features), [task])[0]
    except ConfigError as exc:  # a learned placement can paint itself into a corner under a tight cap
        raise ConfigError(f"--method {method}: no placement under --memory-per-device {task.memory_bytes} bytes "
                          f"({exc}; tables go largest predicted cost first, not largest size first: try more "
                          "memory or a size-aware heuristic such as size_lookup_greedy)") from None
    if method == "torchrec":
        return torchrec_plan(tables.features, task, batch_size)
    return heuristic_plan(method, tables.features, task, seed)


def timed_place(method: str, tables: UserTables, task: Task, models: Models, **options) -> tuple[np.ndarray, float]:
    """`place` and the seconds it took."""
    start = time.perf_counter()
    placement = place(method, tables, task, models, **options)
    return placement, time.perf_counter() - start


def device_table(tables: UserTables, task: Task, placement: np.ndarray, model: CostModel | None) -> pd.DataFrame:
    """Per device: its tables, the memory they use, and the cost model's predicted cost (ms)."""
    from autoshard.plans import device_shards, predicted_device_costs

    shards = device_shards(task, placement)
    sizes = tables.features["size_bytes"].to_numpy()
    out = pd.DataFrame({"device": range(task.devices), "tables": [len(s) for s in shards],
                        "memory_bytes": [int(sizes[s].sum()) for s in shards],
                        "memory_share": [float(sizes[s].sum() / task.memory_bytes) for s in shards]})
    if model is not None:
        out["predicted_ms"] = predicted_device_costs(model, feature_matrix(tables.features), shards)
    out["names"] = [[tables.names[t] for t in s] for s in shards]
    return out


def plan_document(method: str, options: dict, tables: UserTables, task: Task, placement: np.ndarray,
                  models: Models, seconds: float) -> dict:
    """Everything a plan file holds: how it was made, the assignment, and per-device detail."""
    devices = device_table(tables, task, placement, models.cost_model)
    predicted = float(devices["predicted_ms"].max()) if "predicted_ms" in devices else None
    return {"format": FORMAT, "method": method, "options": options, "tables_file": tables.source,
            "devices": task.devices, "memory_per_device_bytes": task.memory_bytes,
            "assignment": {name: int(d) for name, d in zip(tables.names, placement, strict=True)},
            "per_device": devices.to_dict("records"), "predicted_bottleneck_ms": predicted,
            "predicted": "by the cost model, not measured (measure with `autoshard score`)",
            "sharding_seconds": seconds, "model_files": models.files}


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

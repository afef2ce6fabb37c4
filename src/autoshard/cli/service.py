"""Sharding a user's own tables: the methods of the study on one task, the plan document the
`autoshard` command writes, and reading plans back (ours, or TorchRec plans we exported)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from autoshard.cli.defaults import project_root, study_defaults
from autoshard.cli.user_tables import UserTables
from autoshard.core.errors import ConfigError
from autoshard.core.inputs import shown
from autoshard.core.seeding import rng
from autoshard.data.features import feature_matrix
from autoshard.data.tasks import Task
from autoshard.methods.registry import METHODS_LIST, REGISTRY, TORCHREC, check, ids
from autoshard.rl import numpy_planner

if TYPE_CHECKING:  # torch is imported only when a method needs it
    from autoshard.costmodel.model import CostModel
    from autoshard.rl.policy import Policy

# the methods that place on single-table costs, which the command measures on this machine itself
MEASURED = tuple(m.id for m in METHODS_LIST if m.needs == (("single_costs",),))
METHODS = tuple(dict.fromkeys((*ids("command"), *MEASURED)))  # the registry's ids the command offers
LEARNED = ids("learned")
FIRST_RUN = MEASURED[0]  # without trained models (a fresh clone): LPT on costs measured here, instant at any size

MODELS_ENV = "AUTOSHARD_MODELS"
POLICY_FILE, COST_MODEL_FILE = "policy.pt", "cost_model.pt"
FORMAT = "autoshard-plan/1"


@dataclass
class Models:
    """The files a plan came from, loaded either as torch modules or, for greedy placement and
    predicted costs, as the NumPy planner exported from exactly those files (`numpy`)."""

    cost_model: CostModel | None
    policy: Policy | None
    files: dict[str, dict[str, str]]
    numpy: numpy_planner.NumpyModels | None = None

    @property
    def trained_range(self) -> dict[str, list[float]] | None:
        """The [lowest, highest] dim, rows and pooling factor of the tables the cost model was fitted on."""
        if self.numpy is not None:
            return self.numpy.trained_range
        return None if self.cost_model is None else self.cost_model.trained_range

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


def models_folder(option: Path | None = None) -> Path:
    """Where the study's models are: `--models`, else $AUTOSHARD_MODELS, else the project's
    data/rl (found from the package, not from the current folder)."""
    if option is not None:
        if not option.is_dir():
            raise ConfigError(f"--models: {option} (no such folder)")
        return option
    env = os.environ.get(MODELS_ENV)
    if env:
        if not Path(env).is_dir():
            raise ConfigError(f"${MODELS_ENV}: {shown(env)} (no such folder)")
        return Path(env)
    return (project_root() or Path.cwd()) / "data" / "rl"


def default_files(folder: Path) -> list[Path]:
    """The model files looked for in `folder`."""
    return [folder / POLICY_FILE, folder / COST_MODEL_FILE, folder / numpy_planner.FILE_NAME]


def has_models(folder: Path) -> bool:
    """Whether `folder` holds the study's trained policy and cost model."""
    return (folder / POLICY_FILE).is_file() and (folder / COST_MODEL_FILE).is_file()


def _existing(path: Path | None, default: Path, what: str, option: str) -> Path:
    path = path or default
    if not path.is_file():
        made_by = (f"run `dvc repro train_rl`, which writes it, or pass {option} or --models"
                   if path == default else "no such file")
        raise ConfigError(f"{path}: {what} not found ({made_by})")
    return path


def load_models(method: str, policy_path: Path | None, model_path: Path | None, need_torch: bool = False,
                folder: Path | None = None) -> Models:
    """The cost model and policy `method` needs, by default from `folder` (`models_folder`).
    A heuristic or TorchRec plan works without them (predicted costs are then left out)
    unless a path was given explicitly. Unless `need_torch` (sampling), the
    NumPy planner next to the policy (or the cost model) stands in for both when it was
    exported from these very files. A policy given to another method than rl is checked
    (against the NumPy planner's hash, or loaded), never silently ignored."""
    folder = folder or models_folder()
    default_model, default_policy = folder / COST_MODEL_FILE, folder / POLICY_FILE
    model_path = (_existing(model_path, default_model, "cost model", "--cost-model")
                  if method in LEARNED or model_path is not None or policy_path is not None or default_model.is_file()
                  else None)
    policy_path = (_existing(policy_path, default_policy, "policy checkpoint", "--policy")
                   if _needs_policy(method) or policy_path is not None else None)
    if model_path is None:
        return Models(cost_model=None, policy=None, files={})
    used = policy_path if _needs_policy(method) else None
    files = {"cost_model": _file_version(model_path)} | ({"policy": _file_version(used)} if used else {})
    if not need_torch:
        export = (policy_path or model_path).parent / numpy_planner.FILE_NAME
        planner = _loaded(lambda p: numpy_planner.load(p, model_path, policy_path), export, "NumPy planner")
        if planner is not None:
            return Models(cost_model=None, policy=None, files=files, numpy=planner)
    from autoshard.costmodel.model import load_model
    from autoshard.rl.ppo import load_policy

    model = _loaded(load_model, model_path, "cost model")
    if policy_path is not None and not used:  # checked as a checkpoint, not tied to this cost model
        from autoshard.rl.ppo import load_checkpoint

        _loaded(load_checkpoint, policy_path, "policy checkpoint")
    policy = _loaded(lambda p: load_policy(p, model), used, "policy checkpoint") if used else None
    return Models(cost_model=model, policy=policy, files=files)


def _needs_policy(method: str) -> bool:
    return method in LEARNED and REGISTRY[method].kind == "rl"


def _loaded(load, path: Path, what: str):
    """`load(path)`, with a file whose format tag is right but whose contents are not refused
    in one line naming it."""
    try:
        return load(path)
    except ConfigError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as exc:
        raise ConfigError(f"{path}: not a usable {what} ({exc.__class__.__name__}: "
                          f"{shown(str(exc).splitlines()[0] if str(exc) else '', 100)})") from None


def outside_range(tables: UserTables, models: Models) -> str | None:
    """One line naming how many tables lie outside the range of dims, rows or pooling factors the
    cost model was fitted on (with the first of each and the range), where its predictions were
    never checked; None when every table lies inside it, or without a cost model."""
    bounds = models.trained_range
    if not bounds:
        return None
    parts, outside = [], np.zeros(len(tables.features), dtype=bool)
    for column, (low, high) in bounds.items():
        values = tables.features[column].to_numpy(dtype=float)
        out = (values < low) | (values > high)
        if out.any():
            first = int(np.flatnonzero(out)[0])
            parts.append(f"{column} {low:g}-{high:g} ({int(out.sum())} outside, e.g. {tables.names[first]}: "
                         f"{values[first]:g})")
        outside |= out
    if not parts:
        return None
    return (f"warning: {int(outside.sum())} of {len(outside)} tables lie outside the range the cost model was "
            f"fitted on, where its predictions are unchecked: {'; '.join(parts)}")


def make_task(tables: UserTables, devices: int, memory_bytes: int, memory: np.ndarray | None = None) -> Task:
    """The task of placing every table on `devices` devices of `memory_bytes` each; refused when
    a table cannot fit one device or all of them cannot fit the devices together. `memory` is
    each table's bytes (default its `size_bytes`; the command's: `UserTables.memory`, training's)."""
    if devices < 1:
        raise ConfigError(f"--devices: {devices} (must be at least 1)")
    sizes = (tables.features["size_bytes"] if memory is None else memory).tolist()  # Python ints: exact sums
    too_big = [i for i, size in enumerate(sizes) if size > memory_bytes]
    if too_big:
        i = too_big[0]
        raise ConfigError(f"{tables.source}: row {i + 1} ({tables.names[i]}): {sizes[i]} bytes while training do not "
                          f"fit one device's memory ({memory_bytes} bytes, --memory-per-device; --sharding row or "
                          "auto splits such tables)")
    if sum(sizes) > devices * memory_bytes:
        raise ConfigError(f"{tables.source}: the tables need {sum(sizes)} bytes while training, more than the "
                          f"{devices} devices hold together ({devices * memory_bytes} bytes)")
    return Task(name="user", protocol="user", split="test", tables=tuple(range(len(sizes))), devices=devices,
                memory_bytes=int(memory_bytes), unseen_ratio=1.0)


def check_memory(what: str, task: Task, placement: np.ndarray, memory: np.ndarray, hint: str) -> None:
    """Every device holds what the plan puts on it while training (`memory` per placed item): a
    method that counts memory its own way (the torch policy's table sizes, split-then-place's weights
    and state) is held to it too. `what` names the plan, `hint`
    what to try instead."""
    used = np.bincount(placement, weights=memory.astype(float), minlength=task.devices)
    over = np.flatnonzero(used > task.memory_bytes)
    if len(over):
        d = int(over[0])
        raise ConfigError(f"{what}: its plan puts {int(used[d])} bytes (while training) on device {d}, more than "
                          f"--memory-per-device {task.memory_bytes} ({hint})")


def place(method: str, tables: UserTables, task: Task, models: Models, best_of: int | None = None, seed: int = 0,
          batch_size: int | None = None, single_costs: np.ndarray | None = None,
          memory: np.ndarray | None = None) -> np.ndarray:
    """A device per table by the method of that registry id, built by the registry from the
    tables, the loaded models and the tables' `single_costs` (ms, measured alone: what MEASURED
    place on) (`best_of` is rl_best_of_n's N, `seed` its sampling seed and the random
    heuristic's; `batch_size` the training batch TorchRec plans for). Unset, both are the
    study's (`rl.best_of`, `profile.batch_size`: `cli.defaults`), as are the MILP's limits.
    `memory` (bytes per table) is what the methods' memory checks count, in place of the tables'
    `size_bytes` (which the cost model still reads as a feature); TorchRec counts its own."""
    from autoshard.core.seeding import one_thread
    from autoshard.methods.artifacts import Artifacts, Settings
    from autoshard.methods.registry import build
    from autoshard.placement.surrogate import MilpConfig

    if method not in METHODS:
        check(method)  # an unknown id: the registry's own message
        raise ConfigError(f"--method: {method!r} (the command offers {', '.join(METHODS)})")
    counts_own = method == TORCHREC  # TorchRec's planner counts memory with its own storage estimate
    held = tables.features if memory is None or counts_own else tables.features.assign(size_bytes=memory)
    artifacts = Artifacts(pool_features=held, features=feature_matrix(tables.features),
                          cost_model=models.cost_model, policy=models.policy, numpy=models.numpy,
                          single_costs=single_costs)
    study = study_defaults()
    milp = MilpConfig(node_limit=study["evaluate.milp.node_limit"], time_limit_s=study["evaluate.milp.time_limit_s"])
    settings = Settings(seed=seed, batch_size=batch_size or study["profile.batch_size"],
                        best_of=best_of or study["rl.best_of"], milp=milp, sample_seed=lambda t: seed)
    built = build((method,), artifacts, settings)
    if method in built.left_out:
        raise ConfigError(f"--method {method}: {built.left_out[method]} (load_models and measure_singles give them)")
    try:
        if models.cost_model is None:  # heuristics, TorchRec and the NumPy export: no torch model to pin
            return built.planners[method](task)
        with one_thread():  # the same plan whatever torch's thread count
            return built.planners[method](task)
    except ConfigError as exc:
        if method not in LEARNED:
            raise
        # a learned placement can paint itself into a corner under a tight cap
        raise ConfigError(f"--method {method}: no placement under --memory-per-device {task.memory_bytes} bytes "
                          f"({exc}; tables go largest predicted cost first, not largest size first: try more "
                          "memory or a size-aware heuristic such as size_lookup_greedy)") from None


def timed_place(method: str, tables: UserTables, task: Task, models: Models, **options) -> tuple[np.ndarray, float]:
    """`place` and the seconds it took."""
    start = time.perf_counter()
    placement = place(method, tables, task, models, **options)
    return placement, time.perf_counter() - start


def device_table(tables: UserTables, task: Task, placement: np.ndarray, models: Models,
                 memory: np.ndarray | None = None) -> pd.DataFrame:
    """Per device: its tables, the memory they use (`memory` per table, default `size_bytes`),
    and the cost model's predicted cost (ms)."""
    from autoshard.placement.shards import device_shards

    shards = device_shards(task, placement)
    sizes = tables.features["size_bytes"].to_numpy() if memory is None else memory
    out = pd.DataFrame({"device": range(task.devices), "tables": [len(s) for s in shards],
                        "memory_bytes": [int(sizes[s].sum()) for s in shards],
                        "memory_share": [float(sizes[s].sum() / task.memory_bytes) for s in shards]})
    predicted = models.shard_costs(feature_matrix(tables.features), shards)
    if predicted is not None:
        finite_predictions(predicted, models)
        out["predicted_ms"] = predicted
    names = tables.names
    out["names"] = [[names[t] for t in s] for s in shards]
    return out


def plan_document(method: str, options: dict, tables: UserTables, task: Task, placement: np.ndarray,
                  models: Models, seconds: float, costs: dict | None = None, memory: np.ndarray | None = None) -> dict:
    """Everything a plan file holds: how it was made, the costs it placed on (`costs`: measured
    here, as `cli.singles.Singles.source` says; else `cost_source`), the assignment, and
    per-device detail."""
    devices = device_table(tables, task, placement, models, memory)
    predicted = float(devices["predicted_ms"].max()) if "predicted_ms" in devices else None
    return {"format": FORMAT, "method": method, "options": options, "tables_file": tables.source,
            "devices": task.devices, "memory_per_device_bytes": task.memory_bytes,
            "assignment": {name: int(d) for name, d in zip(tables.names, placement, strict=True)},
            "per_device": devices.to_dict("records"), "predicted_bottleneck_ms": predicted,
            "predicted": "by the cost model, not measured (measure with `autoshard score`)",
            "sharding_seconds": seconds, "model_files": models.files, "engine": models.engine,
            "costs": costs or cost_source(method, models)}


def cost_source(method: str, models: Models) -> dict:
    """What a method that measured nothing placed on: the cost model's predictions (with its
    files), TorchRec's analytic estimate, or a heuristic's proxy (sizes, lookups)."""
    kind = REGISTRY[method].kind
    if method in LEARNED:
        return {"kind": "predicted", "what": "the cost model's predicted cost per device", "model_files": models.files}
    if kind == "heuristic":
        return {"kind": "estimated", "what": f"{method}'s proxy: {REGISTRY[method].summary}"}
    return {"kind": "estimated", "what": REGISTRY[method].summary}


def finite_predictions(predicted: np.ndarray, models: Models) -> None:
    """Refuse predictions that are not finite: the model files, not the tables, are at fault."""
    if not np.isfinite(predicted).all():
        files = " and ".join(f["path"] for f in models.files.values())
        raise ConfigError(f"{files}: the cost model predicts {float(predicted[~np.isfinite(predicted)][0])} ms "
                          "(not a finite number: the model file is damaged or not trained)")


def seed_for(tables: UserTables, seed: int) -> int:
    """A seed for sampling (best-of-N, the random heuristic) tied to the table list."""
    return int(rng(seed, "plan", *tables.names[:8], len(tables.names)).integers(2**31))

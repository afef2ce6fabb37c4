"""Score plans by measuring them: every device shard of every plan, with the cost backend.

Per task, the distinct shards of all methods' plans are measured as one batch in interleaved
rounds, each in a seeded shuffled order, with a calibration shard timed between rounds (see
`measure.interleaved`): no method is systematically measured first or last while the machine
warms up or drifts, and a batch measured while the machine changed is measured again. Each
task is saved to `<work>/<task>.json` when done: an interrupted run resumes with the tasks it
finished. Shards measured once are reused for any plan that
holds them. Communication is TorchRec's analytic all-to-all estimate, labelled as such.
"""

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from autoshard.core.atomic import atomic_file
from autoshard.core.digest import key
from autoshard.core.seeding import rng
from autoshard.costmodel.model import CostModel
from autoshard.data.pool import Pool
from autoshard.data.tasks import Task
from autoshard.measure.backends import BackendConfig, measurement_key
from autoshard.measure.base import CostBackend
from autoshard.measure.comm import analytic_comm
from autoshard.measure.interleaved import FIELDS, measure_batch
from autoshard.measure.timing import TimingConfig
from autoshard.placement.shards import device_shards

META = "_batches"  # per task file: the calibration drift and attempts of each measured batch


def _key(shard: Sequence[int]) -> str:
    return ",".join(str(t) for t in sorted(shard))


def _task_file(work: Path, task: Task, tag: str) -> Path:
    return work / f"{task.name.replace('/', '__')}{'.' + tag if tag else ''}.json"


def measure_task(backend: CostBackend, task: Task, plans: Sequence[np.ndarray | None], batch_size: int,
                 work: Path, seed: int, tag: str = "", timing: TimingConfig | None = None) -> dict:
    """Measured costs of the distinct shards of `plans` (one task), keyed by sorted table ids:
    the fields of `interleaved.FIELDS` then the CV across rounds (NaNs for an unmeasurable
    shard), and under `META` the calibration drift and attempts of each batch measured. Reads
    what an earlier run saved, measures what is new in interleaved rounds, saves it."""
    timing = timing or TimingConfig()
    path = _task_file(work, task, tag)
    known = json.loads(path.read_text()) if path.exists() else {}
    shards = [s for p in plans if p is not None for s in device_shards(task, p) if s]
    todo = sorted({_key(s) for s in shards} - set(known) - {META})
    if not todo:
        return known
    g = rng(seed, "evaluate", "order", task.name, tag, len(known))
    batch = measure_batch(backend, [[int(t) for t in k.split(",")] for k in todo], shards[0], batch_size, timing, g)
    known.update(zip(todo, batch.costs, strict=True))
    known.setdefault(META, []).append({"drift": batch.drift, "attempts": batch.attempts})
    work.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(known, sort_keys=True))
    return known


def device_frame(pool_features: pd.DataFrame, task: Task, method: str, plan: np.ndarray,
                 costs: dict[str, list[float]], batch_size: int, device: str) -> pd.DataFrame:
    """One row per device of a plan: measured compute (forward, backward and their IQRs),
    analytic communication, tables and memory."""
    shards = device_shards(task, plan)
    dims = [pool_features["dim"].to_numpy()[s].tolist() for s in shards]
    pfs = [pool_features["pooling_factor"].to_numpy()[s].tolist() for s in shards]
    comm = analytic_comm(dims, pfs, batch_size, device)
    sizes = pool_features["size_bytes"].to_numpy()
    rows = []
    for d, shard in enumerate(shards):
        cost = costs[_key(shard)] if shard else [0.0] * len(FIELDS) + [float("nan")]
        rows.append({"task": task.name, "protocol": task.protocol, "method": method, "device": d,
                     "shard": _key(shard), "tables": len(shard), "memory_bytes": int(sizes[shard].sum()),
                     "forward_compute_ms": cost[0], "backward_compute_ms": cost[1],
                     "forward_iqr_ms": cost[2], "backward_iqr_ms": cost[3], "cv": cost[4],
                     "forward_comm_ms": comm[d][0], "backward_comm_ms": comm[d][1]})
    return pd.DataFrame(rows)


def work_folder(root: str | Path, cfg: BackendConfig, pool: Pool) -> Path:
    """`root/<key>`: measurements are reused only for the same tables (every table's features and
    trace), backend settings, measuring code, libraries and machine (`costs.measurement_key`)."""
    return Path(root) / key(measurement_key(cfg, pool, range(pool.num_tables)))


def score(backend: CostBackend, pool_features: pd.DataFrame, tasks: list[Task],
          plans: dict[str, list[np.ndarray | None]], cfg: BackendConfig, work: str | Path, seed: int,
          tag: str = "", progress: bool = True) -> pd.DataFrame:
    """Per-device measurements of every method's plan of every task (methods without a plan
    for a task are left out), on `cfg.threads` threads with `cfg.batch_size` bags per table."""
    from tqdm.auto import tqdm

    frames = []
    torch.set_num_threads(cfg.threads)  # as the profile stage measured
    for i, task in enumerate(tqdm(tasks, desc=f"measuring plans{' (' + tag + ')' if tag else ''}",
                                  disable=not progress)):
        task_plans = {m: p[i] for m, p in plans.items() if p[i] is not None}
        costs = measure_task(backend, task, list(task_plans.values()), cfg.batch_size, Path(work), seed, tag,
                             cfg.timing)
        batches = costs.get(META, [])
        frames += [device_frame(pool_features, task, m, p, costs, cfg.batch_size, backend.device).assign(
            drift=max((b["drift"] for b in batches), default=0.0),
            remeasured=any(b["attempts"] > 1 for b in batches)) for m, p in task_plans.items()]
    out = pd.concat(frames, ignore_index=True)
    out["compute_ms"] = out["forward_compute_ms"] + out["backward_compute_ms"]
    out["with_comm_ms"] = out["compute_ms"] + out["forward_comm_ms"] + out["backward_comm_ms"]
    return out


def predict_devices(devices: pd.DataFrame, model: CostModel, features: np.ndarray) -> pd.Series:
    """The cost model's prediction (ms) for each device row (0 for an empty device)."""
    busy = devices["tables"] > 0
    shards = [[int(t) for t in key.split(",")] for key in devices.loc[busy, "shard"]]
    out = pd.Series(0.0, index=devices.index)
    out[busy] = model.predict_ms(features, shards)
    return out


def bottlenecks(devices: pd.DataFrame) -> pd.DataFrame:
    """The measured bottleneck (max device compute) per (task, method)."""
    return devices.groupby(["task", "method"], sort=False)["compute_ms"].max().rename("measured_ms").reset_index()


def plan_frame(devices: pd.DataFrame, tasks: list[Task], seconds: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, method) with a plan: measured bottleneck (max device compute),
    the same with analytic communication, the predicted bottleneck (`devices` needs a
    `predicted_ms` column), the fullest device's share of the memory cap, the sharding time."""
    by_task = {t.name: t for t in tasks}
    out = devices.groupby(["task", "protocol", "method"], sort=False).agg(
        measured_ms=("compute_ms", "max"), with_comm_ms=("with_comm_ms", "max"),
        predicted_ms=("predicted_ms", "max"), memory_bytes=("memory_bytes", "max")).reset_index()
    out["memory_share"] = out["memory_bytes"] / out["task"].map(lambda n: by_task[n].memory_bytes)
    out["unseen_ratio"] = out["task"].map(lambda n: by_task[n].unseen_ratio)
    return out.merge(seconds[["task", "method", "seconds"]], on=["task", "method"], how="left")

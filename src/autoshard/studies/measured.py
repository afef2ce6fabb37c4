"""Score plans by measuring them: every device shard of every plan, with the cost backend.

Per task, the distinct shards of all methods' plans are measured as one batch in interleaved
rounds, each in a seeded shuffled order, with a calibration shard timed between rounds (see
`measure.interleaved`): no method is systematically measured first or last while the machine
warms up or drifts, and a batch measured while the machine changed is measured again. Each
task's batch is filed in the measurement store (`measure.store`) when done: an interrupted run
resumes with the tasks it finished, and a shard measured once under the same settings, by this
stage, another or the profile, is reused for any plan that holds it.

Communication, per plan: with `MeasuredComm` (`evaluate.comm`), the plans of the protocols it
names at a device count it names get their whole placement's all-to-all measured, as in
training ("measured"; `measure.comm_store`: one torchrun launch per device count, filed beside
the shards, so a second score launches nothing), or "measured-oversubscribed" at a device count
above `measure.comm.honest_limit` (more ranks than cores or GPUs: the times mostly measure
scheduling). Every other plan, or every plan when the store is an imported read-only space,
gets the comm model the profile stage fitted on measured all-to-alls (`measure.commmodel`), at
a device count it was measured at ("measured-model", or "oversubscribed-model" above the honest
limit) or extrapolated across device counts ("extrapolated-model"); without a model, TorchRec's
analytic estimate ("analytic"). Column `comm_source` says which. Each plan is scored two ways:
the slowest device's compute (`measured_ms`) and DreamShard's synchronized stages, the sum over
the four stages of the slowest device in each (`synchronized_ms`, see
`measure.comm.synchronized_ms`).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from autoshard.core.compute import Engine
from autoshard.core.digest import value_digest
from autoshard.core.seeding import one_thread, rng
from autoshard.costmodel.model import CostModel
from autoshard.data.pool import Pool
from autoshard.data.tasks import Task
from autoshard.measure.backends import BackendConfig
from autoshard.measure.base import CostBackend
from autoshard.measure.batches import BatchJob, measure_batch_job
from autoshard.measure.comm import STAGES, analytic_comm, can_measure, honest_limit
from autoshard.measure.comm_store import CommTiming, placement_key, placement_records, rank_cvs, ranks
from autoshard.measure.commmodel import CommModel
from autoshard.measure.interleaved import FIELDS
from autoshard.measure.store import MeasurementStore, shard_key, store_for, values
from autoshard.placement.shards import device_shards
from autoshard.studies import paired

MEASURED_SOURCES = ("measured", "measured-oversubscribed")  # comm_source of an all-to-all timed, not modelled
MAIN_PASS = "main"  # the pass of `score` without a tag
OBJECTIVES = ("max_device", "synchronized_stages")  # evaluate.objective: what `measured_ms` ranks plans by
Objective = str | Mapping[str, str]  # one objective for every protocol, or protocol -> objective


def task_shards(task: Task, plans: Sequence[np.ndarray | None]) -> list[list[int]]:
    """The non-empty device shards of a task's plans, in plan order (repeats kept)."""
    return [s for p in plans if p is not None for s in device_shards(task, p) if s]


CALIBRATION_TABLES = 8  # a task's calibration shard: its first tables (by id), whatever plans are measured


def calibration_shard(task: Task) -> tuple[int, ...]:
    """The shard timed between a task's rounds: its first CALIBRATION_TABLES tables by id, the
    same whichever plans a pass measures, so two passes over a task share one unit of time."""
    return tuple(sorted(task.tables)[:CALIBRATION_TABLES])


def batch_jobs(tasks: list[Task], plans: list[list[np.ndarray | None]], store: MeasurementStore,
               cfg: BackendConfig, seed: int, tag: str = "", pool_source: dict | None = None) -> list[BatchJob]:
    """One batch per task of the shards of its plans that are not in `store`; a shard two tasks
    share is measured with the first. Each batch's shuffled orders are seeded by its task, so
    the jobs do not depend on the engine that runs them."""
    known = store.read()
    claimed: set[str] = set()
    jobs = []
    for task, task_plans in zip(tasks, plans, strict=True):
        shards = task_shards(task, task_plans)
        todo = [k for k in store.missing(shards, known) if k not in claimed]
        claimed.update(todo)
        if todo:
            jobs.append(BatchJob(shards=tuple(todo), calibration=calibration_shard(task), backend=cfg,
                                 pool=pool_source or {},
                                 store_root=str(store.folder.parent.resolve()), space=store.folder.name,
                                 order=rng(seed, "evaluate", "order", task.name, tag),
                                 label=f"{tag or 'score'} {task.name}"))
    return jobs


def measure_batches(jobs: list[BatchJob], backend: CostBackend, engine: Engine | None = None,
                    desc: str | None = None) -> None:
    """Run the batches: here on `backend` without an `engine`, else as the engine's jobs."""
    if engine is None:
        for job in tqdm(jobs, desc=desc, disable=desc is None):
            measure_batch_job(job, backend)
    else:
        engine.map(measure_batch_job, jobs, desc)


@dataclass(frozen=True)
class MeasuredComm:
    """Which plans `score` measures the all-to-all of (`evaluate.comm`): those of tasks of
    `protocols` on a device count of `device_counts`, timed with `timing`."""

    timing: CommTiming
    device_counts: tuple[int, ...]
    protocols: tuple[str, ...]

    def wants(self, task: Task) -> bool:
        """Whether `task`'s plans get their all-to-all measured."""
        return task.protocol in self.protocols and task.devices in self.device_counts


def device_widths(pool_features: pd.DataFrame, shards: list[list[int]]) -> list[int]:
    """Each device's summed embedding width: all a placement's all-to-all depends on, with the batch."""
    dims = pool_features["dim"].to_numpy()
    return [int(dims[s].sum()) for s in shards]


def measured_plans_comm(pool_features: pd.DataFrame, tasks: list[Task], plans: dict[str, list[np.ndarray | None]],
                        store: MeasurementStore, batch_size: int, device: str, seed: int, label: str,
                        comm: MeasuredComm | None) -> tuple[dict[str, list[tuple[float, float]]],
                                                            dict[str, list[float]]]:
    """The measured all-to-all of every plan `comm` wants, by `placement_key` of its widths (read
    back or measured, `measure.comm_store`), and each device's CV across rounds (`rank_cvs`);
    none without `comm` or in a read-only store."""
    if comm is None:
        return {}, {}
    if store.foreign:
        print(f"all-to-all ({label}): {store.folder.name} is an imported space, read only: comm from the model")
        return {}, {}
    launchable = [task for task in tasks if comm.wants(task) and can_measure(task.devices, device)]
    if len(launchable) < sum(comm.wants(task) for task in tasks):
        print(f"all-to-all ({label}): {device} cannot run one rank per device for every task "
              f"(`comm.can_measure`): those tasks' comm from the model")
    widths = [device_widths(pool_features, device_shards(task, p[i]))
              for i, task in enumerate(tasks) if task in launchable for p in plans.values() if p[i] is not None]
    if not widths:
        return {}, {}
    records = placement_records(widths, store, batch_size, device, comm.timing, seed, label)
    return ({k: ranks(r) for k, r in records.items()}, {k: rank_cvs(r) for k, r in records.items()})


def plan_comm(pool_features: pd.DataFrame, shards: list[list[int]], batch_size: int, device: str, limit: int,
              comm_model: CommModel | None = None,
              measured: Mapping[str, list[tuple[float, float]]] | None = None) -> tuple[list[tuple[float, float]], str]:
    """(forward, backward) all-to-all ms per device of a plan and where they come from: `measured`
    (by `placement_key` of the plan's widths) when it holds the plan ("measured", or
    "measured-oversubscribed" above `limit`, the honest limit `honest_limit(device)`), else the
    comm model (`CommModel.source`: "measured-model" at a fitted device count,
    "oversubscribed-model" at one above `limit`, "extrapolated-model" at another) or, without
    one, TorchRec's analytic estimate ("analytic")."""
    name = placement_key(device_widths(pool_features, shards))
    if measured and name in measured:
        return list(measured[name]), "measured" if len(shards) <= limit else "measured-oversubscribed"
    dims = [pool_features["dim"].to_numpy()[s].tolist() for s in shards]
    if comm_model is not None:
        return comm_model.predict([int(sum(d)) for d in dims], batch_size), comm_model.source(len(shards), limit)
    pfs = [pool_features["pooling_factor"].to_numpy()[s].tolist() for s in shards]
    return analytic_comm(dims, pfs, batch_size, device), "analytic"


def device_frame(pool_features: pd.DataFrame, task: Task, method: str, plan: np.ndarray,
                 costs: dict[str, list[float]], batch_size: int, device: str, limit: int,
                 comm_model: CommModel | None = None,
                 measured: Mapping[str, list[tuple[float, float]]] | None = None,
                 comm_cvs: Mapping[str, list[float]] | None = None) -> pd.DataFrame:
    """One row per device of a plan: measured compute (forward, backward and their IQRs),
    communication (see `plan_comm`; `comm_source` says which; `comm_cv`, a measured all-to-all's
    CV across rounds from `comm_cvs`, else NaN), tables and memory; `limit` is the honest
    limit of `device` (`honest_limit`)."""
    shards = device_shards(task, plan)
    comm, source = plan_comm(pool_features, shards, batch_size, device, limit, comm_model, measured)
    timed = source in MEASURED_SOURCES
    cvs = (comm_cvs or {}).get(placement_key(device_widths(pool_features, shards))) if timed else None
    sizes = pool_features["size_bytes"].to_numpy()
    rows = []
    for d, shard in enumerate(shards):
        cost = costs[shard_key(shard)] if shard else [0.0] * len(FIELDS) + [float("nan")]
        rows.append({"task": task.name, "protocol": task.protocol, "method": method, "device": d,
                     "shard": shard_key(shard), "tables": len(shard), "memory_bytes": int(sizes[shard].sum()),
                     "forward_compute_ms": cost[0], "backward_compute_ms": cost[1],
                     "forward_iqr_ms": cost[2], "backward_iqr_ms": cost[3], "cv": cost[4],
                     "forward_comm_ms": comm[d][0], "backward_comm_ms": comm[d][1], "comm_source": source,
                     "comm_cv": cvs[d] if cvs else float("nan")})
    return pd.DataFrame(rows)


def measurement_store(root: str | Path, cfg: BackendConfig, pool: Pool, space: str | None = None) -> MeasurementStore:
    """The study's store under `root` for `cfg` on `pool`: measurements are reused only for the
    same tables (every table's features and trace), backend settings, measuring code,
    libraries and machine (`measure.store.space`), by whichever stage measured them. With
    `space` (`profile.measurements_space`), that imported space, read only (`store.store_for`)."""
    return store_for(root, cfg, pool, space)


def score(backend: CostBackend, pool_features: pd.DataFrame, tasks: list[Task],
          plans: dict[str, list[np.ndarray | None]], cfg: BackendConfig, store: MeasurementStore, seed: int,
          tag: str = "", progress: bool = True, engine: Engine | None = None,
          pool_source: dict | None = None, comm_model: CommModel | None = None,
          measured_comm: MeasuredComm | None = None) -> pd.DataFrame:
    """Per-device measurements of every method's plan of every task (methods without a plan
    for a task are left out), on `cfg.threads` threads with `cfg.batch_size` bags per table.
    Each call is one pass (`pass_name`: its `tag` and a digest of every plan it measures), in a
    store space of its own: shards this very pass already filed (an interrupted run) are read,
    nothing measured by another pass is (a rerun after retraining measures every plan again, its
    references with it).
    With an `engine`, the tasks' batches are its jobs (they rebuild the backend from `cfg` and
    `pool_source`); each device row carries the drift and re-measurement of its shard's batch.
    Communication measured for the plans `measured_comm` wants (not in a read-only store), else
    from `comm_model` when given, else analytic (`plan_comm`)."""
    name = pass_name(tag, tasks, plans)
    store = store.tagged(name)
    per_task = [[p[i] for p in plans.values()] for i in range(len(tasks))]
    jobs = batch_jobs(tasks, per_task, store, cfg, seed, tag, pool_source)
    store.refuse_measuring([s for job in jobs for s in job.shards], f"the plans of pass {name}")
    measure_batches(jobs, backend, engine, f"measuring plans{' (' + tag + ')' if tag else ''}" if progress else None)
    comm, comm_cvs = measured_plans_comm(pool_features, tasks, plans, store, cfg.batch_size, backend.device, seed,
                                         tag or "score", measured_comm)
    known = store.read()
    limit = honest_limit(backend.device)
    frames = []
    for i, task in enumerate(tasks):
        task_plans = {m: p[i] for m, p in plans.items() if p[i] is not None}
        records = {k: known[k] for k in map(shard_key, task_shards(task, list(task_plans.values())))}
        costs = {k: values(r) for k, r in records.items()}
        wanted = comm if measured_comm is not None and measured_comm.wants(task) else None
        frames += [device_frame(pool_features, task, m, p, costs, cfg.batch_size, backend.device, limit,
                                comm_model, wanted, comm_cvs).assign(
            drift=max((r["drift"] for r in records.values()), default=0.0),
            remeasured=any(r["attempts"] > 1 for r in records.values())) for m, p in task_plans.items()]
    out = pd.concat(frames, ignore_index=True)
    out["compute_ms"] = out["forward_compute_ms"] + out["backward_compute_ms"]
    calibration = out["shard"].map(lambda k: (known.get(k) or {}).get("calibration_ms"))
    out["calibrated"] = out["compute_ms"] / pd.to_numeric(calibration, errors="coerce")  # in calibration-shard units
    out["with_comm_ms"] = out["compute_ms"] + out["forward_comm_ms"] + out["backward_comm_ms"]
    out["pass"] = name  # what the numbers may be compared with: the plans of this pass only
    return out


def predict_devices(devices: pd.DataFrame, model: CostModel, features: np.ndarray) -> pd.Series:
    """The cost model's prediction (ms) for each device row (0 for an empty device)."""
    busy = devices["tables"] > 0
    shards = [[int(t) for t in key.split(",")] for key in devices.loc[busy, "shard"]]
    out = pd.Series(0.0, index=devices.index)
    with one_thread():  # the same predictions whatever torch's thread count
        out[busy] = model.predict_ms(features, shards)
    return out


def synchronized(devices: pd.DataFrame, keys: Sequence[str] = ("task", "method")) -> pd.Series:
    """Per plan, the synchronized-stages cost: the sum over the four stages of the slowest
    device's time in it (measured compute; measured, modelled or analytic comm)."""
    return devices.groupby(list(keys), sort=False)[STAGES].max().sum(axis=1).rename("synchronized_ms")


def bottlenecks(devices: pd.DataFrame, objective: Objective = "max_device") -> pd.DataFrame:
    """The measured bottleneck (max device compute, also in units of its batches' calibration
    shard: `calibrated`, and as `max_device_ms`) and the synchronized-stages cost per (task,
    method); `measured_ms` is the one `objective` names for the task's protocol (as in `plan_frame`)."""
    calibrated = {"calibrated": ("calibrated", "max")} if "calibrated" in devices else {}
    out = devices.groupby(["task", "method"], sort=False).agg(measured_ms=("compute_ms", "max"),
                                                             **calibrated, **_pass_of(devices)).reset_index()
    out = out.merge(synchronized(devices).reset_index(), on=["task", "method"])
    out["max_device_ms"] = out["measured_ms"]
    if isinstance(objective, str):  # one for every protocol: the frame need not name them
        _rank_by(out, pd.Series(objective_of(objective, "every protocol"), index=out.index))
    else:
        protocol = out["task"].map(devices.groupby("task")["protocol"].first())
        _rank_by(out, protocol.map(lambda p: objective_of(objective, p)))
    return out


def pass_name(tag: str, tasks: list[Task], plans: dict[str, list[np.ndarray | None]]) -> str:
    """The pass of measuring `plans` of `tasks` together: the tag (or MAIN_PASS) and a digest of
    every task and plan, so the same plans resume one pass and any other set is a new one."""
    digest = value_digest(*((t.name, m, None if p[i] is None else np.asarray(p[i]).tolist())
                            for i, t in enumerate(tasks) for m, p in sorted(plans.items())))
    return f"{tag or MAIN_PASS}-{digest[:10]}"


def _pass_of(devices: pd.DataFrame) -> dict:
    """The aggregation keeping a plan's pass (its devices all come from one: `score` measures a
    plan in one pass), for frames that carry it."""
    if "pass" not in devices:
        return {}
    paired.one_pass(devices, by="task")
    return {"pass": ("pass", "first")}


def objective_of(objective: Objective, protocol: str) -> str:
    """The objective that ranks `protocol`'s plans: `objective` itself, or its entry."""
    chosen = objective if isinstance(objective, str) else objective.get(protocol)
    if chosen not in OBJECTIVES:
        raise ValueError(f"objective of {protocol}: {chosen!r} (expected one of {', '.join(OBJECTIVES)})")
    return chosen


def _rank_by(out: pd.DataFrame, objectives: pd.Series) -> None:
    """Make `measured_ms` the synchronized cost on the rows whose objective says so."""
    out["measured_ms"] = out["measured_ms"].where(objectives != "synchronized_stages", out["synchronized_ms"])


def plan_frame(devices: pd.DataFrame, tasks: list[Task], seconds: pd.DataFrame,
               objective: Objective = "max_device") -> pd.DataFrame:
    """One row per (task, method) with a plan: measured bottleneck (max device compute),
    the same with communication, the synchronized-stages cost (`synchronized_ms`), the predicted
    bottleneck (`devices` needs a `predicted_ms` column), the fullest device's share of the memory
    cap, the sharding time and the comm source. `objective` (one for all, or per protocol) names
    what each row's headline `measured_ms` is, in column `objective`: with "synchronized_stages" the
    synchronized cost (the compute bottleneck stays in `max_device_ms`)."""
    by_task = {t.name: t for t in tasks}
    out = devices.groupby(["task", "protocol", "method"], sort=False).agg(
        measured_ms=("compute_ms", "max"), with_comm_ms=("with_comm_ms", "max"),
        predicted_ms=("predicted_ms", "max"), memory_bytes=("memory_bytes", "max"),
        comm_source=("comm_source", "first"), **_pass_of(devices),
        **({"calibrated": ("calibrated", "max")} if "calibrated" in devices else {})).reset_index()
    out = out.merge(synchronized(devices).reset_index(), on=["task", "method"])
    out["max_device_ms"] = out["measured_ms"]
    out["objective"] = out["protocol"].map(lambda p: objective_of(objective, p))
    _rank_by(out, out["objective"])
    out["memory_share"] = out["memory_bytes"] / out["task"].map(lambda n: by_task[n].memory_bytes)
    out["unseen_ratio"] = out["task"].map(lambda n: by_task[n].unseen_ratio)
    return out.merge(seconds[["task", "method", "seconds"]], on=["task", "method"], how="left")

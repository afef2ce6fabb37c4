"""The profile stage's data set: which shards to measure, measuring them in resumable chunks.

Shards measured: every table of the pool alone; random subsets of the train tables, sizes
log-uniform from 1 to the largest shard a task can hold; the device shards of the heuristic
plans on training tasks (what a planner meets); the same two kinds built from test-pool
tables only (shards a cost model fitted on the train pool never saw); and a few shards
again in later rounds, to measure repeatability. Results are written in chunks: an
interrupted run continues where it stopped, measures nothing twice, and re-measures a chunk
that fails the consistency check.
"""

import platform
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from autoshard.core.atomic import atomic_dir, atomic_file
from autoshard.core.digest import key
from autoshard.core.errors import ConfigError
from autoshard.core.params import Fields
from autoshard.core.seeding import rng
from autoshard.data.pool import Pool
from autoshard.data.tasks import Task, shards
from autoshard.measure.backends import BackendConfig, measurement_key
from autoshard.measure.base import CostBackend, ShardTooLarge
from autoshard.measure.crosscheck import BenchConfig

KINDS = ("single", "random", "heuristic", "test_random", "test_heuristic", "repeat")
COST_COLUMNS = ["forward_ms", "backward_ms", "forward_iqr_ms", "backward_iqr_ms"]


@dataclass(frozen=True)
class Job:
    """One shard to measure. `round` > 0 marks a repeat of an earlier measurement."""

    kind: str
    tables: tuple[int, ...]
    round: int = 0


@dataclass(frozen=True)
class ProfileConfig:
    """The `profile` section: the backend and what to collect."""

    backend: BackendConfig
    random_shards: int
    heuristic_tasks: int
    test_random_shards: int
    test_heuristic_tasks: int
    repeat_shards: int
    repeat_rounds: int
    chunk_size: int
    torch_shards: int       # cross-check: shards measured by both fbgemm and torch
    bench: "BenchConfig"    # cross-check against FBGEMM's harness
    comm_processes: int     # torchrun processes for the all-to-all check (1: analytic only)
    comm_tasks: int         # DreamShard train tasks whose plan's four stages are shown
    cv_target: float        # repeatability goal: median coefficient of variation across rounds

    @classmethod
    def from_params(cls, values: dict) -> "ProfileConfig":
        f = Fields("profile", values)
        backend = BackendConfig.from_fields(f)
        c = f.sub("collect")
        x, m = f.sub("crosscheck"), f.sub("comm")
        cfg = cls(backend=backend, torch_shards=x.integer("torch_shards", lo=0),
                  bench=BenchConfig.from_params(x.sub("bench").values),
                  comm_processes=m.integer("processes"), comm_tasks=m.integer("tasks", lo=0),
                  random_shards=c.integer("random_shards", lo=0),
                  heuristic_tasks=c.integer("heuristic_tasks", lo=0),
                  test_random_shards=c.integer("test_random_shards", lo=0),
                  test_heuristic_tasks=c.integer("test_heuristic_tasks", lo=0),
                  repeat_shards=c.integer("repeat_shards", lo=0),
                  repeat_rounds=c.integer("repeat_rounds", lo=0), chunk_size=c.integer("chunk_size"),
                  cv_target=f.number("cv_target", lo=0, lo_open=True))
        for section in (c, x, m, f):
            section.done()
        return cfg


def plan_jobs(pool: Pool, tasks: list[Task], train_tables: np.ndarray, cfg: ProfileConfig,
              seed: int, test_tables: np.ndarray | None = None,
              placements: Callable[[Task], list[np.ndarray]] | None = None) -> list[Job]:
    """Every shard the stage measures, in order; deterministic for a seed.

    `placements(task)` gives the plans whose device shards are measured as `heuristic` shards
    (the study passes every heuristic's plan); without it there are none.

    `random` and `heuristic` shards use train-pool tables only; `test_random` and
    `test_heuristic` shards only test-pool tables (the cost model's unseen-table test set).
    """
    jobs = [Job("single", (t,)) for t in range(pool.num_tables)]
    seen = {j.tables for j in jobs}

    def add(kind: str, shard_tables) -> None:
        key = tuple(sorted(int(t) for t in shard_tables))
        if key and key not in seen:
            seen.add(key)
            jobs.append(Job(kind, key))

    train_tasks = [t for t in tasks if t.split == "train"]
    test_tasks = [t for t in tasks if t.split == "test" and t.unseen_ratio == 1.0]
    groups = [("", train_tables, train_tasks, cfg.random_shards, cfg.heuristic_tasks)]
    if test_tables is not None:
        groups.append(("test_", test_tables, test_tasks, cfg.test_random_shards,
                       cfg.test_heuristic_tasks))
    heuristic: list[tuple[int, ...]] = []
    for prefix, tables, group_tasks, n_random, n_tasks in groups:
        for shard in _random_shards(pool, tables, tasks, n_random, rng(seed, "profile", f"{prefix}random")):
            add(f"{prefix}random", shard)
        start = len(jobs)
        for task in _first_per_protocol(group_tasks, n_tasks):
            for placement in placements(task) if placements else []:
                for shard in shards(placement, task.tables, task.devices):
                    add(f"{prefix}heuristic", shard)
        if not prefix:
            heuristic = [j.tables for j in jobs[start:]]
    candidates = heuristic or [j.tables for j in jobs]
    g = rng(seed, "profile", "repeat")
    chosen = sorted(g.choice(len(candidates), min(cfg.repeat_shards, len(candidates)), replace=False))
    for r in range(1, cfg.repeat_rounds + 1):
        jobs += [Job("repeat", candidates[i], r) for i in chosen]
    return jobs


def _random_shards(pool: Pool, tables: np.ndarray, tasks: list[Task], n: int,
                   g: np.random.Generator) -> list[np.ndarray]:
    """`n` random subsets of `tables`, sizes log-uniform in [1, most tables of a task], each
    cut to what one device can hold (smallest tables first)."""
    if not tasks or n == 0:
        return []
    sizes = pool.features["size_bytes"].to_numpy()
    most = min(max(len(t.tables) for t in tasks), len(tables))
    capacity = max(t.memory_bytes for t in tasks)
    out = []
    for _ in range(n):
        k = int(np.clip(np.round(np.exp(g.uniform(0, np.log(most)))), 1, most))
        pick = g.choice(tables, k, replace=False)
        order = pick[np.argsort(sizes[pick], kind="stable")]
        out.append(order[np.cumsum(sizes[order]) <= capacity])
    return out



def _first_per_protocol(tasks: list[Task], n: int) -> list[Task]:
    out: list[Task] = []
    for protocol in sorted({t.protocol for t in tasks}):
        out += [t for t in tasks if t.protocol == protocol][:n]
    return out


def environment(backend: CostBackend, threads: int) -> dict:
    """What every row records about how it was measured."""
    try:
        import fbgemm_gpu
        fbgemm_version = fbgemm_gpu.__version__
    except ImportError:
        fbgemm_version = "absent"
    device = backend.device
    if device == "cuda":
        device = f"cuda:{torch.cuda.get_device_name()}"
    return {"backend": backend.name, "device": device, "threads": threads,
            "host": platform.node(), "cpu": platform.processor() or platform.machine(),
            "torch_version": torch.__version__, "fbgemm_version": fbgemm_version}


def measure_job(backend: CostBackend, job: Job, shard_id: int, batch_size: int,
                sizes: np.ndarray, env: dict) -> dict:
    """One row of the data set: the job, its cost (NaN when unmeasurable) and the environment."""
    row = {"shard_id": shard_id, "kind": job.kind, "round": job.round, "tables": list(job.tables),
           "num_tables": len(job.tables), "shard_bytes": int(sizes[list(job.tables)].sum()),
           "batch_size": batch_size}
    try:
        cost = backend.measure(job.tables, batch_size)
        row |= {"status": "ok", **{c: getattr(cost, c) for c in COST_COLUMNS}}
    except ShardTooLarge as exc:
        row |= {"status": f"too large: {exc}", **{c: float("nan") for c in COST_COLUMNS}}
    row["total_ms"] = row["forward_ms"] + row["backward_ms"]
    return row | env


def run_key(jobs: list[Job], cfg: ProfileConfig, pool: Pool) -> str:
    """Identifies a collection by content: chunks are reused only for the same shards, measured
    the same way on the same tables (`measurement_key`)."""
    tables = {t for j in jobs for t in j.tables}
    return key([asdict(j) for j in jobs], measurement_key(cfg.backend, pool, tables))


def collect(pool: Pool, jobs: list[Job], backend: CostBackend, cfg: ProfileConfig,
            work_root: str | Path, progress: bool = True) -> pd.DataFrame:
    """Measure every job, chunk by chunk under `work_root/<run key>`, resuming what is there."""
    work = Path(work_root) / run_key(jobs, cfg, pool)
    work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.backend.threads)
    env = environment(backend, cfg.backend.threads)
    sizes = pool.features["size_bytes"].to_numpy()
    step = cfg.chunk_size
    bar = tqdm(total=len(jobs), desc=f"profile ({backend.name})", disable=not progress)
    for start in range(0, len(jobs), step):
        path = work / f"chunk-{start // step:05d}.parquet"
        ids = list(range(start, min(start + step, len(jobs))))
        if _chunk_is_complete(path, ids, jobs):
            bar.update(len(ids))
            continue
        rows = []
        for i in ids:
            rows.append(measure_job(backend, jobs[i], i, cfg.backend.batch_size, sizes, env))
            bar.update(1)
        with atomic_file(path) as tmp:
            pd.DataFrame(rows).to_parquet(tmp, index=False)
    bar.close()
    return consolidate(work, jobs, step)


def _chunk_is_complete(path: Path, ids: list[int], jobs: list[Job]) -> bool:
    """A chunk counts only if it reads back whole with exactly its planned shards."""
    if not path.exists():
        return False
    try:
        chunk = pd.read_parquet(path)
        ok = (chunk["shard_id"].tolist() == ids
              and [tuple(t) for t in chunk["tables"]] == [jobs[i].tables for i in ids])
    except Exception:  # noqa: BLE001 - any unreadable file is a half-written chunk
        ok = False
    if not ok:
        path.unlink()
    return ok


def consolidate(work: Path, jobs: list[Job], step: int) -> pd.DataFrame:
    """All chunks as one table, checked: every planned shard exactly once, in order."""
    chunks = [pd.read_parquet(work / f"chunk-{k:05d}.parquet")
              for k in range((len(jobs) + step - 1) // step)]
    table = pd.concat(chunks, ignore_index=True)
    if table["shard_id"].tolist() != list(range(len(jobs))):
        raise ConfigError(f"{work}: chunks do not hold every planned shard exactly once")
    return table


def save_profile(table: pd.DataFrame, folder: str | Path, work_root: str | Path | None = None) -> None:
    """Write the data set at once; then drop the finished run's chunks."""
    with atomic_dir(folder) as tmp:
        table.to_parquet(tmp / "shards.parquet", index=False)
    if work_root is not None:
        shutil.rmtree(work_root, ignore_errors=True)


def load_profile(folder: str | Path) -> pd.DataFrame:
    path = Path(folder) / "shards.parquet"
    if not path.is_file():
        raise ConfigError(f"{path}: no profile data (run `dvc repro profile`)")
    return pd.read_parquet(path)

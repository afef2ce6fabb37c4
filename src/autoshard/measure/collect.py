"""The profile stage's data set: which shards to measure, measuring them in resumable chunks.

Shards measured: every table of the pool alone; random subsets of the train tables, sizes
log-uniform from 1 to the largest shard a task can hold; the device shards of the heuristic
plans on training tasks (what a planner meets); the same two kinds built from test-pool
tables only (shards a cost model fitted on the train pool never saw); and a few shards
again in later rounds, to measure repeatability across separate passes. Chunks of shards are
measured as interleaved batches and filed in the measurement store (`measure.store`) as each
finishes: an interrupted run continues where it stopped, nothing is measured twice under the
same settings, and a chunk whose file is unreadable is measured again.
"""

import platform
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from autoshard.core.atomic import atomic_dir
from autoshard.core.compute import Engine
from autoshard.core.errors import ConfigError
from autoshard.core.params import Fields, Section, bounded, read
from autoshard.core.paths import Paths
from autoshard.core.seeding import rng
from autoshard.data.pool import Pool
from autoshard.data.tasks import Task, shards
from autoshard.data.wide import WideConfig, load_wide
from autoshard.measure.backends import BackendConfig, make_backend
from autoshard.measure.base import CostBackend
from autoshard.measure.batches import BatchJob, measure_batch_job
from autoshard.measure.crosscheck import BenchConfig
from autoshard.measure.protocols import ProtocolCheck
from autoshard.measure.store import shard_key, shard_tables, store_for, values
from autoshard.measure.timing import TimingConfig

REMEASURED = "remeasured.parquet"  # the train-pool shards measured again (profile.collect.remeasure)
REMEASURE = "remeasure"  # the store's pass tag of that second pass
KINDS = ("single", "random", "heuristic", "test_random", "test_heuristic", "repeat")
COST_COLUMNS = ["forward_ms", "backward_ms", "forward_iqr_ms", "backward_iqr_ms"]


@dataclass(frozen=True)
class Job:
    """One shard to measure. `round` > 0 marks a repeat of an earlier measurement."""

    kind: str
    tables: tuple[int, ...]
    round: int = 0


@dataclass(frozen=True)
class ProfileConfig(Section):
    """The `profile` section: the backend, its timing protocol (`warmup` and `runs` per
    round, `rounds` interleaved rounds per chunk, `drift_limit` and `retries`), what to collect and the
    protocol check (the evidence for that timing protocol)."""

    section = "profile"
    backend: BackendConfig
    random_shards: int
    heuristic_tasks: int
    test_random_shards: int
    test_heuristic_tasks: int
    repeat_shards: int
    repeat_rounds: int
    chunk_size: int
    torch_shards: int       # cross-check: shards measured by both fbgemm and torch
    bench: BenchConfig      # cross-check against FBGEMM's harness
    comm_processes: int     # torchrun processes for the all-to-all check (1: analytic only)
    comm_tasks: int         # DreamShard train tasks whose plan's four stages are shown
    comm_device_counts: tuple[int, ...]  # device counts whose all-to-alls the comm model is fitted on
    comm_placements: int    # random placements of train tables measured per device count
    comm_rounds: int        # interleaved rounds each placement is measured in (median over them)
    comm_heldout_share: float  # of those, held out to score the fitted comm model
    comm_mape_target: float  # the comm model's goal: held-out MAPE
    cv_target: float = bounded(lo=0, lo_open=True)  # repeatability goal: median CV across rounds
    remeasure: bool         # measure the train-pool shards again in an independent pass (a replicate's data)
    protocol_check: ProtocolCheck  # the timing protocols compared on a few shards (measure/protocols.py)
    measurements_space: str | None  # read shards from this imported space (measured elsewhere), measure none

    @classmethod
    def from_params(cls, values: dict) -> "ProfileConfig":
        """`parse`, with the backend and its timing from the profile's own keys, and the keys of
        the `collect`, `crosscheck` and `comm` sub-sections as fields (`comm.tasks`: `comm_tasks`)."""
        f = Fields(cls.section, values)
        c, x, m = f.sub("collect"), f.sub("crosscheck"), f.sub("comm")
        cfg = read(cls, f, backend=BackendConfig.from_fields(f, read(TimingConfig, f)),
                   torch_shards=x.integer("torch_shards", lo=0), bench=x.config("bench", BenchConfig),
                   comm_processes=m.integer("processes"), comm_tasks=m.integer("tasks", lo=0),
                   comm_device_counts=tuple(m.integers("device_counts", lo=2)),
                   comm_placements=m.integer("placements", lo=2), comm_rounds=m.integer("rounds"),
                   comm_heldout_share=m.number("heldout_share", lo=0, hi=1, lo_open=True),
                   comm_mape_target=m.number("mape_target", lo=0, lo_open=True),
                   random_shards=c.integer("random_shards", lo=0),
                   heuristic_tasks=c.integer("heuristic_tasks", lo=0),
                   test_random_shards=c.integer("test_random_shards", lo=0),
                   test_heuristic_tasks=c.integer("test_heuristic_tasks", lo=0),
                   repeat_shards=c.integer("repeat_shards", lo=0),
                   repeat_rounds=c.integer("repeat_rounds", lo=0), chunk_size=c.integer("chunk_size"),
                   remeasure=c.boolean("remeasure"))
        for section in (c, x, m, f):
            section.done()
        return cfg

    @property
    def check_timing(self) -> TimingConfig:
        """One pass with as many timed runs as a shard gets over all its rounds: for the
        cross-checks, which time an operator once rather than in interleaved rounds."""
        t = self.backend.timing
        return replace(t, runs=t.runs * t.rounds, rounds=1, retries=0)


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
        if tasks:  # random shards as large as a task's largest device may be
            most, capacity = max(len(t.tables) for t in tasks), max(t.memory_bytes for t in tasks)
            for shard in random_shards(pool, tables, n_random, most, capacity,
                                       rng(seed, "profile", f"{prefix}random")):
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


def wide_jobs(pool: Pool, train_tables: np.ndarray, test_tables: np.ndarray, random: int, test_random: int,
              most: int, capacity: int, seed: int) -> list[Job]:
    """The wide pool's shards (`data.wide`), in order: every table alone, then `random` random shards
    of train tables and `test_random` of test tables, sizes log-uniform in [1, `most`], each cut to
    `capacity` bytes; deterministic for a seed."""
    jobs = [Job("single", (t,)) for t in range(pool.num_tables)]
    seen = {j.tables for j in jobs}
    for kind, tables, n in (("random", train_tables, random), ("test_random", test_tables, test_random)):
        for shard in random_shards(pool, tables, n, most, capacity, rng(seed, "profile", "wide", kind)):
            key = tuple(sorted(int(t) for t in shard))
            if key and key not in seen:
                seen.add(key)
                jobs.append(Job(kind, key))
    return jobs


def collect_wide(paths: Paths, cfg: ProfileConfig, wide: dict, seed: int, engine: Engine | None = None
                 ) -> pd.DataFrame | None:
    """Measure the wide pool's shards (`wide_jobs` of the `wide` section) into the store under
    `paths.measurements`, as `collect` measures the pool's (here, or on `engine`), and save them as
    `paths.wide_profile` (under the pool's profile folder: call it after `save_profile`); None,
    measuring nothing, where the profile reads an imported measurements space (it holds the pool's
    shards only)."""
    if cfg.measurements_space is not None:
        return None
    w = WideConfig.from_params(wide)
    pool, train, test = load_wide(paths.wide)
    jobs = wide_jobs(pool, train, test, w.random_shards, w.test_random_shards, w.shard_tables,
                     cfg.backend.memory_limit_bytes, seed)
    table = collect(pool, jobs, make_backend(pool, cfg.backend), cfg, paths.measurements, seed=seed, engine=engine,
                    pool_source={"folder": str((paths.wide / "pool").resolve())}, what="the wide pool")
    save_profile(table, paths.wide_profile)
    return table


def random_shards(pool: Pool, tables: np.ndarray, n: int, most: int, capacity: int,
                  g: np.random.Generator) -> list[np.ndarray]:
    """`n` random subsets of `tables`, sizes log-uniform in [1, `most`], each cut to what `capacity`
    bytes hold (smallest tables first)."""
    if n == 0:
        return []
    sizes = pool.features["size_bytes"].to_numpy()
    most = min(most, len(tables))
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


def chunks(jobs: list[Job], size: int) -> list[list[int]]:
    """The jobs' indices in batches of at most `size`, consecutive, one round per batch."""
    out: list[list[int]] = []
    for r in sorted({j.round for j in jobs}):
        ids = [i for i, j in enumerate(jobs) if j.round == r]
        out += [ids[k:k + size] for k in range(0, len(ids), size)]
    return out


def pass_tag(round_: int) -> str:
    """The store's pass tag of a round: repeats are independent measurements, never reads."""
    return f"repeat-{round_}" if round_ else ""


def collect(pool: Pool, jobs: list[Job], backend: CostBackend, cfg: ProfileConfig, store_root: str | Path,
            progress: bool = True, seed: int = 0, engine: Engine | None = None,
            pool_source: dict | None = None, tag: str = "", what: str = "the profile") -> pd.DataFrame:
    """Measure every job not in the measurement store under `store_root` and return the data set.

    Chunks of `cfg.chunk_size` shards are batches: each measured in interleaved rounds
    (`measure_batch`, seeded shuffled orders, a calibration shard between rounds, a drifting
    batch measured again) and filed in the store as it finishes, so an interrupted run resumes
    and shards any stage measured under the same settings are read, not measured. Without an
    `engine` the chunks run here on `backend`; with one, each chunk is an engine job that
    rebuilds the backend from `cfg` and `pool_source` (a `measure.worker` pool source). A `tag`
    makes the whole collection an independent pass (its own store space and shuffled orders):
    nothing is read from the untagged measurements. With `cfg.measurements_space` the shards are
    read from that space (imported, measured elsewhere) and none is measured: one missing is an
    error naming `what` wanted it."""
    if engine is not None and pool_source is None:
        raise ConfigError("profile: measuring on an engine needs the pool's source (a folder or its parameters)")
    shared = store_for(store_root, cfg.backend, pool, cfg.measurements_space).tagged(tag)
    stores = {r: shared.tagged(pass_tag(r)) for r in sorted({j.round for j in jobs})}
    known = {r: s.read() for r, s in stores.items()}
    sizes = pool.features["size_bytes"].to_numpy()
    batch_jobs = []
    for c, ids in enumerate(chunks(jobs, cfg.chunk_size)):
        store = stores[jobs[ids[0]].round]
        todo = store.missing((jobs[i].tables for i in ids), known[jobs[ids[0]].round])
        if todo:
            batch_jobs.append(BatchJob(
                shards=tuple(todo), calibration=_calibration(todo, sizes, cfg.backend.memory_limit_bytes),
                backend=cfg.backend, pool=pool_source or {}, store_root=str(store.folder.parent.resolve()),
                space=store.folder.name, order=rng(seed, "profile", "order", *([tag] if tag else []), c),
                label=f"profile{' ' + tag if tag else ''} chunk {c}"))
    shared.refuse_measuring([s for job in batch_jobs for s in job.shards], what)
    desc = f"profile ({backend.name}, {len(batch_jobs)} chunks to measure)" if progress else None
    if engine is None:
        torch.set_num_threads(cfg.backend.threads)
        for job in tqdm(batch_jobs, desc=desc, disable=not progress):
            measure_batch_job(job, backend)
    else:
        engine.map(measure_batch_job, batch_jobs, desc)
    return profile_table(jobs, {r: s.read() for r, s in stores.items()}, cfg, sizes,
                         environment(backend, cfg.backend.threads))


def passes(jobs: list[Job], train_tables: np.ndarray, remeasure: bool) -> dict[str, list[Job]]:
    """The profile's jobs by the store pass tag they are filed under (`collect`'s): "" the first
    round, `repeat-R` each later round, `remeasure` the second pass of the train-pool shards
    (with `remeasure`). Each pass is its own space, so rows measured elsewhere are imported
    per pass (`autoshard store import --pass TAG`)."""
    out = {pass_tag(r): [j for j in jobs if j.round == r] for r in sorted({j.round for j in jobs})}
    if remeasure:
        out[REMEASURE] = remeasure_jobs(jobs, train_tables)
    return out


def remeasure_jobs(jobs: list[Job], train_tables: np.ndarray) -> list[Job]:
    """The first-round jobs made only of train-pool tables (what the cost model fits on), for
    an independent second pass: a replicate fitted on it says how much one measurement pass
    moves the chain's results."""
    train = set(int(t) for t in train_tables)
    return [j for j in jobs if j.round == 0 and set(j.tables) <= train]


def _calibration(shards: list[str], sizes: np.ndarray, memory_limit: int) -> tuple[int, ...]:
    """The batch's calibration shard: of its shards that fit the memory limit, the one with the
    most tables (a long kernel drifts less by chance than a short one), else its first."""
    tables = [shard_tables(s) for s in shards]
    fitting = [t for t in tables if sizes[t].sum() <= memory_limit]
    return tuple(max(fitting, key=lambda t: (len(t), sizes[t].sum())) if fitting else tables[0])


def profile_table(jobs: list[Job], measured: dict[int, dict[str, dict]], cfg: ProfileConfig,
                  sizes: np.ndarray, env: dict) -> pd.DataFrame:
    """One row per job from the store's records (`measured` by round, then shard key)."""
    rows = []
    for i, job in enumerate(jobs):
        entry = measured[job.round].get(shard_key(job.tables))
        if entry is None:
            raise ConfigError(f"profile: shard {list(job.tables)} is missing from the measurement store")
        row = {"shard_id": i, "kind": job.kind, "round": job.round, "tables": list(job.tables),
               "num_tables": len(job.tables), "shard_bytes": int(sizes[list(job.tables)].sum()),
               "batch_size": cfg.backend.batch_size,
               "status": "ok" if entry["status"] == "ok" else "too large for the memory limit"}
        row |= dict(zip([*COST_COLUMNS, "cv"], values(entry), strict=True))
        row |= {"drift": float(entry["drift"]), "attempts": int(entry["attempts"])}
        row["total_ms"] = row["forward_ms"] + row["backward_ms"]
        rows.append(row | env)
    return pd.DataFrame(rows)


def save_profile(table: pd.DataFrame, folder: str | Path, remeasured: pd.DataFrame | None = None) -> None:
    """Write the data set at once, with the independent second pass (`remeasured.parquet`) when
    there is one (the measurements stay in the store for later stages). It replaces `folder`, any
    data set saved under it included: the wide pool's is saved after (`collect_wide`)."""
    with atomic_dir(folder) as tmp:
        table.to_parquet(tmp / "shards.parquet", index=False)
        if remeasured is not None:
            remeasured.to_parquet(tmp / REMEASURED, index=False)


def load_profile(folder: str | Path, remeasured: bool = False) -> pd.DataFrame:
    """The profile's data set, or with `remeasured` its independent second pass."""
    path = Path(folder) / (REMEASURED if remeasured else "shards.parquet")
    if not path.is_file():
        raise ConfigError(f"{path}: no profile data (run `dvc repro profile`)")
    return pd.read_parquet(path)

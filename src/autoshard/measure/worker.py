"""A portable measurement worker: a job file in, measured rows out, on whatever machine runs it.

A job names the shards (lists of table ids), the backend and timing settings, and the pool its
traces come from: a pool folder on the worker's disk, or the `dataset` and `pool` parameters
and seed that rebuild it (`data.pool.build_pool`, deterministic), so only the job file has to
travel. The worker needs torch and numpy; on a CUDA device it uses FBGEMM's CUDA TBE when
`fbgemm_gpu` is installed there and the `torch` backend otherwise (each row says which ran).

    {"format": "autoshard-measure-jobs/1",
     "pool": {"folder": "data/pool"}  or  {"dataset": {...}, "pool": {...}, "seed": 0},
     "backend": {"backend": "fbgemm", "device": "auto", "optimizer": "EXACT_ROWWISE_ADAGRAD",
                 "batch_size": 2048, "threads": 1, "warmup": 2, "runs": 5, "memory_limit_gib": 8},
     "shards": [[0, 5, 9], [3]]}
"""

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autoshard.core.digest import machine
from autoshard.core.errors import ConfigError
from autoshard.core.inputs import read_json, shown
from autoshard.core.params import Fields
from autoshard.data.pool import Pool, build_pool, load_pool
from autoshard.measure.backends import BackendConfig, make_backend
from autoshard.measure.base import CostBackend, ShardTooLarge, check_batch, check_shard

JOBS_FORMAT = "autoshard-measure-jobs/1"
ROWS_FORMAT = "autoshard-measure-rows/1"
MAX_SHARDS = 1_000_000


@dataclass(frozen=True)
class MeasureJob:
    """Shards to measure, how, and where their traces come from (`pool`: a folder, or the
    `dataset`, `pool` and `seed` parameters to rebuild it)."""

    shards: tuple[tuple[int, ...], ...]
    backend: BackendConfig
    pool: dict[str, Any]


def parse_job(doc: object) -> MeasureJob:
    """A job document, every field checked (errors name the field)."""
    f = Fields("job", doc)
    if f.text("format") != JOBS_FORMAT:
        raise ConfigError(f"job.format: {shown(f.values['format'])} (expected {JOBS_FORMAT})")
    source = f.sub("pool")
    if "folder" in source.values:
        pool = {"folder": source.text("folder")}
    else:
        pool = {"dataset": dict(source.sub("dataset").values), "pool": dict(source.sub("pool").values),
                "seed": source.integer("seed", lo=0)}
    source.done()
    backend = BackendConfig.from_fields(f.sub("backend"))
    shards = f.entries("shards")
    if len(shards) > MAX_SHARDS:
        raise ConfigError(f"job.shards: {len(shards)} shards (at most {MAX_SHARDS} per job)")
    ids = []
    for i, shard in enumerate(shards):
        if not isinstance(shard, list) or not shard or not all(type(t) is int for t in shard):
            raise ConfigError(f"job.shards[{i}]: {shown(shard)} (expected a non-empty list of table ids)")
        ids.append(tuple(shard))
    f.done()
    return MeasureJob(shards=tuple(ids), backend=backend, pool=pool)


def read_job(path: Path) -> MeasureJob:
    """The job file at `path`; a bad one is one error naming the file and the field."""
    doc = read_json(path, "measurement job file")
    try:
        return parse_job(doc)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def job_pool(job: MeasureJob) -> Pool:
    """The job's pool: loaded from its folder or rebuilt from its parameters and seed."""
    if "folder" in job.pool:
        return load_pool(job.pool["folder"])
    return build_pool(job.pool["dataset"], job.pool["pool"], job.pool["seed"], progress=False)


def worker_backend(pool: Pool, cfg: BackendConfig) -> CostBackend:
    """The configured backend; on CUDA without FBGEMM's CUDA kernels, the `torch` backend."""
    try:
        return make_backend(pool, cfg)
    except ImportError:
        if cfg.device != "cuda" or cfg.backend != "fbgemm":
            raise
        return make_backend(pool, replace(cfg, backend="torch"))


def measure_job(job: MeasureJob) -> list[dict]:
    """One row per shard: its tables, forward and backward medians and IQRs (ms), the backend
    and device that measured it, and the machine and library versions; a shard too large for
    the device has status `too_large` and no times."""
    import torch

    pool = job_pool(job)
    check_batch(job.backend.batch_size, pool.traces)
    shards = []
    for i, shard in enumerate(job.shards):
        try:
            shards.append(check_shard(shard, pool.num_tables))
        except ConfigError as exc:
            raise ConfigError(f"job.shards[{i}]: {str(exc).removeprefix('shard: ')}") from None
    backend = worker_backend(pool, job.backend)
    versions = machine(job.backend.device)
    torch.set_num_threads(job.backend.threads)
    rows = []
    for shard in shards:
        row = {"tables": shard, "backend": backend.name, "device": job.backend.device, "status": "ok"}
        try:
            cost = backend.measure(shard, job.backend.batch_size)
            row |= {"forward_ms": cost.forward_ms, "backward_ms": cost.backward_ms,
                    "forward_iqr_ms": cost.forward_iqr_ms, "backward_iqr_ms": cost.backward_iqr_ms}
        except ShardTooLarge:
            row |= {"status": "too_large", "forward_ms": None, "backward_ms": None,
                    "forward_iqr_ms": None, "backward_iqr_ms": None}
        rows.append(row | {"versions": versions})
    return rows


def split(job: MeasureJob, parts: int) -> list[MeasureJob]:
    """The job as up to `parts` jobs of consecutive shards (for an engine's workers); their
    rows, concatenated in order, are the job's rows."""
    size = max(1, -(-len(job.shards) // parts))
    return [replace(job, shards=job.shards[k:k + size]) for k in range(0, len(job.shards), size)]

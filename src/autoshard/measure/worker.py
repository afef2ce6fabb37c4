"""The full measurement worker: a job file in, measured rows out, on whatever machine runs it
(`measure.portable` runs the same jobs where only numpy and torch are installed).

A job names the shards (lists of table ids), the backend and timing settings, and the pool its
traces come from: a pool folder on the worker's disk, or the `dataset` and `pool` parameters
and seed that rebuild it (`data.pool.build_pool`, deterministic), so only the job file has to
travel (rebuilding it needs the package's dependencies: pandas, PyYAML, tqdm). On a CUDA
device it uses FBGEMM's CUDA TBE when `fbgemm_gpu` is installed there and the `torch` backend
otherwise (each row says which ran). A job may also carry a `traces` section, which only
`measure.portable` reads.

    {"format": "autoshard-measure-jobs/1",
     "pool": {"folder": "data/pool"}  or  {"dataset": {...}, "pool": {...}, "seed": 0},
     "backend": {"backend": "fbgemm", "device": "auto", "optimizer": "EXACT_ROWWISE_ADAGRAD",
                 "batch_size": 2048, "threads": 1, "warmup": 2, "runs": 5, "memory_limit_gib": 8},
     "shards": [[0, 5, 9], [3]]}

The rows file says where its rows belong in a measurement store: the space key they were
measured under, computed here with this machine (`measure.store.space`), and what that key is
made of (`settings`: the tables' digest, the backend settings that ran, the measuring code's
digest, the machine), so that `autoshard store import` files them under their own key:

    {"format": "autoshard-measure-rows/2", "space": "<16 hex digits>",
     "settings": {"tables": ..., "backend": {...}, "code": ..., "machine": {...}},
     "rows": [{"tables": [0, 5, 9], "status": "ok", "forward_ms": ..., ...}, ...]}

Format 1 files (rows without a space) cannot be imported: measure them again.
"""

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autoshard.core.errors import ConfigError
from autoshard.core.inputs import read_parsed, shown
from autoshard.core.params import Fields
from autoshard.data.pool import Pool, build_pool, load_pool
from autoshard.measure.backends import BACKENDS, BackendConfig
from autoshard.measure.base import CostBackend, check_batch, check_shard
from autoshard.measure.portable import (
    JOBS_FORMAT,
    ROWS_FORMAT,
    parse_backend,
    parse_shards,
    shard_rows,
    worker_backend,
)
from autoshard.measure.store import from_worker_rows, settings, settings_key

OLD_ROWS_FORMAT = "autoshard-measure-rows/1"  # rows without their space: not importable
TIMES = ("forward_ms", "backward_ms", "forward_iqr_ms", "backward_iqr_ms")
ROW_FIELDS = {"tables", "backend", "device", "status", "versions", *TIMES}
SETTINGS_FIELDS = {"tables", "backend", "code", "machine"}
DIGEST = re.compile(r"[0-9a-f]{64}")


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
    backend = parse_backend(f.sub("backend"))
    shards = parse_shards(f)
    if "traces" in f.values:
        f.sub("traces")  # the portable worker's source of the traces (`measure.portable`): not needed here
    f.done()
    return MeasureJob(shards=shards, backend=backend, pool=pool)


def read_job(path: Path) -> MeasureJob:
    """The job file at `path`; a bad one is one error naming the file and the field."""
    return read_parsed(path, "measurement job file", parse_job)


def job_pool(job: MeasureJob) -> Pool:
    """The job's pool: loaded from its folder or rebuilt from its parameters and seed."""
    if "folder" in job.pool:
        return load_pool(job.pool["folder"])
    return build_pool(job.pool["dataset"], job.pool["pool"], job.pool["seed"], progress=False)


def measure_job(job: MeasureJob) -> list[dict]:
    """One row per shard: its tables, forward and backward medians and IQRs (ms), the backend
    and device that measured it, and the machine and library versions; a shard too large for
    the device has status `too_large` and no times."""
    return _measure(job, job_pool(job))[0]


def measure_rows(job: MeasureJob) -> dict:
    """The rows file of `job`: its rows, the space they were measured under (the settings that
    ran, on this machine) and what that key is made of."""
    pool = job_pool(job)
    rows, backend = _measure(job, pool)
    described = settings(replace(job.backend, backend=backend.name), pool)
    return {"format": ROWS_FORMAT, "space": settings_key(described), "settings": described, "rows": rows}


def _measure(job: MeasureJob, pool: Pool) -> tuple[list[dict], CostBackend]:
    """The job's rows on `pool` and the backend that measured them."""
    check_batch(job.backend.batch_size, pool.traces)
    shards = []
    for i, shard in enumerate(job.shards):
        try:
            shards.append(check_shard(shard, pool.num_tables))
        except ConfigError as exc:
            raise ConfigError(f"job.shards[{i}]: {str(exc).removeprefix('shard: ')}") from None
    backend = worker_backend(pool, job.backend)
    return shard_rows(backend, job.backend, shards, shards), backend


@dataclass(frozen=True)
class WorkerRows:
    """A checked rows file: the space its rows were measured under, what that key is made of,
    and the rows as store records by shard key."""

    space: str
    settings: dict
    records: dict[str, dict]


def parse_rows(doc: object) -> WorkerRows:
    """A rows document, every field checked (errors name the field): the space must be the key
    of its settings, every row measured by that backend on that machine, each shard once."""
    if not isinstance(doc, dict):
        raise ConfigError(f"rows: {shown(doc)} (expected an object)")
    if doc.get("format") == OLD_ROWS_FORMAT:
        raise ConfigError(f"rows.format: {OLD_ROWS_FORMAT} (carries no space key or machine: measure the job "
                          f"again with this version of `autoshard measure`)")
    if doc.get("format") != ROWS_FORMAT:
        raise ConfigError(f"rows.format: {shown(doc.get('format'))} (expected {ROWS_FORMAT})")
    _exact_fields(doc, {"format", "space", "settings", "rows"}, "rows")
    described = _settings(doc["settings"])
    if not isinstance(doc["space"], str) or doc["space"] != settings_key(described):
        raise ConfigError(f"rows.space: {shown(doc['space'])} (not the key of rows.settings: the file was "
                          "changed after it was measured)")
    rows = doc["rows"]
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"rows.rows: {shown(rows)} (expected a non-empty list)")
    seen: set[tuple[int, ...]] = set()
    for i, row in enumerate(rows):
        shard = _row(row, f"rows.rows[{i}]", described)
        if shard in seen:
            raise ConfigError(f"rows.rows[{i}].tables: {list(shard)} (this shard is listed twice)")
        seen.add(shard)
    return WorkerRows(space=doc["space"], settings=described, records=from_worker_rows(rows))


def read_rows(path: Path) -> WorkerRows:
    """The rows file at `path`; a bad one is one error naming the file and the field."""
    return read_parsed(path, "measurement rows file", parse_rows)


def _exact_fields(doc: dict, expected: set[str], where: str) -> None:
    missing, extra = sorted(expected - set(doc)), sorted(set(doc) - expected)
    if missing:
        raise ConfigError(f"{where}.{missing[0]}: missing")
    if extra:
        raise ConfigError(f"{where}.{extra[0]}: {shown(doc[extra[0]])} (unknown field)")


def _settings(described: object) -> dict:
    """The rows' `settings`: two SHA-256 digests, the backend settings and the machine."""
    if not isinstance(described, dict):
        raise ConfigError(f"rows.settings: {shown(described)} (expected an object)")
    _exact_fields(described, SETTINGS_FIELDS, "rows.settings")
    for name in ("tables", "code"):
        if not isinstance(described[name], str) or not DIGEST.fullmatch(described[name]):
            raise ConfigError(f"rows.settings.{name}: {shown(described[name])} (expected a SHA-256 digest)")
    backend, host = described["backend"], described["machine"]
    if not isinstance(backend, dict) or backend.get("backend") not in BACKENDS:
        raise ConfigError(f"rows.settings.backend: {shown(backend)} (expected the backend settings)")
    if type(backend.get("batch_size")) is not int or backend["batch_size"] < 1:
        raise ConfigError(f"rows.settings.backend.batch_size: {shown(backend.get('batch_size'))} "
                          "(expected a positive integer)")
    if not isinstance(host, dict) or not host or not all(isinstance(v, str) for v in host.values()):
        raise ConfigError(f"rows.settings.machine: {shown(host)} (expected the machine's description)")
    return described


def _row(row: object, where: str, described: dict) -> tuple[int, ...]:
    """One checked row's shard: measured by the settings' backend on their machine, with
    finite non-negative times when `ok` and none when `too_large`."""
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: {shown(row)} (expected an object)")
    _exact_fields(row, ROW_FIELDS, where)
    tables = row["tables"]
    if not isinstance(tables, list) or not tables or not all(type(t) is int and t >= 0 for t in tables) \
            or len(set(tables)) != len(tables):
        raise ConfigError(f"{where}.tables: {shown(tables)} (expected distinct table ids)")
    if row["backend"] != described["backend"]["backend"]:
        raise ConfigError(f"{where}.backend: {shown(row['backend'])} (the settings say "
                          f"{described['backend']['backend']})")
    if row["versions"] != described["machine"]:
        raise ConfigError(f"{where}.versions: not the machine of rows.settings (rows of two machines in one file)")
    if row["status"] not in ("ok", "too_large"):
        raise ConfigError(f"{where}.status: {shown(row['status'])} (expected ok or too_large)")
    for name in TIMES:
        value = row[name]
        if row["status"] == "too_large":
            if value is not None:
                raise ConfigError(f"{where}.{name}: {shown(value)} (a shard too large has no times)")
        elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise ConfigError(f"{where}.{name}: {shown(value)} (expected a time in ms, at least 0)")
    return tuple(sorted(tables))


def split(job: MeasureJob, parts: int) -> list[MeasureJob]:
    """The job as up to `parts` jobs of consecutive shards (for an engine's workers); their
    rows, concatenated in order, are the job's rows."""
    size = max(1, -(-len(job.shards) // parts))
    return [replace(job, shards=job.shards[k:k + size]) for k in range(0, len(job.shards), size)]

"""A batch of shards as one engine job: measured in interleaved rounds, filed in the store.

The profile's chunks and the scoring's tasks are such batches. A job carries what a worker
needs to rebuild the backend (its settings and where the pool comes from, as
`measure.worker` jobs do), so any engine can run it; it writes its batch to the store itself,
so what finished survives an interruption whichever engine ran it. Run in this process with a
ready backend (`measure_batch_job(job, backend)`), nothing is rebuilt.
"""

import json
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from autoshard.measure.backends import BackendConfig
from autoshard.measure.base import CostBackend
from autoshard.measure.interleaved import measure_batch
from autoshard.measure.store import MeasurementStore, record, shard_tables


@dataclass(frozen=True)
class BatchJob:
    """Shards (store keys) to measure together, the calibration shard timed between rounds,
    the settings, the pool's source (`measure.worker` format), the store folder and space,
    the generator of the batch's shuffled orders, and a label for the batch file."""

    shards: tuple[str, ...]
    calibration: tuple[int, ...]
    backend: BackendConfig
    pool: dict[str, Any]
    store_root: str
    space: str
    order: np.random.Generator
    label: str


def measure_batch_job(job: BatchJob, backend: CostBackend | None = None) -> dict[str, dict]:
    """Measure the job's shards, add them to the store as one batch, return their records."""
    import torch

    backend = backend or _worker_backend(job.pool, job.backend)
    torch.set_num_threads(job.backend.threads)
    batch = measure_batch(backend, [shard_tables(s) for s in job.shards], list(job.calibration),
                          job.backend.batch_size, job.backend.timing, job.order)
    records = {s: record(c, batch.drift, batch.attempts, batch.calibration_ms)
               for s, c in zip(job.shards, batch.costs, strict=True)}
    MeasurementStore(job.store_root, job.space).write(records, job.label)
    return records


_BACKENDS: dict[str, CostBackend] = {}


def _worker_backend(pool: dict[str, Any], cfg: BackendConfig) -> CostBackend:
    """The backend of `cfg` on the pool of `pool`, built once per worker process."""
    from autoshard.measure.worker import MeasureJob, job_pool, worker_backend

    name = json.dumps([pool, asdict(cfg)], sort_keys=True, default=str)
    if name not in _BACKENDS:
        _BACKENDS.clear()  # one pool in memory at a time
        _BACKENDS[name] = worker_backend(job_pool(MeasureJob(shards=(), backend=cfg, pool=pool)), cfg)
    return _BACKENDS[name]

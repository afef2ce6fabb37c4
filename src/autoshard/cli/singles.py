"""Every table measured alone on this machine, cached: what LPT and the MILP place on when no
trained models exist (a fresh clone), and what the TorchRec estimator fills shard costs from.

Tables are measured in chunks, each chunk one interleaved batch (`measure.interleaved`: every
table once a round, shuffled, a calibration shard between rounds), with the profile's backend
and the study's plan timing. Each table's cost is filed under its own measurement key
(`measure.backends.measurement_key`: its features and traces, the backend settings, the
measuring code, the libraries and the machine), one small JSON file per table under the cache
folder, written as each chunk ends: a stopped run resumes, another table list reuses every table
it shares, and a change of anything the key covers measures again.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autoshard.cli.defaults import study_defaults
from autoshard.core.atomic import atomic_file
from autoshard.core.digest import machine
from autoshard.core.seeding import rng
from autoshard.measure.backends import BackendConfig, make_backend, measurement_key
from autoshard.measure.interleaved import measure_batch
from autoshard.measure.timing import TimingConfig

CACHE_ENV = "AUTOSHARD_CACHE"
CHUNK = 32  # tables per interleaved batch


MEMORY_LIMIT_BYTES = 64 * 2**30  # a shard measured here may take this much


def study_backend(backend: str, batch_size: int, timing: TimingConfig) -> BackendConfig:
    """How the command and the TorchRec estimator measure on this CPU: `backend` at `batch_size`
    with `timing`, and the study's optimizer and threads (`cli.defaults`)."""
    study = study_defaults()
    return BackendConfig(backend=backend, device="cpu", optimizer=study["profile.optimizer"], batch_size=batch_size,
                         threads=study["profile.threads"], timing=timing, memory_limit_bytes=MEMORY_LIMIT_BYTES)


def cache_folder(option: Path | None = None) -> Path:
    """Where single-table costs are kept: `option`, else $AUTOSHARD_CACHE, else ~/.cache/autoshard."""
    if option is not None:
        return Path(option)
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "autoshard"


@dataclass(frozen=True)
class Singles:
    """Per table (in table order) its measured forward + backward ms alone (NaN: too large for
    this machine's memory limit) and its forward ms, how many were measured now and how many read
    from the cache, and where and how they were measured."""

    costs: np.ndarray
    forward: np.ndarray
    measured: int
    cached: int
    where: dict

    def source(self) -> dict:
        """The plan file's `costs` entry."""
        return {"kind": "measured", "what": "each table alone, forward + backward (ms)", **self.where,
                "tables_measured_now": self.measured, "tables_from_cache": self.cached}


def measure_singles(pool, cfg: BackendConfig, folder: Path, progress: bool = True) -> Singles:
    """Every table of `pool` (features and traces) measured alone under `cfg`, through the
    cache at `folder`/singles."""
    from tqdm.auto import tqdm

    store = folder / "singles"
    keys = [measurement_key(cfg, pool, [t]) for t in range(pool.num_tables)]
    costs, forward = np.full(pool.num_tables, np.nan), np.full(pool.num_tables, np.nan)
    todo = []
    for t, key in enumerate(keys):
        known = _read(store / f"{key}.json")
        if known is None:
            todo.append(t)
        else:
            forward[t], costs[t] = known[0], known[0] + known[1]
    if todo:
        backend = make_backend(pool, cfg)
        bar = tqdm(total=len(todo), desc="measuring each table alone", unit="table", disable=not progress)
        for start in range(0, len(todo), CHUNK):
            chunk = todo[start:start + CHUNK]
            batch = measure_batch(backend, [[t] for t in chunk], [chunk[0]], cfg.batch_size, cfg.timing,
                                  rng(0, "singles", *[keys[t] for t in chunk]))
            for t, cost in zip(chunk, batch.costs, strict=True):
                forward[t], costs[t] = cost[0], cost[0] + cost[1]  # NaN: too large to measure here, kept as such
                with atomic_file(store / f"{keys[t]}.json") as tmp:
                    tmp.write_text(json.dumps({"forward_ms": cost[0], "backward_ms": cost[1], "round_cv": cost[-1],
                                               "drift": batch.drift}))
            bar.update(len(chunk))
        bar.close()
    where = {"backend": cfg.backend, "device": cfg.device, "batch_size": cfg.batch_size, "threads": cfg.threads,
             "machine": machine(cfg.device), "cache": str(store)}
    return Singles(costs=costs, forward=forward, measured=len(todo), cached=pool.num_tables - len(todo), where=where)


def _read(path: Path) -> tuple[float, float] | None:
    """A cached table's forward and backward ms (NaN as written for a table too large to
    measure); None when it is not cached or its file is damaged (measured again, not trusted)."""
    try:
        record = json.loads(path.read_text())
        return float(record["forward_ms"]), float(record["backward_ms"])
    except (OSError, ValueError, KeyError, TypeError):
        return None

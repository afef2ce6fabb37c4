"""`autoshard measure --write-jobs`: the portable worker's jobs files for the profile stage's
shard list, one file per pass, so another machine measures exactly the shards the study needs.

The pool travels as its parameters and seed (the worker rebuilds it, deterministically), not as
files, so a jobs file stays small; for a synthetic pool the file also carries a `traces` section
(each used table's spec and trace digest, the trace settings and seed, the pool's digest), from
which `measure.portable` (numpy and torch only) regenerates just those tables. The backend
settings are the `profile` section's, with the device and backend overridable (a GPU worker's
rows land in that machine's own space, which the stages then read with
`profile.measurements_space`). The worker times each shard in one pass of as many runs as the
stage's interleaved rounds give it (`ProfileConfig.check_timing`).
"""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autoshard.core.errors import ConfigError, invalid
from autoshard.data.pool import Pool, build_pool
from autoshard.data.synth import PoolConfig, draw_specs
from autoshard.data.tasks import make_tasks
from autoshard.measure.backends import DEVICES
from autoshard.measure.collect import ProfileConfig, passes
from autoshard.measure.portable import ambiguous_draws, trace_digest
from autoshard.measure.portable import parse_job as parse_portable_job
from autoshard.measure.worker import JOBS_FORMAT, parse_job
from autoshard.placement.profile_shards import profile_jobs

MAIN = "main"  # how --passes names the untagged pass
COPIED = ("backend", "optimizer", "batch_size", "threads", "memory_limit_gib")  # the worker takes these as they are


@dataclass(frozen=True)
class PassJobs:
    """One pass's jobs file: its store pass tag ("" the main pass), where it goes, its text."""

    tag: str
    path: Path
    shards: int
    text: str
    portable: bool = False  # the portable worker (`measure.portable`) takes it


def pass_path(path: Path, tag: str) -> Path:
    """The jobs file of pass `tag`: `jobs.json` for the main pass, `jobs.TAG.json` for the others."""
    return path.with_name(f"{path.stem}.{tag}{path.suffix}") if tag else path


def job_docs(params: dict, device: str | None = None, backend: str | None = None) -> dict[str, dict]:
    """The jobs document of every pass of the profile stage's collection under `params`, by
    store pass tag, each listing that pass's shards in the stage's order."""
    profile = params.get("profile")
    if not isinstance(profile, dict):
        raise invalid("profile", profile, "expected the profile section")
    settings = profile | {k: v for k, v in (("device", device), ("backend", backend)) if v is not None}
    if settings.get("device") not in DEVICES:
        raise invalid("profile.device", settings.get("device"), f"expected one of {', '.join(DEVICES)}")
    cfg = ProfileConfig.from_params(settings | {"device": "cpu"})  # the worker resolves the device
    seed = params.get("seed")
    if type(seed) is not int or seed < 0:
        raise invalid("seed", seed, "expected an integer, at least 0")
    pool = build_pool(params.get("dataset"), params.get("pool"), seed, progress=False)
    tasks, train, test = make_tasks(pool.features, params.get("tasks"), seed)
    jobs = profile_jobs(pool, tasks, train, test, cfg, seed)
    worker = {k: settings[k] for k in COPIED} | {"device": settings["device"], "warmup": cfg.check_timing.warmup,
                                                 "runs": cfg.check_timing.runs}
    source = {"dataset": params["dataset"], "pool": params["pool"], "seed": seed}
    docs = {tag: {"format": JOBS_FORMAT, "pool": source, "backend": worker,
                  "shards": [list(j.tables) for j in pass_jobs]}
            for tag, pass_jobs in passes(jobs, train, cfg.remeasure).items() if pass_jobs}
    synthetic = params["dataset"].get("source") == "synthetic"
    for doc in docs.values():  # what the workers will accept, short of a GPU here
        if synthetic:
            doc["traces"] = trace_section(pool, params["pool"], seed, {t for s in doc["shards"] for t in s})
        parse_job(doc | {"backend": worker | {"device": "cpu"}})
        if synthetic and worker["backend"] != "analytic":
            parse_portable_job(doc | {"backend": worker | {"device": "cpu"}})
    return docs


def trace_section(pool: Pool, pool_params: dict, seed: int, tables: set[int]) -> dict:
    """The portable worker's `traces` section for `tables` of the synthetic `pool` (built from
    `pool_params` and `seed`): what regenerates each one's trace, its digest, and the digest of
    every table of the pool, which the space key needs and only pandas computes."""
    cfg = PoolConfig.from_params(pool_params)
    specs = draw_specs(cfg, seed)
    t = pool.traces
    b = t.batch_size
    return {"seed": seed, "batch_size": b, "dispersion": cfg.bag_dispersion,
            "pool": pool.digest(list(range(pool.num_tables))),
            "tables": [table_entry(specs, t, seed, i, cfg.bag_dispersion) for i in sorted(tables)]}


def table_entry(specs, traces, seed: int, table: int, dispersion: float) -> dict:
    """What regenerates one table's trace on the worker, the draws whose floor another CPU may
    take one apart (`portable.ambiguous_draws`), and the digest the trace must have."""
    b = traces.batch_size
    indices = traces.indices[traces.offsets[table * b]:traces.offsets[(table + 1) * b]]
    rows, pf, alpha = int(specs.rows[table]), float(specs.pooling_factors[table]), float(specs.alphas[table])
    return {"table": table, "rows": rows, "dim": int(specs.dims[table]), "pooling_factor": pf, "alpha": alpha,
            "ambiguous": ambiguous_draws(seed, table, rows, pf, alpha, b, dispersion, np.asarray(indices)),
            "trace": trace_digest(traces.lengths[table], indices)}


def write_plan(params: dict, path: Path, device: str | None = None, backend: str | None = None,
               only: list[str] | None = None) -> list[PassJobs]:
    """The jobs files to write for `params` at `path` (`only`: these passes, `main` the untagged
    one); nothing is written here. The text is deterministic: the same params give the same bytes."""
    docs = job_docs(params, device, backend)
    names = {tag or MAIN: tag for tag in docs}
    for name in only or []:
        if name not in names:
            raise ConfigError(f"--passes: {name!r} (the profile's passes here: {', '.join(names)})")
    chosen = [names[n] for n in names if not only or n in only]
    return [PassJobs(tag, pass_path(path, tag), len(docs[tag]["shards"]),
                     json.dumps(docs[tag], separators=(",", ":")) + "\n",
                     "traces" in docs[tag] and docs[tag]["backend"]["backend"] != "analytic") for tag in chosen]

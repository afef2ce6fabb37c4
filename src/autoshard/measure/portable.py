"""The portable measurement worker: a job in, rows for the store out, on a machine that has
only Python, numpy and torch (and `fbgemm_gpu`, used when importable).

    PYTHONPATH=src python -m autoshard.measure.portable --jobs jobs.json --out rows.json

It runs from a copy of the source folder (no install) and imports only the standard library,
numpy, torch and the package modules that need no more (no pandas, PyYAML or tqdm). Instead of
rebuilding the whole pool, it regenerates the traces of the tables its shards use from the
job's `traces` section, which `autoshard measure --write-jobs` fills in for a synthetic pool:
each table's hash size, dim, mean pooling factor and Zipf alpha and the digest of its trace,
the trace settings and seed (`data.synth.table_trace`, bit for bit: a trace that comes out
different on this machine's numpy is refused), and the digest of the pool's tables that the
space key needs (it is computed where pandas is):

    "traces": {"seed": 0, "batch_size": 4096, "dispersion": 1.5, "pool": "<SHA-256>",
               "tables": [{"table": 3, "rows": 9021, "dim": 16, "pooling_factor": 12.5,
                           "alpha": 1.05, "trace": "<SHA-256>", "ambiguous": [[5180, 77]]}, ...]}

A trace's Zipf ranks are floors of a vectorised power (`data.synth.zipf_ranks`), which numpy
computes with the CPU's vector extensions: another CPU may round a draw one ulp apart, and a
draw that close to an integer then floors to the neighbouring rank. The job's writer lists, per
table, the draws within AMBIGUOUS (relative) of an integer as [position, index] pairs of the
pool's trace (`ambiguous_draws`; usually none, and none where the field is absent); the worker
sets those positions to the listed indices (`regenerate`) and still checks the digest exactly.

The rows file is the full worker's (`measure.worker`): same format, same space key (the job's
pool digest, the backend settings that ran, the measuring code's digest and this machine), so
`autoshard store import` files it alike. Bad input: one line naming the file and field, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from autoshard.core.atomic import atomic_file
from autoshard.core.digest import array_digest, machine
from autoshard.core.errors import ConfigError
from autoshard.core.inputs import read_parsed, shown
from autoshard.core.params import Fields
from autoshard.core.seeding import rng
from autoshard.data.synth import bag_trace
from autoshard.data.traces import Traces, from_lengths

if TYPE_CHECKING:
    from autoshard.measure.backends import BackendConfig
    from autoshard.measure.base import CostBackend

JOBS_FORMAT = "autoshard-measure-jobs/1"
ROWS_FORMAT = "autoshard-measure-rows/2"
MAX_SHARDS = 1_000_000
PORTABLE_BACKENDS = ("fbgemm", "torch_fused", "torch")  # `analytic` needs torchrec: not portable
SPEC_FIELDS = ("table", "rows", "dim", "pooling_factor", "alpha", "trace", "ambiguous")
# A draw this close to an integer (relative) is one whose floor another CPU may take one lower or
# higher: vectorised powers differ from one CPU to another by a few ulp (2.2e-16 relative each),
# a few thousand times less; the writer lists such draws (usually none in a million).
AMBIGUOUS = 1e-12


def trace_digest(lengths: np.ndarray, indices: np.ndarray) -> str:
    """SHA-256 of one table's bag lengths and indices (as int64, whatever they are stored as)."""
    return array_digest(np.asarray(lengths, dtype=np.int64), np.asarray(indices, dtype=np.int64))


@dataclass(frozen=True)
class TableSpec:
    """What regenerates one table's trace, and the digest that trace must have."""

    table: int
    rows: int
    dim: int
    pooling_factor: float
    alpha: float
    trace: str
    ambiguous: tuple[tuple[int, int], ...] = ()  # (position, index) of the draws another CPU may floor apart


@dataclass(frozen=True)
class TraceSource:
    """The job's `traces` section: the trace settings and seed, the pool's tables digest, and
    the specs of the tables its shards use."""

    seed: int
    batch_size: int
    dispersion: float
    pool: str
    tables: tuple[TableSpec, ...]


@dataclass(frozen=True)
class PortableJob:
    shards: tuple[tuple[int, ...], ...]
    backend: BackendConfig
    traces: TraceSource


@dataclass
class TracePool:
    """The job's tables as a pool the backends can measure: positions 0..n-1 are `tables`."""

    features: dict[str, np.ndarray]
    traces: Traces
    tables: tuple[int, ...]

    @property
    def num_tables(self) -> int:
        return len(self.tables)


def parse_backend(f: Fields) -> BackendConfig:
    """The job's `backend` section: the settings, each shard timed in one round of its `warmup`
    and `runs` (`ProfileConfig.check_timing`)."""
    from autoshard.measure.backends import BackendConfig
    from autoshard.measure.timing import one_round

    return BackendConfig.from_fields(f, one_round(f.integer("warmup", lo=0), f.integer("runs")))


def parse_shards(f: Fields) -> tuple[tuple[int, ...], ...]:
    """The job's `shards`: non-empty lists of table ids (errors name the shard)."""
    shards = f.entries("shards")
    if len(shards) > MAX_SHARDS:
        raise ConfigError(f"job.shards: {len(shards)} shards (at most {MAX_SHARDS} per job)")
    ids = []
    for i, shard in enumerate(shards):
        if not isinstance(shard, list) or not shard or not all(type(t) is int for t in shard):
            raise ConfigError(f"job.shards[{i}]: {shown(shard)} (expected a non-empty list of table ids)")
        ids.append(tuple(shard))
    return tuple(ids)


def _digest(f: Fields, key: str) -> str:
    value = f.text(key)
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ConfigError(f"{f.name(key)}: {shown(value)} (expected a SHA-256 digest)")
    return value


def parse_traces(f: Fields) -> TraceSource:
    """The job's `traces` section, every field checked."""
    specs, seen = [], set()
    for i, entry in enumerate(f.entries("tables")):
        t = Fields(f"{f.name('tables')}[{i}]", entry)
        spec = TableSpec(table=t.integer("table", lo=0), rows=t.integer("rows", hi=2**31 - 1), dim=t.integer("dim"),
                         pooling_factor=t.number("pooling_factor", lo=0, lo_open=True),
                         alpha=t.number("alpha", lo=0), trace=_digest(t, "trace"))
        spec = replace(spec, ambiguous=parse_ambiguous(t, spec.rows))
        t.done()
        if spec.table in seen:
            raise ConfigError(f"{t.name('table')}: {spec.table} (listed twice)")
        seen.add(spec.table)
        specs.append(spec)
    out = TraceSource(seed=f.integer("seed", lo=0), batch_size=f.integer("batch_size"),
                      dispersion=f.number("dispersion", lo=0, lo_open=True), pool=_digest(f, "pool"),
                      tables=tuple(specs))
    f.done()
    return out


def parse_ambiguous(t: Fields, rows: int) -> tuple[tuple[int, int], ...]:
    """A table's `ambiguous` draws: [position, index] pairs, distinct positions, indices below
    `rows`; absent (a job written before the field) or empty: none."""
    pairs = t.values.get("ambiguous", [])
    t.used.add("ambiguous")
    if not isinstance(pairs, list):
        raise ConfigError(f"{t.name('ambiguous')}: {shown(pairs)} (expected a list of [position, index] pairs)")
    out = []
    for k, pair in enumerate(pairs):
        if not (isinstance(pair, list) and len(pair) == 2 and all(type(v) is int and v >= 0 for v in pair)
                and pair[1] < rows):
            raise ConfigError(f"{t.name('ambiguous')}[{k}]: {shown(pair)} (expected [position, index], "
                              f"an index below the table's {rows} rows)")
        out.append((pair[0], pair[1]))
    if len({p for p, _ in out}) != len(out):
        raise ConfigError(f"{t.name('ambiguous')}: {shown(pairs)} (a position listed twice)")
    return tuple(out)


def parse_job(doc: object) -> PortableJob:
    """A job document for this worker: it needs the `traces` section (its `pool` is not read)."""
    f = Fields("job", doc)
    if f.text("format") != JOBS_FORMAT:
        raise ConfigError(f"job.format: {shown(f.values['format'])} (expected {JOBS_FORMAT})")
    if "traces" not in f.values:
        raise ConfigError("job.traces: missing (write the job with `autoshard measure --write-jobs` from a "
                          "synthetic pool, or measure it with `autoshard measure`)")
    traces = parse_traces(f.sub("traces"))
    if "pool" in f.values:
        f.sub("pool")  # the full worker's source of the pool: not needed here
    backend = parse_backend(f.sub("backend"))
    if backend.backend not in PORTABLE_BACKENDS:
        raise ConfigError(f"job.backend.backend: {shown(backend.backend)} (the portable worker measures with "
                          f"{' or '.join(PORTABLE_BACKENDS)})")
    shards = parse_shards(f)
    f.done()
    known = {s.table for s in traces.tables}
    for i, shard in enumerate(shards):
        missing = [t for t in shard if t not in known]
        if missing:
            raise ConfigError(f"job.shards[{i}]: table {missing[0]} (not in job.traces.tables)")
    if backend.batch_size > traces.batch_size:
        raise ConfigError(f"job.backend.batch_size: {backend.batch_size} (the traces hold {traces.batch_size} "
                          "bags per table)")
    return PortableJob(shards=shards, backend=backend, traces=traces)


def read_job(path: Path) -> PortableJob:
    """The job file at `path`; a bad one is one error naming the file and the field."""
    return read_parsed(path, "measurement job file", parse_job)


def regenerate(source: TraceSource) -> TracePool:
    """The traces of the listed tables, as the pool has them (`data.synth.table_trace`, each
    table's `ambiguous` draws set to the pool's indices), each checked against its digest; their
    rows and dims."""
    lengths = np.empty((len(source.tables), source.batch_size), dtype=np.int64)
    parts = []
    for i, s in enumerate(source.tables):
        lengths[i], idx = bag_trace(rng(source.seed, "pool", "trace", s.table), s.rows, s.pooling_factor, s.alpha,
                                    source.batch_size, source.dispersion)
        if s.ambiguous:
            positions, values = np.array(s.ambiguous, dtype=np.int64).T
            if positions.max() >= idx.size:
                raise ConfigError(f"job.traces.tables[{i}].ambiguous: position {positions.max()} (table {s.table}'s "
                                  f"trace has {idx.size} lookups)")
            idx[positions] = values
        if trace_digest(lengths[i], idx) != s.trace:
            raise ConfigError(f"job.traces.tables[{i}].trace: table {s.table}'s trace regenerated here differs "
                              f"from the pool's (numpy {np.__version__} draws other numbers: use the planning "
                              "machine's numpy, or ship the pool folder and `autoshard measure`)")
        parts.append(idx)
    features = {"rows": np.array([s.rows for s in source.tables], dtype=np.int64),
                "dim": np.array([s.dim for s in source.tables], dtype=np.int64)}
    return TracePool(features=features, traces=from_lengths(np.concatenate(parts), lengths),
                     tables=tuple(s.table for s in source.tables))


def zipf_points(u: np.ndarray, rows: int, alpha: float) -> np.ndarray:
    """The continuous power-law draws whose floors are a trace's Zipf ranks: the formula of
    `data.synth.zipf_ranks` (kept equal to it by a test), for `ambiguous_draws` to see how close
    to an integer each one came."""
    n1 = rows + 1.0
    if abs(alpha - 1.0) < 1e-9:
        return n1 ** u
    e = 1.0 - alpha
    return (1.0 + u * (n1 ** e - 1.0)) ** (1.0 / e)


def replay(seed: int, table: int, rows: int, pooling_factor: float, alpha: float, batch_size: int,
           dispersion: float) -> tuple[np.ndarray, np.ndarray, np.random.Generator]:
    """The draws of `data.synth.bag_trace` for one table of the pool, in its order: the bag
    lengths, the power-law points whose floors are the ranks, and the generator as it stands
    after them (it draws the scatter next)."""
    g = rng(seed, "pool", "trace", table)
    lengths = g.poisson(g.gamma(dispersion, pooling_factor / dispersion, batch_size)).astype(np.int64)
    return lengths, zipf_points(g.random(int(lengths.sum())), rows, alpha), g


def ambiguous_draws(seed: int, table: int, rows: int, pooling_factor: float, alpha: float, batch_size: int,
                    dispersion: float, indices: np.ndarray) -> list[list[int]]:
    """A table's `ambiguous` entry for the job: [position, index] of every draw within AMBIGUOUS
    (relative) of an integer, the index being the pool's, `indices` (its trace's flat indices)."""
    _, points, _ = replay(seed, table, rows, pooling_factor, alpha, batch_size, dispersion)
    near = np.flatnonzero(np.abs(points - np.rint(points)) <= AMBIGUOUS * points)
    return [[int(p), int(indices[p])] for p in near]


def worker_backend(pool, cfg: BackendConfig) -> CostBackend:
    """The configured backend; on CUDA without FBGEMM's CUDA kernels, `torch_fused`, the fused
    operator built like FBGEMM's (its rows are named for it, never `fbgemm`)."""
    from autoshard.measure.backends import make_backend

    try:
        return make_backend(pool, cfg)
    except ImportError:
        if cfg.device != "cuda" or cfg.backend != "fbgemm":
            raise
        return make_backend(pool, replace(cfg, backend="torch_fused"))


def shard_rows(backend: CostBackend, cfg: BackendConfig, shards: Sequence[list[int]],
               measured: Sequence[list[int]]) -> list[dict]:
    """One row per shard (`measured`: its table ids in the backend's pool): its tables, forward
    and backward medians and IQRs (ms), the backend and device, the machine and library
    versions; a shard too large for the device has status `too_large` and no times."""
    import torch

    from autoshard.measure.base import ShardTooLarge

    versions = machine(cfg.device)
    torch.set_num_threads(cfg.threads)
    rows = []
    for shard, ids in zip(shards, measured, strict=True):
        row = {"tables": list(shard), "backend": backend.name, "device": cfg.device, "status": "ok"}
        try:
            cost = backend.measure(ids, cfg.batch_size)
            row |= {"forward_ms": cost.forward_ms, "backward_ms": cost.backward_ms,
                    "forward_iqr_ms": cost.forward_iqr_ms, "backward_iqr_ms": cost.backward_iqr_ms}
        except ShardTooLarge:
            row |= {"status": "too_large", "forward_ms": None, "backward_ms": None,
                    "forward_iqr_ms": None, "backward_iqr_ms": None}
        rows.append(row | {"versions": versions})
    return rows


def measure_rows(job: PortableJob) -> dict:
    """The rows file of `job` (`measure.worker`'s format and space key)."""
    from autoshard.measure.store import described_settings, settings_key

    pool = regenerate(job.traces)
    position = {t: i for i, t in enumerate(pool.tables)}
    backend = worker_backend(pool, job.backend)
    rows = shard_rows(backend, job.backend, [list(s) for s in job.shards],
                      [[position[t] for t in s] for s in job.shards])
    described = described_settings(replace(job.backend, backend=backend.name), job.traces.pool)
    return {"format": ROWS_FORMAT, "space": settings_key(described), "settings": described, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    """`python -m autoshard.measure.portable --jobs JOBS --out ROWS`."""
    p = argparse.ArgumentParser(prog="autoshard.measure.portable", description=__doc__.splitlines()[0])
    p.add_argument("--jobs", required=True, type=Path, help="a jobs file of `autoshard measure --write-jobs`")
    p.add_argument("--out", required=True, type=Path, help="the rows file to write (for `autoshard store import`)")
    args = p.parse_args(argv)
    try:
        if args.out.resolve() == args.jobs.resolve():
            raise ConfigError(f"--out: {str(args.out)!r} (the jobs file itself)")
        if args.out.is_dir():
            raise ConfigError(f"--out: {str(args.out)!r} (a folder)")
        job = read_job(args.jobs)
        try:
            doc = measure_rows(job)
        except ConfigError as exc:
            raise ConfigError(f"{args.jobs}: {exc}") from None
    except ConfigError as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 2
    with atomic_file(args.out) as tmp:
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
    rows = doc["rows"]
    ok = sum(r["status"] == "ok" for r in rows)
    print(f"measured {ok} of {len(rows)} shards with {rows[0]['backend']} on {rows[0]['device']} "
          f"(space {doc['space']}): wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

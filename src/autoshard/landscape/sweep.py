"""The GPU landscape: one short run that maps how shard costs behave on a GPU, with both torch
backends, from nothing but Python, numpy and torch (a copy of `src/`, no install):

    PYTHONPATH=src python -m autoshard.landscape.sweep --out DIR      (scripts/gpu_landscape.sh)

It draws a seeded pool sample like the study's wide pool (log-normal hash sizes and pooling
factors, Zipf skew, dims 16 to 256, each table at most `TABLE_MIB_MAX`; `data.synth`, on this
machine, from the seed), spins the GPU until its clocks are up, measures a device copy (the
bandwidth bound), then times, at `bags` bags per table: every table alone, the prefixes of random
table orders (2, 4, ... 64 tables), one reference shard at several batch sizes, random shards, and
the reference shard again at moments spread over the run (repeatability). Each shard is measured
with `torch_fused` and `torch` back to back, the first of the two alternating, so both share the
machine's state. A hard budget (`budget_s`, from the start of the run, setup included) stops it
cleanly: a shard whose predicted time would overrun it is skipped.

What it writes to `--out` (four files; the script adds `log.txt`): `run.json` (settings, device,
versions, warm-up and copy bandwidth), `tables.json` (each table's spec and trace digest, as
`measure.portable` names them), `rows.jsonl` (one row per shard and backend, flushed as measured:
a killed run loses nothing) and `summary.json` (the sanity figures of `landscape.sanity`, also
printed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

import numpy as np
import torch

from autoshard.core.atomic import atomic_file
from autoshard.core.errors import ConfigError
from autoshard.core.seeding import rng
from autoshard.data.sizes import table_bytes
from autoshard.data.synth import PoolConfig, draw_specs, table_trace
from autoshard.data.traces import from_lengths
from autoshard.landscape.device import copy_bandwidth, describe, memory_limit, spin
from autoshard.landscape.sanity import summarize, summary_lines
from autoshard.measure.backends import BackendConfig, make_backend
from autoshard.measure.base import CostBackend, ShardTooLarge
from autoshard.measure.portable import TableSpec, TracePool, read_job, regenerate, trace_digest
from autoshard.measure.timing import one_round

FORMAT = "autoshard-gpu-landscape/1"
STREAM = "landscape"  # the random streams' prefix, beside the pool's "pool" and the wide pool's "wide"
BACKENDS = ("torch_fused", "torch")
# The wide pool's generator (params.yaml `pool` with the `wide` overrides; a test keeps them equal)
# with the dims of the issue: the study's 16 and 32 and the wider ones real models have.
SAMPLE_POOL = {"dims": [16, 32, 64, 128, 256], "weight_bytes": 4, "rows_median": 20000, "rows_sigma": 2.5,
               "rows_min": 100, "rows_max": 2000000, "pooling_factor_mean": 15.8, "pooling_factor_sigma": 1.5,
               "pooling_factor_max": 200.0, "bag_dispersion": 1.0, "uniform_share": 0.5, "uniform_alpha_max": 0.3,
               "zipf_alpha_min": 0.6, "zipf_alpha_max": 1.3}
TABLE_MIB_MAX = 64  # a table's weights and row-wise state, at most (params.yaml `wide.table_mib_max`)
MAX_ERRORS = 5      # measurements that fail other than by memory before the run gives up


@dataclass(frozen=True)
class LandscapeConfig:
    """Every setting of a run; the defaults fit one H200 in under 6 minutes."""

    device: str = "cuda"
    bags: int = 65_536                              # bags per table of the traces and the main batch
    tables: int = 96                                # the pool sample
    orders: int = 3                                 # random table orders whose prefixes are measured
    prefixes: tuple[int, ...] = (2, 4, 8, 16, 32, 64)
    random_shards: int = 24                         # random shards of the sample ...
    random_tables: int = 32                         # ... their sizes log-uniform in [2, this]
    reference_tables: int = 16                      # the reference shard: order 0's first tables
    batches: tuple[int, ...] = (8192, 16384, 32768, 65536)  # the reference shard's batch scaling
    repeats: int = 4                                # the reference shard again, spread over the run
    warmup: int = 2                                 # untimed runs per measurement
    runs: int = 5                                   # timed runs per measurement (median, IQR)
    spin_s: float = 5.0                             # clock warm-up before anything is timed
    copy_mib: int = 4096                            # the device copy that measures the bandwidth bound
    budget_s: float = 330.0                         # hard stop, from the start of the run
    seed: int = 0
    threads: int = 8                                # torch's CPU threads (the inputs' preparation)
    memory_gib: float = 0.0                         # 0: 90% of the GPU's memory, 4 GiB on a CPU
    jobs: str = ""                                  # a `--write-jobs` file: its tables, not a drawn sample

    def __post_init__(self):
        for name in ("bags", "tables", "orders", "reference_tables", "random_tables", "runs", "threads", "copy_mib"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')}: {getattr(self, name)} (expected at least 1)")
        for name in ("random_shards", "repeats", "warmup", "spin_s", "budget_s", "memory_gib"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')}: {getattr(self, name)} (expected at least 0)")
        if self.tables < 2:
            raise ConfigError(f"--tables: {self.tables} (expected at least 2)")
        if self.device not in ("cuda", "cpu"):
            raise ConfigError(f"--device: {self.device!r} (expected cuda or cpu)")
        for name in ("prefixes", "batches"):
            values = getattr(self, name)
            if not values or min(values) < 1:
                raise ConfigError(f"--{name}: {values} (expected positive sizes)")
        if max(self.batches) > self.bags:
            raise ConfigError(f"--batches: {max(self.batches)} (above --bags {self.bags})")


# toy sizes for a CPU (`--smoke`): the whole run in seconds
SMOKE = {"device": "cpu", "bags": 512, "tables": 12, "orders": 2, "prefixes": (2, 4, 8), "random_shards": 4,
         "random_tables": 6, "reference_tables": 4, "batches": (128, 256, 512), "repeats": 3, "warmup": 1,
         "runs": 3, "spin_s": 0.0, "copy_mib": 32, "budget_s": 60.0, "threads": 1}


@dataclass(frozen=True)
class Item:
    """One shard to measure (with every backend): its sample tables, batch and why it is there."""

    kind: str                   # single, prefix, batch, random_shard or repeat
    tables: tuple[int, ...]
    batch_size: int
    order: int = -1             # a prefix's random order


def sample_pool(cfg: LandscapeConfig) -> tuple[TracePool, list[dict]]:
    """The pool sample with its traces (`cfg.bags` bags per table), and per table its spec, trace
    digest and mean lookups per bag."""
    gen = PoolConfig.from_params(SAMPLE_POOL | {"num_tables": cfg.tables, "batch_size": cfg.bags})

    def rows_cap(dims: np.ndarray) -> np.ndarray:
        fits = np.floor(TABLE_MIB_MAX * 2**20 / table_bytes(1, dims, gen.weight_bytes)).astype(np.int64)
        return np.maximum(np.minimum(fits, gen.rows_max), 1)

    specs = draw_specs(gen, cfg.seed, STREAM, rows_cap)
    lengths = np.empty((cfg.tables, cfg.bags), dtype=np.int64)
    parts, entries = [], []
    for t in range(cfg.tables):
        lengths[t], idx = table_trace(gen, specs, t, cfg.seed, STREAM)
        parts.append(idx)
        spec = TableSpec(table=t, rows=int(specs.rows[t]), dim=int(specs.dims[t]),
                         pooling_factor=float(specs.pooling_factors[t]), alpha=float(specs.alphas[t]),
                         trace=trace_digest(lengths[t], idx))
        entries.append(asdict(spec) | {"lookups_per_bag": float(lengths[t].mean())})
    features = {"rows": specs.rows.astype(np.int64), "dim": specs.dims.astype(np.int64)}
    pool = TracePool(features=features, traces=from_lengths(np.concatenate(parts), lengths),
                     tables=tuple(range(cfg.tables)))
    return pool, entries


def job_pool(cfg: LandscapeConfig) -> tuple[TracePool, list[dict]]:
    """The sample from the study's own tables: `cfg.tables` of the tables a `autoshard measure
    --write-jobs` file lists (a seeded choice, in the file's order), their traces regenerated and
    checked as the portable worker does (`portable.regenerate`), and per table its spec, trace
    digest and mean lookups per bag (its `table`: the pool's id)."""
    source = read_job(Path(cfg.jobs)).traces
    if source.batch_size < cfg.bags:
        raise ConfigError(f"--bags: {cfg.bags} (the traces of {cfg.jobs} hold {source.batch_size} bags per table: "
                          f"write the jobs from params with pool.batch_size >= {cfg.bags}, or lower --bags)")
    chosen = rng(cfg.seed, STREAM, "jobs").choice(len(source.tables), min(cfg.tables, len(source.tables)),
                                                  replace=False)
    try:
        pool = regenerate(dataclasses.replace(source, tables=tuple(source.tables[i] for i in sorted(chosen))))
    except ConfigError as exc:
        raise ConfigError(f"--jobs: {cfg.jobs}: {exc}") from None
    specs = [s for s in source.tables if s.table in set(pool.tables)]
    entries = [{f: getattr(s, f) for f in ("table", "rows", "dim", "pooling_factor", "alpha", "trace")}
               | {"lookups_per_bag": float(pool.traces.lengths[i, :cfg.bags].mean())} for i, s in enumerate(specs)]
    return pool, entries


def plan(cfg: LandscapeConfig) -> list[Item]:
    """What to measure, in order: singles, prefixes, the batch scaling, random shards, with the
    reference shard repeated at evenly spread places (first and last among them)."""
    n, b = cfg.tables, cfg.bags
    orders = [tuple(int(t) for t in rng(cfg.seed, STREAM, "order", o).permutation(n)) for o in range(cfg.orders)]
    sizes = sorted({k for k in cfg.prefixes if k <= n})
    reference = orders[0][:min(cfg.reference_tables, n)]
    items = [Item("single", (t,), b) for t in orders[0]]
    items += [Item("prefix", order[:k], b, o) for o, order in enumerate(orders) for k in sizes]
    items += [Item("batch", reference, batch) for batch in sorted(cfg.batches)]
    g = rng(cfg.seed, STREAM, "random_shard")
    top = min(max(cfg.random_tables, 2), n)
    for _ in range(cfg.random_shards):
        size = int(np.clip(np.rint(np.exp(g.uniform(np.log(2), np.log(top)))), 2, top))
        items.append(Item("random_shard", tuple(int(t) for t in g.choice(n, size, replace=False)), b))
    length = len(items)
    for r in reversed(range(cfg.repeats)):
        items.insert(round(r * length / max(cfg.repeats - 1, 1)), Item("repeat", reference, b))
    return items


class Budget:
    """The hard time budget: the clock from the start, and each shard's time predicted from the
    shards measured before it: the most that any of at least a quarter its lookups took per
    lookup, or where none is that large, what the largest took per lookup (none: no prediction)."""

    def __init__(self, seconds: float, clock: Callable[[], float]):
        self.seconds, self.clock, self.start = seconds, clock, clock()
        self.taken: list[tuple[float, float]] = []  # (lookups, wall seconds) of each measured shard

    def elapsed(self) -> float:
        return self.clock() - self.start

    def exhausted(self) -> bool:
        return self.elapsed() >= self.seconds

    def predicted(self, lookups: float) -> float:
        if not self.taken:
            return 0.0
        alike = [(done, wall) for done, wall in self.taken if done >= lookups / 4] or [max(self.taken)]
        return max(wall * lookups / max(done, 1.0) for done, wall in alike)

    def fits(self, lookups: float) -> bool:
        return self.elapsed() + self.predicted(lookups) <= self.seconds


def measure_row(backend: CostBackend, item: Item, index: int, lookups: float, forward_bytes: float,
                elapsed: float) -> dict:
    """One backend's row for one item: its times, or why it has none."""
    row = {"item": index, "kind": item.kind, "order": item.order, "tables": list(item.tables),
           "batch_size": item.batch_size, "backend": backend.name, "device": backend.device, "status": "ok",
           "lookups": lookups, "forward_bytes": forward_bytes, "at_s": round(elapsed, 3)}
    t0 = time.perf_counter()
    try:
        cost = backend.measure(list(item.tables), item.batch_size)
        row |= {"forward_ms": cost.forward_ms, "backward_ms": cost.backward_ms,
                "forward_iqr_ms": cost.forward_iqr_ms, "backward_iqr_ms": cost.backward_iqr_ms}
    except ShardTooLarge as exc:
        row |= {"status": "too_large", "error": str(exc)}
    except RuntimeError as exc:  # a CUDA or torch failure: recorded, the run goes on
        row |= {"status": "error", "error": (str(exc).splitlines() or [type(exc).__name__])[0]}
    if row["status"] != "ok" and backend.device == "cuda":
        torch.cuda.empty_cache()
    return row | {"wall_s": round(time.perf_counter() - t0, 4)}


def weight_bytes(backend: CostBackend) -> int:
    """Bytes per weight the backend reads: its `weight_dtype`, fp32 where it names none (nn.EmbeddingBag)."""
    return torch.finfo(getattr(backend, "weight_dtype", torch.float32)).bits // 8


def run(cfg: LandscapeConfig, out: Path, clock: Callable[[], float] = time.monotonic) -> dict:
    """Measure the landscape into `out` (see the module's docstring); the summary."""
    budget = Budget(cfg.budget_s, clock)
    if (out / "rows.jsonl").exists():
        raise ConfigError(f"--out: {str(out)!r} (holds rows.jsonl of another run: give an empty folder)")
    device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device: 'cuda' (no CUDA GPU on this machine: --device cpu runs it on the CPU)")
    out.mkdir(parents=True, exist_ok=True)
    head = {"format": FORMAT, "settings": asdict(cfg), "device": describe(device)}
    _write_json(out / "run.json", head)
    head |= {"spin": spin(device, cfg.spin_s), "copy": copy_bandwidth(device, cfg.copy_mib)}
    pool, tables = job_pool(cfg) if cfg.jobs else sample_pool(cfg)
    cfg = dataclasses.replace(cfg, tables=len(tables))  # a jobs file may list fewer
    source = {"jobs": cfg.jobs} if cfg.jobs else SAMPLE_POOL | {"table_mib_max": TABLE_MIB_MAX}
    _write_json(out / "tables.json", {"format": FORMAT, "seed": cfg.seed, "stream": STREAM, "bags": cfg.bags,
                                      "generator": source, "tables": tables})
    _write_json(out / "run.json", head | {"setup_s": round(budget.elapsed(), 3)})
    print(f"setup {budget.elapsed():.1f} s: {cfg.tables} tables, copy {head['copy']['gbps']:.0f} GB/s", flush=True)
    backends = [make_backend(pool, _backend_config(cfg, name, device)) for name in BACKENDS]
    per_bag = np.array([t["lookups_per_bag"] for t in tables])
    with open(out / "rows.jsonl", "w") as sink:
        rows, state = measure_items(plan(cfg), backends, budget, sink, per_bag, pool.features["dim"])
    summary = summarize(head, rows, state)
    _write_json(out / "summary.json", summary)
    return summary


def measure_items(items: list[Item], backends: list[CostBackend], budget: Budget, sink: TextIO,
                  per_bag: np.ndarray, dims: np.ndarray) -> tuple[list[dict], dict]:
    """Every item with every backend, in turn, while the budget lasts, each row written to `sink`
    as it is measured; the rows, and how the run went."""
    rows, state = [], {"stopped": None, "skipped": 0, "measured": 0, "errors": 0}
    for index, item in enumerate(items):
        lookups = float(per_bag[list(item.tables)].sum() * item.batch_size)
        if budget.exhausted():
            state["stopped"] = "budget"
            break
        if not budget.fits(lookups):
            state["skipped"] += 1
            continue
        t0 = budget.elapsed()
        for backend in (backends if index % 2 == 0 else backends[::-1]):
            fwd = _forward_bytes(per_bag, dims, item, weight_bytes(backend))
            row = measure_row(backend, item, index, lookups, fwd, budget.elapsed())
            rows.append(row)
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            state["errors"] += row["status"] == "error"
        budget.taken.append((lookups, budget.elapsed() - t0))
        state["measured"] += 1
        if state["errors"] >= MAX_ERRORS:
            state["stopped"] = "errors"
            break
        if index % 20 == 0:
            print(f"  {budget.elapsed():6.1f} s  item {index + 1}/{len(items)} ({item.kind}, "
                  f"{len(item.tables)} tables)", flush=True)
    if state["skipped"] and not state["stopped"]:
        state["stopped"] = "budget"
    return rows, state | {"planned": len(items), "elapsed_s": round(budget.elapsed(), 3)}


def _backend_config(cfg: LandscapeConfig, name: str, device: torch.device) -> BackendConfig:
    return BackendConfig(backend=name, device=device.type, optimizer="EXACT_ROWWISE_ADAGRAD", batch_size=cfg.bags,
                         threads=cfg.threads, timing=one_round(cfg.warmup, cfg.runs),
                         memory_limit_bytes=memory_limit(device, cfg.memory_gib))


def _forward_bytes(per_bag: np.ndarray, dims: np.ndarray, item: Item, weight: int) -> float:
    """What the forward must move at least: each lookup's weight row and index, each bag's
    offset, and the fp32 output."""
    ids = list(item.tables)
    lookups = per_bag[ids] * item.batch_size
    return float((lookups * (dims[ids] * weight + 8)).sum() + item.batch_size * len(ids) * 8
                 + item.batch_size * dims[ids].sum() * 4)


def _write_json(path: Path, doc: dict) -> None:
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(doc, indent=1) + "\n")


def sizes(text: str) -> tuple[int, ...]:
    """A comma-separated list of sizes, e.g. `2,4,8`."""
    return tuple(int(v) for v in text.split(","))


def parse_args(argv: Sequence[str] | None) -> tuple[LandscapeConfig, Path]:
    """The settings: `LandscapeConfig`'s defaults, `--smoke`'s toy sizes over them, the options given."""
    p = argparse.ArgumentParser(prog="autoshard.landscape.sweep",
                                description="Shard costs on a GPU with both torch backends, in one short run "
                                            "(docs/gpu.md).")
    p.add_argument("--out", required=True, type=Path, help="the folder for the result files")
    p.add_argument("--smoke", action="store_true", help="toy sizes on the CPU (seconds)")
    for f in dataclasses.fields(LandscapeConfig):
        kind = type(f.default)
        parse = sizes if kind is tuple else kind
        shown = ",".join(map(str, f.default)) if kind is tuple else f.default
        p.add_argument(f"--{f.name.replace('_', '-')}", type=parse, default=None, help=f"default {shown}")
    args = vars(p.parse_args(argv))
    given = {k: v for k, v in args.items() if k not in ("out", "smoke") and v is not None}
    return LandscapeConfig(**((SMOKE if args["smoke"] else {}) | given)), args["out"]


def main(argv: list[str] | None = None) -> int:
    """`python -m autoshard.landscape.sweep --out DIR [--smoke] [--budget-s S] ...`."""
    try:
        cfg, out = parse_args(argv)
        summary = run(cfg, out)
    except ConfigError as exc:
        print(f"autoshard.landscape.sweep: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(summary_lines(summary)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

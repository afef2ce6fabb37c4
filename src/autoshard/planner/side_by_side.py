"""Side by side with TorchRec's own planner, on the study's tasks (a benchmark, not a stage).

  python -m autoshard.planner.side_by_side [--protocol dreamshard] [--tasks 10] [--out bench.json]

Three planners on each held-out task of a protocol (the study's pool and tasks: `dvc repro
synthesize` first), planning for this machine (a CPU topology of the task's devices and memory
cap, table-wise shards, the fused kernel, no storage reservation) at the per-rank batch the
plans are measured at (`profile.batch_size` bags per table on every device):
  torchrec_defaults    TorchRec's planner with its defaults (its perf estimator, its greedy partitioner)
  our_estimator        TorchRec's planner with our estimator (each table measured alone here)
  ours                 our estimator and our partitioner (`--method`, default the exact MILP on those costs)
Every plan is scored two ways: measured (each task's device shards of all three plans in one
interleaved batch, the study's backend and plan timing: ratios come from one pass) and by
TorchRec's own estimate (the per-rank sum of its perf estimator's shard totals, what its stats
report); and the planning time. The ratios against `torchrec_defaults` are exploratory (median with a
bootstrap 95% interval over tasks, Wilcoxon p): no verdict.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from autoshard.cli import service
from autoshard.core.params import load_params
from autoshard.core.paths import Paths
from autoshard.core.seeding import rng
from autoshard.data.pool import load_pool
from autoshard.data.tasks import load_tasks
from autoshard.measure.backends import BackendConfig, make_backend
from autoshard.measure.interleaved import measure_batch
from autoshard.measure.timing import TimingConfig
from autoshard.methods.registry import ids
from autoshard.placement.torchrec import planner_inputs, table_name
from autoshard.studies.paired import compare

PLANNERS = ("torchrec_defaults", "our_estimator", "ours")
EXACT = next(m for m in service.MEASURED if m in ids("solver"))  # the MILP on single-shard costs


def plan_task(pool, task, planner: str, method: str, batch: int, cache: Path) -> tuple[np.ndarray, float]:
    """(device per table of `task`, planning seconds) by one of PLANNERS."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation

    from autoshard.planner.estimator import AutoShardEstimator
    from autoshard.planner.partitioner import AutoShardPartitioner

    ebc, topology, constraints = planner_inputs(pool.features, task, compute_device="cpu")
    perf = (EmbeddingPerfEstimator(topology, constraints=constraints) if planner == PLANNERS[0]
            else AutoShardEstimator(topology, cache=cache))
    enumerator = EmbeddingEnumerator(topology=topology, batch_size=batch, constraints=constraints,
                                     estimator=[perf, EmbeddingStorageEstimator(topology, constraints=constraints)])
    partitioner = AutoShardPartitioner(method=method) if planner == PLANNERS[2] else None
    start = time.perf_counter()
    plan = EmbeddingShardingPlanner(topology=topology, batch_size=batch, enumerator=enumerator,
                                    constraints=constraints, partitioner=partitioner,
                                    storage_reservation=FixedPercentageStorageReservation(0.0)).plan(
        ebc, [EmbeddingBagCollectionSharder()]).plan[""]
    seconds = time.perf_counter() - start
    return np.array([plan[table_name(t)].ranks[0] for t in task.tables], dtype=np.int64), seconds


def torchrec_estimate(pool, task, placement: np.ndarray, batch: int) -> float:
    """The largest per-rank sum of TorchRec's perf estimates (table-wise, fused, this CPU topology)."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator

    ebc, topology, constraints = planner_inputs(pool.features, task, compute_device="cpu")
    enumerator = EmbeddingEnumerator(topology=topology, batch_size=batch, constraints=constraints,
                                     estimator=[EmbeddingPerfEstimator(topology, constraints=constraints)])
    cost = {o.name: o.shards[0].perf.total for o in enumerator.enumerate(ebc, [EmbeddingBagCollectionSharder()])}
    loads = np.zeros(task.devices)
    for t, d in zip(task.tables, placement, strict=True):
        loads[d] += cost[table_name(t)]
    return float(loads.max())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autoshard.planner.side_by_side", description=__doc__.split("\n")[0])
    p.add_argument("--protocol", default="dreamshard")
    p.add_argument("--tasks", type=int, default=10)
    p.add_argument("--method", default=EXACT, help="our partitioner's method")
    p.add_argument("--cache", type=Path, default=Path("data/planner-bench-cache"))
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    params = load_params(Path("params.yaml"))
    paths = Paths()
    pool = load_pool(paths.pool)
    tasks = [t for t in load_tasks(paths.tasks)[0] if t.protocol == args.protocol and t.split == "test"][:args.tasks]
    prof, timing = params["profile"], params["evaluate"]["timing"]
    batch = int(prof["batch_size"])
    cfg = BackendConfig(backend=prof["backend"], device="cpu", optimizer=prof["optimizer"], batch_size=batch,
                        threads=int(prof["threads"]), memory_limit_bytes=int(prof["memory_limit_gib"] * 2**30),
                        timing=TimingConfig(**{k: timing[k] for k in ("warmup", "runs", "rounds", "drift_limit",
                                                                      "retries")}))
    backend = make_backend(pool, cfg)
    rows = []
    for task in tasks:
        # the planners' per-rank batch is the bags each device's shard runs per table when measured
        per_rank = batch
        plans = {name: plan_task(pool, task, name, args.method, per_rank, args.cache) for name in PLANNERS}
        shards = sorted({tuple(sorted(int(t) for t, d in zip(task.tables, plan, strict=True) if d == dev))
                         for plan, _ in plans.values() for dev in range(task.devices)} - {()})
        batch_costs = measure_batch(backend, [list(s) for s in shards], list(max(shards, key=len)), batch,
                                    cfg.timing, rng(0, "planner-bench", task.name))
        cost = {s: c[0] + c[1] for s, c in zip(shards, batch_costs.costs, strict=True)}
        for name, (plan, seconds) in plans.items():
            devices = [tuple(sorted(int(t) for t, d in zip(task.tables, plan, strict=True) if d == dev))
                       for dev in range(task.devices)]
            rows.append({"task": task.name, "planner": name, "measured_ms": max(cost.get(s, 0.0) for s in devices),
                         "torchrec_estimate_ms": torchrec_estimate(pool, task, plan, per_rank),
                         "planning_seconds": seconds, "drift": batch_costs.drift})
        print(json.dumps(rows[-3:]), file=sys.stderr, flush=True)
    summary = {}
    for name in PLANNERS[1:]:
        ours = np.array([r["measured_ms"] for r in rows if r["planner"] == name])
        ref = np.array([r["measured_ms"] for r in rows if r["planner"] == PLANNERS[0]])
        est = np.array([r["torchrec_estimate_ms"] for r in rows if r["planner"] == name])
        est_ref = np.array([r["torchrec_estimate_ms"] for r in rows if r["planner"] == PLANNERS[0]])
        summary[name] = {"measured_vs_defaults": compare(ours, ref, keys=("planner-bench", name)),
                         "torchrec_estimate_vs_defaults": compare(est, est_ref, keys=("planner-bench-est", name))}
    seconds = {n: [r["planning_seconds"] for r in rows if r["planner"] == n] for n in PLANNERS}
    summary["planning_seconds_median"] = {n: float(np.median(v)) for n, v in seconds.items()}
    doc = {"protocol": args.protocol, "tasks": len(tasks), "method": args.method, "rows": rows, "summary": summary}
    text = json.dumps(doc, indent=1)
    if args.out:
        args.out.write_text(text)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

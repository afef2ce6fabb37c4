"""A production-shaped model planned by `autoshard plan --sharding auto` and by TorchRec's own
planner with its defaults, side by side (a benchmark, not a stage).

  python -m autoshard.planner.production [--tables 1900] [--devices 96] [--devices-per-host 8]
      [--memory-per-device 138GiB] [--batch-per-rank 2048] [--methods cost_greedy lpt_measured torchrec]
      [--no-defaults] [--out bench.json]

`--methods torchrec` is TorchRec's planner through the command (`cli.torchrec.method`: the
fused kernel, storage at the training batch, no reservation); "defaults" is TorchRec's planner as
it comes (every kernel and sharding type it proposes, its heuristical storage reservation).

The model is `cli.bench.production_tables` (seeded by params.yaml's `seed`); the training batch
is the per-rank batch times the devices.

Both plans are scored by TorchRec's own estimators on a GPU topology of the devices (hosts of
`--devices-per-host`, HBM of `--memory-per-device`): each rank's storage (weights, optimizer
state, input and output buffers) and perf (the sum of its shards' perf totals, what TorchRec's
`EmbeddingStats` reports), our plan read through `AutoShardPlanLoader`; and by our cost model's
prediction, where one is given. The command is timed end to end (start-up, reading, placing,
writing both files) with its peak memory; TorchRec's planner is timed in this process.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from autoshard.cli.bench import production_tables
from autoshard.cli.service import FIRST_RUN, TORCHREC
from autoshard.cli.torchrec.method import sharders
from autoshard.methods.registry import GREEDY


def model_and_topology(tables: pd.DataFrame, devices: int, local: int, hbm: int):
    """The meta-device model of the tables, TorchRec's GPU topology (`cli.torchrec.method`)
    and the tables as the command reads them."""
    from autoshard.cli.torchrec.method import model_and_topology as planned
    from autoshard.cli.user_tables import tables_from_records

    user = tables_from_records(tables.to_dict("records"), "the production-shaped model")
    return (*planned(user, devices, local, hbm, "cuda"), user)


def per_rank(options: list, devices: int) -> dict:
    """Each rank's storage (HBM bytes) and perf (ms) under TorchRec's estimators."""
    hbm, perf = np.zeros(devices), np.zeros(devices)
    for option in options:
        for shard in option.shards:
            hbm[shard.rank] += shard.storage.hbm
            perf[shard.rank] += shard.perf.total
    return {"hbm_max_bytes": int(hbm.max()), "hbm_mean_bytes": float(hbm.mean()), "perf_max_ms": float(perf.max()),
            "perf_mean_ms": float(perf.mean()),
            "sharding_types": dict(Counter(o.sharding_type for o in options))}


def constraints(tables: pd.DataFrame, plan: Path | None = None) -> dict:
    """What TorchRec is told of each table: its pooling factor (TorchRec assumes 1 otherwise), and
    for a plan of ours only the sharding type and kernel it chose (and its column shards' width),
    so that TorchRec scores that plan without searching."""
    from torchrec.distributed.planner import ParameterConstraints

    from autoshard.core.inputs import read_json, torchrec_blocks
    from autoshard.placement.torchrec import split_name

    chosen = torchrec_blocks(read_json(plan, "TorchRec plan"), plan) if plan is not None else None
    out = {}
    for name, pooling, module in zip(tables["name"], tables["pooling_factor"], tables["module"], strict=True):
        extra = {}
        if chosen is not None:
            qualified = f"{module}.{name}"
            blocks, kind = chosen.blocks[qualified], chosen.kinds[qualified]
            extra = {"sharding_types": [kind], "compute_kernels": ["dense" if kind == "data_parallel" else "fused"]}
            if kind == "column_wise":
                extra["min_partition"] = blocks[0].width
        out[split_name(name)[1]] = ParameterConstraints(pooling_factors=[float(pooling)], **extra)
    return out


def torchrec_plan(tables: pd.DataFrame, devices: int, local: int, hbm: int, batch_per_rank: int,
                  loader_plan: Path | None = None) -> tuple[dict, float, object]:
    """TorchRec's planner with its defaults, told each table's pooling factor (or, with
    `loader_plan`, our plan read through `AutoShardPlanLoader`): per-rank stats, planning seconds
    and the TorchRec plan."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    from autoshard.planner.loader import AutoShardPlanLoader

    quiet()
    model, topology, _ = model_and_topology(tables, devices, local, hbm)
    told = constraints(tables, loader_plan)
    loader = (AutoShardPlanLoader(loader_plan, model, sharders(), topology, batch_per_rank, told)
              if loader_plan is not None else None)
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=batch_per_rank, plan_loader=loader,
                                       constraints=told)
    start = time.perf_counter()
    plan = planner.plan(model, sharders())
    seconds = time.perf_counter() - start
    return per_rank(planner._best_plan, devices), seconds, plan  # noqa: SLF001 - the options TorchRec chose


def quiet() -> None:
    """TorchRec's planner logs only its errors (its stats tables run to thousands of lines)."""
    import logging

    for name in ("torchrec", "torchrec.distributed.planner"):
        logging.getLogger(name).setLevel(logging.ERROR)


def predicted_load(user, plan, devices: int, models) -> float:
    """Our cost model's predicted bottleneck of a TorchRec `ShardingPlan` of `user`'s tables: each
    shard predicted alone (`cli.sharding_plan.predicted`), summed per rank; a data-parallel table
    as a row shard's share of its lookups on every rank."""
    from autoshard.cli.sharding_plan import Shape, piece_key, predicted

    index = {n: i for i, n in enumerate(user.names)}
    placed = []
    for module, params in plan.plan.items():
        for name, p in params.items():
            t = index[f"{module}.{name}" if module else name]
            if p.sharding_type == "data_parallel":  # a replica on every rank, serving its 1/world of the batch
                share = math.ceil(int(user.features["rows"].iloc[t]) / devices)
                placed += [(Shape(t, 0, share, 0, int(user.features["dim"].iloc[t]), devices), r) for r in p.ranks]
                continue
            ways = len(p.ranks) if p.sharding_type in ("row_wise", "table_row_wise") else 1
            for shard, rank in zip(p.sharding_spec.shards, p.ranks, strict=True):
                (row, column), (rows, width) = shard.shard_offsets, shard.shard_sizes
                placed.append((Shape(t, int(row), int(rows), int(column), int(width), ways), int(rank)))
    distinct = list({piece_key(s): s for s, _ in placed if s.rows}.values())
    costs, _ = predicted(user, models)(distinct)
    cost = {piece_key(s): float(c) for s, c in zip(distinct, costs, strict=True)}
    load = np.zeros(devices)
    for s, rank in placed:
        load[rank] += cost.get(piece_key(s), 0.0)
    return float(load.max())


def defaults(tables: pd.DataFrame, args: argparse.Namespace, hbm: int) -> dict:
    """TorchRec's planner with its defaults on the model: its per-rank estimate, planning time and
    (with the cost model) our prediction of its plan; or how it failed."""
    start = time.perf_counter()
    try:
        theirs, planning, plan = torchrec_plan(tables, args.devices, args.devices_per_host, hbm, args.batch_per_rank)
    except Exception as exc:  # noqa: BLE001 - TorchRec's planner fails in many ways; the failure is the result
        return {"feasible": False, "error": f"{exc.__class__.__name__}: {str(exc)[:300]}",
                "seconds": time.perf_counter() - start}
    out = {"feasible": True, "planning_seconds": planning, "seconds": time.perf_counter() - start,
           "torchrec_estimate": theirs}
    if GREEDY in args.methods:
        from autoshard.cli import service

        models = service.load_models(GREEDY, None, None, folder=args.models)
        _, _, user = model_and_topology(tables, args.devices, args.devices_per_host, hbm)
        out["predicted_bottleneck_ms"] = predicted_load(user, plan, args.devices, models)
    return out


def main(argv: list[str] | None = None) -> int:
    from autoshard.cli.bench import run_once
    from autoshard.cli.defaults import study_defaults
    from autoshard.cli.user_tables import parse_memory

    p = argparse.ArgumentParser(prog="python -m autoshard.planner.production", description=__doc__.split("\n")[0])
    p.add_argument("--tables", type=int, default=1900)
    p.add_argument("--devices", type=int, default=96)
    p.add_argument("--devices-per-host", type=int, default=8)
    p.add_argument("--memory-per-device", default="138GiB")
    p.add_argument("--batch-per-rank", type=int, default=2048)
    p.add_argument("--methods", nargs="+", default=[GREEDY, FIRST_RUN], choices=[GREEDY, FIRST_RUN, TORCHREC],
                   help=f"{GREEDY} (predicted by the cost model, needs --models), {FIRST_RUN} (on --backend), "
                        "torchrec (TorchRec's planner through the command: fused kernel, training-batch storage)")
    p.add_argument("--no-defaults", action="store_true", help="skip TorchRec's planner with its defaults")
    p.add_argument("--backend", default="analytic", help=f"{FIRST_RUN}'s --backend (default analytic: TorchRec's "
                                                         "perf estimate of each piece, no trace drawn)")
    p.add_argument("--models", type=Path, default=Path("data/rl"))
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    hbm = parse_memory(args.memory_per_device)
    tables = production_tables(study_defaults()["seed"], args.tables)
    result: dict = {"tables": len(tables), "devices": args.devices, "devices_per_host": args.devices_per_host,
                    "memory_per_device_bytes": hbm, "batch_per_rank": args.batch_per_rank}
    with tempfile.TemporaryDirectory(prefix="autoshard-production-") as tmp:
        path = Path(tmp) / "model.csv"
        tables.to_csv(path, index=False)
        result["autoshard"] = {}
        for method in args.methods:
            out, exported = Path(tmp) / f"{method}.json", Path(tmp) / f"{method}.torchrec.json"
            cmd = ["plan", "--tables", str(path), "--devices", str(args.devices), "--memory-per-device", str(hbm),
                   "--sharding", "auto", "--devices-per-host", str(args.devices_per_host), "--method", method,
                   "--batch-size", str(args.batch_per_rank * args.devices),
                   "--out", str(out), "--torchrec", str(exported), "--cache", str(Path(tmp) / "cache")]
            cmd += {FIRST_RUN: ["--backend", args.backend], GREEDY: ["--models", str(args.models)]}.get(method, [])
            try:
                seconds, peak = run_once(cmd)
            except RuntimeError as exc:  # no plan (the command's one line): the failure is the result
                result["autoshard"][method] = {"feasible": False, "error": str(exc)[-300:]}
                print(json.dumps({method: result["autoshard"][method]}), flush=True)
                continue
            doc = json.loads(out.read_text())
            ours, _, _ = torchrec_plan(tables, args.devices, args.devices_per_host, hbm, args.batch_per_rank,
                                       exported)
            result["autoshard"][method] = {
                "costs": doc["costs"]["kind"], "backend": doc["costs"].get("backend"), "feasible": True,
                "command_seconds": seconds, "peak_memory_gib": peak, "placing_seconds": doc["sharding_seconds"],
                "our_memory_max_bytes": max(d["memory_bytes"] for d in doc["per_device"]),
                "predicted_bottleneck_ms": doc["predicted_bottleneck_ms"],
                "comm_modelled_bottleneck_ms": doc["costs"]["comm"]["bottleneck_ms"],
                "split": {"rows": len(doc["rows"]), "columns": len(doc["columns"])}, "torchrec_estimate": ours}
            print(json.dumps({method: result["autoshard"][method]}), flush=True)
        if not args.no_defaults:
            result["torchrec_defaults"] = defaults(tables, args, hbm)
            print(json.dumps(result["torchrec_defaults"]), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

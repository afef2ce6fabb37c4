"""Plans checked by real training steps: our plan and TorchRec's, applied with TorchRec's
`DistributedModelParallel` on CPU ranks over gloo, timed step by step in one interleaved pass
(a benchmark, not a stage), written into docs/ by one command:

  python -m autoshard.planner.steps [--models 10] [--ranks 2] [--steps 12] [--rounds 4]
      [--batch-per-rank 1024] [--out docs/planner-steps.md]

Each model is a seeded table list of 8 to 64 pooled tables (one EmbeddingBagCollection). Two plans
of it on `--ranks` CPU ranks of one host:
- `ours`: `autoshard plan --sharding auto --method lpt_measured --backend analytic --torchrec-device cpu`,
  its sharding types those TorchRec's sharders offer CPU ranks (table-wise, column-wise,
  data-parallel: row-wise ones are for GPUs), so that both planners choose among the same;
- `torchrec_defaults`: TorchRec's `EmbeddingShardingPlanner` as it comes, told each table's pooling factor, on
  TorchRec's CPU topology of the same ranks and memory.

A training step is one forward (input distribution included: the local batch's ids go to the
ranks that hold their rows), a loss, and one backward with TorchRec's fused row-wise Adagrad
applied in it (`apply_optimizer_in_backward`), as DLRM trains. Every rank runs one process (one
thread each); a step is timed between two barriers, so it lasts as long as the slowest rank's.
Both plans' models are built in the same processes, and their steps interleaved (ABBA by round,
after warm-up steps) on the same batches: the ratio of the two is within one pass.

Each plan is also predicted, before it runs, by TorchRec's estimate (the busiest rank's sum of
shard perf totals) and by ours (the busiest device's TorchRec table-wise compute plus our traffic
model's comm, `placement.traffic`: what `--backend analytic` places on). The page reports, for
each predictor, its rank correlation with the measured steps and whether it picks the plan that
measured faster.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from autoshard.methods.registry import LPT

PLANS = ("ours", "torchrec_defaults")
CPU_KINDS = ("table_wise", "column_wise", "data_parallel")  # what TorchRec's sharders offer CPU ranks
SIZES = (8, 12, 16, 20, 24, 32, 40, 48, 56, 64)  # tables per model, one model each


def model_tables(seed: int, tables: int) -> pd.DataFrame:
    """A seeded list of pooled tables of the shapes DLRM-like models mix: hash sizes from a
    thousand to 200,000 rows, dims 16 to 128, 1 to 40 lookups a sample."""
    g = np.random.default_rng([seed, tables])
    return pd.DataFrame({"name": [f"t{i}" for i in range(tables)],
                         "rows": np.exp(g.uniform(np.log(1e3), np.log(2e5), tables)).astype(int),
                         "dim": g.choice([16, 32, 64, 128], tables),
                         "pooling_factor": np.round(np.exp(g.uniform(0, np.log(40), tables)), 1)})


def our_plan(csv: Path, folder: Path, ranks: int, memory: str, batch: int) -> tuple[Path, dict]:
    """Our command's TorchRec export and plan file."""
    import contextlib
    import io

    from autoshard.cli.main import main as command

    out, export, kinds = folder / "ours.json", folder / "ours.torchrec.json", folder / "kinds.yaml"
    names = pd.read_csv(csv)["name"]
    kinds.write_text("".join(f"{n}: {{sharding_types: [{', '.join(CPU_KINDS)}]}}\n" for n in names))
    said = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(said):
        code = command(["plan", "--tables", str(csv), "--devices", str(ranks), "--memory-per-device", memory,
                        "--sharding", "auto", "--method", LPT, "--backend", "analytic",
                        "--torchrec-device", "cpu", "--batch-size", str(batch * ranks), "--out", str(out),
                        "--torchrec", str(export), "--constraints", str(kinds)])
    if code != 0:
        raise RuntimeError(said.getvalue().strip())
    return export, json.loads(out.read_text())


def torchrec_side(tables: pd.DataFrame, ranks: int, memory: int, batch: int, ours: Path, folder: Path) -> dict:
    """TorchRec's plan as it comes (written as a TorchRec export) and TorchRec's estimate of both
    plans, on its CPU topology of `ranks` ranks of `memory` bytes."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints

    from autoshard.cli.torchrec.method import model_and_topology, sharders
    from autoshard.cli.user_tables import tables_from_records
    from autoshard.core.inputs import read_json, torchrec_blocks
    from autoshard.placement.torchrec import plan_to_json
    from autoshard.planner.loader import AutoShardPlanLoader
    from autoshard.planner.production import per_rank, quiet

    quiet()
    user = tables_from_records(tables.to_dict("records"), "the benchmark model")
    pooling = {n: ParameterConstraints(pooling_factors=[float(p)]) for n, p in
               zip(tables["name"], tables["pooling_factor"], strict=True)}
    model, topology = model_and_topology(user, ranks, ranks, memory, "cpu")
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=batch, constraints=pooling)
    start = time.perf_counter()
    plan = planner.plan(model, sharders())
    seconds = time.perf_counter() - start
    theirs = folder / "torchrec.torchrec.json"
    theirs.write_text(json.dumps(plan_to_json(plan, ranks, "cpu")))
    estimates = {"torchrec_defaults": per_rank(planner._best_plan, ranks)}  # noqa: SLF001 - the options TorchRec chose
    chosen = torchrec_blocks(read_json(ours, "TorchRec plan"), ours)
    told = {n: ParameterConstraints(pooling_factors=[float(p)], sharding_types=[chosen.kinds[n]],
                                    compute_kernels=["dense" if chosen.kinds[n] == "data_parallel" else "fused"],
                                    **({"min_partition": chosen.blocks[n][0].width}
                                       if chosen.kinds[n] == "column_wise" else {}))
            for n, p in zip(tables["name"], tables["pooling_factor"], strict=True)}
    model, topology = model_and_topology(user, ranks, ranks, memory, "cpu")
    loader = AutoShardPlanLoader(ours, model, sharders(), topology, batch, told)
    scorer = EmbeddingShardingPlanner(topology=topology, batch_size=batch, plan_loader=loader, constraints=told)
    scorer.plan(model, sharders())
    estimates["ours"] = per_rank(scorer._best_plan, ranks)  # noqa: SLF001
    return {"export": theirs, "planning_seconds": seconds, "torchrec_estimate": estimates}


def our_estimate(tables: pd.DataFrame, export: Path, ranks: int, batch: int) -> float:
    """Our analytic estimate of a TorchRec export (ms): per device, each piece's TorchRec
    table-wise compute at its rows, width and lookups plus its comm under our traffic model at
    the default links, as `autoshard plan --backend analytic` charges them; the busiest device's."""
    from autoshard.cli.sharding_plan import Shape, estimated, parse_bandwidths, piece_key
    from autoshard.cli.user_tables import tables_from_records
    from autoshard.core.inputs import read_json, torchrec_blocks
    from autoshard.placement.traffic import gradient_bytes, piece_bytes

    user = tables_from_records(tables.to_dict("records"), "the benchmark model")
    links = parse_bandwidths(None)
    plan = torchrec_blocks(read_json(export, "TorchRec plan"), export)
    placed = []
    for t, name in enumerate(user.names):
        rows, dim = int(user.features["rows"].iloc[t]), int(user.features["dim"].iloc[t])
        kind, held = plan.kinds.get(name, "table_wise"), plan.blocks[name]
        if kind == "data_parallel":
            comm = links.ms(*gradient_bytes(rows, dim, ranks, ranks))
            placed += [(Shape(t, 0, rows, 0, dim, 1, ranks), b.device, comm) for b in held]
            continue
        ways = len(held) if kind in ("row_wise", "table_row_wise") else 1
        for b in held:
            width = dim if b.width is None else b.width
            share = rows if b.rows is None else b.rows
            comm = links.ms(*piece_bytes(kind, width, 1.0, False, batch * ranks, ranks, ranks)) if share else 0.0
            placed.append((Shape(t, b.row, share, b.column, width, ways), b.device, comm))
    distinct = list({piece_key(s): s for s, _, _ in placed if s.rows}.values())
    costs = dict(zip((piece_key(s) for s in distinct), estimated(user, batch * ranks, "cpu")(distinct)[0],
                     strict=True))
    busy = np.zeros(ranks)
    for shape, device, comm in placed:
        busy[device] += (costs[piece_key(shape)] if shape.rows else 0.0) + comm
    return float(busy.max())


def measure(csv: Path, plans: dict[str, Path], ranks: int, batch: int, steps: int, rounds: int, seed: int,
            timeout_s: float) -> dict:
    """Every plan's training steps in one pass of `ranks` CPU processes (see the module)."""
    with tempfile.TemporaryDirectory(prefix="autoshard-steps-") as tmp:
        spec, out = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec.write_text(json.dumps({"tables": str(csv), "plans": {k: str(v) for k, v in plans.items()},
                                    "batch": batch, "steps": steps, "rounds": rounds, "seed": seed, "out": str(out)}))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
               "-m", "autoshard.planner.steps", "--worker", str(spec)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              env=os.environ | {"OMP_NUM_THREADS": "1"})
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(" | ".join((done.stderr or done.stdout).strip().splitlines()[-4:]))
        return json.loads(out.read_text())


def _worker(spec_path: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv
    from torchrec.optim import RowWiseAdagrad
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from autoshard.cli.torchrec.check import embedding_model
    from autoshard.cli.user_tables import read_tables
    from autoshard.placement.torchrec import load_sharding_plan, modules_of

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tables = read_tables(spec["tables"], reuse=False)
    modules = modules_of(tables.features, tables.names)
    models = {}
    for name, path in spec["plans"].items():
        torch.manual_seed(spec["seed"])
        model = embedding_model(tables, modules, "meta")
        _apply_optimizer_in_backward(RowWiseAdagrad, model.parameters(), {"lr": 0.01})
        models[name] = DistributedModelParallel(model, device=torch.device("cpu"), plan=load_sharding_plan(path),
                                                env=ShardingEnv.from_process_group(dist.group.WORLD))
    g = torch.Generator().manual_seed(spec["seed"] * 1000 + rank)
    rows = tables.features["rows"].to_numpy()
    pooling = tables.features["pooling_factor"].to_numpy()
    batch = spec["batch"]

    def inputs() -> KeyedJaggedTensor:
        lengths = torch.cat([torch.poisson(torch.full((batch,), float(p)), generator=g).long() for p in pooling])
        per = lengths.view(len(rows), batch).sum(1)
        values = torch.cat([torch.randint(0, int(r), (int(n),), generator=g) for r, n in zip(rows, per, strict=True)])
        return KeyedJaggedTensor(keys=list(tables.names), values=values, lengths=lengths)

    def step(model, kjt) -> float:
        dist.barrier()
        start = time.perf_counter()
        loss = model(kjt).values().pow(2).mean()
        loss.backward()
        dist.barrier()
        return (time.perf_counter() - start) * 1e3

    times: dict[str, list[float]] = {name: [] for name in models}
    order = list(models)
    for r in range(spec["rounds"]):
        kjt = inputs()
        for name in (order if r % 2 == 0 else order[::-1]):
            for _ in range(2):  # warm-up: the first steps of a round allocate
                step(models[name], kjt)
            times[name] += [step(models[name], kjt) for _ in range(spec["steps"])]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, times)
    if rank == 0:
        Path(spec["out"]).write_text(json.dumps({"ranks": gathered}))
    dist.destroy_process_group()


def summary(times: list[float]) -> dict:
    q1, median, q3 = (float(x) for x in np.percentile(times, [25, 50, 75]))
    return {"median_ms": median, "iqr_ms": [q1, q3], "steps": len(times)}


def run_model(k: int, seed: int, args: argparse.Namespace) -> dict:
    """One model: both plans, both predictions, the measured pass."""
    from autoshard.cli.user_tables import parse_memory

    tables = model_tables(seed + k, SIZES[k % len(SIZES)])
    memory = parse_memory(args.memory_per_device)
    with tempfile.TemporaryDirectory(prefix="autoshard-steps-") as tmp:
        folder = Path(tmp)
        csv = folder / "model.csv"
        tables.to_csv(csv, index=False)
        ours, doc = our_plan(csv, folder, args.ranks, args.memory_per_device, args.batch_per_rank)
        side = torchrec_side(tables, args.ranks, memory, args.batch_per_rank, ours, folder)
        exports = {"ours": ours, "torchrec_defaults": side["export"]}
        measured = measure(csv, exports, args.ranks, args.batch_per_rank, args.steps, args.rounds, seed + k,
                           args.timeout_s)
        rank0 = measured["ranks"][0]
        kinds = {p: _kinds(exports[p]) for p in PLANS}
        return {"model": k, "tables": len(tables),
                "plans": {p: {**summary(rank0[p]), "torchrec_estimate_ms": side["torchrec_estimate"][p]["perf_max_ms"],
                              "our_estimate_ms": our_estimate(tables, exports[p], args.ranks, args.batch_per_rank),
                              "sharding_types": kinds[p]} for p in PLANS},
                "paired_ratio": float(np.median(np.array(rank0["ours"]) / np.array(rank0["torchrec_defaults"]))),
                "torchrec_planning_seconds": side["planning_seconds"], "our_planning_seconds": doc["sharding_seconds"]}


def _kinds(export: Path) -> dict[str, int]:
    from collections import Counter

    from autoshard.core.inputs import read_json, torchrec_blocks

    plan = torchrec_blocks(read_json(export, "TorchRec plan"), export)
    return dict(Counter(plan.kinds.get(n, "table_wise") for n in plan.blocks))


def agreement(rows: list[dict]) -> dict:
    """Per predictor: Kendall's tau with the measured medians over every (model, plan), and the
    share of models where it picks the plan that measured faster."""
    from scipy.stats import kendalltau

    measured = [r["plans"][p]["median_ms"] for r in rows for p in PLANS]
    out = {}
    for key in ("torchrec_estimate_ms", "our_estimate_ms"):
        predicted = [r["plans"][p][key] for r in rows for p in PLANS]
        picks = [(r["plans"]["ours"][key] <= r["plans"]["torchrec_defaults"][key]) ==
                 (r["plans"]["ours"]["median_ms"] <= r["plans"]["torchrec_defaults"]["median_ms"]) for r in rows]
        out[key] = {"kendall_tau": float(kendalltau(predicted, measured).statistic),
                    "picks_faster_share": float(np.mean(picks)),
                    "median_measured_over_predicted": float(statistics.median(m / p for m, p in
                                                                             zip(measured, predicted, strict=True)))}
    return out


def page(rows: list[dict], fit: dict, args: argparse.Namespace, machine: str) -> str:
    """docs/planner-steps.md."""
    lines = ["# Plans checked by real training steps", "",
             f"Generated by `python -m autoshard.planner.steps --models {args.models} --ranks {args.ranks} --steps "
             f"{args.steps} --rounds {args.rounds} --batch-per-rank {args.batch_per_rank}` on {machine} (see the "
             "module for the models, plans and step). Each row's two plans ran in one pass of "
             f"{args.ranks} CPU processes over gloo, interleaved; a step is one forward with its input distribution, "
             "a loss and a backward with TorchRec's fused row-wise Adagrad, timed between barriers.", "",
             "| model | tables | plan | measured step (ms), median [IQR] | TorchRec's estimate (ms) | our estimate "
             "(ms) | sharding types |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        for p in PLANS:
            e = r["plans"][p]
            kinds = ", ".join(f"{k} {v}" for k, v in sorted(e["sharding_types"].items()))
            lines.append(f"| {r['model']} | {r['tables']} | {p} | {e['median_ms']:.2f} [{e['iqr_ms'][0]:.2f}, "
                         f"{e['iqr_ms'][1]:.2f}] | {e['torchrec_estimate_ms']:.4g} | {e['our_estimate_ms']:.4g} | "
                         f"{kinds} |")
    ratios = [r["paired_ratio"] for r in rows]
    lines += ["", f"Ours over TorchRec's, the median of each model's paired step ratios: "
                  f"{statistics.median(ratios):.3f} (models {min(ratios):.3f} to {max(ratios):.3f}; below 1 is "
                  f"ours faster on {sum(x < 1 for x in ratios)} of {len(ratios)}).", "",
              "| predictor | Kendall's tau with the measured steps | picks the faster plan | measured over predicted "
              "(median) |", "|---|---|---|---|"]
    for key, name in (("torchrec_estimate_ms", "TorchRec's estimate"), ("our_estimate_ms", "our estimate")):
        f = fit[key]
        lines.append(f"| {name} | {f['kendall_tau']:.2f} | {f['picks_faster_share']:.0%} | "
                     f"{f['median_measured_over_predicted']:.3g} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        _worker(argv[1])
        return 0
    from autoshard.cli.defaults import study_defaults
    from autoshard.measure.harness import machine_facts

    p = argparse.ArgumentParser(prog="python -m autoshard.planner.steps", description=__doc__.split("\n")[0])
    p.add_argument("--models", type=int, default=10)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--batch-per-rank", type=int, default=1024)
    p.add_argument("--memory-per-device", default="4GiB")
    p.add_argument("--timeout-s", type=float, default=600.0)
    p.add_argument("--out", type=Path, default=Path("docs/planner-steps.md"))
    args = p.parse_args(argv)
    seed = study_defaults()["seed"]
    rows = []
    for k in range(args.models):
        rows.append(run_model(k, seed, args))
        print(json.dumps(rows[-1]), flush=True)
    fit = agreement(rows)
    facts = machine_facts()
    machine = f"{facts.cpu_model}, {os.cpu_count()} cores, FBGEMM {facts.fbgemm_isa}"
    args.out.write_text(page(rows, fit, args, machine))
    args.out.with_suffix(".json").write_text(json.dumps({"models": rows, "agreement": fit,
                                                         "machine": dataclasses.asdict(facts)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

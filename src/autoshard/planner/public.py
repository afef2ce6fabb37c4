"""Our planner beside TorchRec's on public model shapes, scored by TorchRec's own estimate (a
benchmark, not a stage), written into docs/ by one command:

  python -m autoshard.planner.public [--ranks 8 32 128] [--bound-s 120] [--out docs/planner-benchmark.md]
  python -m autoshard.planner.public --bound-s 120 --page-only    (the page again from its .json)

The models:
- `criteo_kaggle`: DLRM on Criteo Kaggle, its 26 categorical features at their published
  cardinalities, dim 16, one lookup each;
- `criteo_terabyte`: Criteo Terabyte as MLPerf's DLRM-DCNv2 uses it, the 26 features hashed to at
  most 40 million rows, dim 128, MLPerf's multi-hot sizes as lookups;
- `production_240`, `production_1900`: the production-shaped generator (`cli.bench.production_tables`);
- `synthetic_10000`: the same generator's shapes at 10,000 tables, each table's rows divided by 32
  (at least 100), so that its weights (0.3 TiB, not 10) fit the ranks compared; the production
  shapes keep their rows and do not fit the fewest ranks, which the page records.

On each number of ranks (hosts of 8 GPUs of `--memory-per-device`, `--batch-per-rank` samples a
rank), three plans:
- `ours`: `autoshard plan --sharding auto --method lpt_measured --backend analytic` (TorchRec's perf
  estimate of each piece, our placement, data-parallel, row- and column-wise shards), timed end to
  end as a command with its peak memory;
- `torchrec_defaults`: TorchRec's `EmbeddingShardingPlanner` as it comes;
- `torchrec_our_accounting`: TorchRec's planner through our command (`--method torchrec`: the fused
  kernel, storage at the training batch, the same memory accounting as ours).
Each is scored by TorchRec's estimators on the same topology (`production.torchrec_plan`: the
busiest rank's sum of shard perf totals), our plans read through `AutoShardPlanLoader`. Every
TorchRec run and every scoring runs in its own process, bounded by `--bound-s`: a run past it is
recorded as "not finished in N s", a result.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from autoshard.cli.bench import PEAK, production_tables
from autoshard.methods.registry import LPT, TORCHREC

KAGGLE = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992, 5461306,
          10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)  # DLRM's Criteo Kaggle cardinalities
TERABYTE = (40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209, 11938,
            155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36)  # MLPerf DLRM-DCNv2, capped 40M
MULTI_HOT = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)  # its lookups
PLANS = ("ours", "torchrec_defaults", "torchrec_our_accounting")
SYNTHETIC_SHRINK = 32  # the 10,000-table synthetic's rows over the generator's: 10 TiB of weights to 0.3


def criteo(cardinalities: tuple[int, ...], dim: int, lookups: tuple[int, ...]) -> pd.DataFrame:
    """One pooled EmbeddingBagCollection of the 26 categorical features."""
    return pd.DataFrame({"name": [f"cat_{i}" for i in range(len(cardinalities))], "rows": cardinalities,
                         "dim": dim, "pooling_factor": [float(x) for x in lookups], "module": "sparse",
                         "pooling": "pooled"})


def model(name: str, seed: int) -> pd.DataFrame:
    """The named model's table list (see the module)."""
    if name == "criteo_kaggle":
        return criteo(KAGGLE, 16, (1,) * len(KAGGLE))
    if name == "criteo_terabyte":
        return criteo(TERABYTE, 128, MULTI_HOT)
    if name == "synthetic_10000":
        return production_tables(seed, 10_000).assign(rows=lambda t: (t["rows"] // SYNTHETIC_SHRINK).clip(lower=100))
    return production_tables(seed, int(name.rsplit("_", 1)[1]))


MODELS = ("criteo_kaggle", "criteo_terabyte", "production_240", "production_1900", "synthetic_10000")


def _bounded(argv: list[str], bound_s: float) -> tuple[str, float, str] | str:
    """(stdout, seconds, stderr) of a child process, or why it did not finish within `bound_s`."""
    start = time.perf_counter()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=bound_s)
    except subprocess.TimeoutExpired:
        return f"not finished in {bound_s:g} s"
    if done.returncode != 0:
        said = [line for line in done.stderr.strip().splitlines() if not line.startswith("peak_kib ")]
        return said[-1] if said else f"exit {done.returncode}"  # whole: the page is one line a cell
    return done.stdout, time.perf_counter() - start, done.stderr


def score(tables_csv: Path, ranks: int, hbm: int, batch: int, plan: Path | None, bound_s: float) -> dict:
    """TorchRec's estimate of a plan (`plan`: our TorchRec export; None: TorchRec plans with its
    defaults), in a bounded process: per-rank stats and planning seconds, or why not."""
    argv = [sys.executable, "-m", "autoshard.planner.public", "--worker", str(tables_csv), str(ranks), str(hbm),
            str(batch), str(plan or "")]
    got = _bounded(argv, bound_s)
    if isinstance(got, str):
        return {"finished": False, "why": got}
    out, seconds, _ = got
    return {"finished": True, "seconds": seconds, **json.loads(out.strip().splitlines()[-1])}


def ours(tables_csv: Path, ranks: int, hbm: int, batch: int, folder: Path, method: str, bound_s: float) -> dict:
    """Our command's plan (`method`), timed end to end with its peak memory, and its export."""
    out, exported = folder / f"{method}.json", folder / f"{method}.torchrec.json"
    argv = [sys.executable, "-c", PEAK, "plan", "--tables", str(tables_csv), "--devices", str(ranks),
            "--devices-per-host", str(min(8, ranks)), "--memory-per-device", str(hbm), "--sharding", "auto",
            "--method", method, "--batch-size", str(batch * ranks), "--out", str(out), "--torchrec", str(exported)]
    argv += ["--backend", "analytic"] if method != TORCHREC else []
    got = _bounded(argv, bound_s)
    if isinstance(got, str):
        return {"finished": False, "why": got}
    _, seconds, err = got
    peak = [int(line.split()[1]) for line in err.splitlines() if line.startswith("peak_kib ")]
    doc = json.loads(out.read_text())
    kinds = {"replicated": len(doc.get("replicated", [])), "rows": len(doc.get("rows", {})),
             "columns": len(doc.get("columns", {}))}
    return {"finished": True, "command_seconds": seconds, "peak_gib": peak[-1] / 2**20 if peak else None,
            "placing_seconds": doc["sharding_seconds"], "split": kinds, "export": str(exported)}


def cell(name: str, tables: pd.DataFrame, ranks: int, args: argparse.Namespace) -> dict:
    """The three plans of one model on `ranks` ranks, each scored by TorchRec's estimate."""
    out: dict = {"model": name, "tables": len(tables), "ranks": ranks}
    with tempfile.TemporaryDirectory(prefix="autoshard-public-") as tmp:
        folder = Path(tmp)
        csv = folder / "model.csv"
        tables.to_csv(csv, index=False)
        for plan, method in (("ours", LPT), ("torchrec_our_accounting", TORCHREC)):
            made = ours(csv, ranks, args.hbm, args.batch_per_rank, folder, method, args.bound_s)
            if made["finished"]:
                made["score"] = score(csv, ranks, args.hbm, args.batch_per_rank, Path(made.pop("export")),
                                      args.bound_s)
            out[plan] = made
        out["torchrec_defaults"] = score(csv, ranks, args.hbm, args.batch_per_rank, None, args.bound_s)
    return out


def estimate(entry: dict) -> float | None:
    """The busiest rank's TorchRec estimate (ms) of a plan entry, where it finished."""
    scored = entry.get("score", entry)
    return scored.get("perf_max_ms") if entry.get("finished") and scored.get("finished") else None


def _label(e: dict) -> str:
    """Why a plan has no estimate: the plan itself did not come (`why`), or it came and TorchRec's
    scoring of it did not finish (the score's `why`)."""
    if e.get("why"):
        return f" ({e['why']})"
    scored = e.get("score", {})
    return f" (planned; TorchRec's scoring of the plan: {scored['why']})" if scored.get("why") else ""


def _times(plan: str, e: dict) -> tuple[float | None, float | None]:
    """The whole process's seconds and the placing call's: for our command (`ours`,
    `torchrec_our_accounting`) the command's wall time and its placement; for TorchRec's planner
    as it comes, its scoring process (imports, plan, estimate) and its `plan` call."""
    if plan == "torchrec_defaults":
        return e.get("seconds"), e.get("planning_seconds")
    return e.get("command_seconds"), e.get("placing_seconds")


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def page(cells: list[dict], args: argparse.Namespace) -> str:
    """docs/planner-benchmark.md: one row per model, ranks and plan."""
    lines = ["# Our planner beside TorchRec's on public model shapes", "",
             f"Generated by `python -m autoshard.planner.public --ranks {' '.join(map(str, args.ranks))} "
             f"--bound-s {args.bound_s:g}` (see its docstring for the models and plans); hosts of 8 ranks of "
             f"{args.hbm / 2**30:g} GiB, {args.batch_per_rank} samples a rank. Scored by TorchRec's own estimate "
             "(the busiest rank's sum of shard perf totals, ms); every TorchRec run and scoring bounded in time. "
             "`process (s)` is a whole process: our command end to end for `ours` and `torchrec_our_accounting`, "
             "the scoring process (imports, plan, estimate) for `torchrec_defaults`; `placing (s)` is the "
             "placement inside it (our placement; TorchRec's `plan` call).", "",
             "| model | tables | ranks | plan | TorchRec estimate (ms) | over TorchRec's defaults | process (s) | "
             "placing (s) | peak (GiB) | replicated / row / column |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        base = estimate(c["torchrec_defaults"])
        for plan in PLANS:
            e = c[plan]
            value = estimate(e)
            process, placing = _times(plan, e)
            split = e.get("split")
            lines.append(f"| {c['model']} | {c['tables']} | {c['ranks']} | {plan} | "
                         f"{_cell(value, '.4g')}{_label(e)} | "
                         f"{'-' if value is None or base is None else f'{value / base:.3f}'} | "
                         f"{_cell(process, '.1f')} | {_cell(placing, '.2f')} | {_cell(e.get('peak_gib'), '.2f')} | "
                         f"{'-' if split is None else '{replicated} / {rows} / {columns}'.format(**split)} |")
    return "\n".join(lines) + "\n"


def _worker(argv: list[str]) -> int:
    """One scoring in its own process: prints TorchRec's per-rank stats as one JSON line."""
    from autoshard.planner.production import torchrec_plan

    tables_csv, ranks, hbm, batch, plan = argv
    tables = pd.read_csv(tables_csv)
    stats, seconds, _ = torchrec_plan(tables, int(ranks), min(8, int(ranks)), int(hbm), int(batch),
                                      Path(plan) if plan else None)
    print(json.dumps({**stats, "planning_seconds": seconds}))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return _worker(argv[1:])
    from autoshard.cli.defaults import study_defaults
    from autoshard.cli.user_tables import parse_memory

    p = argparse.ArgumentParser(prog="python -m autoshard.planner.public", description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--ranks", nargs="+", type=int, default=[8, 32, 128])
    p.add_argument("--memory-per-device", default="80GiB")
    p.add_argument("--batch-per-rank", type=int, default=2048)
    p.add_argument("--bound-s", type=float, default=120.0)
    p.add_argument("--out", type=Path, default=Path("docs/planner-benchmark.md"))
    p.add_argument("--page-only", action="store_true",
                   help="write the page again from the run recorded beside it (OUT with .json), running nothing")
    args = p.parse_args(argv)
    args.hbm = parse_memory(args.memory_per_device)
    if args.page_only:
        args.out.write_text(page(json.loads(args.out.with_suffix(".json").read_text()), args))
        return 0
    seed = study_defaults()["seed"]
    cells = []
    for name in args.models:
        tables = model(name, seed)
        for ranks in args.ranks:
            cells.append(cell(name, tables, ranks, args))
            print(json.dumps(cells[-1]), flush=True)
    args.out.write_text(page(cells, args))
    args.out.with_suffix(".json").write_text(json.dumps(cells, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

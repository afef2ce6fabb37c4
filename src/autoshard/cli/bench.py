"""Benchmark of `autoshard plan` at scale: the whole command (Python start-up, reading the
tables, loading the models, placing, writing the plan) as a user runs it, timed end to end,
with the process's peak memory.

  python -m autoshard.cli.bench [--sizes 856x128 10000x1024] [--repeats 3] [--method rl_greedy]
(`--method rl_local_search` times the refinement too)
  python -m autoshard.cli.bench --production [--sizes 2000x96] [--method cost_greedy] [--backend analytic]
(the production-shaped model, `production_tables`, planned with `--sharding auto` on hosts of 8
devices of 138 GiB at a training batch of 2048 a device)

Table lists come from the study's pool (`data/pool`): its tables with their measured features,
tiled under new names beyond the pool's size. Each device gets twice its even share of the
total size plus the largest table (as the evaluate stage's timing tasks). Needs the study's
models (`dvc repro train_rl`).
"""

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from autoshard.data.features import REUSE_COLUMNS
from autoshard.methods.registry import POLICY


def table_list(pool_features: pd.DataFrame, n: int) -> pd.DataFrame:
    """`n` tables as a CSV frame: the pool's tables in order, repeated under new names."""
    reps = -(-n // len(pool_features))
    f = pd.concat([pool_features] * reps, ignore_index=True).iloc[:n]
    out = pd.DataFrame({"name": [f"t{i}" for i in range(n)], "rows": f["rows"], "dim": f["dim"],
                        "pooling_factor": f["pooling_factor"]})
    for i, c in enumerate(REUSE_COLUMNS):
        out[f"reuse_bin_{i}"] = f[c]
    return out


MODULES = ("sparse.user", "sparse.item", "sparse.context")
DIMS = (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
DIM_SHARES = (0.34, 0.25, 0.05, 0.05, 0.04, 0.22, 0.02, 0.015, 0.01, 0.005)
MAX_ROWS = 80_000_000
SEQUENCES = (("clicked_items", 50_000_000, 1516.5), ("viewed_items", 30_000_000, 1480.0))


def production_tables(seed: int, tables: int = 1900) -> pd.DataFrame:
    """A seeded production-shaped table list (name, rows, dim, pooling_factor, module, pooling):
    `tables` tables in three pooled modules and one sequence module; dims 4 to 2048, most of
    them 4, 8 or 128; hash sizes log-uniform up to 80 million rows (most small); pooling factors
    mostly 1 to a few tens; two sequence features of 128 columns with about 1,500 lookups a sample."""
    from autoshard.core.seeding import rng

    g = rng(seed, "bench", "production", tables)
    n = tables - len(SEQUENCES)
    rows = np.minimum(MAX_ROWS, np.floor(10 ** g.uniform(1, math.log10(MAX_ROWS), n))).astype(np.int64)
    frame = pd.DataFrame({"name": [f"f{i}" for i in range(n)], "rows": rows,
                          "dim": g.choice(DIMS, n, p=DIM_SHARES),
                          "pooling_factor": np.round(np.minimum(200, g.lognormal(0.5, 1.2, n)), 2),
                          "module": g.choice(MODULES, n), "pooling": "pooled"})
    sequences = pd.DataFrame({"name": [s[0] for s in SEQUENCES], "rows": [s[1] for s in SEQUENCES], "dim": 128,
                              "pooling_factor": [s[2] for s in SEQUENCES], "module": "sequence",
                              "pooling": "sequence"})
    return pd.concat([frame, sequences], ignore_index=True)


# The command's own peak (VmHWM of its address space) printed as it exits: ru_maxrss of a child
# would count this benchmark's memory too, since Linux carries the high-water mark across fork/exec.
PEAK = ("import atexit, sys\n"
        "def peak():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmHWM:'):\n"
        "            print('peak_kib', line.split()[1], file=sys.stderr)\n"
        "atexit.register(peak)\n"
        "sys.argv = ['autoshard', *sys.argv[1:]]\n"
        "from autoshard.cli.entry import run\n"
        "run()\n")


def run_once(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and peak resident memory (GiB) of one `autoshard` command (its arguments)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PEAK, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"autoshard {' '.join(argv)} failed: {done.stderr[-500:]}")
    kib = [int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("peak_kib ")]
    return seconds, kib[-1] / 2**20


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autoshard.cli.bench", description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", default=["856x128", "10000x1024"], help="TABLESxDEVICES")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--method", default=POLICY,
                   help="any method of `autoshard plan` (rl_local_search: with the search)")
    p.add_argument("--pool", type=Path, default=Path("data/pool"))
    p.add_argument("--models", type=Path, default=Path("data/rl"), help="the command's --models")
    p.add_argument("--backend", default=None, help="the command's --backend (analytic: TorchRec's estimate, "
                                                   "nothing measured; default the command's)")
    p.add_argument("--production", action="store_true",
                   help="the production-shaped model (`production_tables`) with --sharding auto")
    args = p.parse_args(argv)
    from autoshard.cli.defaults import study_defaults
    from autoshard.data.pool import load_pool

    features = None if args.production else load_pool(args.pool).features
    rows = []
    with tempfile.TemporaryDirectory(prefix="autoshard-bench-") as tmp:
        for size in args.sizes:
            n, devices = (int(x) for x in size.split("x"))
            path, out = Path(tmp) / f"tables_{n}.csv", Path(tmp) / "plan.json"
            if args.production:
                production_tables(study_defaults()["seed"], n).to_csv(path, index=False)
                cmd = ["plan", "--tables", str(path), "--devices", str(devices), "--memory-per-device", "138GiB",
                       "--sharding", "auto", "--devices-per-host", "8", "--batch-size", str(2048 * devices),
                       "--method", args.method, "--out", str(out), "--models", str(args.models)]
            else:
                tables = table_list(features, n)
                tables.to_csv(path, index=False)
                sizes = tables["rows"] * tables["dim"] * 4
                memory = int(sizes.max() + 2 * sizes.sum() / devices)
                cmd = ["plan", "--tables", str(path), "--devices", str(devices), "--memory-per-device", str(memory),
                       "--method", args.method, "--out", str(out), "--models", str(args.models)]
            cmd += ["--backend", args.backend] if args.backend else []
            runs = [run_once(cmd) for _ in range(args.repeats)]
            doc = json.loads(out.read_text())
            rows.append({"tables": n, "devices": devices, "method": args.method, "backend": args.backend,
                         "sharding": "auto" if args.production else "table",
                         "engine": doc["engine"],
                         "command_seconds_median": statistics.median(r[0] for r in runs),
                         "command_seconds_all": [round(r[0], 3) for r in runs],
                         "placing_seconds_last": doc["sharding_seconds"],
                         "peak_memory_gib": max(r[1] for r in runs)})
            print(json.dumps(rows[-1]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How much faster the profile's collection runs on 2 local Ray workers than on 1, and what
measuring side by side does to the noise (issue 19).

  python scripts/profile_speedup.py [--pool data/pool] [--tasks data/tasks.json] [--shards 200]

Plans the profile stage's shards with params.yaml (`profile`), draws `--shards` of the first
round (seeded), and collects them twice with the `profile.backend` (fbgemm by default), each
time into a fresh measurement store: on a local Ray instance of 1 CPU, then of 2. Prints one
JSON line per run: wall time (Ray start-up excluded, each worker's pool loading included), and
the interleaved rounds' noise (`measure.analysis.round_noise`).
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

from autoshard.core.compute import RayEngine
from autoshard.core.params import load_params
from autoshard.core.seeding import rng
from autoshard.data.pool import load_pool
from autoshard.data.tasks import load_tasks
from autoshard.measure.analysis import round_noise
from autoshard.measure.backends import make_backend
from autoshard.measure.collect import ProfileConfig, collect, plan_jobs
from autoshard.placement.heuristics import every_plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--pool", type=Path, default=Path("data/pool"))
    parser.add_argument("--tasks", type=Path, default=Path("data/tasks.json"))
    parser.add_argument("--shards", type=int, default=200)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    params = load_params(args.params)
    seed = params["seed"]
    cfg = ProfileConfig.from_params(params["profile"])
    pool = load_pool(args.pool)
    tasks, train, test = load_tasks(args.tasks)
    planned = [j for j in plan_jobs(pool, tasks, train, cfg, seed, test,
                                    placements=lambda task: every_plan(pool.features, task, seed)) if j.round == 0]
    picked = sorted(rng(seed, "bench", "profile_speedup").choice(len(planned), args.shards, replace=False))
    jobs = [planned[i] for i in picked]
    backend = make_backend(pool, cfg.backend)
    for workers in args.workers:
        engine = RayEngine(num_cpus=workers)
        try:
            with tempfile.TemporaryDirectory() as store:
                start = time.perf_counter()
                table = collect(pool, jobs, backend, cfg, store, progress=False, seed=seed, engine=engine,
                                pool_source={"folder": str(args.pool.resolve())})
                seconds = time.perf_counter() - start
        finally:
            engine.close()
        print(json.dumps({"ray_workers": workers, "shards": len(jobs), "chunks": -(-len(jobs) // cfg.chunk_size),
                          "backend": cfg.backend.backend, "wall_s": round(seconds, 2),
                          "median_total_ms": float(table["total_ms"].median())} | round_noise(table)), flush=True)


if __name__ == "__main__":
    main()

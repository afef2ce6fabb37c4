"""`python -m autoshard.pipeline.profile_run`: the profile stage's collection outside its notebook
(the same shards, measured and saved as the stage does)."""

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from autoshard.core.compute import ENGINES, ComputeConfig, measuring_engine
from autoshard.core.errors import ConfigError
from autoshard.core.params import load_params
from autoshard.core.paths import Paths
from autoshard.data.pool import Pool, load_pool
from autoshard.data.tasks import Task, load_tasks
from autoshard.measure.backends import make_backend
from autoshard.measure.collect import ProfileConfig, collect, save_profile
from autoshard.placement.profile_shards import profile_jobs


def run(params: dict, pool: Pool, tasks: list[Task], train_tables: np.ndarray,
        test_tables: np.ndarray, store_root: str | Path, progress: bool = True,
        pool_folder: str | Path | None = None) -> pd.DataFrame:
    """The whole collection for `params` (a dict with `seed`, `profile` and optionally
    `compute`: with `compute.measure_workers` above 1 or the Ray engine, chunks are engine jobs
    that load the pool from `pool_folder`)."""
    cfg = ProfileConfig.from_params(params["profile"])
    seed = params["seed"]
    jobs = profile_jobs(pool, tasks, train_tables, test_tables, cfg, seed)
    engine = measuring_engine(ComputeConfig.from_params(params["compute"])) if "compute" in params else None
    if engine is not None and pool_folder is None:
        raise ConfigError("compute.measure_workers: measuring on an engine needs the pool's folder (--pool)")
    try:
        return collect(pool, jobs, make_backend(pool, cfg.backend), cfg, store_root, progress, seed, engine,
                       {"folder": str(Path(pool_folder).resolve())} if pool_folder is not None else None)
    finally:
        if engine is not None:
            engine.close()


def main(argv: list[str] | None = None) -> int:
    paths = Paths()
    parser = argparse.ArgumentParser(prog="python -m autoshard.pipeline.profile_run",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--pool", type=Path, default=paths.pool)
    parser.add_argument("--tasks", type=Path, default=paths.tasks)
    parser.add_argument("--out", type=Path, default=paths.profile)
    parser.add_argument("--store", type=Path, default=paths.measurements,
                        help="the measurement store (shared with the other measuring stages)")
    parser.add_argument("--engine", choices=ENGINES, help="overrides compute.engine (ray: see README, Scale out)")
    parser.add_argument("--address", help="overrides compute.address (a Ray cluster's, or auto)")
    parser.add_argument("--measure-workers", type=int, help="overrides compute.measure_workers")
    args = parser.parse_args(argv)
    try:
        params = load_params(args.params)
        overrides = {"engine": args.engine, "address": args.address, "measure_workers": args.measure_workers}
        overrides = {k: v for k, v in overrides.items() if v is not None}
        if overrides:
            params["compute"] = params.get("compute", {}) | overrides
        ProfileConfig.from_params(params.get("profile"))  # bad parameters fail before any loading
        tasks, train, test = load_tasks(args.tasks)
        table = run(params, load_pool(args.pool), tasks, train, test, args.store, pool_folder=args.pool)
    except ConfigError as exc:
        print(f"profile: error: {exc}", file=sys.stderr)
        return 2
    save_profile(table, args.out)
    print(f"profile: {len(table)} shards measured, written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

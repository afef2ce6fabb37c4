"""`python -m autoshard.pipeline.profile`: the profile stage's collection outside its notebook
(the same shards, measured and saved as the stage does)."""

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from autoshard.core.errors import ConfigError
from autoshard.core.params import load_params
from autoshard.core.paths import Paths
from autoshard.data.pool import Pool, load_pool
from autoshard.data.tasks import Task, load_tasks
from autoshard.measure.backends import make_backend
from autoshard.measure.collect import ProfileConfig, collect, plan_jobs, save_profile
from autoshard.placement.heuristics import every_plan


def run(params: dict, pool: Pool, tasks: list[Task], train_tables: np.ndarray,
        test_tables: np.ndarray, work_root: str | Path, progress: bool = True) -> pd.DataFrame:
    """The whole collection for `params` (a dict with `seed` and `profile`)."""
    cfg = ProfileConfig.from_params(params["profile"])
    seed = params["seed"]
    jobs = plan_jobs(pool, tasks, train_tables, cfg, seed, test_tables,
                     placements=lambda task: every_plan(pool.features, task, seed))
    return collect(pool, jobs, make_backend(pool, cfg.backend), cfg, work_root, progress)


def main(argv: list[str] | None = None) -> int:
    paths = Paths()
    parser = argparse.ArgumentParser(prog="python -m autoshard.pipeline.profile", description=__doc__.split("\n")[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--pool", type=Path, default=paths.pool)
    parser.add_argument("--tasks", type=Path, default=paths.tasks)
    parser.add_argument("--out", type=Path, default=paths.profile)
    parser.add_argument("--work", type=Path, default=paths.work("profile"))
    args = parser.parse_args(argv)
    try:
        params = load_params(args.params)
        ProfileConfig.from_params(params.get("profile"))  # bad parameters fail before any loading
        tasks, train, test = load_tasks(args.tasks)
        table = run(params, load_pool(args.pool), tasks, train, test, args.work)
    except ConfigError as exc:
        print(f"profile: error: {exc}", file=sys.stderr)
        return 2
    save_profile(table, args.out, args.work)
    print(f"profile: {len(table)} shards measured, written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

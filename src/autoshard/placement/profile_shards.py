"""The profile stage's shard list: `measure.collect.plan_jobs` given every heuristic's plans
(here, the lowest layer that knows both), so the stage and `autoshard measure --write-jobs`
plan the same shards in the same order; and the candidate shards the cost_model stage may
measure on top, where its hybrid model is least sure."""

import numpy as np
import pandas as pd

from autoshard.core.seeding import rng
from autoshard.data.pool import Pool
from autoshard.data.tasks import Task, shards
from autoshard.measure.collect import Job, ProfileConfig, plan_jobs
from autoshard.placement.heuristics import every_plan


def profile_jobs(pool: Pool, tasks: list[Task], train_tables: np.ndarray, test_tables: np.ndarray,
                 cfg: ProfileConfig, seed: int) -> list[Job]:
    """Every shard the profile stage measures, in order: `plan_jobs` with every heuristic's
    placement of a task as its heuristic shards."""
    return plan_jobs(pool, tasks, train_tables, cfg, seed, test_tables,
                     placements=lambda task: every_plan(pool.features, task, seed))


SOURCES = ("pair", "small", "planner")  # what `candidate_shards` draws, a third each


def candidate_shards(pool: Pool, tasks: list[Task], train_tables: np.ndarray, count: int, seed: int,
                     measured: set[tuple[int, ...]]) -> pd.DataFrame:
    """Up to `count` distinct train-table shards not in `measured`, for the cost model's active
    selection (`costmodel.active`): a third random pairs (what fusion changes first), a third
    small shards of 3 to 6 tables, a third the devices of heuristic plans of train tasks (the
    shards planners produce; the profile measured those of a few tasks only). Columns `tables`
    (sorted tuples) and `source`; deterministic for a seed."""
    g = rng(seed, "cost_model", "candidates")
    tables = np.asarray(train_tables)
    train = {int(t) for t in tables}
    seen = set(measured)
    out: list[tuple[tuple[int, ...], str]] = []

    def add(shard, source: str) -> None:
        key = tuple(sorted(int(t) for t in shard))
        if len(key) > 1 and key not in seen and set(key) <= train:
            seen.add(key)
            out.append((key, source))

    share = count // len(SOURCES)
    for source, sizes in (("pair", (2, 2)), ("small", (3, 6))):
        start, attempts = len(out), 0
        while len(out) - start < share and attempts < 20 * share:
            attempts += 1
            add(g.choice(tables, int(g.integers(sizes[0], sizes[1] + 1)), replace=False), source)
    planner = []
    for task in (t for t in tasks if t.split == "train"):
        for placement in every_plan(pool.features, task, seed):
            planner += [tuple(sorted(int(t) for t in s)) for s in shards(placement, task.tables, task.devices)]
    planner = sorted(set(planner) - seen)
    for i in g.permutation(len(planner))[:count - len(out)]:
        add(planner[i], "planner")
    return pd.DataFrame({"tables": [k for k, _ in out], "source": [s for _, s in out]})

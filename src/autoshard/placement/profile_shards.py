"""The profile stage's shard list: `measure.collect.plan_jobs` given every heuristic's plans
(here, the lowest layer that knows both), so the stage and `autoshard measure --write-jobs`
plan the same shards in the same order."""

import numpy as np

from autoshard.data.pool import Pool
from autoshard.data.tasks import Task
from autoshard.measure.collect import Job, ProfileConfig, plan_jobs
from autoshard.placement.heuristics import every_plan


def profile_jobs(pool: Pool, tasks: list[Task], train_tables: np.ndarray, test_tables: np.ndarray,
                 cfg: ProfileConfig, seed: int) -> list[Job]:
    """Every shard the profile stage measures, in order: `plan_jobs` with every heuristic's
    placement of a task as its heuristic shards."""
    return plan_jobs(pool, tasks, train_tables, cfg, seed, test_tables,
                     placements=lambda task: every_plan(pool.features, task, seed))

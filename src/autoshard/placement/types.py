"""The placement protocol: what every method of the study is, once built."""

from collections.abc import Callable

import numpy as np

from autoshard.data.tasks import Task

Planner = Callable[[Task], np.ndarray]
"""Places a task's tables: a device per `task.tables` entry. Raises `ConfigError` (or its subclass
`Infeasible`) when it finds no placement. What a method's registry entry builds."""

SplitPlanner = Callable[[Task], tuple[list, np.ndarray]]
"""Places a task's tables split into column shards: the shards (`placement.column_split.ColumnShard`)
and a device per shard. What a column-wise method's registry entry builds (kind `column`)."""

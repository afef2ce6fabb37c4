"""The placement protocol: what every method of the study is, once built."""

from collections.abc import Callable

import numpy as np

from autoshard.data.tasks import Task

Planner = Callable[[Task], np.ndarray]
"""Places a task's tables: a device per `task.tables` entry. Raises `ConfigError` (or its subclass
`Infeasible`) when it finds no placement. What a method's registry entry builds."""

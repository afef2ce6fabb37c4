"""Failed placements: counted per protocol and method; a plan over the cap is recorded as no plan."""

import numpy as np
import pandas as pd
import pytest

from autoshard.core.errors import ConfigError
from autoshard.core.schema import check
from autoshard.data.tasks import Task
from autoshard.studies.evaluate import FailedPlacements, plan_all
from autoshard.studies.memory import failed_counts


def test_failed_placements_are_counted_per_protocol_and_method():
    sizes = np.array([4, 4, 4, 4])
    tasks = [Task("tight/0", "tight", "test", (0, 1, 2, 3), 2, 8, 1.0),
             Task("tight/1", "tight", "test", (0, 1, 2, 3), 2, 8, 1.0),
             Task("dreamshard/0", "dreamshard", "test", (0, 1), 2, 8, 1.0)]
    fine = np.array([0, 0, 1, 1])
    plans = {"cost_greedy": [fine, None, np.array([0, 1])],
             "naive": [np.array([0, 0, 0, 1]), np.array([0, 1, 2, 1]), np.array([0, 1, 1])],
             "exact": [None, None, np.array([1, 1])]}
    status = pd.DataFrame([{"task": t.name, "method": "exact", "status": "not run (small tasks only)"}
                           for t in tasks[:2]])
    counts = failed_counts(tasks, plans, sizes, status)
    assert counts == {"tight": {"cost_greedy": 1, "naive": 2, "exact": 0},
                      "dreamshard": {"cost_greedy": 0, "naive": 1, "exact": 0}}
    assert failed_counts(tasks, plans, sizes)["tight"]["exact"] == 2
    assert check({"failed": counts}, FailedPlacements, "evaluate.json") == {"failed": counts}
    with pytest.raises(ConfigError, match="failed.tight.naive"):
        check({"failed": {"tight": {"naive": "2"}}}, FailedPlacements, "evaluate.json")
    with pytest.raises(ValueError, match="2 plans for 3 tasks"):
        failed_counts(tasks, {"naive": plans["naive"][:2]}, sizes)


def test_a_plan_over_the_cap_is_recorded_as_no_plan_and_counted():
    sizes = np.array([4, 4, 4, 4])
    tasks = [Task("tight/0", "tight", "test", (0, 1, 2, 3), 2, 8, 1.0)]
    methods = {"overflow": lambda t: np.array([0, 0, 0, 1]), "fine": lambda t: np.array([0, 0, 1, 1])}
    plans, status = plan_all(methods, tasks, sizes, progress=False)
    assert plans["overflow"] == [None] and plans["fine"][0].tolist() == [0, 0, 1, 1]
    assert status.set_index("method").loc["overflow", "status"].startswith("no plan: ")
    assert failed_counts(tasks, plans, sizes, status) == {"tight": {"overflow": 1, "fine": 0}}

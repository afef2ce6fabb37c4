"""The column study compares like with like: each column-wise method against its table-wise twin
(the same planner, every table whole), on the same tasks, within one measuring pass."""

import numpy as np
import pandas as pd
import pytest

from autoshard.core.errors import ConfigError
from autoshard.data.tasks import Task
from autoshard.measure.store import MeasurementStore
from autoshard.measure.timing import TimingConfig
from autoshard.methods.artifacts import Artifacts, Settings
from autoshard.methods.registry import COLUMNS
from autoshard.placement.surrogate import MilpConfig
from autoshard.studies import columns as study

from helpers import LinearModel

SINGLES = np.array([4.0, 1.0, 0.5, 2.0])  # measured alone (ms): table a above a balanced device of two
MILP = MilpConfig(node_limit=50, time_limit_s=10.0)
SETTINGS = Settings(seed=0, batch_size=64, milp=MILP)


def bundle(features: pd.DataFrame) -> Artifacts:
    """What the column methods are built from: the tables, a linear cost model, the single costs."""
    return Artifacts(pool_features=features, features=np.zeros((len(features), 21)), cost_model=LinearModel(),
                     single_costs=SINGLES)
TIMING = TimingConfig(warmup=0, runs=1, rounds=1, drift_limit=0.25, retries=1)


class Counting:
    """The analytic backend, counting the shards it is asked to measure."""

    name, device = "counting", "cpu"

    def __init__(self, pool):
        from autoshard.measure.analytic import AnalyticBackend

        self.inner = AnalyticBackend(pool)
        self.calls = []

    def measure(self, tables, batch_size, dims=None):
        self.calls.append((list(tables), None if dims is None else list(dims)))
        return self.inner.measure(tables, batch_size, dims)


def config(methods=("column_greedy", "column_lpt"), **changes) -> study.ColumnsConfig:
    return study.ColumnsConfig.from_params({"ways": [4, 1, 2], "candidates": 4, "methods": list(methods),
                                            "tasks_per_protocol": 10, "bootstrap": 50} | changes)


def test_the_columns_section_is_checked():
    assert config().ways == (1, 2, 4)
    with pytest.raises(ConfigError, match=r"columns.methods\[0\]"):
        config(methods=["lpt_measured"])
    with pytest.raises(ConfigError, match="columns.tasks_per_protocol"):
        config(tasks_per_protocol=0)


def test_the_study_takes_ten_tasks_of_every_protocol_from_the_evaluate_stage():
    """params.yaml: at least 10 tasks per protocol, and the evaluate stage has that many of each."""
    from study_configs import PARAMS

    per_protocol = PARAMS["columns"]["tasks_per_protocol"]
    evaluate = PARAMS["evaluate"]
    ratios = len(PARAMS["tasks"]["autoshard"]["unseen_ratios"])
    available = {"autoshard": evaluate["autoshard_tasks_per_ratio"] * ratios,
                 "dreamshard": evaluate["dreamshard_tasks"], "tight": evaluate["tight_tasks"]}
    assert per_protocol >= 10
    assert all(n >= per_protocol for n in available.values()), available


def test_study_tasks_take_turns_over_the_unseen_ratios():
    tasks = [Task(f"a{r}-{k}", "autoshard", "test", (0,), 1, 1, r) for r in (0.0, 0.5, 1.0) for k in range(4)]
    tasks += [Task(f"d{k}", "dreamshard", "test", (0,), 1, 1, 0.0) for k in range(3)]
    chosen = study.study_tasks(tasks, 5)
    autoshard = [t for t in chosen if t.protocol == "autoshard"]
    assert [t.name for t in autoshard] == ["a0.0-0", "a0.0-1", "a0.5-0", "a0.5-1", "a1.0-0"]
    assert [t.name for t in chosen if t.protocol == "dreamshard"] == ["d0", "d1", "d2"]  # fewer: all of them


def test_each_twin_is_its_planner_with_every_table_whole(user_pool):
    """The twins that carry a registry id place exactly as that method; column_greedy's splits nothing."""
    from autoshard.placement.lpt import lpt
    from autoshard.placement.milp import solve_costs
    from autoshard.placement.torchrec import torchrec_plan

    f = user_pool.features
    t = Task("t", "autoshard", "test", (0, 1, 2, 3), 2, 2**30, 0.5)
    built = study.planners(bundle(f), config(study.TWIN), SETTINGS)
    assert set(built) == set(study.TWIN) | set(study.TWIN.values())
    sizes = f["size_bytes"].to_numpy()
    for twin, expected in (("lpt_measured", lpt(SINGLES, sizes, 2, t.memory_bytes)),
                           ("milp", solve_costs(SINGLES, sizes, 2, t.memory_bytes, time_limit=10.0, seed=0,
                                          node_limit=50).placement),
                           ("torchrec", torchrec_plan(f, t, 64))):
        shards, placement = built[twin](t)
        assert all(s.whole for s in shards) and [s.table for s in shards] == [0, 1, 2, 3], twin
        np.testing.assert_array_equal(placement, expected, err_msg=twin)
    assert all(s.whole for s in built["column_greedy_unsplit"](t)[0])
    assert any(not s.whole for s in built["column_lpt"](t)[0]), "table a costs more than half the task"


def test_the_column_methods_are_registry_entries_kept_out_of_the_table_wise_stages(user_pool):
    """One catalogue: the column study's methods are the registry's kind-`column` entries, which the
    stages that plan table-wise (`METHODS`) and the command never build; a missing need is refused."""
    from autoshard.cli.service import METHODS as OFFERED
    from autoshard.methods.registry import METHODS, ids

    assert set(COLUMNS) == set(study.TWIN) == set(ids(kind="column")) == set(ids("columns"))
    assert not set(COLUMNS) & (set(METHODS) | set(OFFERED))
    f = user_pool.features
    with pytest.raises(ConfigError, match="columns.methods: column_lpt needs single_costs"):
        study.planners(Artifacts(pool_features=f, features=np.zeros((len(f), 21)), cost_model=LinearModel()),
                       config(), SETTINGS)


def test_a_plan_over_the_memory_cap_is_no_plan(user_pool):
    from autoshard.placement.column_split import expand

    f = user_pool.features
    t = Task("t", "autoshard", "test", (0, 1), 2, int(f["size_bytes"].iloc[0]), 0.0)
    together = (expand(t, f["dim"]), np.zeros(2, dtype=np.int64))  # both tables on device 0
    apart = (together[0], np.array([0, 1]))
    assert not study.within_memory(f, t, together) and study.within_memory(f, t, apart)
    assert study.plan_columns(lambda task: together, [t], f) == [None]
    assert study.plan_columns(lambda task: apart, [t], f) == [apart]


def measured(user_pool, tmp_path, backend):
    """Two two-device tasks (column_lpt splits table a) and one one-device task (nothing to
    balance, so nothing split), planned by two pairs and measured; the rows and the pairs."""
    f = user_pool.features
    tasks = [Task("t0", "autoshard", "test", (0, 1, 2, 3), 2, 2**30, 0.0),
             Task("t1", "autoshard", "test", (0, 1, 2, 3), 2, 2**30, 0.5),
             Task("t2", "autoshard", "test", (0, 1, 3), 1, 2**30, 0.5)]
    cfg = config()
    plans = {m: study.plan_columns(p, tasks, f)
             for m, p in study.planners(bundle(f), cfg, SETTINGS).items()}
    store = study.columns_store(MeasurementStore(tmp_path, "space"))
    rows = study.plan_rows(backend, f, tasks, plans, 64, store, 0, TIMING, progress=False)
    return cfg, tasks, plans, store, rows, study.pair_frame(rows, cfg.methods, tasks, SINGLES)


def test_each_pair_is_compared_on_the_same_tasks_in_one_pass(user_pool, tmp_path):
    from autoshard.core.schema import check

    backend = Counting(user_pool)
    cfg, tasks, plans, store, rows, pairs = measured(user_pool, tmp_path, backend)
    assert len(rows) == 3 * 4 and rows["pass"].nunique() == 1 and rows["pass"].iloc[0].startswith("columns-")
    assert any(d is not None and d != [int(user_pool.features["dim"][t]) for t in ts] for ts, d in backend.calls)
    calls = len(backend.calls)
    again = study.plan_rows(backend, user_pool.features, tasks, plans, 64, store, 0, TIMING, progress=False)
    assert len(backend.calls) == calls, "resumed from the store"
    pd.testing.assert_frame_equal(rows, again)

    lpt = pairs[pairs["method"] == "column_lpt"].set_index("task")
    assert (lpt["twin"] == "lpt_measured").all() and list(lpt.index) == ["t0", "t1", "t2"]
    assert lpt["split"].tolist() == [True, True, False]
    assert lpt.loc["t2", "identical"] and lpt.loc["t2", "ratio"] == 1.0, "one plan: measured once, ratio exactly 1"
    ms = rows.set_index(["task", "method"])["measured_ms"]
    assert lpt.loc["t0", "ratio"] == ms["t0", "column_lpt"] / ms["t0", "lpt_measured"]
    assert lpt.loc["t0", "bound_share"] == 4.0 / ms["t0", "lpt_measured"]

    metrics = check(study.columns_metrics(pairs, cfg, 0, shards_measured=study.distinct_shards(rows), seconds=1.0),
                    study.Columns, "columns.json")
    entry = metrics["protocols"]["autoshard"]["column_lpt"]
    assert entry["tasks"] == 3 and entry["twin"] == "lpt_measured"
    assert entry["split_share"] == pytest.approx(2 / 3) and entry["identical_share"] == pytest.approx(1 / 3)
    assert entry["direction"] == ("below 1" if entry["ci_high"] < 1 else "above 1" if entry["ci_low"] > 1
                                  else "spans 1"), "where its interval lies"
    assert metrics["pairs"] == {"column_greedy": "column_greedy_unsplit", "column_lpt": "lpt_measured"}
    assert metrics["tasks"] == {"autoshard": 3} and metrics["measuring_pass"] == rows["pass"].iloc[0]
    keys = {k for i, t in enumerate(tasks) for p in plans.values() if p[i] is not None
            for k in study.plan_keys(p[i], t.devices) if k}
    assert metrics["shards_measured"] == len(keys)


def test_a_ratio_across_two_passes_is_refused(user_pool, tmp_path):
    cfg, tasks, _, _, rows, _ = measured(user_pool, tmp_path, Counting(user_pool))
    rows.loc[rows["method"] == "lpt_measured", "pass"] = "columns-other"
    with pytest.raises(ValueError, match="different passes"):
        study.pair_frame(rows, cfg.methods, tasks, SINGLES)


def test_other_plans_are_another_pass(user_pool, tmp_path):
    f = user_pool.features
    tasks = [Task("t0", "autoshard", "test", (0, 1, 2, 3), 2, 2**30, 0.0)]
    built = study.planners(bundle(f), config(), SETTINGS)
    plans = {m: study.plan_columns(p, tasks, f) for m, p in built.items()}
    fewer = {m: p for m, p in plans.items() if m != "column_greedy"}
    assert study.pass_name(tasks, plans) != study.pass_name(tasks, fewer)
    assert study.pass_name(tasks, plans) == study.pass_name(tasks, dict(plans))

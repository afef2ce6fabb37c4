"""LPT and the MILP on a linear surrogate, against brute force on small instances."""

import itertools

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.core.errors import ConfigError
from autoshard.data.tasks import Task
from autoshard.methods.artifacts import Artifacts, Settings
from autoshard.methods.registry import build
from autoshard.placement.greedy import Infeasible
from autoshard.placement.lpt import lpt, makespan
from autoshard.placement.milp import solve_costs
from autoshard.placement.surrogate import MilpConfig, per_table, solve_table


def brute_force(costs: np.ndarray, sizes: np.ndarray, devices: int, capacity: int) -> float:
    """The optimal bottleneck over every placement under the cap (inf if none fits)."""
    placements = np.array(list(itertools.product(range(devices), repeat=len(costs))))
    onehot = placements[:, :, None] == np.arange(devices)
    loads = (onehot * costs[None, :, None]).sum(axis=1).max(axis=1)
    fits = (onehot * sizes[None, :, None]).sum(axis=1).max(axis=1) <= capacity
    return float(loads[fits].min()) if fits.any() else float("inf")


def instance(draw, max_tables: int = 7, max_devices: int = 3, slack: tuple[float, float] = (1.0, 2.0)):
    tables = draw(st.integers(2, max_tables))
    devices = draw(st.integers(2, max_devices))
    seed = draw(st.integers(0, 2**32 - 1))
    g = np.random.default_rng(seed)
    costs = np.round(g.lognormal(0, 1, tables), 3)
    sizes = g.integers(1, 100, tables)
    capacity = max(int(sizes.max()), int(draw(st.floats(*slack)) * sizes.sum() / devices))
    return costs, sizes, devices, capacity


@st.composite
def uncapped(draw):
    costs, sizes, devices, _ = instance(draw)
    return costs, sizes, devices, int(sizes.sum())


@st.composite
def capped(draw):
    return instance(draw, slack=(0.9, 1.5))


@settings(max_examples=60, deadline=None)
@given(uncapped())
def test_lpt_within_graham_bound_of_brute_force(case):
    costs, sizes, devices, capacity = case
    best = brute_force(costs, sizes, devices, capacity)
    assert makespan(costs, lpt(costs, sizes, devices, capacity), devices) <= (4 / 3 - 1 / (3 * devices)) * best + 1e-9


@settings(max_examples=60, deadline=None)
@given(capped())
def test_lpt_respects_memory_or_raises(case):
    costs, sizes, devices, capacity = case
    try:
        placement = lpt(costs, sizes, devices, capacity)
    except Infeasible:
        return
    assert placement.min() >= 0 and placement.max() < devices
    assert np.bincount(placement, weights=sizes, minlength=devices).max() <= capacity


def test_lpt_order_and_ties():
    # Costliest first; equal loads go to the device with less memory, then the lower index.
    placement = lpt(np.array([5.0, 5.0, 1.0, 1.0]), np.array([3, 1, 1, 1]), 2, 10)
    assert placement.tolist() == [0, 1, 1, 0]


def test_lpt_raises_infeasible_naming_the_table():
    with pytest.raises(Infeasible, match="table 1 .*fits on no device"):
        lpt(np.array([1.0, 2.0]), np.array([5, 11]), 2, 10)


def test_lpt_rejects_mismatched_inputs():
    with pytest.raises(ValueError, match="one length"):
        lpt(np.ones(3), np.ones(2, dtype=int), 2, 10)


@settings(max_examples=25, deadline=None)
@given(capped())
def test_milp_equals_brute_force(case):
    costs, sizes, devices, capacity = case
    best = brute_force(costs, sizes, devices, capacity)
    if not np.isfinite(best):
        with pytest.raises(Infeasible):
            solve_costs(costs, sizes, devices, capacity, time_limit=10)
        return
    res = solve_costs(costs, sizes, devices, capacity, time_limit=10, rel_gap=0)
    assert res.objective == pytest.approx(best, rel=1e-6)
    assert np.bincount(res.placement, weights=sizes, minlength=devices).max() <= capacity
    assert 0 <= res.lower_bound <= res.objective and res.gap >= 0
    assert res.status == "optimal" and res.gap <= 1e-6


def test_milp_eight_tables_three_devices():
    g = np.random.default_rng(8)
    costs, sizes = g.lognormal(0, 1, 8), g.integers(10, 100, 8)
    capacity = int(sizes.sum() / 3 * 1.1)
    res = solve_costs(costs, sizes, 3, capacity, rel_gap=0)
    assert res.objective == pytest.approx(brute_force(costs, sizes, 3, capacity), rel=1e-9)
    assert res.objective <= makespan(costs, lpt(costs, sizes, 3, capacity), 3)


def test_milp_is_deterministic():
    g = np.random.default_rng(1)
    costs, sizes = g.lognormal(0, 1, 12), g.integers(10, 100, 12)
    first, again = (solve_costs(costs, sizes, 3, int(sizes.sum() / 2), time_limit=20) for _ in range(2))
    assert first.status == "optimal"
    assert np.array_equal(first.placement, again.placement) and first.objective == again.objective


def test_milp_out_of_time_keeps_a_valid_plan_and_bound():
    g = np.random.default_rng(2)
    costs, sizes = g.lognormal(0, 1, 60), g.integers(10, 100, 60)
    capacity = int(sizes.sum() / 6 * 1.2)
    res = solve_costs(costs, sizes, 6, capacity, time_limit=0.05)
    assert res.status in ("time_limit", "start"), "60 tables on 6 devices are not proven optimal in 50 ms"
    if res.status == "start":  # the solver found nothing as good: LPT's very plan
        np.testing.assert_array_equal(res.placement, lpt(costs, sizes, 6, capacity))
    else:  # stopped by the clock with its own plan, not proven optimal
        assert res.seconds >= 0.95 * 0.05 and res.gap > 0
    assert res.objective <= makespan(costs, lpt(costs, sizes, 6, capacity), 6)
    assert max(costs.max(), costs.sum() / 6) <= res.lower_bound + 1e-12 <= res.objective + 1e-12
    assert np.bincount(res.placement, weights=sizes, minlength=6).max() <= capacity


def test_milp_node_limit_is_repeatable():
    g = np.random.default_rng(3)
    costs, sizes = g.lognormal(0, 0.8, 40), g.integers(10, 100, 40)
    first, again = (solve_costs(costs, sizes, 4, int(sizes.sum() / 3), rel_gap=0, node_limit=50) for _ in range(2))
    assert np.array_equal(first.placement, again.placement) and first.lower_bound == again.lower_bound


def test_milp_raises_infeasible_when_nothing_fits():
    with pytest.raises(Infeasible, match="no placement exists"):
        solve_costs(np.ones(3), np.array([6, 6, 6]), 2, 10)


def test_measured_planners_on_tasks():
    singles = pd.Series([3.0, 1.0, 2.0, 2.0, 4.0, 5.0], index=[0, 1, 2, 2, 3, 4])  # table 2 measured twice
    costs = per_table(singles, 6)
    assert costs[2] == 2.0 and np.isnan(costs[5])
    sizes = np.array([10, 10, 10, 10, 10, 10])
    artifacts = Artifacts(pool_features=pd.DataFrame({"size_bytes": sizes}), features=np.zeros((6, 21)),
                          single_costs=costs)
    built = build(("lpt_measured", "milp"), artifacts, Settings(seed=0, batch_size=1,
                                                                 milp=MilpConfig(node_limit=1000, time_limit_s=5)))
    methods = built.planners
    task = Task(name="t", protocol="p", split="test", tables=(0, 1, 2, 3, 4), devices=2, memory_bytes=30,
                unseen_ratio=0.0)
    for name, planner in methods.items():
        placement = planner(task)
        assert len(placement) == 5 and np.bincount(placement, minlength=2).max() <= 3, name
    assert makespan(costs[:5], methods["milp"](task), 2) == 8.0  # {5, 3} and {4, 2, 1}
    row = solve_table(built.solves["milp"]).set_index("task").loc["t"]
    assert row["objective"] == 8.0 and row["lower_bound"] <= 8.0 and row["gap"] >= 0
    unmeasured = Task(name="u", protocol="p", split="test", tables=(0, 5), devices=2, memory_bytes=30,
                      unseen_ratio=0.0)
    with pytest.raises(ConfigError, match=r"task u: no single-table measurement of tables \[5\]"):
        methods["lpt_measured"](unmeasured)


def test_milp_names_the_limit_that_stopped_it():
    """A node limit reached long before the clock is "node_limit", not "time_limit"."""
    from autoshard.placement.milp import stop_status

    g = np.random.default_rng(4)
    costs, sizes = g.uniform(1, 2, 13), g.integers(10, 100, 13)
    res = solve_costs(costs, sizes, 3, int(sizes.sum() / 3 * 1.3), time_limit=60, node_limit=1, rel_gap=0.0)
    assert res.status == "node_limit" and res.gap > 0 and res.seconds < 30
    assert stop_status(0, 100.0, 1.0) == "optimal"
    assert stop_status(1, 0.99, 1.0) == "time_limit" and stop_status(1, 0.2, 1.0) == "node_limit"


def brute_force_mixed(costs: np.ndarray, sizes: np.ndarray, caps: np.ndarray, speeds: np.ndarray,
                      comm: np.ndarray) -> float:
    """The optimal bottleneck on devices of their own speed and memory, each table's comm added
    to its device's busy time whatever the speed (inf if nothing fits)."""
    devices = len(caps)
    placements = np.array(list(itertools.product(range(devices), repeat=len(costs))))
    onehot = placements[:, :, None] == np.arange(devices)
    loads = ((onehot * costs[None, :, None]).sum(axis=1) / speeds + (onehot * comm[None, :, None]).sum(axis=1)
             ).max(axis=1)
    fits = ((onehot * sizes[None, :, None]).sum(axis=1) <= caps).all(axis=1)
    return float(loads[fits].min()) if fits.any() else float("inf")


@st.composite
def mixed(draw):
    costs, sizes, devices, capacity = instance(draw, max_tables=6, max_devices=4, slack=(0.9, 1.6))
    kinds = draw(st.sampled_from(["generations", "shared"]))
    half = devices // 2
    speeds = (np.array([1.0] * (devices - half) + [0.5] * half) if kinds == "generations"
              else np.array([1.0] * (devices - 1) + [0.5]))  # two GPU generations, or one device half taken
    caps = np.array([capacity] * (devices - half) + [max(int(sizes.max()), capacity // 2)] * half)
    comm = np.round(np.random.default_rng(len(costs)).uniform(0, 0.5, len(costs)), 3) * draw(st.sampled_from([0, 1]))
    return costs, sizes, caps, speeds, comm


@settings(max_examples=40, deadline=None)
@given(mixed())
def test_milp_on_a_mixed_cluster_equals_brute_force(case):
    # devices alike only within their group: the mirror-image cut must not cut a device of another
    from autoshard.placement.milp import solve
    from autoshard.placement.objective import Linear

    costs, sizes, caps, speeds, comm = case
    best = brute_force_mixed(costs, sizes, caps, speeds, comm)
    if not np.isfinite(best):
        with pytest.raises(Infeasible):
            solve(Linear.max_device(costs), sizes, len(caps), caps, speeds=speeds, comm=comm[:, None], time_limit=10)
        return
    res = solve(Linear.max_device(costs), sizes, len(caps), caps, speeds=speeds, comm=comm[:, None], time_limit=10,
                rel_gap=0)
    assert res.objective == pytest.approx(best, rel=1e-6)
    assert (np.bincount(res.placement, weights=sizes, minlength=len(caps)) <= caps).all()
    assert res.lower_bound <= res.objective * (1 + 1e-9) and res.status == "optimal"


def test_a_slow_device_gets_less_work_and_the_bound_counts_its_speed():
    from autoshard.placement.milp import solve
    from autoshard.placement.objective import Linear

    costs, sizes = np.array([4.0, 4.0, 2.0, 2.0]), np.ones(4, dtype=np.int64)
    res = solve(Linear.max_device(costs), sizes, 2, 10, speeds=np.array([1.0, 0.5]), rel_gap=0)
    on_slow = costs[res.placement == 1].sum()
    assert on_slow == 4.0 and res.objective == 8.0, "a third of the work at half the speed: 8 ms on both"
    assert res.lower_bound == pytest.approx(8.0), "12 ms of work over a summed speed of 1.5"

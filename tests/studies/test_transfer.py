"""The transfer study's logic: task draws shared between the axes, the shapes it refuses, and the
table it reports."""

import numpy as np
import pandas as pd
import pytest

from autoshard.core.errors import ConfigError
from autoshard.data.tasks import first_fit_decreasing
from autoshard.studies import transfer

from helpers import PROFILE, TIMING, pool_features


def transfer_config(params, **changes):
    return transfer.TransferConfig.from_params(params["transfer"] | changes, TIMING, PROFILE)


def test_transfer_tasks_are_feasible_seeded_and_shared_between_axes(params):
    cfg = transfer_config(params, tables=[4, 8], tables_devices=2, devices=[2, 4], devices_tables=8,
                          memory_per_device_gib=0.001, unseen_ratio=0.5, tasks_per_point=2)
    features = pool_features()
    train, test = np.arange(30), np.arange(30, 60)
    tasks, membership = transfer.transfer_tasks(features, train, test, cfg, seed=3)
    again, _ = transfer.transfer_tasks(features, train, test, cfg, seed=3)
    assert tasks == again
    assert len(tasks) == 6, "the 8 x 2 point is on both axes: its tasks are drawn once"
    assert len(membership) == 8 and set(membership["axis"]) == {"tables", "devices"}
    sizes = features["size_bytes"].to_numpy()
    for t in tasks:
        tables = np.array(t.tables)
        assert (tables >= 30).sum() == round(0.5 * len(tables))
        assert first_fit_decreasing(sizes[tables], t.devices, t.memory_bytes) is not None


def test_transfer_refuses_shapes_that_cannot_exist(params):
    features = pool_features()
    train, test = np.arange(30), np.arange(30, 60)
    with pytest.raises(ConfigError, match=r"transfer\.tables: 40 "):
        transfer.transfer_tasks(features, train, test, transfer_config(params, tables=[40]), 0)
    with pytest.raises(ConfigError, match=r"transfer\.devices: 16 .*more devices than"):
        transfer.transfer_tasks(features, train, test, transfer_config(params, devices=[16], devices_tables=8), 0)
    with pytest.raises(ConfigError, match=r"transfer\.memory_per_device_gib"):
        transfer.transfer_tasks(features, train, test, transfer_config(params, memory_per_device_gib=1e-6), 0)
    with pytest.raises(ConfigError, match=r"transfer\.unseen_ratio: 1\.5"):
        transfer_config(params, unseen_ratio=1.5)


def test_transfer_summary_intervals_hold_the_median():
    g = np.random.default_rng(0)
    rows = [{"axis": "tables", "value": v, "task": f"t{v}/{k}", "method": m, "ratio": g.uniform(0.8, 1.1),
             "predicted_ratio": 0.9, "measured_ms": 1.0}
            for v in (10, 20) for k in range(5) for m in ("rl_greedy", "cost_greedy", "size_greedy")]
    table = transfer.summary(pd.DataFrame(rows), 300, 0)
    assert set(table["method"]) == {"rl_greedy", "cost_greedy"} and (table["tasks"] == 5).all()
    assert ((table["ratio_lo"] <= table["ratio_median"]) & (table["ratio_median"] <= table["ratio_hi"])).all()


def test_transfer_points_say_when_they_share_tasks_or_must_tie():
    rows = []
    for axis, value, shape in [("tables", 40, "40x8"), ("devices", 8, "40x8"), ("devices", 64, "40x64")]:
        for k in range(3):
            for method, ms in [("size_greedy", 10.0), ("rl_greedy", 9.0)]:
                rows.append({"axis": axis, "value": value, "task": f"transfer/{shape}/{k:03d}", "method": method,
                             "ratio": ms / 10.0, "predicted_ratio": 1.0, "measured_ms": ms})
    table = transfer.summary(pd.DataFrame(rows), 100, 0)
    rl = table[table["method"] == "rl_greedy"].set_index(["axis", "value"])
    assert rl.loc[("tables", 40), "shared_with"] == "devices" and rl.loc[("devices", 8), "shared_with"] == "tables"
    assert pd.isna(rl.loc[("devices", 64), "shared_with"]) and rl.loc[("devices", 64), "trivial"]
    assert not rl.loc[("tables", 40), "trivial"]


def test_a_task_is_bounded_when_its_best_heuristic_is_slowest_on_a_lone_table():
    rows = [  # task a: size_greedy best, slowest device holds one table; task b: slowest holds two
        ("a", "size_greedy", 0, 1, 5.0), ("a", "size_greedy", 1, 3, 4.0),
        ("a", "lookup_greedy", 0, 2, 6.0), ("a", "rl_greedy", 0, 1, 5.0),
        ("b", "size_greedy", 0, 2, 5.0), ("b", "size_greedy", 1, 1, 4.0)]
    devices = pd.DataFrame(rows, columns=["task", "method", "device", "tables", "compute_ms"])
    assert transfer.bounded_tasks(devices) == {"a"}
    ratios = pd.DataFrame([{"axis": "tables", "value": 2, "task": t, "method": "rl_greedy", "ratio": 1.0,
                            "predicted_ratio": 1.0, "measured_ms": 5.0} for t in "ab"])
    assert transfer.summary(ratios, 100, 0, frozenset({"a"}))["bounded_share"].tolist() == [0.5]

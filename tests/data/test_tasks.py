"""Task generation: feasibility, split disjointness, unseen ratios, and infeasible caps."""

import numpy as np
import pytest

from autoshard.core.errors import ConfigError
from autoshard.data.pool import build_pool
from autoshard.data.tasks import first_fit_decreasing, load_tasks, make_tasks, save_tasks


@pytest.fixture(scope="module")
def features(smoke_params):
    return build_pool(smoke_params["dataset"], smoke_params["pool"], seed=0, progress=False).features


def test_every_task_is_feasible(features, params):
    tasks, _, _ = make_tasks(features, params["tasks"], seed=0)
    sizes = features["size_bytes"].to_numpy()
    assert tasks
    for task in tasks:
        assert len(set(task.tables)) == len(task.tables)
        placement = first_fit_decreasing(sizes[list(task.tables)], task.devices, task.memory_bytes)
        assert placement is not None
        load = np.bincount(placement, weights=sizes[list(task.tables)], minlength=task.devices)
        assert (load <= task.memory_bytes).all()


def test_split_is_disjoint_and_covers_the_pool(features, params):
    _, train, test = make_tasks(features, params["tasks"], seed=0)
    assert not set(train) & set(test)
    assert sorted([*train, *test]) == list(range(len(features)))


def test_train_and_test_tables_come_from_their_pools(features, params):
    tasks, train, test = make_tasks(features, params["tasks"], seed=0)
    train, test = set(train.tolist()), set(test.tolist())
    for task in tasks:
        unseen = sum(t in test for t in task.tables)
        if task.split == "train":
            assert unseen == 0
        else:
            assert unseen == round(task.unseen_ratio * len(task.tables))
    ratios = {t.unseen_ratio for t in tasks if t.protocol == "autoshard" and t.split == "test"}
    assert ratios == {0.0, 0.5, 1.0}
    assert {t.unseen_ratio for t in tasks if t.protocol == "dreamshard" and t.split == "test"} == {1.0}


def test_counts_and_determinism(features, params):
    a, _, _ = make_tasks(features, params["tasks"], seed=0)
    b, _, _ = make_tasks(features, params["tasks"], seed=0)
    c, _, _ = make_tasks(features, params["tasks"], seed=1)
    assert a == b and a != c
    auto = params["tasks"]["autoshard"]
    n_auto = auto["train_tasks"] + auto["test_tasks"] * len(auto["unseen_ratios"])
    assert sum(t.protocol == "autoshard" for t in a) == n_auto


def test_round_trip(tmp_path, features, params):
    tasks, train, test = make_tasks(features, params["tasks"], seed=0)
    save_tasks(tmp_path / "tasks.json", tasks, train, test, seed=0)
    back, back_train, back_test = load_tasks(tmp_path / "tasks.json")
    assert back == tasks
    assert np.array_equal(back_train, train) and np.array_equal(back_test, test)


def test_first_fit_decreasing():
    assert first_fit_decreasing(np.array([5, 4, 3]), devices=2, capacity=7).tolist() == [0, 1, 1]
    assert first_fit_decreasing(np.array([5, 5, 5]), devices=2, capacity=7) is None


def test_cap_below_largest_table(features, params):
    params["tasks"]["dreamshard"]["memory_per_device_gib"] = 1e-6
    with pytest.raises(ConfigError, match=r"tasks.dreamshard.memory_per_device_gib: .*largest table"):
        make_tasks(features, params["tasks"], seed=0)


def test_cap_that_no_draw_satisfies(features, params):
    largest = features["size_bytes"].max() / 2**30
    params["tasks"]["dreamshard"] |= {"memory_per_device_gib": largest * 1.0001, "devices": 1,
                                      "tables": 6}
    params["tasks"]["max_draws"] = 3
    with pytest.raises(ConfigError, match=r"memory_per_device_gib: .*no feasible task .* in 3 draws"):
        make_tasks(features, params["tasks"], seed=0)


def test_more_tables_than_the_pool(features, params):
    params["tasks"]["autoshard"]["tables"] = len(features)
    with pytest.raises(ConfigError, match=r"tasks.autoshard.tables: \d+ \(more than the \d+ tables"):
        make_tasks(features, params["tasks"], seed=0)


def test_unreadable_task_file(tmp_path):
    (tmp_path / "t.json").write_text("{}")
    with pytest.raises(ConfigError, match="t.json: not a task file"):
        load_tasks(tmp_path / "t.json")
    with pytest.raises(ConfigError, match="task file not found"):
        load_tasks(tmp_path / "missing.json")

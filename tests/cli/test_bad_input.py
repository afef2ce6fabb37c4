"""Invalid parameters give one clear error naming the parameter and its value."""

import pytest

from autoshard.core.errors import ConfigError
from autoshard.core.params import Fields, load_params, merge
from autoshard.data.pool import build_pool
from autoshard.data.tasks import TaskConfig, make_tasks


@pytest.mark.parametrize(("key", "value", "message"), [
    ("num_tables", 0, r"pool.num_tables: 0 \(must be at least 1\)"),
    ("num_tables", -3, r"pool.num_tables: -3"),
    ("batch_size", 0, r"pool.batch_size: 0"),
    ("batch_size", 2.5, r"pool.batch_size: 2.5 \(expected an integer\)"),
    ("dims", [16, 18], r"pool.dims\[1\]: 18 \(not a multiple of 4"),
    ("dims", [], r"pool.dims: \[\] \(expected a non-empty list\)"),
    ("rows_min", 0, r"pool.rows_min: 0"),
    ("rows_min", 10**7, r"pool.rows_min: 10000000 \(above pool.rows_max"),
    ("pooling_factor_mean", 0, r"pool.pooling_factor_mean: 0 \(must be above 0\)"),
    ("pooling_factor_mean", "lots", r"pool.pooling_factor_mean: 'lots' \(expected a number\)"),
    ("uniform_share", 1.5, r"pool.uniform_share: 1.5 \(must be at most 1\)"),
    ("num_table", 5, r"pool.num_table: 5 \(unknown parameter\)"),
])
def test_bad_pool_parameter(params, key, value, message):
    params["pool"][key] = value
    with pytest.raises(ConfigError, match=message):
        build_pool(params["dataset"], params["pool"], seed=0, progress=False)


def test_missing_pool_parameter(params):
    del params["pool"]["rows_max"]
    with pytest.raises(ConfigError, match=r"pool.rows_max: missing"):
        build_pool(params["dataset"], params["pool"], seed=0, progress=False)


def test_unknown_source(params):
    params["dataset"]["source"] = "criteo"
    with pytest.raises(ConfigError, match=r"dataset.source: 'criteo' \(expected one of synthetic, dlrm\)"):
        build_pool(params["dataset"], params["pool"], seed=0, progress=False)


@pytest.mark.parametrize(("path", "value", "message"), [
    (("autoshard", "devices"), 0, r"tasks.autoshard.devices: 0"),
    (("autoshard", "tables"), -1, r"tasks.autoshard.tables: -1"),
    (("dreamshard", "memory_per_device_gib"), 0, r"tasks.dreamshard.memory_per_device_gib: 0"),
    (("autoshard", "unseen_ratios"), [0.5, 2], r"tasks.autoshard.unseen_ratios\[1\]: 2"),
])
def test_bad_task_parameter(params, path, value, message):
    node = params["tasks"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ConfigError, match=message):
        TaskConfig.from_params(params["tasks"])


def test_train_share_that_empties_a_pool(params):
    features = build_pool(params["dataset"], params["pool"], seed=0, progress=False).features
    params["tasks"]["train_share"] = 1.0
    with pytest.raises(ConfigError, match=r"tasks.train_share: 1.0 \(leaves an empty train or test"):
        make_tasks(features, params["tasks"], seed=0)


def test_section_must_be_a_mapping():
    with pytest.raises(ConfigError, match=r"pool: \[1, 2\] \(expected a mapping\)"):
        Fields("pool", [1, 2])


def test_params_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="parameter file not found"):
        load_params(tmp_path / "missing.yaml")
    (tmp_path / "p.yaml").write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping of parameters"):
        load_params(tmp_path / "p.yaml")
    (tmp_path / "q.yaml").write_text("pool: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_params(tmp_path / "q.yaml")


def test_merge_is_deep():
    assert merge({"a": {"b": 1, "c": 2}, "d": 3}, {"a": {"b": 5}}) == {"a": {"b": 5, "c": 2}, "d": 3}


def test_paper_scale_parameters_are_valid():
    """Dry validation of configs/paper.yaml: every section it touches passes the checks."""
    from pathlib import Path

    from autoshard.data.synth import PoolConfig
    from autoshard.pipeline.stage import select, stage_spec
    from autoshard.studies.evaluate import EvaluateConfig

    root = Path(__file__).resolve().parents[2]
    paper = merge(load_params(root / "params.yaml"), load_params(root / "configs" / "paper.yaml"))
    pool = PoolConfig.from_params(paper["pool"])
    tasks = TaskConfig.from_params(paper["tasks"])
    assert pool.batch_size == 65536 and pool.num_tables == 856
    largest = pool.rows_max * max(pool.dims) * pool.weight_bytes
    assert all(p.memory_bytes >= largest for p in tasks.protocols)
    # The device is checked when the stage runs (this machine may have no GPU); the rest now.
    chosen = select(paper, stage_spec("evaluate", root / "dvc.yaml")[1], "paper")
    evaluate = EvaluateConfig.from_params(chosen["evaluate"], chosen["profile"] | {"device": "cpu"}, chosen["rl"])
    by_name = {p.name: p for p in tasks.protocols}
    assert evaluate.autoshard_tasks_per_ratio == by_name["autoshard"].test_tasks
    assert evaluate.dreamshard_tasks == by_name["dreamshard"].test_tasks


def test_overrides_for_dvc_exp_run(tmp_path, capsys):
    from autoshard.core.params import main

    (tmp_path / "o.yaml").write_text("pool:\n  dims: [16, 32]\n  batch_size: 8\nseed: 3\n")
    assert main(["overrides", str(tmp_path / "o.yaml")]) == 0
    assert capsys.readouterr().out.split() == ["-S", "pool.dims=[16,32]", "-S", "pool.batch_size=8",
                                               "-S", "seed=3"]

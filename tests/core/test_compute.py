"""The execution layer: every engine returns the same results, in job order, as this process
would; bad `compute` parameters are one clear error."""

import sys

import numpy as np
import pandas as pd
import pytest
import torch
from study_configs import study

from autoshard.core.compute import ComputeConfig, LocalEngine, RayEngine, make_engine, measuring_engine
from autoshard.core.errors import ConfigError
from autoshard.costmodel.model import CostModel, CostModelConfig, save_model
from autoshard.data.features import feature_matrix
from autoshard.data.pool import build_pool
from autoshard.data.tasks import Task
from autoshard.rl.ppo import RLConfig
from autoshard.studies.ablation import Job, run_job

TOY = study(RLConfig, iterations=2, tasks_per_batch=4, validate_every=2, checkpoint_every=2, epochs=1, minibatches=1)
COMPUTE = {"engine": "local", "workers": 2, "address": None, "gpus_per_job": 0, "measure_workers": 1}


@pytest.fixture(scope="module")
def world(smoke_params, tmp_path_factory):
    """A pool, its feature matrix, a saved cost model and four training tasks."""
    pool = build_pool(smoke_params["dataset"], smoke_params["pool"], seed=0, progress=False)
    features = feature_matrix(pool.features)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("compute") / "cost_model.pt"
    save_model(CostModel.fitted_to(study(CostModelConfig), features, scale=1.0), path)
    g = np.random.default_rng(0)
    sizes = pool.features["size_bytes"].to_numpy()
    tasks = []
    for k in range(4):
        ids = tuple(sorted(g.choice(pool.num_tables, 8, replace=False).tolist()))
        tasks.append(Task(f"t/{k}", "test", "train", ids, 2, int(sizes[list(ids)].sum() + sizes.max()), 0.0))
    return features, str(path), tuple(tasks)


def training_runs(world, folder) -> list[Job]:
    """Two seeds of one toy ablation variant, checkpointed under `folder`."""
    features, model, tasks = world
    return [Job("full", s, TOY, model, features, tasks, str(folder / f"seed_{s}.pt")) for s in (0, 1)]


def histories(engine, world, folder) -> list[pd.DataFrame]:
    return [pd.DataFrame(rows) for rows in engine.map(run_job, training_runs(world, folder))]


def assert_same(a: list[pd.DataFrame], b: list[pd.DataFrame]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        pd.testing.assert_frame_equal(x, y)


def test_local_engine_gives_the_same_runs_in_job_order_with_one_or_two_workers(world, tmp_path):
    one = histories(LocalEngine(1), world, tmp_path / "one")
    two = histories(LocalEngine(2), world, tmp_path / "two")
    assert_same(one, two)
    assert not one[0].equals(one[1]), "the seeds differ, so job order is visible"
    assert LocalEngine(2).map(abs, [-3, 1, -2]) == [3, 1, 2]


def test_ray_engine_on_a_local_instance_gives_the_local_engine_results(world, tmp_path):
    pytest.importorskip("ray", reason="Ray is optional (requirements.lock pins ray==2.52.0)")
    engine = RayEngine(num_cpus=2)
    try:
        on_ray = histories(engine, world, tmp_path / "ray")
    finally:
        engine.close()
    assert_same(on_ray, histories(LocalEngine(1), world, tmp_path / "local"))


def test_ray_engine_refuses_in_one_line_without_ray(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ConfigError, match=r"^compute\.engine: ray \(Ray is not installed"):
        make_engine(ComputeConfig.from_params(COMPUTE | {"engine": "ray"}))


def test_compute_params_are_checked_by_name():
    assert make_engine(ComputeConfig.from_params(COMPUTE)).workers == 2
    bad = [({"engine": "spark"}, r"compute\.engine: .*spark.*expected one of local, ray"),
           ({"workers": 0}, r"compute\.workers: 0 .*at least 1"),
           ({"address": "ray://head:10001"}, r"compute\.address: .*needs compute\.engine: ray"),
           ({"address": 5, "engine": "ray"}, r"compute\.address: 5 .*string or null"),
           ({"gpus_per_job": 1}, r"compute\.gpus_per_job: .*only with compute\.engine: ray"),
           ({"gpus_per_job": -1, "engine": "ray"}, r"compute\.gpus_per_job: -1 .*at least 0"),
           ({"measure_workers": 0}, r"compute\.measure_workers: 0 .*at least 1"),
           ({"threads": 2}, r"compute\.threads: 2 .*unknown parameter")]
    for change, message in bad:
        with pytest.raises(ConfigError, match=message):
            ComputeConfig.from_params(COMPUTE | change)
    assert measuring_engine(ComputeConfig.from_params(COMPUTE)) is None, "measuring stays in the stage's process"
    assert measuring_engine(ComputeConfig.from_params(COMPUTE | {"measure_workers": 2})).workers == 2
    with pytest.raises(ConfigError, match=r"compute\.workers: missing"):
        ComputeConfig.from_params({k: v for k, v in COMPUTE.items() if k != "workers"})


def test_replicates_train_the_same_on_any_engine_and_land_in_their_folders(world, tmp_path, smoke_params):
    from dataclasses import replace

    from autoshard.placement.heuristics import heuristic_plans
    from autoshard.rl.ppo import RLStageConfig
    from autoshard.rl.replicates import train_replicates

    features, model, tasks = world
    pool = build_pool(smoke_params["dataset"], smoke_params["pool"], seed=0, progress=False)
    train_tasks, val_tasks = list(tasks[:3]), list(tasks[3:])
    heuristics = heuristic_plans(pool.features, val_tasks, 0)
    cfg = replace(RLStageConfig.from_params(smoke_params["rl"]), train=TOY)

    def run(engine, folder):
        return train_replicates([model, model], features, train_tasks, val_tasks, heuristics, cfg, 0, folder / "work",
                                [folder / "r1", folder / "r2"], engine)

    here = run(None, tmp_path / "here")
    assert_same(here, run(LocalEngine(2), tmp_path / "two"))
    assert not here[0].equals(here[1]), "replicates train from different seeds"
    assert here[0]["val_ratio"].notna().any(), "validated as the stage's own run"
    assert (tmp_path / "two" / "r2" / "policy.pt").is_file() and (tmp_path / "two" / "r2" / "cost_model.pt").is_file()

"""Refresh rounds: the policy's plans measured (once, through the store), the cost model refitted
on the grown profile, the policy trained on."""

import numpy as np
import pandas as pd
import torch
from study_configs import study

from autoshard.costmodel.model import CostModel, CostModelConfig
from autoshard.data.features import feature_matrix
from autoshard.data.pool import build_pool
from autoshard.rl.policy import Policy

from helpers import tasks_of


def test_refresh_round_measures_plans_and_refits(tmp_path, smoke_params):
    """One refresh round with the analytic backend: the policy's unmeasured device shards are
    measured, the cost model is refitted on the grown profile, and the policy trains on."""
    from autoshard.costmodel.model import save_model
    from autoshard.data.tasks import make_tasks, save_tasks
    from autoshard.measure.collect import ProfileConfig, collect, plan_jobs, save_profile
    from autoshard.rl.ppo import RLStageConfig, split_validation
    from autoshard.rl.refresh import refresh_rounds

    params = smoke_params | {"profile": smoke_params["profile"] | {"backend": "analytic"}}
    pool = build_pool(params["dataset"], params["pool"], seed=0, progress=False)
    tasks, train_tables, test_tables = make_tasks(pool.features, params["tasks"], seed=0)
    save_tasks(tmp_path / "tasks.json", tasks, train_tables, test_tables, seed=0)
    cfg = ProfileConfig.from_params(params["profile"])
    from autoshard.measure.backends import make_backend
    from autoshard.placement.heuristics import every_plan

    jobs = plan_jobs(pool, tasks, train_tables, cfg, 0, test_tables, lambda task: every_plan(pool.features, task, 0))
    save_profile(collect(pool, jobs, make_backend(pool, cfg.backend), cfg, tmp_path / "w", progress=False),
                 tmp_path / "profile")
    features = feature_matrix(pool.features)
    torch.manual_seed(0)
    model = CostModel.fitted_to(study(CostModelConfig), features)
    rl = RLStageConfig.from_params(params["rl"])
    train_tasks, _ = split_validation(tasks, rl.validation_tasks)
    policy = Policy(rl.train.policy, model)
    new_policy, new_model, summary = refresh_rounds(policy, model, pool, train_tasks, params, rl, tmp_path,
                                                    tmp_path / "refresh", None, seed=0)
    assert summary["round"].tolist() == [1] and summary["shards_measured"].iloc[0] > 0
    assert np.isfinite(summary["model_mape_on_them_before_refit"].iloc[0])
    assert not torch.equal(new_model.head[0].weight, model.head[0].weight)
    assert (tmp_path / "refresh" / "round_1.pt").exists()
    save_model(new_model, tmp_path / "m.pt")
    assert new_policy is not policy
    assert len(list((tmp_path / "refresh").glob("*/round_1.pt"))) == 1, "the round trains in a keyed folder"
    torch.manual_seed(1)
    refresh_rounds(Policy(rl.train.policy, model), model, pool, train_tasks, params, rl, tmp_path,
                   tmp_path / "refresh", None, seed=0)
    assert len(list((tmp_path / "refresh").glob("*/round_1.pt"))) == 2, "another start policy is another run"


def test_refresh_measures_through_the_store(tmp_path, world, smoke_params):
    """The plans' new shards are measured once into the measurement store: the same call again
    measures nothing and returns the same rows, numbered after the profile's last shard."""
    from autoshard.measure.backends import make_backend
    from autoshard.measure.collect import ProfileConfig
    from autoshard.rl.refresh import measure_plans

    pool, _, _ = world
    cfg = ProfileConfig.from_params(smoke_params["profile"] | {"backend": "analytic"})
    backend = make_backend(pool, cfg.backend)
    calls = []
    measure = backend.measure
    backend.measure = lambda *args: calls.append(args) or measure(*args)
    tasks = tasks_of(pool, 3, 6, 2)
    plans = [np.arange(len(t.tables)) % t.devices for t in tasks]
    profile = pd.DataFrame({"shard_id": [0, 7], "tables": [[tasks[0].tables[0]], [tasks[0].tables[1]]]})

    def rows() -> pd.DataFrame:
        return measure_plans(pool, tasks, plans, profile, backend, cfg, tmp_path / "measurements", 1, seed=0)

    first = rows()
    assert calls and len(first) == 6 and first["shard_id"].tolist() == list(range(8, 14))
    assert set(first["status"]) == {"ok"} and np.isfinite(first["total_ms"]).all()
    assert (first["kind"] == "refresh_1").all()
    calls.clear()
    again = rows()
    assert not calls, "a rerun reads the store"
    pd.testing.assert_frame_equal(first, again)
    known = pd.concat([profile, first], ignore_index=True)
    assert measure_plans(pool, tasks, plans, known, backend, cfg, tmp_path / "measurements", 2, seed=0).empty

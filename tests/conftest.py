"""Shared fixtures: smoke-sized parameters, the repository root, and metrics files as the
stages' builders write them."""

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from study_configs import study

from autoshard.core.params import load_params, merge

ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(items: list) -> None:
    """The files holding `slow` tests (the pipeline, the notebooks) first, each file's tests in
    their order: `make test` spreads whole files over its workers in this order (`--dist
    loadfile --no-loadscope-reorder`), so the longest start at once instead of ending the run alone."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


@pytest.fixture(scope="session")
def smoke_params() -> dict:
    """params.yaml with configs/smoke.yaml merged over it."""
    return merge(load_params(ROOT / "params.yaml"), load_params(ROOT / "configs" / "smoke.yaml"))


@pytest.fixture(scope="session")
def pool(smoke_params):
    """The smoke-sized synthetic pool (seed 0); a test module may define its own."""
    from autoshard.data.pool import build_pool

    return build_pool(smoke_params["dataset"], smoke_params["pool"], seed=0, progress=False)


@pytest.fixture(scope="session")
def features(pool):
    """The smoke pool's feature matrix (tables x 21); a test module may define its own."""
    from autoshard.data.features import feature_matrix

    return feature_matrix(pool.features)


@pytest.fixture(scope="module")
def world(pool, features):
    """The smoke pool, its features and an untrained cost model whose costs add up (a known,
    learnable simulator)."""
    import torch

    from autoshard.costmodel.model import CostModel, CostModelConfig

    torch.manual_seed(0)
    return pool, features, CostModel.fitted_to(study(CostModelConfig), features, scale=1.0)


@pytest.fixture
def params(smoke_params) -> dict:
    """A fresh, mutable copy of the smoke parameters for one test."""
    return copy.deepcopy(smoke_params)


def _as_written(metrics: dict) -> dict:
    """What a reader of the metrics file gets: strict JSON of the plain values."""
    from autoshard.core.metrics import _plain

    return json.loads(json.dumps(_plain(metrics), allow_nan=False))


@pytest.fixture(scope="session")
def transfer_metrics() -> dict:
    """transfer.json as the transfer stage writes it, from measured ratios of two axis points."""
    from autoshard.studies import transfer

    g = np.random.default_rng(0)
    rows = [{"axis": "tables", "value": v, "task": f"t{v}/{k}", "method": m, "ratio": g.uniform(0.8, 1.1),
             "predicted_ratio": 0.9, "measured_ms": 1.0}
            for v in (10, 320) for k in range(4) for m in ("rl_greedy", "cost_greedy", "size_greedy")]
    table = transfer.summary(pd.DataFrame(rows), 200, 0)
    return _as_written(transfer.transfer_metrics(table, tasks_measured=8, shards_measured=20, seconds=30.0))


@pytest.fixture(scope="session")
def ablation_metrics(smoke_params) -> dict:
    """ablation.json as the ablation stage writes it, from measured plans of two variants, three seeds."""
    from autoshard.studies import ablation

    rows = [{"task": f"t{k}", "method": f"{v}|{s}", "measured_ms": base + 0.01 * s + 0.001 * k}
            for v, base in (("full", 0.9), ("no_lstm", 0.95)) for s in (0, 1, 2) for k in range(4)]
    rows += [{"task": f"t{k}", "method": h, "measured_ms": 1.0} for k in range(4) for h in ("size_greedy", "naive")]
    cfg = ablation.AblationConfig.from_params(smoke_params["ablation"] | {"variants": ["full", "no_lstm"], "seeds": 3},
                                              smoke_params["rl"], smoke_params["profile"] | {"device": "cpu"},
                                              {"timing": smoke_params["evaluate"]["timing"]})
    frame = pd.DataFrame(rows)
    predicted = frame.set_index(["task", "method"])["measured_ms"]  # a prediction that agrees with the pass
    table = ablation.summary(ablation.ratios(frame, predicted), cfg.labels())
    return _as_written(ablation.ablation_metrics(table, cfg, 0, test_tasks=4, shards_measured=12, seconds=40.0))


USER_TABLES = """name,rows,dim,pooling_factor
a,5000,64,8
b,2000,16,2
c,300,16,1
d,1000,32,3
"""


@pytest.fixture(scope="session")
def user_pool(tmp_path_factory):
    """Four tables as a user writes them (a, 64 columns, the costliest), as a pool: the column tests'."""
    from autoshard.cli.user_tables import read_tables
    from autoshard.data.pool import Pool

    path = tmp_path_factory.mktemp("columns") / "tables.csv"
    path.write_text(USER_TABLES)
    tables = read_tables(path)
    return Pool(features=tables.features, traces=tables.traces)


@pytest.fixture(scope="session")
def user_models(tmp_path_factory) -> dict:
    """A table list (`helpers.MODEL_TABLES`) and a tiny cost model and policy trained for a few
    steps on it: the command's and the TorchRec components' learned methods."""
    from study_configs import study

    from autoshard.cli.user_tables import read_tables
    from autoshard.costmodel.model import CostModel, CostModelConfig, save_model
    from autoshard.data.features import feature_matrix
    from autoshard.data.tasks import Task
    from autoshard.rl.policy import PolicyConfig
    from autoshard.rl.ppo import RLConfig, train

    from helpers import MODEL_TABLES

    root = tmp_path_factory.mktemp("cli")
    tables_csv = root / "tables.csv"
    tables_csv.write_text(MODEL_TABLES)
    x = feature_matrix(read_tables(tables_csv).features)
    model = CostModel.fitted_to(study(CostModelConfig, hidden=16, encoding=8, head_hidden=8), x, scale=1.0)
    save_model(model, root / "cost_model.pt")
    tasks = [Task(f"t{k}", "user", "train", tuple(range(8)), 2, 2**30, 0.0) for k in range(4)]
    cfg = study(RLConfig, policy=study(PolicyConfig, hidden=8, lstm_layers=1), iterations=2, tasks_per_batch=2)
    train(model, x, tasks, cfg, 0, root / "policy.pt", progress=False)
    return {"root": root, "tables": tables_csv, "model": root / "cost_model.pt", "policy": root / "policy.pt"}

"""Exploratory: local search under a random cost model from random starts, 30 tasks per shape.

Run from a checkout (its src on PYTHONPATH, its tests folder as TESTS), e.g.
    TESTS=tests PYTHONPATH=src .venv/bin/python docs/wip/search_bench.py
to compare two versions' mean predicted bottleneck reached and the seconds the search took.
"""

import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.environ.get("TESTS", "tests"))
from study_configs import study  # noqa: E402

import autoshard.placement.search as search  # noqa: E402
from autoshard.costmodel.model import CostModel, CostModelConfig  # noqa: E402
from autoshard.data.tasks import Task  # noqa: E402
from autoshard.placement.shards import predicted_bottleneck  # noqa: E402

torch.set_num_threads(1)
place = search.model_search if hasattr(search, "model_search") else search.local_search  # before: local_search
g = np.random.default_rng(0)
n_all = 400
rows, dims = g.integers(100, 10**6, n_all), g.choice([16, 32], n_all)
x = np.column_stack([dims, rows, g.uniform(1, 50, n_all), rows * dims * 4, g.dirichlet(np.ones(17), n_all)])
torch.manual_seed(0)
model = CostModel.fitted_to(study(CostModelConfig), x)
for n, devices in ((40, 4), (80, 8), (24, 8)):
    reached, seconds = [], 0.0
    for _ in range(30):
        ids = np.sort(g.choice(n_all, n, replace=False))
        sizes = x[ids, 3]
        cap = int(sizes.max() + 1.5 * sizes.sum() / devices)
        task = Task("t", "u", "test", tuple(int(i) for i in ids), devices, cap, 1.0)
        start = g.integers(0, devices, n)
        clock = time.perf_counter()
        plan = place(model, x, task, start)
        seconds += time.perf_counter() - clock
        reached.append(predicted_bottleneck(model, x, task, plan))
    print(f"{n} tables on {devices} devices: mean predicted bottleneck {np.mean(reached):.5f}, {seconds:.2f} s")

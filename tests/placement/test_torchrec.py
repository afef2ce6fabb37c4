"""TorchRec's planner: the machine it plans for and the memory it counts (the study's one accounting)."""

import numpy as np
import pytest

from autoshard.core.errors import ConfigError
from autoshard.data.tasks import Task, tight_tasks
from autoshard.placement.heuristics import heuristic_plan
from autoshard.placement.shards import memory_ok
from autoshard.placement.torchrec import enumerator, planner_inputs, torchrec_plan

BATCH = 2048  # the study's training batch (profile.batch_size): the buffers TorchRec would count grow with it


def storages(features, task, compute_device="cpu") -> dict[str, list]:
    """TorchRec's storage estimate of each table-wise shard, by table name."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    ebc, topology, constraints = planner_inputs(features, task, compute_device=compute_device)
    options = enumerator(topology, constraints, BATCH // task.devices).enumerate(ebc, [EmbeddingBagCollectionSharder()])
    return {o.name: [s.storage for s in o.shards] for o in options}


@pytest.mark.parametrize("compute_device", ["cpu", "cuda"])
def test_torchrecs_storage_of_a_table_is_its_size_bytes_exactly(pool, compute_device):
    sizes = pool.features["size_bytes"].to_numpy()
    task = Task("all", "test", "test", tuple(range(pool.num_tables)), 4, int(sizes.sum()), 0.0)
    found = storages(pool.features, task, compute_device)
    memory, other = ("ddr", "hbm") if compute_device == "cpu" else ("hbm", "ddr")
    for t in task.tables:
        (storage,) = found[f"table_{t}"]
        assert getattr(storage, memory) == sizes[t], f"table {t}"
        assert getattr(storage, other) == 0


def test_torchrec_fits_wherever_random_fits(pool, smoke_params):
    sizes = pool.features["size_bytes"].to_numpy()
    tasks = tight_tasks(pool.features, smoke_params["tasks"], seed=0)
    # and the tightest cap: the largest device of a random placement under a loose one
    loose = Task("loose", "test", "test", tuple(range(12)), 3, int(sizes[:12].sum()), 0.0)
    used = np.bincount(heuristic_plan("random", pool.features, loose, 0), weights=sizes[:12], minlength=3)
    tasks.append(Task("snug", "test", "test", loose.tables, 3, int(used.max()), 0.0))
    checked = 0
    for task in tasks:
        if not memory_ok(task, heuristic_plan("random", pool.features, task, 0), sizes):
            continue
        assert memory_ok(task, torchrec_plan(pool.features, task, BATCH), sizes), task.name
        checked += 1
    assert checked >= 2


def test_torchrec_returns_a_complete_valid_map(pool):
    sizes = pool.features["size_bytes"].to_numpy()
    task = Task("tr", "test", "test", tuple(range(12)), 3, int(sizes[:12].sum()), 0.0)
    plan = torchrec_plan(pool.features, task, 256)
    assert plan.shape == (12,) and set(plan.tolist()) <= {0, 1, 2}
    assert memory_ok(task, plan, sizes)
    assert len(set(plan.tolist())) > 1, "12 tables with room everywhere should spread"


def test_torchrec_refusal_names_the_task(pool):
    sizes = pool.features["size_bytes"].to_numpy()
    task = Task("tight", "test", "test", (0, 1, 2), 2, int(sizes[[0, 1, 2]].max()) // 2, 0.0)
    with pytest.raises(ConfigError, match="task tight: TorchRec's planner found no plan"):
        torchrec_plan(pool.features, task, 256)


def test_an_unknown_compute_device_is_refused(pool):
    task = Task("t", "test", "test", (0, 1), 2, 10**12, 0.0)
    with pytest.raises(ConfigError, match="compute_device: 'tpu'"):
        torchrec_plan(pool.features, task, BATCH, compute_device="tpu")

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


def _blocks_plan():
    """Four tables in two modules: whole, column-wise, row-wise over every rank, and table-row-wise
    on the second host of two; a sequence table in a module of its own."""
    import pandas as pd

    from autoshard.core.inputs import Block
    from autoshard.data.footprint import row_split
    from autoshard.data.sizes import table_bytes

    rows, dims = [10, 100, 1001, 64, 5], [8, 16, 8, 8, 16]
    sizes = [table_bytes(r, d, 4) for r, d in zip(rows, dims, strict=True)]
    f = pd.DataFrame({"rows": rows, "dim": dims, "size_bytes": sizes, "sequence": [False] * 4 + [True]})
    names = ["top.a", "top.b", "top.c", "d", "seq.e"]
    split = row_split(1001, 4)
    blocks = {"top.a": [Block(0, None, 0, None, 1)],
              "top.b": [Block(0, None, 0, 8, 3), Block(0, None, 8, 8, 0)],
              "top.c": [Block(sum(split[:i]), n, 0, None, i) for i, n in enumerate(split)],
              "d": [Block(0, 32, 0, None, 2), Block(32, 32, 0, None, 3)],
              "seq.e": [Block(0, 2, 0, None, 0), Block(2, 2, 0, None, 1), Block(4, 1, 0, None, 2),
                        Block(5, 0, 0, None, 3)]}
    kinds = {"top.b": "column_wise", "top.c": "row_wise", "d": "table_row_wise", "seq.e": "row_wise"}
    return f, names, blocks, kinds


def test_any_plans_blocks_export_to_torchrec_and_read_back_the_same(tmp_path):
    from autoshard.core.inputs import plan_blocks
    from autoshard.placement.torchrec import block_sharding_plan, plan_to_json

    f, names, blocks, kinds = _blocks_plan()
    kinds_all = {n: kinds.get(n, "table_wise") for n in names}
    plan = block_sharding_plan(f, names, blocks, kinds, 4, local_size=2, device_type="cpu")
    assert sorted(plan.plan) == ["", "seq", "top"]
    assert plan.plan["top"]["c"].sharding_type == "row_wise" and plan.plan[""]["d"].ranks == [2, 3]
    assert {p.compute_kernel for m in plan.plan.values() for p in m.values()} == {"fused"}
    doc = plan_to_json(plan, 4, "cpu")
    back = plan_blocks(doc, tmp_path / "p.json")
    assert back.blocks == blocks and back.kinds == kinds_all and back.devices == 4
    assert back.shapes == {n: [int(r), int(d)] for n, r, d in zip(names, f["rows"], f["dim"], strict=True)}


def test_an_export_unlike_torchrecs_split_or_module_rules_is_refused():
    from autoshard.core.inputs import Block
    from autoshard.placement.torchrec import block_sharding_plan

    f, names, blocks, kinds = _blocks_plan()
    uneven = dict(blocks, **{"top.c": [Block(0, 500, 0, None, 0), Block(500, 501, 0, None, 1),
                                       Block(1001, 0, 0, None, 2), Block(1001, 0, 0, None, 3)]})
    with pytest.raises(ConfigError, match="not TorchRec's row_wise split"):
        block_sharding_plan(f, names, uneven, kinds, 4, local_size=2, device_type="cpu")
    with pytest.raises(ConfigError, match="table_row_wise shards of a sequence table"):
        block_sharding_plan(f, names, blocks, dict(kinds, **{"seq.e": "table_row_wise"}), 4, 2, "cpu")
    mixed = ["top.a", "top.b", "top.c", "d", "top.e"]
    with pytest.raises(ConfigError, match="a sequence table in module 'top'"):
        block_sharding_plan(f, mixed, {m: blocks[n] for m, n in zip(mixed, names, strict=True)}, {}, 4, 2, "cpu")
    two = f.assign(sequence=True)
    with pytest.raises(ConfigError, match="share one dim"):
        block_sharding_plan(two, names, blocks, {}, 4, 2, "cpu")


def test_a_gpu_plan_of_several_hosts_places_each_rank_on_its_hosts_gpu(tmp_path):
    from autoshard.core.inputs import plan_blocks
    from autoshard.placement.torchrec import block_sharding_plan, plan_to_json

    f, names, blocks, kinds = _blocks_plan()
    doc = plan_to_json(block_sharding_plan(f, names, blocks, kinds, 4, local_size=2, device_type="cuda"), 4, "cuda")
    placements = {s["placement"] for m in doc["modules"].values() for p in m.values() for s in p["shards"]}
    assert {"rank:2/cuda:0", "rank:3/cuda:1"} <= placements and "rank:3/cuda:3" not in placements
    assert plan_blocks(doc, tmp_path / "p.json").blocks == blocks
    doc["modules"][""]["d"]["shards"][1]["placement"] = "rank:3/cuda:3"
    with pytest.raises(ConfigError, match=r"field placement: 'rank:3/cuda:.' \(expected .*ranks fill hosts of"):
        plan_blocks(doc, tmp_path / "p.json")


def test_hosts_whose_last_gpu_holds_nothing_are_still_hosts_of_their_size():
    """An export says no host size; 26 tables on 32 ranks of 8 may leave every cuda:7 unused: the
    reader takes the smallest size the placements agree with, not the highest GPU seen plus one."""
    from autoshard.core.inputs import _host_size

    used = [(rank, rank % 8, f"rank:{rank}/cuda:{rank % 8}") for rank in range(32) if rank % 8 != 7]
    assert _host_size(used, 32) == 8
    assert _host_size([(0, 0, ""), (1, 1, ""), (4, 0, ""), (6, 2, "")], 8) == 4
    assert _host_size([(0, 0, ""), (3, 1, "")], 4) == 2 and _host_size([(1, 0, "")], 4) == 1

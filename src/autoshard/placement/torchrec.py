"""TorchRec's planner as a baseline: plan a task table-wise on a meta-device EmbeddingBagCollection.

TorchRec plans for the machine that measures: `compute_device="cpu"` by default (every plan of
the study is measured on CPU: FBGEMM's CPU TBE, fp32, EXACT_ROWWISE_ADAGRAD fused into the
backward), D devices with the task's memory cap each as DDR (no HBM; the CPU kernels' bandwidth
is TorchRec's DDR one) and no storage reservation; "cuda" plans for GPUs, the cap as HBM. Every
table is constrained to table-wise sharding (column-wise too for `torchrec_column_plan`), the
FUSED kernel (the one TorchRec allows on CPU besides data-parallel DENSE, and on CUDA the one
keeping the whole table in device memory, as every other method assumes) and its pooling factor.

Memory: TorchRec must see the study's one accounting, `data.sizes.table_bytes` (weights plus
row-wise Adagrad's state, the pool's `size_bytes`). Its storage estimate of a table-wise shard
(`torchrec/distributed/planner/shard_estimators.py`, `calculate_shard_storages`) is the weights,
plus the optimizer state of the parameter's `_optimizer_classes` (`_get_optimizer_multipler`:
`RowWiseAdagrad` adds weights / dim, one element per row; no optimizer adds nothing), plus on CPU
the batch's input indices and pooled outputs (on CUDA the same, as pipeline IO). So the tables
get the pool's weight precision and row-wise Adagrad (`_apply_optimizer_in_backward`, what
TorchRec fuses into the backward, as the measured operator), and the storage estimator, alone,
plans for a batch of 0: the per-batch buffers are activations sized by the batch rather than
state held by the table, which no other method's memory check and no backend's `shard_bytes`
counts. TorchRec's estimate of a whole table then equals its `size_bytes` exactly in fp32 (in
fp16 TorchRec counts the state in fp16, 2 bytes a row fewer than the fp32 state FBGEMM keeps).
The perf estimator still sees the real batch. The plan is read back as a table -> device map.
"""

import dataclasses
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from autoshard.core.errors import ConfigError
from autoshard.data.sizes import ROW_STATE_BYTES
from autoshard.data.tasks import Task


def table_name(table: int) -> str:
    return f"table_{table}"


def torchrec_plan(features: pd.DataFrame, task: Task, batch_size: int, compute_device: str = "cpu") -> np.ndarray:
    """Device per entry of `task.tables` chosen by TorchRec's `EmbeddingShardingPlanner`."""
    shardings = _planned(features, task, batch_size, None, compute_device)
    return np.array([shardings[table_name(t)].ranks[0] for t in task.tables], dtype=np.int64)


def torchrec_column_plan(features: pd.DataFrame, task: Task, batch_size: int, ways: int,
                         compute_device: str = "cpu") -> list[tuple[int, int, int, int]]:
    """TorchRec's planner with column-wise sharding allowed too (column shards of dim / `ways`
    columns, TorchRec's `min_partition`, where that is a multiple of 4): (pool table, first
    column, width) and the rank, per column shard, as `(table, start, width, rank)` tuples."""
    shardings = _planned(features, task, batch_size, ways, compute_device)
    out = []
    for t in task.tables:
        p = shardings[table_name(t)]
        for shard, rank in zip(p.sharding_spec.shards, p.ranks, strict=True):
            out.append((int(t), int(shard.shard_offsets[1]), int(shard.shard_sizes[1]), int(rank)))
    return out


def planner_inputs(features: pd.DataFrame, task: Task, column_ways: int | None = None, compute_device: str = "cpu"):
    """What TorchRec plans `task` from: the meta-device `EmbeddingBagCollection` of its tables
    (row-wise Adagrad attached), its topology and its per-table constraints (table-wise only, or
    also column-wise with blocks of dim / `column_ways` columns)."""
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.planner import ParameterConstraints, Topology
    from torchrec.distributed.types import ShardingType
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim import RowWiseAdagrad

    if compute_device not in ("cpu", "cuda"):
        raise ConfigError(f"compute_device: {compute_device!r} (expected 'cpu' or 'cuda')")
    for name in ("torchrec", "torchrec.distributed.planner"):
        logging.getLogger(name).setLevel(logging.ERROR)
    rows = features.iloc[list(task.tables)]
    ebc = EmbeddingBagCollection(tables=embedding_configs(rows, [table_name(t) for t in task.tables]),
                                 device=torch.device("meta"))
    _apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": 0.01})  # the rate does not enter a plan

    def allowed(dim: int) -> tuple[list[str], int | None]:
        width = dim // column_ways if column_ways else 0
        if column_ways and column_ways > 1 and dim % column_ways == 0 and width % 4 == 0:
            return [ShardingType.TABLE_WISE.value, ShardingType.COLUMN_WISE.value], width
        return [ShardingType.TABLE_WISE.value], None

    constraints = {}
    for t, r in zip(task.tables, rows.itertuples(), strict=True):
        types, width = allowed(int(r.dim))
        constraints[table_name(t)] = ParameterConstraints(
            sharding_types=types, compute_kernels=[EmbeddingComputeKernel.FUSED.value],
            pooling_factors=[float(r.pooling_factor)], min_partition=width)
    cap = {"ddr_cap": task.memory_bytes} if compute_device == "cpu" else {"hbm_cap": task.memory_bytes}
    topology = Topology(world_size=task.devices, compute_device=compute_device, **cap)
    return ebc, topology, constraints


def enumerator(topology, constraints: dict, batch_size: int):
    """TorchRec's `EmbeddingEnumerator` with its perf estimator on the real (per-rank) batch and its
    storage estimator on a batch of 0: the storage of a shard is then its weights and optimizer
    state, without the batch's input and output buffers."""
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator

    no_batch = {name: dataclasses.replace(c, batch_sizes=[0] * len(c.pooling_factors))
                for name, c in constraints.items()}
    return EmbeddingEnumerator(topology=topology, batch_size=batch_size, constraints=constraints,
                               estimator=[EmbeddingPerfEstimator(topology=topology, constraints=constraints),
                                          EmbeddingStorageEstimator(topology=topology, constraints=no_batch)])


def _planned(features: pd.DataFrame, task: Task, batch_size: int, column_ways: int | None,
             compute_device: str) -> dict:
    """TorchRec's `EmbeddingShardingPlanner` on the task's tables; its parameter shardings by name."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation

    ebc, topology, constraints = planner_inputs(features, task, column_ways, compute_device)
    per_rank = max(1, batch_size // task.devices)
    # No reserve beyond the tables themselves: the same memory cap as every other method.
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=per_rank,
                                       enumerator=enumerator(topology, constraints, per_rank), constraints=constraints,
                                       storage_reservation=FixedPercentageStorageReservation(0.0))
    try:
        plan = planner.plan(ebc, [EmbeddingBagCollectionSharder()])
    except Exception as exc:  # noqa: BLE001 - the planner's own errors are many and specific
        raise ConfigError(f"task {task.name}: TorchRec's planner found no plan ({exc.__class__.__name__}: "
                          f"{str(exc).splitlines()[0][:200]})") from None
    return plan.plan[""]


TORCHREC_FORMAT = "autoshard-torchrec-plan/1"


def embedding_configs(features: pd.DataFrame, names: list[str]) -> list:
    """TorchRec `EmbeddingBagConfig`s of the tables (one feature per table, named as the table)."""
    from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig

    weight_bytes = (features["size_bytes"] - features["rows"] * ROW_STATE_BYTES) / (features["rows"] * features["dim"])
    types = {4: DataType.FP32, 2: DataType.FP16}
    return [EmbeddingBagConfig(name=n, embedding_dim=int(r.dim), num_embeddings=int(r.rows), feature_names=[n],
                               data_type=types.get(int(round(w)), DataType.FP32))
            for n, r, w in zip(names, features.itertuples(), weight_bytes, strict=True)]


def sharding_plan(features: pd.DataFrame, names: list[str], placement: np.ndarray, devices: int,
                  device_type: str = "cuda"):
    """TorchRec's `ShardingPlan` for an `EmbeddingBagCollection` of these tables (module path ""):
    each table whole on its device, built with `construct_module_sharding_plan` and `table_wise`."""
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
    from torchrec.distributed.types import ShardingPlan
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    ebc = EmbeddingBagCollection(tables=embedding_configs(features, names), device=torch.device("meta"))
    per_table = {n: table_wise(rank=int(d), compute_kernel=EmbeddingComputeKernel.FUSED.value)
                 for n, d in zip(names, placement, strict=True)}
    module_plan = construct_module_sharding_plan(ebc, per_table, local_size=devices, world_size=devices,
                                                 device_type=device_type)
    return ShardingPlan(plan={"": module_plan})


def column_sharding_plan(features: pd.DataFrame, names: list[str], shards: list, placement: np.ndarray,
                         devices: int, device_type: str = "cuda"):
    """TorchRec's `ShardingPlan` of a column-wise plan: `shards` are `columns.ColumnShard`s whose
    `table` is a row of `features`, `placement` a rank per shard. A whole table is `table_wise`;
    a split one `column_wise` with its equal column shards' ranks left to right."""
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan, table_wise
    from torchrec.distributed.types import ShardingPlan
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    ranks: dict[int, list[tuple[int, int]]] = {}
    for shard, rank in zip(shards, placement, strict=True):
        ranks.setdefault(int(shard.table), []).append((int(shard.start), int(rank)))
    kernel = EmbeddingComputeKernel.FUSED.value
    per_table = {}
    for t, name in enumerate(names):
        held = [r for _, r in sorted(ranks[t])]
        per_table[name] = (table_wise(rank=held[0], compute_kernel=kernel) if len(held) == 1
                           else column_wise(ranks=held, compute_kernel=kernel))
    ebc = EmbeddingBagCollection(tables=embedding_configs(features, names), device=torch.device("meta"))
    module_plan = construct_module_sharding_plan(ebc, per_table, local_size=devices, world_size=devices,
                                                 device_type=device_type)
    return ShardingPlan(plan={"": module_plan})


def plan_to_json(plan, world_size: int, device_type: str) -> dict:
    """A `ShardingPlan` of table-wise or column-wise shards as plain JSON (no pickles: loading it runs no code)."""
    modules = {}
    for path, module_plan in plan.plan.items():
        modules[path] = {name: {"sharding_type": p.sharding_type, "compute_kernel": p.compute_kernel,
                                "ranks": list(p.ranks),
                                "shards": [{"offsets": list(s.shard_offsets), "sizes": list(s.shard_sizes),
                                            "placement": str(s.placement)} for s in p.sharding_spec.shards]}
                         for name, p in module_plan.items()}
    return {"format": TORCHREC_FORMAT, "world_size": world_size, "device_type": device_type, "modules": modules}


def load_sharding_plan(path: str | Path):
    """The TorchRec `ShardingPlan` saved by `autoshard plan --torchrec`, to hand to
    `DistributedModelParallel(module, plan=...)` (the module: an `EmbeddingBagCollection`)."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ParameterSharding, ShardingPlan

    from autoshard.core.inputs import read_json, torchrec_columns

    path = Path(path)
    doc = read_json(path, "TorchRec plan")
    if not isinstance(doc, dict) or doc.get("format") != TORCHREC_FORMAT:
        raise ConfigError(f"{path}: not a TorchRec plan written by autoshard (format {TORCHREC_FORMAT!r})")
    torchrec_columns(doc, path)
    plan = {}
    for module, params in doc["modules"].items():
        plan[module] = EmbeddingModuleShardingPlan({
            name: ParameterSharding(
                sharding_type=p["sharding_type"], compute_kernel=p["compute_kernel"], ranks=list(p["ranks"]),
                sharding_spec=EnumerableShardingSpec([ShardMetadata(shard_offsets=s["offsets"], shard_sizes=s["sizes"],
                                                                    placement=s["placement"]) for s in p["shards"]]))
            for name, p in params.items()})
    return ShardingPlan(plan=plan)

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

from autoshard.core.errors import ConfigError
from autoshard.core.inputs import CACHING_KERNEL, Cached
from autoshard.data.footprint import row_split
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
    import torch
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


def embedding_configs(features: pd.DataFrame, names: list[str], sequence: bool = False) -> list:
    """TorchRec embedding configs of the tables (one feature per table, named as the table):
    `EmbeddingBagConfig`s, or with `sequence` the `EmbeddingConfig`s of an EmbeddingCollection."""
    from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig, EmbeddingConfig

    weight_bytes = (features["size_bytes"] - features["rows"] * ROW_STATE_BYTES) / (features["rows"] * features["dim"])
    types = {4: DataType.FP32, 2: DataType.FP16}
    config = EmbeddingConfig if sequence else EmbeddingBagConfig
    return [config(name=n, embedding_dim=int(r.dim), num_embeddings=int(r.rows), feature_names=[n],
                   data_type=types.get(int(round(w)), DataType.FP32))
            for n, r, w in zip(names, features.itertuples(), weight_bytes, strict=True)]


def split_name(qualified: str) -> tuple[str, str]:
    """(module path, table name) of a qualified name: `sparse.ebc.user_id` is table `user_id` of
    module `sparse.ebc`; a plain name is in the root module `""`."""
    module, _, name = qualified.rpartition(".")
    return module, name


def modules_of(features: pd.DataFrame, names: list[str]) -> dict[str, tuple[list[int], bool]]:
    """The embedding modules the tables make, by module path: their rows of `features` and whether
    the module is an EmbeddingCollection (its tables `sequence`) rather than an EmbeddingBagCollection.
    A module holds one kind (pooled and sequence tables in one module are refused), and an
    EmbeddingCollection's tables share one dim, as TorchRec requires."""
    sequence = features["sequence"].to_numpy(dtype=bool) if "sequence" in features else np.zeros(len(names), bool)
    out: dict[str, tuple[list[int], bool]] = {}
    for i, qualified in enumerate(names):
        module = split_name(qualified)[0]
        rows, kind = out.setdefault(module, ([], bool(sequence[i])))
        if kind != bool(sequence[i]):
            where = f"module {module!r}" if module else "the root module (give the tables a module)"
            raise ConfigError(f"table {qualified}: {'a sequence' if sequence[i] else 'a pooled'} table in {where}, "
                              f"which holds {'sequence' if kind else 'pooled'} tables (an EmbeddingCollection and an "
                              "EmbeddingBagCollection are two modules)")
        rows.append(i)
    for module, (rows, kind) in out.items():
        dims = sorted({int(features["dim"].iloc[i]) for i in rows})
        if kind and len(dims) > 1:
            raise ConfigError(f"module {module!r}: sequence tables of dims {dims[0]} and {dims[1]} (the tables of an "
                              "EmbeddingCollection share one dim: give each dim its module)")
    return out


def embedding_module(features: pd.DataFrame, names: list[str], sequence: bool, device: str = "meta"):
    """The EmbeddingBagCollection (or, `sequence`, EmbeddingCollection) of these tables, named by
    their table names (the module path stripped)."""
    import torch
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    configs = embedding_configs(features, [split_name(n)[1] for n in names], sequence)
    module = EmbeddingCollection if sequence else EmbeddingBagCollection
    return module(tables=configs, device=torch.device(device))


def block_sharding_plan(features: pd.DataFrame, names: list[str], blocks: dict, kinds: dict, devices: int,
                        local_size: int | None = None, device_type: str = "cuda", cached: Cached | None = None):
    """TorchRec's `ShardingPlan` of any plan (`core.inputs.PlanBlocks`: `blocks` and `kinds` by
    qualified name, `features` rows in the order of `names`): per module path, each table
    `table_wise`, `column_wise` (ranks left to right), `row_wise` (every rank, TorchRec's row
    split), `table_row_wise` (the ranks of one host of `local_size`) or `data_parallel` (a replica
    on every rank, TorchRec's dense kernel), built with TorchRec's own generators. A row split
    unlike the one TorchRec makes is refused rather than changed."""
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.sharding_plan import (
        column_wise,
        construct_module_sharding_plan,
        data_parallel,
        row_wise,
        table_row_wise,
        table_wise,
    )
    from torchrec.distributed.types import CacheParams, ShardingPlan

    local = local_size or devices
    kernel = EmbeddingComputeKernel.FUSED.value
    plan = {}
    for module, (rows, sequence) in modules_of(features, names).items():
        per_table = {}
        for i in rows:
            name = names[i]
            held, kind = blocks[name], kinds.get(name, "table_wise")
            ranks = [b.device for b in held]
            if kind == "table_wise":
                per_table[split_name(name)[1]] = table_wise(rank=ranks[0], compute_kernel=kernel)
            elif kind == "column_wise":
                per_table[split_name(name)[1]] = column_wise(ranks=ranks, compute_kernel=kernel)
            elif kind == "row_wise":
                per_table[split_name(name)[1]] = row_wise(compute_kernel=kernel)
            elif kind == "data_parallel":
                per_table[split_name(name)[1]] = data_parallel()
            elif sequence:
                raise ConfigError(f"table {name}: table_row_wise shards of a sequence table (an EmbeddingCollection "
                                  "is sharded table-, column- or row-wise)")
            else:
                per_table[split_name(name)[1]] = table_row_wise(host_index=ranks[0] // local)
        subset = features.iloc[rows]
        module_plan = construct_module_sharding_plan(embedding_module(subset, [names[i] for i in rows], sequence),
                                                     per_table, local_size=local, world_size=devices,
                                                     device_type=device_type)
        for i in rows:
            name = split_name(names[i])[1]
            _same_rows(names[i], blocks[names[i]], module_plan[name])
            if module_plan[name].compute_kernel != kernel and module_plan[name].sharding_type != "data_parallel":
                # table_row_wise takes no kernel: it would be dense (as a data-parallel table is)
                module_plan[name] = dataclasses.replace(module_plan[name], compute_kernel=kernel)
            if cached is not None and names[i] in cached.tables:
                module_plan[name] = dataclasses.replace(module_plan[name], compute_kernel=CACHING_KERNEL,
                                                        cache_params=CacheParams(load_factor=cached.load_factor))
        plan[module] = module_plan
    return ShardingPlan(plan=plan)


def _same_rows(name: str, held: list, sharding) -> None:
    """The row shards TorchRec made are the plan's (same ranks, same first rows, same sizes)."""
    if sharding.sharding_type not in ("row_wise", "table_row_wise"):
        return
    made = [(int(s.shard_offsets[0]), int(s.shard_sizes[0]), int(r))
            for s, r in zip(sharding.sharding_spec.shards, sharding.ranks, strict=True)]
    wanted = [(b.row, b.rows, b.device) for b in held]
    if made != wanted:
        raise ConfigError(f"table {name}: row shards {wanted[:3]}... are not TorchRec's {sharding.sharding_type} split "
                          f"({made[:3]}...)")


def plan_to_json(plan, world_size: int, device_type: str) -> dict:
    """A `ShardingPlan` as plain JSON (no pickles: loading it runs no code)."""
    modules = {}
    for path, module_plan in plan.plan.items():
        modules[path] = {name: {"sharding_type": p.sharding_type, "compute_kernel": p.compute_kernel,
                                "ranks": list(p.ranks),
                                "shards": [{"offsets": list(s.shard_offsets), "sizes": list(s.shard_sizes),
                                            "placement": str(s.placement)}
                                           for s in (p.sharding_spec.shards if p.sharding_spec else [])]}
                                | ({} if p.cache_params is None else
                                   {"cache_params": {"load_factor": p.cache_params.load_factor}})
                         for name, p in module_plan.items()}
    return {"format": TORCHREC_FORMAT, "world_size": world_size, "device_type": device_type, "modules": modules}


def plan_json(features: pd.DataFrame, names: list[str], blocks: dict, kinds: dict, devices: int,
              local_size: int | None = None, device_type: str = "cuda", cached: Cached | None = None) -> dict:
    """The file `plan_to_json(block_sharding_plan(...))` writes, written from the blocks alone,
    without torch or torchrec (the command's `--torchrec`): per module path, in the tables' order,
    each table's sharding type, kernel (`fused`; a data-parallel table TorchRec's `dense`), ranks
    and shards, a row split TorchRec's own (`data.footprint.row_split`, checked like
    `block_sharding_plan`'s), each shard on GPU `rank % local_size` of its host (or the CPU); the
    tables of `cached` on TorchRec's UVM caching kernel, their `cache_params` its load factor."""
    local = local_size or devices
    placement = (lambda r: f"rank:{r}/cpu") if device_type == "cpu" else (lambda r: f"rank:{r}/cuda:{r % local}")
    f = features.reset_index(drop=True)
    modules = {}
    for module, (rows, sequence) in modules_of(features, names).items():
        params = {}
        for i in rows:
            name, held = names[i], blocks[names[i]]
            kind, table_rows, dim = kinds.get(name, "table_wise"), int(f["rows"].iloc[i]), int(f["dim"].iloc[i])
            if kind == "table_row_wise" and sequence:
                raise ConfigError(f"table {name}: table_row_wise shards of a sequence table (an EmbeddingCollection "
                                  "is sharded table-, column- or row-wise)")
            if kind in ("row_wise", "table_row_wise"):
                first = 0 if kind == "row_wise" else held[0].device // local * local
                split = row_split(table_rows, devices if kind == "row_wise" else local)
                starts = np.concatenate([[0], np.cumsum(split)[:-1]]).tolist()
                made = [(int(a), int(n), first + k) for k, (a, n) in enumerate(zip(starts, split, strict=True))]
                if made != [(b.row, b.rows, b.device) for b in held]:
                    raise ConfigError(f"table {name}: row shards {[(b.row, b.rows, b.device) for b in held][:3]}... "
                                      f"are not TorchRec's {kind} split ({made[:3]}...)")
                shards = [([a, 0], [n, dim], r) for a, n, r in made]
            elif kind == "data_parallel":
                shards = []
            else:  # table- or column-wise, columns left to right
                shards = [([0, b.column], [table_rows, dim if b.width is None else b.width], b.device) for b in held]
            cache = cached is not None and name in cached.tables
            params[split_name(name)[1]] = {
                "sharding_type": kind,
                "compute_kernel": CACHING_KERNEL if cache else "dense" if kind == "data_parallel" else "fused",
                "ranks": list(range(devices)) if kind == "data_parallel" else [r for _, _, r in shards],
                "shards": [{"offsets": o, "sizes": z, "placement": placement(r)} for o, z, r in shards]}
            if cache:
                params[split_name(name)[1]]["cache_params"] = {"load_factor": cached.load_factor}
        modules[module] = params
    return {"format": TORCHREC_FORMAT, "world_size": devices, "device_type": device_type, "modules": modules}


def load_sharding_plan(path: str | Path):
    """The TorchRec `ShardingPlan` saved by `autoshard plan --torchrec`, to hand to
    `DistributedModelParallel(model, plan=...)`: its modules by path, `""` for a model that is
    one `EmbeddingBagCollection`."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec
    from torchrec.distributed.types import CacheParams, EmbeddingModuleShardingPlan, ParameterSharding, ShardingPlan

    from autoshard.core.inputs import read_json, torchrec_blocks

    path = Path(path)
    doc = read_json(path, "TorchRec plan")
    if not isinstance(doc, dict) or doc.get("format") != TORCHREC_FORMAT:
        raise ConfigError(f"{path}: not a TorchRec plan written by autoshard (format {TORCHREC_FORMAT!r})")
    torchrec_blocks(doc, path)
    plan = {}
    for module, params in doc["modules"].items():
        plan[module] = EmbeddingModuleShardingPlan({
            name: ParameterSharding(
                sharding_type=p["sharding_type"], compute_kernel=p["compute_kernel"], ranks=list(p["ranks"]),
                cache_params=CacheParams(**p["cache_params"]) if "cache_params" in p else None,
                sharding_spec=EnumerableShardingSpec([ShardMetadata(shard_offsets=s["offsets"], shard_sizes=s["sizes"],
                                                                    placement=s["placement"]) for s in p["shards"]])
                if p["shards"] else None)  # data_parallel: no shards
            for name, p in params.items()})
    return ShardingPlan(plan=plan)

"""TorchRec's planner as a baseline: plan a task table-wise on a meta-device EmbeddingBagCollection.

No GPU is needed: the tables live on the `meta` device, the topology declares D CUDA devices
with the task's memory cap each (no extra reservation), and every table is constrained to
table-wise sharding, the fused kernel (the whole table in device memory, as every other
method assumes) and its pooling factor. The tables get the pool's weight precision, so
TorchRec counts the same bytes per table as the pool's `size_bytes`. The plan is read back as a table -> device map.
"""

import logging

import numpy as np
import pandas as pd
import torch

from autoshard.errors import ConfigError
from autoshard.tasks import Task


def table_name(table: int) -> str:
    return f"table_{table}"


def torchrec_plan(features: pd.DataFrame, task: Task, batch_size: int) -> np.ndarray:
    """Device per entry of `task.tables` chosen by TorchRec's `EmbeddingShardingPlanner`."""
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
    from torchrec.distributed.types import ShardingType
    from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    for name in ("torchrec", "torchrec.distributed.planner"):
        logging.getLogger(name).setLevel(logging.ERROR)
    rows = features.iloc[list(task.tables)]
    weight_bytes = rows["size_bytes"] / (rows["rows"] * rows["dim"])
    types = {4: DataType.FP32, 2: DataType.FP16}
    configs = [EmbeddingBagConfig(name=table_name(t), embedding_dim=int(r.dim), num_embeddings=int(r.rows),
                                  feature_names=[f"feature_{t}"], data_type=types[int(round(w))])
               for t, r, w in zip(task.tables, rows.itertuples(), weight_bytes, strict=True)]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    # FUSED keeps every table whole in device memory (no UVM cache spilling to host memory).
    constraints = {table_name(t): ParameterConstraints(sharding_types=[ShardingType.TABLE_WISE.value],
                                                       compute_kernels=[EmbeddingComputeKernel.FUSED.value],
                                                       pooling_factors=[float(r.pooling_factor)])
                   for t, r in zip(task.tables, rows.itertuples(), strict=True)}
    topology = Topology(world_size=task.devices, compute_device="cuda", hbm_cap=task.memory_bytes)
    # No reserve beyond the tables themselves: the same memory cap as every other method.
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints,
                                       batch_size=max(1, batch_size // task.devices),
                                       storage_reservation=FixedPercentageStorageReservation(0.0))
    try:
        plan = planner.plan(ebc, [EmbeddingBagCollectionSharder()])
    except Exception as exc:  # noqa: BLE001 - the planner's own errors are many and specific
        raise ConfigError(f"task {task.name}: TorchRec's planner found no plan ({exc.__class__.__name__}: "
                          f"{str(exc).splitlines()[0][:200]})") from None
    shardings = plan.plan[""]
    placement = np.array([shardings[table_name(t)].ranks[0] for t in task.tables], dtype=np.int64)
    return placement

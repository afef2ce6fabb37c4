"""Analytic backend: TorchRec's own table-wise performance estimate, per table, summed per shard.

Calls the planner's `TableWiseEvaluator` (torchrec/distributed/planner/estimator/estimator.py,
torchrec 1.8.0) on a standalone table, the same code `EmbeddingShardingPlanner` runs. Its
formulas: forward = (input bytes B*L*W*8 + lookup bytes B*L*W*max(D, 32)*e + output bytes
B*min(1, L)*W*D*e) * block penalty (1.75 for D < 64, 1.15 for D < 128) / device bandwidth
(DDR 51 GB/s for CPU, HBM 897 GB/s for CUDA); backward = 2 x forward; all-to-all =
output bytes / comms bandwidth. The number of rows does not enter. Deterministic and instant.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from autoshard.measure.base import ShardCost, check_batch, check_shard, shard_dims

if TYPE_CHECKING:  # only a type here: the portable worker (no pandas) imports this module
    from autoshard.data.pool import Pool


@dataclass(frozen=True)
class TablePerf:
    """TorchRec's estimate for one table, in ms."""

    fwd_compute: float
    bwd_compute: float
    fwd_comms: float
    bwd_comms: float


@lru_cache(maxsize=65536)
def table_perf(dim: int, pooling_factor: float, batch_per_rank: int, world_size: int,
               device: str = "cpu", dtype_bytes: int = 4) -> TablePerf:
    """TorchRec's table-wise perf estimate for one table (rows do not matter to it)."""
    from torchrec.distributed.planner.constants import (
        DDR_MEM_BW,
        HBM_MEM_BW,
        HBM_TO_DDR_MEM_BW,
        kernel_bw_lookup,
    )
    from torchrec.distributed.planner.estimator.config import EmbeddingPerfEstimatorConfig
    from torchrec.distributed.planner.estimator.estimator import TableWiseEvaluator
    from torchrec.distributed.planner.estimator.types import ShardPerfContext
    from torchrec.distributed.planner.types import BasicCommsBandwidths

    logging.getLogger("torchrec").setLevel(logging.ERROR)
    ctx = ShardPerfContext(
        sharding_type="table_wise", compute_kernel="fused", hash_size=1, emb_dim=dim,
        batch_sizes=[batch_per_rank], num_poolings=[1.0], input_lengths=[pooling_factor],
        world_size=world_size, local_world_size=world_size, intra_group_size=world_size,
        table_data_type_size=dtype_bytes, output_data_type_size=dtype_bytes,
        fwd_a2a_comm_data_type_size=dtype_bytes, bwd_a2a_comm_data_type_size=dtype_bytes,
        device_bw=kernel_bw_lookup(device, "fused", HBM_MEM_BW, DDR_MEM_BW, HBM_TO_DDR_MEM_BW),
        hbm_to_ddr_mem_bw=HBM_TO_DDR_MEM_BW, comms_bandwidths=BasicCommsBandwidths())
    perf = TableWiseEvaluator().compute_perf(ctx, EmbeddingPerfEstimatorConfig())
    return TablePerf(perf.fwd_compute, perf.bwd_compute, perf.fwd_comms, perf.bwd_comms)


class AnalyticBackend:
    name = "analytic"

    def __init__(self, pool: Pool, device: str = "cpu"):
        self.pool = pool
        self.device = device

    def measure(self, tables: Sequence[int], batch_size: int, dims: Sequence[int] | None = None) -> ShardCost:
        """Compute cost of the whole batch on one device (world size 1), summed over tables;
        `dims` estimates column shards (see `base.CostBackend`)."""
        check_batch(batch_size, self.pool.traces)
        ids = check_shard(tables, self.pool.num_tables)
        f = self.pool.features.iloc[ids]
        widths = shard_dims(f["dim"].astype(int).tolist(), dims)
        perfs = [table_perf(int(d), round(float(pf), 6), batch_size, 1, self.device)
                 for d, pf in zip(widths, f["pooling_factor"], strict=True)]
        return ShardCost(forward_ms=sum(p.fwd_compute for p in perfs),
                         backward_ms=sum(p.bwd_compute for p in perfs))

"""Analytic backend: TorchRec's own table-wise performance estimate, per table, summed per shard.

The estimate is the planner's `TableWiseEvaluator` (torchrec/distributed/planner/estimator/
estimator.py, torchrec 1.8.0) on a standalone table, written as formulas in `measure.formulas`
(checked against TorchRec's evaluator to 1e-6 in its test, so the command's analytic path needs
no torchrec): forward = (input bytes B*L*W*8 + lookup bytes B*L*W*max(D, 32)*e + output bytes
B*min(1, L)*W*D*e) * block penalty (1.75 for D < 64, 1.15 for D < 128) / device bandwidth
(DDR 51 GB/s for CPU, HBM 897 GB/s for CUDA); backward = 2 x forward; all-to-all =
output bytes / comms bandwidth. The number of rows does not enter. Deterministic and instant.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from autoshard.measure.base import ShardCost, check_batch, check_shard, shard_dims
from autoshard.measure.formulas import table_perf

if TYPE_CHECKING:  # only a type here: the portable worker (no pandas) imports this module
    from autoshard.data.pool import Pool


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

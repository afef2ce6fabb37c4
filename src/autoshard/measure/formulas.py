"""TorchRec's table-wise perf estimate as formulas of our own: what `measure.analytic` asks
TorchRec's `TableWiseEvaluator` for, without importing torch or torchrec, so that the command's
analytic path (`autoshard plan --backend analytic`) starts in a fraction of a second.

The facts, from torchrec 1.8.0 (`distributed/planner/constants.py`, `estimator/estimator.py`,
`estimator/types.py`), for one table-wise shard with the fused kernel, a per-rank batch of B
samples of L lookups each, dim D, e bytes per value (weights, outputs and the all-to-all alike),
W ranks:

- input read: ceil(B * L * W * 8) bytes (int64 indices);
- lookups: B * L * W * max(D, 32) * e bytes (a row is read in blocks of at least 32 values);
- output: B * min(1, L) * W * D * e bytes (one pooled embedding per sample that has a lookup);
- forward = (input + lookups + output) * penalty / device bandwidth, the penalty 1.75 for D < 64,
  1.15 for 64 <= D < 128 and 1 from 128 (FBGEMM's 32 threads x 4-wide vectors);
- backward = 2 x forward (`BWD_COMPUTE_MULTIPLIER`);
- device bandwidth: DDR 51 GiB/s on a CPU, HBM 897 GiB/s on a GPU (the fused kernel's);
- the all-to-all, forward and backward: the output bytes over the intra-host bandwidth
  (600 GiB/s) within one host, the cross-host one (12.5 GiB/s) beyond it.

The rows do not enter. `tests/measure/test_formulas.py` checks every field against TorchRec's
own evaluator to 1e-6.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

GIB_PER_MS = 1024**3 / 1000  # bytes per ms in one GiB/s
DEVICE_GIB_PER_S = {"cpu": 51.0, "cuda": 897.0}  # DDR_MEM_BW, HBM_MEM_BW: the fused kernel's
INTRA_GIB_PER_S, CROSS_GIB_PER_S = 600.0, 12.5  # INTRA_NODE_BANDWIDTH, CROSS_NODE_BANDWIDTH
INDEX_BYTES = 8  # BIGINT_DTYPE: the input indices
MIN_LOOKUP_DIM = 32  # table-wise lookups read at least this many values a row
BACKWARD_MULTIPLIER = 2.0  # BWD_COMPUTE_MULTIPLIER


@dataclass(frozen=True)
class TablePerf:
    """TorchRec's estimate for one table, in ms."""

    fwd_compute: float
    bwd_compute: float
    fwd_comms: float
    bwd_comms: float


def block_penalty(dim: int) -> float:
    """FBGEMM's kernel reads rows in blocks of 128 values: narrower rows waste part of a block."""
    if dim >= 128:
        return 1.0
    return 1.15 if dim >= 64 else 1.75


@lru_cache(maxsize=65536)
def table_perf(dim: int, pooling_factor: float, batch_per_rank: int, world_size: int,
               device: str = "cpu", dtype_bytes: int = 4) -> TablePerf:
    """TorchRec's table-wise perf estimate for one table with the fused kernel, the world being
    one host (`measure.analytic.table_perf` without torchrec; see the module)."""
    if device not in DEVICE_GIB_PER_S:
        raise ValueError(f"device: {device!r} (expected one of {', '.join(DEVICE_GIB_PER_S)})")
    lookups = batch_per_rank * pooling_factor * world_size
    output = batch_per_rank * min(1.0, pooling_factor) * world_size * dim * dtype_bytes
    moved = math.ceil(lookups * INDEX_BYTES) + lookups * max(dim, MIN_LOOKUP_DIM) * dtype_bytes + output
    forward = moved * block_penalty(dim) / (DEVICE_GIB_PER_S[device] * GIB_PER_MS)
    comms = output / (INTRA_GIB_PER_S * GIB_PER_MS)
    return TablePerf(forward, forward * BACKWARD_MULTIPLIER, comms, comms)

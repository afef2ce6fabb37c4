"""TorchRec's UVM caching kernel (`fused_uvm_caching`) for a table that does not fit in a GPU's
HBM: the whole table lives in the host's DDR, a cache of `load_factor` of it in HBM, and its
lookups run at a bandwidth between the two.

The facts, from torchrec 1.8.0 (`distributed/planner/constants.py`, `shard_estimators.py`):

- storage (`calculate_shard_storages`, no pipeline): DDR holds the table's weights and optimizer
  state; HBM holds the cache, `round(load_factor x` the weights`)`, its rows' optimizer state
  (row-wise Adagrad: one value a row), the cache's bookkeeping (`4 + 16 x load_factor` bytes a
  row of the table: its index map, its slots' indices and LRU stamps) and the batch's input and
  output buffers;
- bandwidth: `(load_factor x HBM + (1 - load_factor) x HBM-to-DDR) / 10`, against the fused
  kernel's HBM (`kernel_bw_lookup`), with HBM 897 GiB/s and HBM-to-DDR 32 GiB/s; TorchRec's
  compute estimate is bytes over bandwidth, so a cached table's compute is the fused one's
  times `slowdown(load_factor)`;
- default: a load factor of 0.2 (`UVM_CACHING_RATIO`); a rank's DDR is `placement.topology`'s.

`tests/placement/test_caching.py` checks both against TorchRec's own code.
"""

from __future__ import annotations

import math

from autoshard.core.inputs import CACHING_KERNEL
from autoshard.data.footprint import io_bytes
from autoshard.data.sizes import ROW_STATE_BYTES, table_bytes

KERNEL = CACHING_KERNEL  # "fused_uvm_caching"
HBM_GIB_PER_S, HBM_TO_DDR_GIB_PER_S = 897.0, 32.0  # HBM_MEM_BW, HBM_TO_DDR_MEM_BW
LOAD_FACTOR = 0.2  # UVM_CACHING_RATIO
UVM_PENALTY = 10  # the bandwidth of UVM access, over its nominal one
CACHE_INDEX_BYTES, CACHE_SLOT_BYTES = 4, 16  # a row's cache_index_table_map; a slot's lxu_cache_state + lru_state


def slowdown(load_factor: float) -> float:
    """How many times the fused kernel's compute a cached table's takes (TorchRec's estimate)."""
    cached = (load_factor * HBM_GIB_PER_S + (1 - load_factor) * HBM_TO_DDR_GIB_PER_S) / UVM_PENALTY
    return HBM_GIB_PER_S / cached


def memory(rows: int, width: int, weight_bytes: int, batch: int, pooling: float, sequence: bool,
           load_factor: float) -> tuple[int, int]:
    """(HBM, DDR) bytes of a whole table with the caching kernel while training, at a training
    batch of `batch` samples."""
    held = int(table_bytes(rows, width, weight_bytes))
    cache = round(rows * width * weight_bytes * load_factor)
    state = math.ceil(cache * ROW_STATE_BYTES / (width * weight_bytes))  # the cached rows' Adagrad state
    bookkeeping = math.ceil(rows * (CACHE_INDEX_BYTES + CACHE_SLOT_BYTES * load_factor))
    inputs, outputs = io_bytes(batch, pooling, width, sequence)
    return cache + state + bookkeeping + inputs + outputs, held

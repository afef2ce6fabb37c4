"""What a shard takes in device memory while it trains: its weights and row-wise optimizer state
(`data.sizes.table_bytes`, the study's accounting), plus the batch's input indices and output
embeddings. TorchRec's storage estimate (`shard_estimators.calculate_shard_storages`, without a
pipeline) counts the same four, with the same formulas, and so does every method of the command.

Per shard of a table with `pooling` lookups a sample, at a (global) training batch of `batch`
samples: its inputs are its share of the batch's lookups (all of them for a table- or column-wise
shard; a 1/k share for one of k row shards, which TorchRec's input distribution splits evenly),
as int64 indices; its outputs are, for a pooled table, one embedding of the shard's width per
sample (a row shard's partial sums too: every sample's), and for a sequence table one per lookup
of its share. A row shard that holds no rows holds no buffers either.
"""

from __future__ import annotations

import math

from autoshard.data.sizes import table_bytes

INDEX_BYTES = 8   # int64 indices: TorchRec's `input_data_type_size`
OUTPUT_BYTES = 4  # fp32 embeddings out: TorchRec's `output_data_type_size` for fp32 tables


def row_split(rows: int, ways: int) -> list[int]:
    """The rows of each of `ways` row shards, as TorchRec splits them: ceil(rows / ways) each,
    the remainder on the next rank, none on the ranks after it (10 rows in 4: 3, 3, 3, 1)."""
    block = math.ceil(rows / ways)
    return [max(0, min(block, rows - i * block)) for i in range(ways)]


def io_bytes(batch: int, pooling: float, width: int, sequence: bool, ways: int = 1) -> tuple[int, int]:
    """(input, output) bytes of one shard `width` columns wide, one of `ways` row shards of its
    table (1: the table's whole rows), at a training batch of `batch` samples."""
    lookups = batch * pooling / ways
    outputs = lookups if sequence else batch * min(1.0, pooling)
    return math.ceil(lookups * INDEX_BYTES), math.ceil(outputs * width * OUTPUT_BYTES)


def shard_footprint(rows: int, width: int, weight_bytes: int, batch: int, pooling: float, sequence: bool,
                    ways: int = 1) -> int:
    """Bytes a shard of `rows` rows and `width` columns holds while training (see the module)."""
    if rows == 0:
        return 0
    inputs, outputs = io_bytes(batch, pooling, width, sequence, ways)
    return int(table_bytes(rows, width, weight_bytes)) + inputs + outputs

"""What a table holds in memory: the study's one accounting (no pandas: the portable worker
imports it)."""

ROW_STATE_BYTES = 4  # EXACT_ROWWISE_ADAGRAD's state: one fp32 per row of every table or column shard


def table_bytes(rows, dims, weight_bytes: int):
    """The bytes the measured operator holds for a table (or a column shard `dims` wide): its
    weights and its row-wise Adagrad state. The one memory accounting of the study: the pool's
    `size_bytes`, every method's memory check, the tasks' caps, the backends' `shard_bytes` and
    the budget TorchRec's planner sees. Ints or arrays, elementwise."""
    return rows * dims * weight_bytes + rows * ROW_STATE_BYTES

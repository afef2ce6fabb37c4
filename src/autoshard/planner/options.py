"""TorchRec's sharding options as autoshard sees them: one item per proposed shard, with the
table it belongs to, its rows and columns, its pooling factor, and the storage and perf TorchRec's
estimators gave it; and the items as a table list (`cli.user_tables`) our methods place."""

from __future__ import annotations

import re
from dataclasses import dataclass

from autoshard.cli.user_tables import DEFAULT_TRACE_BATCH, UserTables, tables_from_records


@dataclass(frozen=True)
class Item:
    """One shard of a sharding option: `option` and `shard` index the proposal."""

    option: int
    shard: int
    name: str       # a table name our readers accept: the option's, made safe, with the shard's offsets and shape
    rows: int
    dim: int
    pooling_factor: float


def safe(name: str) -> str:
    """`name` with every character a table name may not hold (`core.inputs.NAME`) as `_`."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:100] or "table"


def items(proposal: list, fixed: bool = True) -> list[Item]:
    """Every shard of every option of `proposal`, in order (without `fixed`: only the shards
    placed one by one, those of options partitioned by `device`; `uniform` ones have a shard on
    every rank, `host` ones on every rank of a host). A row shard holds its rows' share of the
    table's lookups (TorchRec's even input split)."""
    out = []
    for i, option in enumerate(proposal):
        if not fixed and option.partition_by in ("uniform", "host"):
            continue
        pooling = float(sum(option.input_lengths)) or 1.0
        table_rows = int(option.tensor.shape[0]) if getattr(option, "tensor", None) is not None else None
        for j, shard in enumerate(option.shards):
            rows, dim = (int(x) for x in shard.size)
            row, column = (int(x) for x in shard.offset)
            share = rows / table_rows if table_rows and option.sharding_type in ("row_wise", "table_row_wise") else 1.0
            out.append(Item(i, j, f"{safe(option.name)}-{row}-{column}-{rows}x{dim}", rows, dim, pooling * share))
    return out


def as_tables(shards: list[Item], weight_bytes: int, batch: int) -> UserTables:
    """The items as a table list (each shard a table of its own rows and columns), with synthetic
    traces of at least `batch` bags seeded by each name (`user_tables.table_trace`)."""
    records = [{"name": s.name, "rows": s.rows, "dim": s.dim, "pooling_factor": s.pooling_factor}
               for s in dict((s.name, s) for s in shards).values()]
    return tables_from_records(records, "TorchRec's sharding options", weight_bytes,
                               max(DEFAULT_TRACE_BATCH, batch))

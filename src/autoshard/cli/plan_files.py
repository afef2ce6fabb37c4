"""Reading plan files for the command (`score`, the TorchRec check, the plan loader): ours or
their TorchRec export, checked against the tables, as blocks, column shards or a device per
table. The command's modules that write plans sit above it; it imports none of them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from autoshard.cli.user_tables import UserTables
from autoshard.core.errors import ConfigError
from autoshard.core.inputs import PlanBlocks, plan_blocks, read_json, shown
from autoshard.placement import caching
from autoshard.placement.column_split import ColumnShard

NOTES = {"costs": dict, "topology": dict, "cached": dict, "warnings": list}  # what the plan says beside its blocks


def without_costs(doc: object, path: Path) -> object:
    """A plan document without what it says beside its blocks (`NOTES`: what the plan placed on,
    `service.plan_document`; its topology of unlike devices; its tables cached in host memory;
    its warnings), each checked for its type, `costs` to name its kind; the rest is
    `core.inputs`' to check."""
    if not isinstance(doc, dict):
        return doc
    for field, kind in NOTES.items():
        if field in doc and not isinstance(doc[field], kind):
            expected = "an object" if kind is dict else "a list"
            raise ConfigError(f"{path}, field {field}: {shown(doc[field])} (expected {expected})")
    if "costs" in doc and not isinstance(doc["costs"].get("kind"), str):
        raise ConfigError(f"{path}, field costs: {shown(doc['costs'])} (expected an object with a `kind`)")
    return {k: v for k, v in doc.items() if k not in NOTES}


def _cached(doc: object) -> list[str]:
    """The tables a plan file (ours or its TorchRec export) keeps in host memory."""
    if not isinstance(doc, dict):
        return []
    if isinstance(doc.get("cached"), dict):
        return list(doc["cached"])
    modules = doc.get("modules")
    return [f"{m}.{n}" if m else n for m, params in (modules.items() if isinstance(modules, dict) else ())
            if isinstance(params, dict) for n, p in params.items()
            if isinstance(p, dict) and p.get("compute_kernel") == caching.KERNEL]


def read_blocks(path: str | Path, tables: UserTables) -> PlanBlocks:
    """The blocks of any plan file (ours or its TorchRec export), checked against the tables: every
    table placed, none unknown, its shape as the file says, its columns or rows covered."""
    path = Path(path)
    doc = read_json(path, "plan file")
    cached = _cached(doc)
    if cached:
        raise ConfigError(f"{path}: table {shown(cached[0])} is kept in host memory by TorchRec's UVM caching kernel, "
                          "which this machine cannot measure (its cost in the plan is TorchRec's model)")
    plan = plan_blocks(without_costs(doc, path), path)
    names = tables.names
    unknown = sorted(set(plan.blocks) - set(names))
    if unknown:
        raise ConfigError(f"{path}: table {shown(unknown[0])} is not in {tables.source}")
    absent = [n for n in names if n not in plan.blocks]
    if absent:
        raise ConfigError(f"{path}: table {shown(absent[0])} of {tables.source} has no device")
    f = tables.features
    for name, rows, dim in zip(names, f["rows"].tolist(), f["dim"].tolist(), strict=True):
        if name in plan.shapes and plan.shapes[name] != [rows, dim]:
            raise ConfigError(f"{path}: table {shown(name)}, field sizes: {plan.shapes[name]} (the table is "
                              f"[{rows}, {dim}] in {tables.source})")
        held = plan.blocks[name]
        if plan.kinds.get(name) == "data_parallel":
            continue  # whole replicas, one on every device (`core.inputs`)
        columns = sum(dim if b.width is None else b.width for b in held if b.row == 0)
        covered = sum(rows if b.rows is None else b.rows for b in held if b.column == 0)
        if columns != dim or covered != rows:
            what, got, has = ("columns", columns, f"dim is {dim}") if columns != dim else ("rows", covered,
                                                                                        f"rows are {rows}")
            raise ConfigError(f"{path}: table {shown(name)}: its shards cover {got} {what} (its {has} in "
                              f"{tables.source})")
    return plan


def read_columns(path: str | Path, tables: UserTables) -> tuple[list[ColumnShard], np.ndarray, int]:
    """(column shards, device per shard, devices) of any plan file of table- or column-wise shards
    (ours or its TorchRec export), checked against the tables (`read_blocks`)."""
    path = Path(path)
    plan = read_blocks(path, tables)
    dims = tables.features["dim"].tolist()
    shards, placement = [], []
    for t, (name, dim) in enumerate(zip(tables.names, dims, strict=True)):
        if plan.kinds[name] in ("row_wise", "table_row_wise", "data_parallel"):
            what = "data-parallel replicas" if plan.kinds[name] == "data_parallel" else "row-wise shards"
            raise ConfigError(f"{path}: table {shown(name)}: {what} (this reader takes table- and column-wise "
                              "plans)")
        for b in plan.blocks[name]:
            shards.append(ColumnShard(t, b.column, dim if b.width is None else b.width, dim))
            placement.append(b.device)
    return shards, np.array(placement, dtype=np.int64), plan.devices


def read_plan(path: str | Path, tables: UserTables) -> tuple[np.ndarray, int]:
    """(device per table in file order, devices) of a table-wise plan file of ours or of its
    TorchRec export: `read_columns` (strict, checked against the tables), refusing a plan
    that splits a table into column shards."""
    shards, placement, devices = read_columns(path, tables)
    if not all(s.whole for s in shards):
        raise ConfigError(f"{path}: a column-wise plan (this reader takes table-wise plans)")
    by_table = np.full(len(tables.names), -1, dtype=np.int64)
    by_table[[s.table for s in shards]] = placement
    return by_table, devices

"""`autoshard plan --constraints FILE`: what a user may ask of single tables, in the spirit of
TorchRec's `ParameterConstraints`: pin a table to a device, keep a group of tables on one device,
restrict a table's sharding types.

The file (YAML or JSON) maps table names to their constraints:

    sparse.user_id: {sharding_types: [row_wise, table_row_wise]}
    sparse.country: {device: 0}
    sparse.query:   {group: text}          # sparse.query and sparse.title share a device
    sparse.title:   {group: text}

A pinned or grouped table stays whole (table-wise); a group with a pinned member goes where it
is pinned. Each constraint is checked before anything is measured: an unknown table, field or
sharding type, a device out of range, a sharding `--sharding` does not offer, a group pinned to
two devices, or tables pinned or grouped beyond one device's memory are refused in one line
naming the file, the table, the field and the value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from autoshard.cli.user_tables import StrictLoader, UserTables
from autoshard.core.errors import ConfigError
from autoshard.core.inputs import read_text, shown
from autoshard.placement.sharding import KINDS, host_split

FIELDS = ("device", "group", "sharding_types")
OFFERED = {"table": ("table_wise",), "row": ("table_wise", "row_wise", "table_row_wise"), "auto": KINDS}


@dataclass(frozen=True)
class Constraints:
    """By table index: the device it is pinned to, the groups of tables kept on one device (each
    with the device it is pinned to, or None), and the sharding types it may take."""

    device: dict[int, int] = field(default_factory=dict)
    groups: list[tuple[tuple[int, ...], int | None]] = field(default_factory=list)
    kinds: dict[int, tuple[str, ...]] = field(default_factory=dict)

    @property
    def places(self) -> bool:
        """Whether it pins or groups anything (TorchRec's planner cannot be told that)."""
        return bool(self.device or self.groups)


def read_constraints(path: str | Path, tables: UserTables, devices: int, local: int, sharding: str,
                     memory: np.ndarray, memory_bytes: int) -> Constraints:
    """The constraints of `path` on `tables` (see the module); `memory` is each table's training
    bytes whole, `memory_bytes` a device's."""
    path = Path(path)
    text = read_text(path, "constraints file")
    try:
        doc = json.loads(text) if path.suffix.lower() == ".json" else yaml.load(text, Loader=StrictLoader)  # noqa: S506
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid {'JSON' if path.suffix.lower() == '.json' else 'YAML'} "
                          f"({shown(str(exc).splitlines()[0], 120)})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    if not isinstance(doc, dict) or not doc:
        raise ConfigError(f"{path}: expected a mapping of table names to their constraints")
    index = {n: i for i, n in enumerate(tables.names)}
    pinned, kinds, groups = {}, {}, {}
    for name, wanted in doc.items():
        if name not in index:
            raise ConfigError(f"{path}: table {shown(name)} is not in {tables.source}")
        t = index[name]
        if not isinstance(wanted, dict) or not wanted:
            raise ConfigError(f"{path}: table {shown(name)}: {shown(wanted)} (expected a mapping with "
                              f"{', '.join(FIELDS)})")
        unknown = [k for k in wanted if k not in FIELDS]
        if unknown:
            raise ConfigError(f"{path}: table {shown(name)}, field {shown(unknown[0])} is unknown (expected "
                              f"{', '.join(FIELDS)})")
        where = f"{path}: table {shown(name)}, field"
        if "device" in wanted:
            d = wanted["device"]
            if not isinstance(d, int) or isinstance(d, bool) or not 0 <= d < devices:
                raise ConfigError(f"{where} device: {shown(d)} (a device from 0 to {devices - 1})")
            if int(memory[t]) > memory_bytes:
                raise ConfigError(f"{where} device: {d} (the table needs {int(memory[t])} bytes while training, more "
                                  f"than a device's {memory_bytes}: it cannot stay whole)")
            pinned[t] = d
        if "group" in wanted:
            g = wanted["group"]
            if not isinstance(g, str) or not g.strip():
                raise ConfigError(f"{where} group: {shown(g)} (a group's name)")
            groups.setdefault(g, []).append(t)
        if "sharding_types" in wanted:
            kinds[t] = _kinds(wanted["sharding_types"], where, sharding, bool(tables.sequence[t]), devices, local)
        if (t in pinned or "group" in wanted) and "table_wise" not in kinds.get(t, ("table_wise",)):
            raise ConfigError(f"{where} sharding_types: {shown(wanted['sharding_types'])} (a pinned or grouped "
                              "table is whole: table_wise)")
        if t in pinned or "group" in wanted:
            kinds[t] = ("table_wise",)
    out_groups = []
    for g, members in groups.items():
        at = sorted({pinned[t] for t in members if t in pinned})
        if len(at) > 1:
            raise ConfigError(f"{path}: group {shown(g)}: its tables are pinned to devices {at} (one device holds "
                              "a group)")
        need = int(sum(int(memory[t]) for t in members))
        if need > memory_bytes:
            raise ConfigError(f"{path}: group {shown(g)}: its tables need {need} bytes while training, more than "
                              f"one device's {memory_bytes}")
        out_groups.append((tuple(members), at[0] if at else None))
        for t in members:
            pinned.pop(t, None)
    load = {}
    for t, d in pinned.items():
        load[d] = load.get(d, 0) + int(memory[t])
    for g, d in out_groups:
        if d is not None:
            load[d] = load.get(d, 0) + sum(int(memory[t]) for t in g)
    full = next((d for d, used in sorted(load.items()) if used > memory_bytes), None)
    if full is not None:
        raise ConfigError(f"{path}: the tables pinned to device {full} need {load[full]} bytes while training, more "
                          f"than its {memory_bytes}")
    return Constraints(device=pinned, groups=out_groups, kinds=kinds)


def _kinds(value, where: str, sharding: str, sequence: bool, devices: int, local: int) -> tuple[str, ...]:
    """A table's `sharding_types`: known, offered by `--sharding`, possible for the table."""
    if not isinstance(value, list) or not value or not all(isinstance(k, str) for k in value):
        raise ConfigError(f"{where} sharding_types: {shown(value)} (a list of {', '.join(OFFERED['auto'])})")
    for k in value:
        if k not in OFFERED["auto"]:
            raise ConfigError(f"{where} sharding_types: {shown(k)} (expected {', '.join(OFFERED['auto'])})")
        if k not in OFFERED[sharding]:
            raise ConfigError(f"{where} sharding_types: {shown(k)} (--sharding {sharding} offers "
                              f"{', '.join(OFFERED[sharding])})")
        if k == "table_row_wise" and not host_split(sequence, devices, local):
            why = "a sequence table's EmbeddingCollection has none" if sequence else "one host (--devices-per-host)"
            raise ConfigError(f"{where} sharding_types: 'table_row_wise' ({why})")
    return tuple(dict.fromkeys(value))

"""A TorchRec `PlanLoader` that hands one of our plan files to TorchRec's planner.

`EmbeddingShardingPlanner(..., plan_loader=AutoShardPlanLoader(path, module, sharders, topology,
batch_size))` then skips its search and returns the plan of the file, checked by TorchRec
against the search space it enumerates for that module, topology and constraints: every table
of the module must be in the file, each on a rank of the topology. The file is any plan of
`autoshard plan` (each table's sharding type: table-, column-, row- or table-row-wise, its option
of as many shards) or its `--torchrec` export (the sharding type and kernel it names). A table
the file keeps in host memory (our plan's `cached`, the export's `fused_uvm_caching` with its
`cache_params`) takes TorchRec's option of that kernel, whose cache load factor (its constraints'
`CacheParams`, else its sharder's `fused_params`, else TorchRec's 0.2) must be the file's. Tables are matched by
name in the module given (a plan's qualified names `module.name` by their last part).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from torchrec.distributed.planner.types import PlanLoader
from torchrec.distributed.types import ShardingType

from autoshard.cli.plan_files import without_costs
from autoshard.core.errors import ConfigError
from autoshard.core.inputs import CACHING_KERNEL, plan_blocks, read_json, shown
from autoshard.placement import caching
from autoshard.placement.torchrec import split_name

KERNEL_ORDER = ("fused", "dense")  # the kernel taken where the file does not name one: as every method assumes


class AutoShardPlanLoader(PlanLoader):
    """The sharding options of the plan file `path` for `module` (see the module docstring)."""

    def __init__(self, path: str | Path, module, sharders: list, topology, batch_size: int,
                 constraints: dict | None = None) -> None:
        self.path = Path(path)
        self.module, self.sharders = module, sharders
        self.topology, self.batch_size, self.constraints = topology, batch_size, constraints
        raw = read_json(self.path, "plan file")
        self.doc = without_costs(raw, self.path)
        plan = plan_blocks(self.doc, self.path)  # refuses anything but a plan object first
        self.cached = _cached(raw.get("cached") or {}, self.path)
        self.per_table = {split_name(n)[1]: b for n, b in plan.blocks.items()}
        self.kinds = {split_name(n)[1]: k for n, k in plan.kinds.items()}
        self.devices = plan.devices
        if self.devices != topology.world_size:
            raise ConfigError(f"{self.path}: a plan for {self.devices} devices (the topology has "
                              f"{topology.world_size})")

    def load(self) -> dict[int, object]:
        """One sharding option per table of the module, its shards on the file's ranks, keyed by
        `storage_hash` as TorchRec's planner merges them."""
        from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

        enumerator = EmbeddingEnumerator(topology=self.topology, batch_size=self.batch_size,
                                         constraints=self.constraints)
        options: dict[str, list] = {}
        for option in enumerator.enumerate(self.module, self.sharders):
            options.setdefault(option.name, []).append(option)
        absent = sorted(set(options) - set(self.per_table))
        if absent:
            raise ConfigError(f"{self.path}: table {shown(absent[0])} of the module has no device in the plan")
        unknown = sorted(set(self.per_table) - set(options))
        if unknown:
            raise ConfigError(f"{self.path}: table {shown(unknown[0])} is not a table of the module")
        return {chosen.storage_hash(): chosen for chosen in (self._chosen(n, options[n]) for n in options)}

    def _chosen(self, name: str, candidates: list):
        """The candidate option of table `name` the file's shards describe, its ranks set."""
        held = self.per_table[name]
        wanted = self._named(name)
        if wanted is None:
            wanted = (self.kinds.get(name, ShardingType.TABLE_WISE.value), None, None)
        fitting = [o for o in candidates if o.sharding_type == wanted[0] and len(o.shards) == len(held)
                   and (wanted[1] is None or o.compute_kernel == wanted[1])]
        fitting.sort(key=lambda o: KERNEL_ORDER.index(o.compute_kernel) if o.compute_kernel in KERNEL_ORDER else 99)
        if not fitting:
            raise ConfigError(f"{self.path}: table {shown(name)}: TorchRec offers no {wanted[0]} option of "
                              f"{len(held)} shards for it under these constraints")
        option = fitting[0]
        if wanted[2] is not None:
            given = self._load_factor(option)
            if given != wanted[2]:
                raise ConfigError(f"{self.path}: table {shown(name)}: cached at a load factor of {wanted[2]:g}, and "
                                  f"TorchRec's option at {given:g} (give it ParameterConstraints(cache_params="
                                  f"CacheParams(load_factor={wanted[2]:g})), or its sharder fused_params="
                                  f"{{'cache_load_factor': {wanted[2]:g}}})")
        for shard, block in zip(sorted(option.shards, key=lambda s: tuple(s.offset)), held, strict=True):
            shard.rank = int(block.device)
        return option

    def _load_factor(self, option) -> float:
        """The cache load factor TorchRec's kernel will use for `option`: its constraints'
        `CacheParams`, else its sharder's `fused_params["cache_load_factor"]`, else TorchRec's 0.2."""
        from torchrec.distributed.planner.utils import sharder_name

        if option.cache_params is not None and option.cache_params.load_factor is not None:
            return option.cache_params.load_factor
        sharder = {sharder_name(s.module_type): s for s in self.sharders}.get(option.module_type_key)  # as its own
        factor = (getattr(sharder, "fused_params", None) or {}).get("cache_load_factor")
        return factor or caching.LOAD_FACTOR  # the kernel takes 0.2 where the factor is absent or 0

    def _named(self, name: str) -> tuple[str, str, float | None] | None:
        """(sharding type, kernel, cache load factor or None) of table `name` where the file names
        its kernel: every table of a TorchRec export, a cached one of a plan of ours; else None."""
        for tables in self.doc.get("modules", {}).values():
            if name in tables:
                p = tables[name]
                return p["sharding_type"], p["compute_kernel"], p.get("cache_params", {}).get("load_factor")
        if name in self.cached:
            return self.kinds.get(name, ShardingType.TABLE_WISE.value), CACHING_KERNEL, self.cached[name]
        return None

    def plan_context_hash(self) -> str | None:
        return None  # the search space is checked instead (`load`, and TorchRec's `extract_plan`)

    def get_plan_id(self) -> str:
        """The file and a digest of its bytes (TorchRec's planner logs it)."""
        return f"{self.path}#{hashlib.sha256(self.path.read_bytes()).hexdigest()[:12]}"


def _cached(entries: object, path: Path) -> dict[str, float]:
    """Our plan file's `cached` tables (by their name in the module) and their cache load factors."""
    if not isinstance(entries, dict):
        raise ConfigError(f"{path}, field cached: {shown(entries)} (expected an object by table)")
    out = {}
    for name, entry in entries.items():
        factor = entry.get("cache_load_factor") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or entry.get("kernel") != CACHING_KERNEL or isinstance(factor, bool) or \
                not isinstance(factor, int | float) or not 0 < factor <= 1:
            raise ConfigError(f"{path}, field cached: table {shown(name)}: {shown(entry)} (expected kernel "
                              f"{CACHING_KERNEL!r} and a cache_load_factor above 0, at most 1)")
        out[split_name(name)[1]] = float(factor)
    return out

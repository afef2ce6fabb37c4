"""A TorchRec `PlanLoader` that hands one of our plan files to TorchRec's planner.

`EmbeddingShardingPlanner(..., plan_loader=AutoShardPlanLoader(path, module, sharders, topology,
batch_size))` then skips its search and returns the plan of the file, checked by TorchRec
against the search space it enumerates for that module, topology and constraints: every table
of the module must be in the file, each on a rank of the topology. The file is any plan of
`autoshard plan` (each table's sharding type: table-, column-, row- or table-row-wise, its option
of as many shards) or its `--torchrec` export (the sharding type and kernel it names). Tables are
matched by name in the module given (a plan's qualified names `module.name` by their last part).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from torchrec.distributed.planner.types import PlanLoader
from torchrec.distributed.types import ShardingType

from autoshard.cli.plan_files import without_costs
from autoshard.core.errors import ConfigError
from autoshard.core.inputs import plan_blocks, read_json, shown
from autoshard.placement.torchrec import split_name

KERNEL_ORDER = ("fused", "dense")  # the kernel taken where the file does not name one: as every method assumes


class AutoShardPlanLoader(PlanLoader):
    """The sharding options of the plan file `path` for `module` (see the module docstring)."""

    def __init__(self, path: str | Path, module, sharders: list, topology, batch_size: int,
                 constraints: dict | None = None) -> None:
        self.path = Path(path)
        self.module, self.sharders = module, sharders
        self.topology, self.batch_size, self.constraints = topology, batch_size, constraints
        self.doc = without_costs(read_json(self.path, "plan file"), self.path)
        plan = plan_blocks(self.doc, self.path)
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
            wanted = (self.kinds.get(name, ShardingType.TABLE_WISE.value), None)
        fitting = [o for o in candidates if o.sharding_type == wanted[0] and len(o.shards) == len(held)
                   and (wanted[1] is None or o.compute_kernel == wanted[1])]
        fitting.sort(key=lambda o: KERNEL_ORDER.index(o.compute_kernel) if o.compute_kernel in KERNEL_ORDER else 99)
        if not fitting:
            raise ConfigError(f"{self.path}: table {shown(name)}: TorchRec offers no {wanted[0]} option of "
                              f"{len(held)} shards for it under these constraints")
        option = fitting[0]
        for shard, block in zip(sorted(option.shards, key=lambda s: tuple(s.offset)), held, strict=True):
            shard.rank = int(block.device)
        return option

    def _named(self, name: str) -> tuple[str, str] | None:
        """(sharding type, kernel) of table `name` in a TorchRec export; None for a plan of ours."""
        for tables in self.doc.get("modules", {}).values():
            if name in tables:
                return tables[name]["sharding_type"], tables[name]["compute_kernel"]
        return None

    def plan_context_hash(self) -> str | None:
        return None  # the search space is checked instead (`load`, and TorchRec's `extract_plan`)

    def get_plan_id(self) -> str:
        """The file and a digest of its bytes (TorchRec's planner logs it)."""
        return f"{self.path}#{hashlib.sha256(self.path.read_bytes()).hexdigest()[:12]}"

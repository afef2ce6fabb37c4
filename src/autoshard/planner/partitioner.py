"""A TorchRec `Partitioner` that places the proposed shards with any method of our registry.

TorchRec's planner proposes sharding options (sharding type, kernel, shards with their storage
and perf from its estimators); the partitioner gives every shard a rank. This one hands the
shards to one of `autoshard`'s methods (`cli.service.METHODS`): `lpt_measured` and `milp` place
on the shards' perf totals (whichever estimator filled them: ours measures, TorchRec's models),
the heuristics and learned methods on the shards' features (learned methods need the study's
models). Memory is TorchRec's own storage estimate on the device memory the shards use (HBM, or
DDR on CPU), each device's capacity the smallest left in the topology (our methods take one cap;
every device is checked after); where nothing fits it raises TorchRec's `PlannerError` of type
`PARTITION`, as TorchRec's partitioners do. Options partitioned `uniform`ly (row-wise and
data-parallel: a shard on every rank) go first, shard i on rank i, as TorchRec's own partitioner
puts them; then those partitioned by `host` (table-row-wise: a shard on every rank of one host),
largest perf first, each on the host where it fits and leaves the busiest rank least busy, shard
i on the host's rank i; then the user's constraints, tables pinned to a rank (`pins`, by the
table's name as TorchRec has it) and groups of tables kept on one rank (`groups`, each on the
rank where it fits that is least busy); our method places the rest on what is left. Placed shards
are charged to the topology's devices. (Sharding types are TorchRec's own `ParameterConstraints`.)
Given our `topology` (`placement.topology`, what `autoshard plan --topology` reads), whose devices
may differ in speed, `lpt_measured` places the rest on it (`placement.sharding.place`): each
shard's compute over its rank's speed, each rank's own storage as TorchRec's topology has it
(`torchrec_topology` makes that from ours); `milp` then improves that placement under the same
busy time (`cli.topology_search`; not for a shard that holds host memory, which it does not count).

    planner = EmbeddingShardingPlanner(topology=topology, enumerator=enumerator,
                                       partitioner=AutoShardPartitioner(method=...))  # any id of `cli.service.METHODS`
"""

from __future__ import annotations

import functools
import operator
from collections import Counter
from pathlib import Path

import numpy as np
from torchrec.distributed.planner.types import Partitioner, PlannerError, PlannerErrorType

from autoshard.cli import service, topology_search
from autoshard.cli.sharding_plan import Result
from autoshard.core.errors import ConfigError
from autoshard.data.tasks import Task
from autoshard.methods.registry import MILP
from autoshard.placement.sharding import Layout, Piece, place
from autoshard.placement.topology import Topology
from autoshard.planner.options import as_tables, items

ON_TOPOLOGY = (service.FIRST_RUN, MILP)  # the methods that place on a topology: LPT, and the MILP from LPT's plan


class AutoShardPartitioner(Partitioner):
    """Place proposals with registry method `method` (see the module); `models` is the folder of
    the trained policy and cost model, for the learned methods (default `service.models_folder`);
    `seed` seeds the sampled and random methods. `last` keeps the last placement's method,
    bottleneck (the largest per-device sum of perf totals) and memory kind; on a topology, the
    topology too, and (`solver`) the MILP's status, lower bound and gap where it placed."""

    def __init__(self, method: str = service.FIRST_RUN, models: Path | None = None, seed: int = 0,
                 pins: dict[str, int] | None = None, groups: list[list[str]] | None = None,
                 topology: Topology | None = None) -> None:
        if method not in service.METHODS:
            raise ConfigError(f"method: {method!r} (expected one of {', '.join(service.METHODS)})")
        if topology is not None and method not in ON_TOPOLOGY:
            raise ConfigError(f"method: {method!r} places on devices alike; with a topology, "
                              f"{' or '.join(ON_TOPOLOGY)} (each shard's compute over its rank's speed, each rank's "
                              "own storage)")
        self.topology = topology
        twice = [n for n, c in Counter(n for g in groups or [] for n in g).items() if c > 1]
        if twice:
            raise ConfigError(f"groups: table {twice[0]!r} is in two groups")
        self.method = method
        self.seed = seed
        self.pins = dict(pins or {})
        self.groups = [list(g) for g in groups or []]
        self.models = (service.load_models(method, None, None, folder=service.models_folder(models))
                       if method in service.LEARNED else service.Models(cost_model=None, policy=None, files={}))
        self.last: dict = {}

    def partition(self, proposal: list, storage_constraint) -> list:
        devices = storage_constraint.devices
        for option in (o for o in proposal if o.partition_by == "uniform"):
            for rank, shard in enumerate(option.shards):
                self._charge(shard, rank, devices, option.name)
        self._by_host([o for o in proposal if o.partition_by == "host"], devices,
                      storage_constraint.local_world_size)
        held = self._constrained(proposal, devices)
        shards = [s for s in items(proposal, fixed=False) if s.option not in held]
        if not shards:
            self.last = {"method": self.method, "bottleneck": 0.0, "memory": None, "shards": 0}
            return proposal
        kind = "hbm" if any(proposal[s.option].shards[s.shard].storage.hbm > 0 for s in shards) else "ddr"
        need = np.array([getattr(proposal[s.option].shards[s.shard].storage, kind) for s in shards], dtype=np.int64)
        cap = min(getattr(d.storage, kind) for d in devices)
        if self.topology is not None:
            return self._on_topology(proposal, shards, devices, kind)
        tables = as_tables(shards, 4, max(int(o.batch_size) for o in proposal))
        tables.features["size_bytes"] = need  # TorchRec's storage estimate, not ours: its constraint is honoured
        costs = np.array([proposal[s.option].shards[s.shard].perf.total for s in shards], dtype=float)
        task = Task(name="torchrec-proposal", protocol="user", split="test", tables=tuple(range(len(shards))),
                    devices=len(devices), memory_bytes=int(cap), unseen_ratio=1.0)
        if need.max(initial=0) > cap or need.sum() > cap * len(devices):
            raise PlannerError(error_type=PlannerErrorType.PARTITION,
                               message=f"{self.method}: the shards need {int(need.sum())} bytes of {kind}, at most "
                                       f"{int(need.max(initial=0))} each; the devices hold {int(cap)} each")
        try:
            placement = service.place(self.method, tables, task, self.models, seed=self.seed,
                                      batch_size=max(int(o.batch_size) for o in proposal), single_costs=costs)
        except ConfigError as exc:
            raise PlannerError(error_type=PlannerErrorType.PARTITION, message=f"{self.method}: {exc}") from None
        for s, rank in zip(shards, placement, strict=True):
            self._charge(proposal[s.option].shards[s.shard], int(rank), devices, s.name)
        loads = np.bincount(placement, weights=costs, minlength=len(devices))
        self.last = {"method": self.method, "bottleneck": float(loads.max()), "memory": kind, "shards": len(shards)}
        return proposal

    def _on_topology(self, proposal: list, shards: list, devices: list, kind: str) -> list:
        """The shards placed by `placement.sharding.place` on the topology's speeds and on what
        each rank has left of its own storage: TorchRec's perf estimate, its compute over the
        rank's speed and its comm as it is."""
        if self.topology.devices != len(devices):
            raise ConfigError(f"topology: {self.topology.devices} devices, TorchRec's topology {len(devices)} ranks")
        layouts = []
        for s in shards:
            shard = proposal[s.option].shards[s.shard]
            perf = shard.perf
            compute = perf.fwd_compute + perf.bwd_compute + perf.prefetch_compute  # as in its total
            # on GPUs a UVM-cached shard holds DDR too, counted apart from the HBM
            ddr = np.array([shard.storage.ddr if kind == "hbm" else 0], dtype=np.int64)
            layouts.append([Layout("table_wise", (Piece(0, None, 0, None, compute, int(getattr(shard.storage, kind)),
                                                        perf.fwd_comms + perf.bwd_comms),), ddrs=ddr)])
        free = np.array([getattr(d.storage, kind) for d in devices], dtype=np.int64)
        ddr_free = np.array([d.storage.ddr if kind == "hbm" else 0 for d in devices], dtype=np.int64)
        left = Topology(self.topology.speeds, free, self.topology.hosts, ddr_free)
        found = None  # the MILP's status, bound and gap
        try:
            placed = place(layouts, left, [s.name for s in shards])
            if self.method == MILP:  # from LPT's placement, under the same busy time, each rank's own storage
                held = next((s.name for s, x in zip(shards, layouts, strict=True) if x[0].cached), None)
                if held is not None:
                    raise ConfigError(f"shard of {held} holds host memory (the UVM caching kernel), which the MILP "
                                      f"does not count ({service.FIRST_RUN} does)")
                solved = topology_search.plan(MILP, Result(placed, 0.0, {}), left)
                placed, found = solved.placed, solved.costs[MILP]
        except ConfigError as exc:
            raise PlannerError(error_type=PlannerErrorType.PARTITION, message=f"{self.method}: {exc}") from None
        busy = np.zeros(len(devices))
        for s, p in zip(shards, placed, strict=True):
            rank = p.devices[0]
            self._charge(proposal[s.option].shards[s.shard], rank, devices, s.name)
            piece = p.layout.pieces[0]
            busy[rank] += piece.cost / self.topology.speeds[rank] + piece.comm
        self.last = {"method": self.method, "bottleneck": float(busy.max()), "memory": kind, "shards": len(shards),
                     "topology": self.topology.document(),
                     **({"solver": {k: found[k] for k in ("status", "lower_bound_ms", "gap")}} if found else {})}
        return proposal

    def _constrained(self, proposal: list, devices: list) -> set[int]:
        """Place the pinned tables on their ranks and each group on one rank (see the module); the
        indices of the options placed. A name not proposed, or proposed split, is refused."""
        by_name = {o.name: i for i, o in enumerate(proposal)}
        for name in [*self.pins, *(n for g in self.groups for n in g)]:
            if name not in by_name:
                raise ConfigError(f"pins/groups: table {name!r} is not among the proposed tables")
            if len(proposal[by_name[name]].shards) != 1:
                raise ConfigError(f"pins/groups: table {name!r} is proposed {proposal[by_name[name]].sharding_type} "
                                  "(a pinned or grouped table is whole: constrain its sharding_types to table_wise)")
        wrong = [(n, r) for n, r in self.pins.items() if not (isinstance(r, int) and 0 <= r < len(devices))]
        if wrong:
            raise ConfigError(f"pins: table {wrong[0][0]!r}: rank {wrong[0][1]!r} (ranks 0 to {len(devices) - 1})")
        groups = [[by_name[n] for n in g] for g in self.groups]
        for group in groups:
            at = {self.pins[proposal[i].name] for i in group if proposal[i].name in self.pins}
            if len(at) > 1:
                raise ConfigError(f"groups: {[proposal[i].name for i in group]} pinned to ranks {sorted(at)}")
            if not at:
                need = functools.reduce(operator.add, (proposal[i].shards[0].storage for i in group))
                fits = [r for r, d in enumerate(devices) if need.fits_in(d.storage)]
                if not fits:
                    raise PlannerError(error_type=PlannerErrorType.PARTITION,
                                       message=f"{self.method}: group {[proposal[i].name for i in group]} fits no rank")
                at = {min(fits, key=lambda r: (devices[r].perf.total, r))}
            for i in group:
                self._charge(proposal[i].shards[0], next(iter(at)), devices, proposal[i].name)
        grouped = {i for g in groups for i in g}
        for name, rank in self.pins.items():
            if by_name[name] not in grouped:
                self._charge(proposal[by_name[name]].shards[0], rank, devices, name)
        return grouped | {by_name[n] for n in self.pins}

    def _by_host(self, options: list, devices: list, local: int) -> None:
        """Each option's shards on the ranks of one host, in order (see the module)."""
        for option in sorted(options, key=lambda o: -sum(s.perf.total for s in o.shards)):
            best, best_peak = None, None
            for host in range(len(devices) // local):
                ranks = range(host * local, host * local + len(option.shards))
                if all(s.storage.fits_in(devices[r].storage) for s, r in zip(option.shards, ranks, strict=False)):
                    peak = max(devices[r].perf.total + s.perf.total for s, r in zip(option.shards, ranks,
                                                                                   strict=False))
                    if best_peak is None or peak < best_peak:
                        best, best_peak = host, peak
            if best is None:
                raise PlannerError(error_type=PlannerErrorType.PARTITION,
                                   message=f"{self.method}: {option.name}'s table-row-wise shards fit no host")
            for i, shard in enumerate(option.shards):
                self._charge(shard, best * local + i, devices, option.name)

    def _charge(self, shard, rank: int, devices: list, name: str) -> None:
        """Put `shard` on `rank` and charge its storage and perf there (TorchRec's error if it
        does not fit what is left: every memory kind is checked, not only the one placed on)."""
        if not shard.storage.fits_in(devices[rank].storage):
            raise PlannerError(error_type=PlannerErrorType.PARTITION,
                               message=f"{self.method}: a shard of {name} does not fit rank {rank}")
        shard.rank = rank
        devices[rank].storage -= shard.storage
        devices[rank].perf += shard.perf


def torchrec_topology(topology: Topology, compute_device: str = "cuda"):
    """TorchRec's `Topology` of ours: its ranks in hosts of one size, each rank's own memory (HBM
    and DDR on GPUs, DDR on CPU); TorchRec has no speed per device, which
    `AutoShardPartitioner(topology=...)` adds."""
    from torchrec.distributed.planner import Topology as TorchRecTopology

    if topology.local is None:
        raise ConfigError(f"topology: hosts of {sorted(set(topology.hosts))} devices (TorchRec's ranks fill hosts "
                          "of one size)")
    kind = "ddr" if compute_device == "cpu" else "hbm"
    out = TorchRecTopology(world_size=topology.devices, local_world_size=topology.local,
                           compute_device=compute_device, **{f"{kind}_cap": int(topology.memories.max())})
    for device, memory, ddr in zip(out.devices, topology.memories, topology.ddrs, strict=True):
        setattr(device.storage, kind, int(memory))
        if kind == "hbm":
            device.storage.ddr = int(ddr)
    return out

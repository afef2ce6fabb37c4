"""`autoshard plan --method torchrec --sharding row|auto`: TorchRec's own planner on the user's
model, with the accounting every other method of the command has.

TorchRec plans the model the export writes (`cli.torchrec.check.embedding_model`: an
EmbeddingBagCollection per module path, an EmbeddingCollection for the sequence tables, row-wise
Adagrad fused into the backward) on a topology of `--torchrec-device` devices (GPUs by default;
on CPU TorchRec's planner finds no fused option for sequence tables) in hosts of
`--devices-per-host`, each with `--memory-per-device` and no storage reservation. It is told every table's pooling
factor, the kernels our planner may choose (the fused one, the whole table in device memory; on
GPUs also the UVM caching kernel at `--cache-load-factor`, TorchRec's 0.2 by default, each rank
with `--ddr-per-device` of host memory) and the sharding types `--sharding` offers (`row`:
table-, row- and table-row-wise; `auto`: column-wise too). A shard it keeps in host memory is
counted as ours are (`placement.caching`: HBM and DDR apart). Its storage estimate is at the
per-rank training batch, so it counts what `data.footprint` counts (weights, optimizer state,
input and output buffers); its perf estimate of each chosen shard is the shard's cost (compute,
forward and backward), and the plan's communication and memory are counted as for our own plans
(`placement.traffic`, `data.footprint`), so the two plan files read alike.
"""

from __future__ import annotations

import logging
import time

from autoshard.cli.constraints import OFFERED
from autoshard.cli.sharding_plan import Result
from autoshard.cli.user_tables import UserTables
from autoshard.core.errors import ConfigError
from autoshard.data.footprint import shard_footprint
from autoshard.placement import caching
from autoshard.placement.sharding import Layout, Piece, Placed, host_split
from autoshard.placement.topology import DDR_BYTES
from autoshard.placement.traffic import Links, piece_bytes


def plan(tables: UserTables, sharding: str, devices: int, local: int, memory_bytes: int, batch: int, links: Links,
         compute_device: str = "cuda", kinds: dict[int, tuple[str, ...]] | None = None,
         load_factor: float | None = None, ddr_bytes: int = DDR_BYTES) -> Result:
    """TorchRec's plan of `tables` (see the module) as our sharded placement, `kinds` restricting
    tables' sharding types (by index), `load_factor` (GPUs) offering the UVM caching kernel with
    `ddr_bytes` of host memory a rank; refused in one line when TorchRec finds none."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
    from torchrec.distributed.types import CacheParams

    from autoshard.placement.torchrec import split_name

    for name in ("torchrec", "torchrec.distributed.planner"):
        logging.getLogger(name).setLevel(logging.ERROR)
    model, topology = model_and_topology(tables, devices, local, memory_bytes, compute_device, ddr_bytes)
    kernels = ["fused"] if load_factor is None else ["fused", caching.KERNEL]
    cache = {} if load_factor is None else {"cache_params": CacheParams(load_factor=load_factor)}
    f = tables.features
    told = {}
    for t, (name, pooling, sequence) in enumerate(zip(tables.names, f["pooling_factor"], tables.sequence,
                                                      strict=True)):
        types = [k for k in (kinds or {}).get(t, OFFERED[sharding])
                 if k != "table_row_wise" or host_split(sequence, devices, local)]
        told[split_name(name)[1]] = ParameterConstraints(sharding_types=types, compute_kernels=kernels,
                                                         pooling_factors=[float(pooling)], **cache)
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=max(1, batch // devices), constraints=told,
                                       storage_reservation=FixedPercentageStorageReservation(0.0))
    start = time.perf_counter()
    try:
        planner.plan(model, sharders())
    except Exception as exc:  # noqa: BLE001 - the planner's own errors are many and specific
        raise ConfigError(f"--method torchrec: TorchRec's planner found no plan ({exc.__class__.__name__}: "
                          f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from None
    seconds = time.perf_counter() - start
    chosen = {(f"{o.path}.{o.name}" if o.path else o.name): o for o in planner._best_plan}  # noqa: SLF001
    placed = [_placed(tables, t, chosen[name], batch, devices, local, links, load_factor)
              for t, name in enumerate(tables.names)]
    used, held = [0] * devices, [0] * devices
    for p in placed:
        for q, d, ddr in zip(p.layout.pieces, p.devices, p.layout.ddrs, strict=True):
            used[d] += q.memory
            held[d] += int(ddr)
    for what, counted, cap in (("--memory-per-device", used, memory_bytes), ("--ddr-per-device", held, ddr_bytes)):
        over = [d for d in range(devices) if counted[d] > cap]
        if over:
            raise ConfigError(f"--method torchrec: its plan puts {counted[over[0]]} bytes (while training) on device "
                              f"{over[0]}, more than {what} {cap}")
    return Result(placed, seconds, {
        "objective": "TorchRec's planner's own (its perf estimate, comm included, and its storage estimate)",
        "kind": "estimated", "what": "TorchRec's perf estimate of each shard its planner chose, compute forward + "
                                     "backward (ms)", "backend": "torchrec planner", "device": compute_device,
        "batch_size": batch})


def model_and_topology(tables: UserTables, devices: int, local: int, memory_bytes: int, compute_device: str,
                       ddr_bytes: int = DDR_BYTES):
    """The meta-device model the export writes (`cli.torchrec.check.embedding_model`, row-wise
    Adagrad attached) and TorchRec's topology of the devices (`memory_bytes` each as HBM and
    `ddr_bytes` as DDR, or `memory_bytes` as DDR on CPU)."""
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec.distributed.planner import Topology
    from torchrec.optim import RowWiseAdagrad

    from autoshard.cli.torchrec.check import embedding_model
    from autoshard.placement.torchrec import modules_of

    model = embedding_model(tables, modules_of(tables.features, tables.names), "meta")
    _apply_optimizer_in_backward(RowWiseAdagrad, model.parameters(), {"lr": 0.01})  # the rate does not enter a plan
    cap = {"ddr_cap": memory_bytes} if compute_device == "cpu" else {"hbm_cap": memory_bytes, "ddr_cap": ddr_bytes}
    return model, Topology(world_size=devices, local_world_size=local, compute_device=compute_device, **cap)


def sharders() -> list:
    """The sharders of the model's modules: EmbeddingBagCollections and EmbeddingCollections."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    return [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]


def _placed(tables: UserTables, t: int, option, batch: int, devices: int, local: int, links: Links,
            load_factor: float | None = None) -> Placed:
    """One table's TorchRec sharding option as our layout and devices (a cached one's pieces
    counted as `placement.caching` counts a cached table: its rows' cache in HBM, all of them in
    DDR)."""
    f = tables.features
    dim, pooling = int(f["dim"].iloc[t]), float(f["pooling_factor"].iloc[t])
    sequence, weight = bool(tables.sequence[t]), int(tables.weight_bytes[t])
    kind = option.sharding_type
    if kind == "column_wise" and len(option.shards) == 1:
        kind = "table_wise"  # one column shard of all the columns: the whole table
    ways = len(option.shards) if kind in ("row_wise", "table_row_wise") else 1
    values = pooling if sequence else 1.0
    cached = option.compute_kernel == caching.KERNEL
    pieces, ddrs = [], []
    for shard in option.shards:
        (row, column), (held, width) = shard.offset, shard.size
        comm = links.ms(*piece_bytes(kind, width, values, sequence, batch, devices, local)) if held else 0.0
        cost = float(shard.perf.fwd_compute + shard.perf.bwd_compute)
        if cached:
            hbm, ddr = caching.memory(int(held), int(width), weight, batch, pooling, sequence, load_factor)
        else:
            hbm, ddr = shard_footprint(int(held), int(width), weight, batch, pooling, sequence, ways), 0
        pieces.append(Piece(int(row), None if ways == 1 else int(held), int(column),
                            None if width == dim else int(width), cost, hbm, comm))
        ddrs.append(ddr)
    layout = Layout(kind, tuple(pieces), kernel=caching.KERNEL, ddrs=ddrs) if cached else Layout(kind, tuple(pieces))
    return Placed(layout, tuple(int(s.rank) for s in option.shards))

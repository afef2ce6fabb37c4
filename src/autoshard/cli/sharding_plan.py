"""`autoshard plan --sharding row|auto` (or `table` with `--constraints`): each table's sharding
chosen with its placement (`placement.sharding`), on per-piece costs measured here
(`lpt_measured`; with the analytic backend, TorchRec's perf estimate at the training batch on
`--torchrec-device`, no trace drawn) or predicted by the cost model (`cost_greedy`), with the
memory of training (`data.footprint`) for every piece, and the plan file listing whole tables
(`assignment`), column shards (`columns`) and row shards (`rows`).

`--sharding row` offers every table whole, row-wise over all devices and, with more than one
host (`--devices-per-host`), table-row-wise over one host; `auto` offers column-wise splits
(`--column-ways`) too, and data-parallel: a replica of the table on every device, each serving
its 1/D of the batch (its cost: the table with 1/D of its lookups, measured on every D-th lookup of
its trace; its memory: the whole table and the buffers of its share of the batch), whose gradient
all-reduce is charged as its communication. A row shard of a table holds its rows' share of the lookups (TorchRec's
input split) and the table's reuse histogram (its rows are a random share of the table's
popularity ranks, `synth.scatter`); measured, it is timed on its own slice of the table's trace.
Sequence tables are not offered table-row-wise (TorchRec's EmbeddingCollection has no such sharding)
nor data-parallel (TorchRec 1.8's EmbeddingCollection fails a data-parallel forward on CPU ranks:
its output lengths do not match the local batch, `tests/cli/test_sharding.py`).

Each piece also pays for its output exchange (`placement.traffic`: the bytes its device moves,
within its host and across hosts, at `--bandwidths`, TorchRec's by default), so that a split's
choice weighs the communication it adds; that time is reported beside the pieces' costs, never
summed into them (it is modelled, they are measured or predicted).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import lru_cache, partial
from itertools import groupby
from typing import NamedTuple

import numpy as np
import pandas as pd

from autoshard.cli.constraints import Constraints
from autoshard.cli.service import FIRST_RUN, finite_predictions
from autoshard.cli.user_tables import UserTables
from autoshard.core.errors import ConfigError
from autoshard.core.inputs import PLAN_FORMAT, Block, Cached, shown
from autoshard.data.features import REUSE_COLUMNS, feature_matrix
from autoshard.data.footprint import io_bytes, row_split, shard_footprint
from autoshard.data.sizes import table_bytes
from autoshard.data.traces import from_lengths
from autoshard.methods.registry import GREEDY
from autoshard.placement import caching
from autoshard.placement.column_split import ALIGN
from autoshard.placement.sharding import Layout, Piece, Placed, check_memory, host_split, place
from autoshard.placement.topology import Topology
from autoshard.placement.traffic import TORCHREC_GIB_PER_S, Links, gradient_bytes, piece_bytes

COST_METHODS = (FIRST_RUN, GREEDY)  # piece costs measured here, or predicted by the cost model
COST_COLUMNS = {"predicted": "predicted_ms", "measured": "measured_alone_ms", "estimated": "estimated_ms"}


class Shape(NamedTuple):
    """A piece: table `table`'s rows [row, row + rows) and columns [column, column + width), one
    of `ways` row shards (1: all its rows, the whole table or a column shard), or one of
    `replicas` data-parallel copies of the whole table (1: not replicated). A tuple: there are
    hundreds of thousands of them at 2,000 tables on 96 devices."""

    table: int
    row: int
    rows: int
    column: int
    width: int
    ways: int
    replicas: int = 1

    def block(self, dim: int) -> tuple[int, int | None, int, int | None]:
        """(row, rows, column, width) as a plan's `Block` has them (None: all)."""
        return (self.row, None if self.ways == 1 else self.rows, self.column,
                None if self.width == dim else self.width)


class Spread(NamedTuple):
    """A layout with a piece on each of `ways` (row shards) or `replicas` (data-parallel) devices,
    its pieces made only when asked for: at most three distinct shapes (TorchRec's row split has
    one size, the remainder and empty shards), among up to hundreds of pieces."""

    table: int
    rows: int
    dim: int
    ways: int = 1
    replicas: int = 1

    def shapes(self) -> list[Shape]:
        """Every piece, in device order."""
        if self.replicas > 1:
            return [Shape(self.table, 0, self.rows, 0, self.dim, 1, self.replicas)] * self.replicas
        split = _split(self.rows, self.ways)
        starts = np.concatenate([[0], np.cumsum(split)[:-1]]).tolist()
        return [Shape(self.table, int(s), int(n), 0, self.dim, self.ways) for s, n in zip(starts, split, strict=True)]

    def sizes(self) -> list[int]:
        """Each piece's rows, in device order."""
        return [self.rows] * self.replicas if self.replicas > 1 else _split(self.rows, self.ways)

    def distinct(self) -> dict[int, Shape]:
        """The last piece of each distinct size, by its rows, in the order the sizes first come
        (a piece's cost depends on its size, `piece_key`; measured, on its own slice of the trace)."""
        return _distinct(self)

    def _distinct(self) -> dict[int, Shape]:
        if self.replicas > 1:
            return {self.rows: Shape(self.table, 0, self.rows, 0, self.dim, 1, self.replicas)}
        out, start = {}, 0
        for n, run in groupby(_split(self.rows, self.ways)):  # a run of equal sizes: its last piece
            count = sum(1 for _ in run)
            out[n] = Shape(self.table, start + (count - 1) * n, n, 0, self.dim, self.ways)
            start += count * n
        return out


@lru_cache(maxsize=65_536)
def _split(rows: int, ways: int) -> list[int]:
    """`row_split`, once per (rows, ways): a spread asks for its sizes and its distinct pieces."""
    return row_split(rows, ways)


@lru_cache(maxsize=65_536)
def _sizes(spread: Spread) -> np.ndarray:
    """`Spread.sizes` as an array, once per spread."""
    return np.array(spread.sizes(), dtype=np.int64)


@lru_cache(maxsize=65_536)
def _distinct(spread: Spread) -> dict[int, Shape]:
    """`Spread.distinct`, once per spread (the placement asks for it several times a table)."""
    return spread._distinct()  # noqa: SLF001


def shapes(tables: UserTables, sharding: str, devices: int, local: int,
           column_ways: tuple[int, ...]) -> list[list[tuple[str, list[Shape] | Spread]]]:
    """Each table's candidate layouts: (kind, pieces), whole first (`placement.sharding` breaks
    ties towards fewer pieces); row-wise, table-row-wise and data-parallel pieces as a `Spread`."""
    f = tables.features
    out = []
    for t, (rows, dim, sequence) in enumerate(zip(f["rows"].tolist(), f["dim"].tolist(), tables.sequence.tolist(),
                                                  strict=True)):
        options = [("table_wise", [Shape(t, 0, rows, 0, dim, 1)])]
        if sharding == "auto":
            for k in column_ways:
                if k > 1 and dim % k == 0 and (dim // k) % ALIGN == 0:
                    w = dim // k
                    options.append(("column_wise", [Shape(t, 0, rows, i * w, w, 1) for i in range(k)]))
        if sharding == "auto" and devices > 1 and not sequence:
            options.append(("data_parallel", Spread(t, rows, dim, replicas=devices)))
        for kind, k in (("row_wise", devices), ("table_row_wise", local)) if sharding != "table" else ():
            if k > 1 and rows >= k and (kind != "table_row_wise" or host_split(sequence, devices, local)):
                options.append((kind, Spread(t, rows, dim, ways=k)))
        out.append(options)
    return out


def piece_key(s: Shape) -> tuple[int, int, int, int]:
    """Pieces of one table with the same rows, width and replicas cost the same (their rows are a
    random share)."""
    return s.table, s.rows, s.width, s.replicas


def piece_tables(tables: UserTables, distinct: list[Shape], traces: bool) -> tuple[pd.DataFrame, object]:
    """The distinct pieces as tables of their own: features (the table's reuse histogram, the
    lookups of its rows) and, with `traces`, each piece's slice of its table's trace."""
    f = tables.features
    weight = tables.weight_bytes
    t = np.array([s.table for s in distinct])
    rows = np.array([s.rows for s in distinct], dtype=np.int64)
    width = np.array([s.width for s in distinct], dtype=np.int64)
    share = rows / f["rows"].to_numpy()[t] / np.array([s.replicas for s in distinct])
    pieces = pd.DataFrame({"table": np.arange(len(distinct)), "dim": width, "rows": rows,
                           "pooling_factor": f["pooling_factor"].to_numpy()[t] * share,
                           "size_bytes": [int(table_bytes(int(r), int(w), int(b)))
                                          for r, w, b in zip(rows, width, weight[t], strict=True)]})
    if all(c in f for c in REUSE_COLUMNS):  # absent where the tables were read without (`read_tables`)
        pieces[REUSE_COLUMNS] = f[REUSE_COLUMNS].to_numpy()[t]
    if not traces:
        return pieces, None
    whole = tables.traces
    lengths, parts = [], []
    for s in distinct:
        idx, counts = whole.table(s.table), whole.lengths[s.table]
        keep = (idx >= s.row) & (idx < s.row + s.rows) & (np.arange(len(idx)) % s.replicas == 0)
        bags = np.repeat(np.arange(len(counts)), counts)
        lengths.append(np.bincount(bags[keep], minlength=len(counts)))
        parts.append((idx[keep] - s.row).astype(idx.dtype))
    pieces["pooling_factor"] = [float(n.mean()) for n in lengths]
    return pieces, from_lengths(np.concatenate(parts), np.stack(lengths))


@dataclass(frozen=True)
class Result:
    """Each table's layout and devices, the seconds the placement took, and the plan file's
    `costs` entry (what the pieces' costs are)."""

    placed: list[Placed]
    seconds: float
    costs: dict


def parse_bandwidths(value: str | None) -> Links:
    """`--bandwidths INTRA,CROSS` (GiB/s, each positive and finite; default TorchRec's)."""
    if value is None:
        return Links.from_gib_per_s(*TORCHREC_GIB_PER_S)
    try:
        intra, cross = (float(v) for v in value.split(","))
    except ValueError:
        intra = cross = float("nan")
    if not (0 < intra < 1e6 and 0 < cross < 1e6):
        raise ConfigError(f"--bandwidths: {shown(value)} (expected INTRA,CROSS in GiB/s, e.g. 600,12.5)")
    return Links.from_gib_per_s(intra, cross)


def plan(tables: UserTables, sharding: str, topology: Topology, batch: int,
         column_ways: tuple[int, ...], piece_costs, links: Links, constraints: Constraints | None = None,
         load_factor: float | None = None) -> Result:
    """The tables' layouts and devices on `topology`. `piece_costs(distinct)` gives each distinct
    piece's cost (ms, on a device of speed 1) and the plan file's `costs` entry (`measured`,
    `estimated` or `predicted` below); each piece's communication is charged at `links`;
    `constraints` pin, group and restrict tables. Table-row-wise shards are offered where every
    host has as many devices (TorchRec's), and comm is charged as if every host were the smallest.
    With `load_factor` (GPUs), a table that fits no device's HBM whole is offered whole with
    TorchRec's UVM caching kernel too (`placement.caching`): that share of it in HBM, all of it in
    DDR, its cost the whole table's times TorchRec's slowdown for the kernel; where the tables do
    not fit HBM together, some that fit it alone are kept there as well (`_place`)."""
    constraints = constraints or Constraints()
    devices, local = topology.devices, topology.local or min(topology.hosts)
    candidates = shapes(tables, sharding, devices, topology.local or 1, column_ways)
    for t, kinds in constraints.kinds.items():
        candidates[t] = [o for o in candidates[t] if o[0] in kinds]
        if not candidates[t]:
            raise ConfigError(f"table {tables.names[t]}: none of its sharding_types {list(kinds)} can shard it "
                              f"({int(tables.features['rows'].iloc[t])} rows)")
    distinct = list({piece_key(s): s for c in candidates for _, pieces in c
                     for s in (pieces.distinct().values() if isinstance(pieces, Spread) else pieces)
                     if s.rows}.values())
    index = {piece_key(s): i for i, s in enumerate(distinct)}
    costs, source = piece_costs(distinct)
    f = tables.features
    weight, pooling, sequence = tables.weight_bytes, f["pooling_factor"].to_numpy(), tables.sequence
    dims = f["dim"].tolist()
    layouts: list[list[Layout]] = []
    biggest = int(topology.memories.max())  # a table whole above it may be cached (`load_factor`)
    wholes: dict[int, Piece] = {}  # each table's whole fused piece, where one may be cached
    for t, options in enumerate(candidates):
        found = []
        held = {}  # a row-wise table's shards come in two or three sizes: each computed once
        values = float(pooling[t]) if sequence[t] else 1.0
        for kind, pieces in options:
            spread = isinstance(pieces, Spread)
            first = next(iter(pieces.distinct().values())) if spread else pieces[0]
            if kind == "data_parallel":
                each = links.ms(*gradient_bytes(first.rows, first.width, devices, local))
            else:
                each = links.ms(*piece_bytes(kind, first.width, values, bool(sequence[t]), batch, devices, local))
            made = {}  # each distinct shape's (cost, memory, comm)
            for s in (pieces.distinct().values() if spread else pieces):
                key = (s.rows, s.width, s.ways, s.replicas)
                if key not in held:
                    held[key] = footprint(s, int(weight[t]), batch, float(pooling[t]), bool(sequence[t]))
                made[s.rows, s.width] = (0.0 if s.rows == 0 else float(costs[index[piece_key(s)]]), held[key],
                                         0.0 if s.rows == 0 else each)
            if not all(np.isfinite(c) for c, _, _ in made.values()):
                continue  # too large to measure here: not offered
            if not spread:
                found.append(Layout(kind, tuple(Piece(*s.block(dims[t]), *made[s.rows, s.width]) for s in pieces)))
                if kind == "table_wise" and load_factor is not None:
                    wholes[t] = found[-1].pieces[0]
                    if found[-1].memories[0] > biggest:
                        found.append(_cached(wholes[t], tables, t, batch, load_factor))
                continue
            sizes = _sizes(pieces)
            loads, memories = np.empty(len(sizes)), np.empty(len(sizes), dtype=np.int64)
            costs_of, comms = np.empty(len(sizes)), np.empty(len(sizes))
            for n in pieces.distinct():  # at most three sizes among up to hundreds of pieces
                c, b, m = made[n, first.width]
                at = sizes == n
                loads[at], memories[at], costs_of[at], comms[at] = c + m, b, c, m
            found.append(Layout(kind, loads=loads, memories=memories, comms=comms, costs=costs_of,
                                build=partial(_pieces, pieces, made)))
        if not found:
            raise ConfigError(f"{tables.source}: table {tables.names[t]}: too large to measure on this machine, "
                              f"whole or split (use --method {GREEDY})")
        layouts.append(found)
    start = time.perf_counter()
    placed = _place(layouts, wholes, topology, tables, constraints, batch, load_factor)
    return Result(placed, time.perf_counter() - start,
                  {"objective": "the busiest device's costs plus its comm (placement.sharding)", **source})


FILLS = (0.9, 0.75, 0.6, 0.45, 0.3)  # the shares of the devices' HBM the tables kept there may ask, tried in turn


def _place(layouts: list[list[Layout]], wholes: dict[int, Piece], topology: Topology, tables: UserTables,
           constraints: Constraints, batch: int, load_factor: float | None) -> list[Placed]:
    """`grouped_place`, and where the tables do not fit in HBM: with `load_factor`, tables are kept
    in host memory by the caching kernel, those whose caching adds the least compute for each byte
    of HBM it frees first (cold, large tables), as many as bring the tables' smallest layouts within
    `FILLS[k]` of the devices' HBM, each share tried in turn until the placement fits (the greedy
    would otherwise fill HBM with the first tables and find no room one table later)."""
    if load_factor is None or not wholes:
        return grouped_place(layouts, topology, tables.names, constraints)
    plain = np.array([min(int(layout.memories.sum()) for layout in c if not layout.cached) for c in layouts])
    has = int(topology.memories.sum())
    failed = None
    if plain.sum() <= has:
        try:
            return grouped_place(layouts, topology, tables.names, constraints)
        except ConfigError as error:
            failed = error
    fixed = {t for members, _ in constraints.groups for t in members} | set(constraints.device)
    offered = {t: next((layout for layout in layouts[t] if layout.cached), None) or
               _cached(whole, tables, t, batch, load_factor) for t, whole in wholes.items() if t not in fixed}
    check_memory([c if t not in offered or offered[t] in c else [*c, offered[t]] for t, c in enumerate(layouts)],
                 topology, tables.names)  # the shortfall of the model, whichever tables were cached, in one line
    hbm, ddr = int(topology.memories.max()), int(topology.ddrs.max())
    offered = {t: layout for t, layout in offered.items() if layout.memories[0] <= hbm and layout.ddrs[0] <= ddr}
    freed = {t: plain[t] - int(layout.memories.sum()) for t, layout in offered.items()}
    cheapest = {t: min(layout.load for layout in layouts[t] if not layout.cached) for t in offered}
    order = sorted((t for t in offered if freed[t] > 0),
                   key=lambda t: ((offered[t].load - cheapest[t]) / freed[t], t))
    room, tried = int(topology.ddrs.sum()), []
    for fill in FILLS:
        need, held, chosen = int(plain.sum()), 0, []
        for t in order:
            if need <= fill * has:
                break
            if held + int(offered[t].ddrs[0]) > room:  # no DDR left for it: the next coldest instead
                continue
            chosen.append(t)
            need, held = need - freed[t], held + int(offered[t].ddrs[0])
        if not chosen or chosen == tried:  # the same tables as the share before: the same refusal
            continue
        tried = chosen
        trial = list(layouts)
        for t in chosen:
            trial[t] = [offered[t]]
        try:
            return grouped_place(trial, topology, tables.names, constraints)
        except ConfigError as error:
            failed = failed or error
    if failed is None:  # no share asked any table to move: the tables' own layouts decide
        return grouped_place(layouts, topology, tables.names, constraints)
    raise failed


def _cached(whole: Piece, tables: UserTables, t: int, batch: int, load_factor: float) -> Layout:
    """Table `t` whole with TorchRec's UVM caching kernel, from its `whole` fused piece: its compute
    slowed as TorchRec estimates, its comm as it is, its memory in HBM and DDR apart."""
    f = tables.features
    hbm, ddr = caching.memory(int(f["rows"].iloc[t]), int(f["dim"].iloc[t]), int(tables.weight_bytes[t]), batch,
                              float(f["pooling_factor"].iloc[t]), bool(tables.sequence[t]), load_factor)
    piece = whole._replace(cost=whole.cost * caching.slowdown(load_factor), memory=hbm)
    return Layout("table_wise", (piece,), kernel=caching.KERNEL, ddrs=np.array([ddr]))


def cached(tables: UserTables, placed: list[Placed], load_factor: float | None) -> Cached | None:
    """The tables placed on TorchRec's UVM caching kernel, by name, with the cache's load factor
    (None where no table is)."""
    names = frozenset(n for n, p in zip(tables.names, placed, strict=True) if p.layout.kernel == caching.KERNEL)
    return Cached(names, load_factor) if names and load_factor is not None else None


def _pieces(spread: Spread, made: dict) -> tuple[Piece, ...]:
    """A spread layout's pieces, each with its shape's (cost, memory, comm)."""
    return tuple(Piece(*s.block(spread.dim), *made[s.rows, s.width]) for s in spread.shapes())


def footprint(s: Shape, weight_bytes: int, batch: int, pooling: float, sequence: bool) -> int:
    """Bytes a piece holds while training (`data.footprint`); a data-parallel replica holds the
    whole table and the buffers of its 1/replicas of the batch."""
    if s.replicas == 1:
        return shard_footprint(s.rows, s.width, weight_bytes, batch, pooling, sequence, s.ways)
    inputs, outputs = io_bytes(math.ceil(batch / s.replicas), pooling, s.width, sequence)
    return int(table_bytes(s.rows, s.width, weight_bytes)) + inputs + outputs


def grouped_place(layouts: list[list[Layout]], topology: Topology, names: list[str],
                   constraints: Constraints) -> list[Placed]:
    """`placement.sharding.place` with each group of tables placed as one whole table (its costs,
    comm and memory summed) and pinned tables on their devices; then each member on its group's device."""
    grouped = {t for members, _ in constraints.groups for t in members}
    alone = [t for t in range(len(layouts)) if t not in grouped]
    items = [layouts[t] for t in alone]
    labels = [names[t] for t in alone]
    fixed = [constraints.device.get(t) for t in alone]
    for members, device in constraints.groups:
        whole = [layouts[t][0].pieces[0] for t in members]  # pinned and grouped tables offer table_wise only
        items.append([Layout("table_wise", (Piece(0, None, 0, None, sum(p.cost for p in whole),
                                                  sum(p.memory for p in whole), sum(p.comm for p in whole)),))])
        labels.append(f"group of {', '.join(names[t] for t in members)}")
        fixed.append(device)
    placed = place(items, topology, labels, fixed)
    out: list[Placed | None] = [None] * len(layouts)
    for t, p in zip(alone, placed[:len(alone)], strict=True):
        out[t] = p
    for (members, _), p in zip(constraints.groups, placed[len(alone):], strict=True):
        for t in members:
            out[t] = Placed(layouts[t][0], p.devices)
    return [p for p in out if p is not None]


def measured(tables: UserTables, cfg, folder, progress: bool):
    """Piece costs measured alone on this machine (`cli.singles`, cached), each on its own slice
    of its table's trace."""
    from autoshard.cli.singles import measure_singles
    from autoshard.data.pool import Pool

    def costs(distinct: list[Shape]) -> tuple[np.ndarray, dict]:
        features, traces = piece_tables(tables, distinct, traces=True)
        singles = measure_singles(Pool(features=features, traces=traces), cfg, folder, progress)
        return singles.costs, {**singles.source(), "what": "each piece (whole table, column or row shard) alone, on "
                                                           "its slice of the trace, forward + backward (ms)"}
    return costs


def estimated(tables: UserTables, batch: int, device: str = "cpu"):
    """Piece costs by TorchRec's own table-wise perf model (`measure.analytic`, what the analytic
    backend returns) at the training batch on `device` (the command's `--torchrec-device`: the
    devices planned for, so that compute and comm are on one scale), without traces: instant at
    any size (`lookup_scaled`)."""

    def costs(distinct: list[Shape]) -> tuple[np.ndarray, dict]:
        pieces = piece_tables(tables, distinct, traces=False)[0]
        sequence = tables.sequence[[s.table for s in distinct]]
        return lookup_scaled(pieces["dim"].to_numpy(), pieces["pooling_factor"].to_numpy(float), batch, device,
                             sequence), {
            "kind": "estimated", "what": "TorchRec's table-wise perf estimate of each piece alone, forward + "
                                         "backward (ms)", "backend": "analytic", "device": device, "batch_size": batch}
    return costs


def lookup_scaled(dims: np.ndarray, lookups: np.ndarray, batch: int, device: str,
                  sequence: np.ndarray | None = None) -> np.ndarray:
    """TorchRec's table-wise compute estimate (forward + backward, ms) of each (dim, lookups per
    sample): its bytes are linear in the lookups, a pooled output's at min(1, lookups), so the
    estimate is linear in them on each side of 1 and is read off TorchRec's at 0.5, 1 and 2
    lookups, once per dim, not once per piece (thousands of pieces: TorchRec's evaluator takes ms
    a call). A `sequence` table's output holds every lookup: its line is the one below 1, extended."""
    from autoshard.measure.formulas import table_perf

    out = np.empty(len(dims))
    for dim in np.unique(dims):
        at = {lookups: (lambda p: p.fwd_compute + p.bwd_compute)(table_perf(int(dim), lookups, batch, 1, device))
              for lookups in (0.5, 1.0, 2.0)}
        held = dims == dim
        x = lookups[held]
        unpooled = np.zeros(len(x), bool) if sequence is None else np.asarray(sequence, bool)[held]
        out[held] = np.where((x >= 1) & ~unpooled, at[1.0] + (at[2.0] - at[1.0]) * (x - 1),
                             at[1.0] + (at[1.0] - at[0.5]) * 2 * (x - 1))
    return out


def predicted(tables: UserTables, models):
    """Piece costs predicted one piece at a time by the cost model (`service.Models`)."""
    def costs(distinct: list[Shape]) -> tuple[np.ndarray, dict]:
        x = feature_matrix(piece_tables(tables, distinct, traces=False)[0])
        cost = models.shard_costs(x, [[i] for i in range(len(x))])
        finite_predictions(cost, models)
        return cost, {"kind": "predicted", "what": "the cost model's prediction of each piece (whole table, column "
                                                   "or row shard) alone (ms)", "model_files": models.files}
    return costs


def blocks(tables: UserTables, placed: list[Placed]) -> tuple[dict[str, list[Block]], dict[str, str]]:
    """The plan as `core.inputs` blocks and TorchRec sharding types, by table name."""
    out, kinds = {}, {}
    for name, p in zip(tables.names, placed, strict=True):
        out[name] = [Block(q.row, q.rows, q.column, q.width, d) for q, d in zip(p.layout.pieces, p.devices,
                                                                                 strict=True)]
        kinds[name] = p.layout.kind
    return out, kinds


def document(method: str, options: dict, tables: UserTables, topology: Topology, result: Result,
             models_files: dict, engine: str) -> dict:
    """The plan file: whole tables in `assignment`, split ones (`--sharding` row or auto) in
    `columns` or `rows` (with their TorchRec sharding type), data-parallel ones in `replicated`
    and UVM-cached ones in `cached` (where there are any), and per device its pieces, their memory
    while training (HBM; with a cached table, its DDR apart) and the sum of the costs the plan placed on
    (`costs` says whether measured alone or predicted); on a topology of unlike devices, each
    device's speed and memory, and its busy time (its costs over its speed, plus its comm)."""
    devices, memory_bytes = topology.devices, int(topology.memories.max())
    kind = result.costs["kind"]
    timed = kind in COST_COLUMNS  # else a heuristic's key (`cli.topology_plan`), or no cost at all
    column = COST_COLUMNS[kind] if timed else f"{result.costs['key']}_key" if kind == "heuristic" else None
    load, used, count = np.zeros(devices), np.zeros(devices, dtype=np.int64), np.zeros(devices, dtype=np.int64)
    comm, host = np.zeros(devices), np.zeros(devices, dtype=np.int64)
    names: list[list[str]] = [[] for _ in range(devices)]
    assignment, columns, rows, replicated, cached = {}, {}, {}, [], {}
    for name, p in zip(tables.names, result.placed, strict=True):
        at = list(p.devices)  # each device's sums in table order, as adding piece by piece would make them
        np.add.at(load, at, p.layout.costs)
        np.add.at(comm, at, p.layout.comms)
        np.add.at(used, at, p.layout.memories)
        np.add.at(count, at, 1)
        if p.layout.kind in ("table_wise", "data_parallel"):  # named without their pieces (a replica on every device)
            shown_as = name if p.layout.kind == "table_wise" else f"{name} (replica)"
            for d in p.devices:
                names[d].append(shown_as)
        else:
            for q, d in zip(p.layout.pieces, p.devices, strict=True):
                names[d].append(f"{name}[{q.row}:{q.row + q.rows}, :]" if q.rows is not None else
                                f"{name}[:, {q.column}:{q.column + q.width}]")
        if p.layout.cached:
            np.add.at(host, list(p.devices), p.layout.ddrs)
            cached[name] = {"kernel": p.layout.kernel, "cache_load_factor": options["cache_load_factor"],
                            "hbm_bytes": int(p.layout.memories.sum()), "ddr_bytes": int(p.layout.ddrs.sum())}
        if p.layout.kind == "table_wise":
            assignment[name] = int(p.devices[0])
        elif p.layout.kind == "data_parallel":
            replicated.append(name)
        elif p.layout.kind == "column_wise":
            columns[name] = [{"start": q.column, "width": q.width, "device": int(d)}
                             for q, d in zip(p.layout.pieces, p.devices, strict=True)]
        else:
            rows[name] = {"kind": p.layout.kind, "shards": [{"start": q.row, "rows": q.rows, "device": int(d)}
                                                            for q, d in zip(p.layout.pieces, p.devices, strict=True)]}
    unlike = not topology.alike
    busy = "busy_ms" if timed else "busy_key"
    per_device = [{"device": d, "shards": int(count[d]), "memory_bytes": int(used[d]),
                   "memory_share": float(used[d] / topology.memories[d]),
                   **({column: float(load[d])} if column else {}),
                   **({"comm_modelled_ms": float(comm[d])} if timed else {}),
                   **({"ddr_bytes": int(host[d]), "ddr_capacity_bytes": int(topology.ddrs[d])} if cached else {}),
                   **({"speed": float(topology.speeds[d]), "capacity_bytes": int(topology.memories[d])} if unlike
                      else {}),
                   **({busy: float(load[d] / topology.speeds[d] + comm[d])} if unlike and column else {}),
                   "names": names[d]}
                  for d in range(devices)]
    return {"format": PLAN_FORMAT, "method": method, "options": options, "tables_file": tables.source,
            "devices": devices, "memory_per_device_bytes": memory_bytes,
            **({"topology": topology.document()} if unlike else {}), "assignment": assignment,
            **({} if options["sharding"] == "table" else  # every table whole: a plan of whole tables
               {"sharding": options["sharding"], "columns": columns, "rows": rows}),
            **({"replicated": replicated} if replicated else {}), **({"cached": cached} if cached else {}),
            "per_device": per_device,
            "predicted_bottleneck_ms": float(load.max()) if kind == "predicted" else None,
            "predicted": "by the cost model, one piece at a time, summed per device, not measured (measure with "
                         "`autoshard score`)" if kind == "predicted" else
                         f"nothing (the plan placed on costs {kind} piece by piece, summed per device)" if timed else
                         f"nothing (the plan placed on {result.costs['what']})",
            "sharding_seconds": result.seconds, "model_files": models_files, "engine": engine,
            "costs": {**result.costs, **({"cached": _cached_costs(options["cache_load_factor"])} if cached else {}),
                      "comm": {"what": "not charged: the plan placed on no time"} if not timed else {
                "what": "each piece's output exchange, forward and backward (a data-parallel replica's gradient "
                        "all-reduce), charged on its device: bytes within its host and across hosts over the links' "
                        "bandwidths (placement.traffic), modelled, not measured",
                "bandwidths_gib_per_s": options["bandwidths_gib_per_s"], "bottleneck_ms": float(comm.max())}}}


def _cached_costs(load_factor: float) -> dict:
    """The plan file's word on what a cached table's cost is."""
    return {"what": f"a table kept in host memory by TorchRec's UVM caching kernel costs the whole table's cost times "
                    f"TorchRec's slowdown for the kernel ({caching.slowdown(load_factor):.1f}x at a cache load factor "
                    f"of {load_factor:g}: its bandwidth against HBM's, placement.caching), modelled, not measured",
            "slowdown": caching.slowdown(load_factor)}

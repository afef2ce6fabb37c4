"""Each table's sharding chosen with its placement: table-wise (whole, on any device),
column-wise (k column shards, each on any device), row-wise (a row shard on every device),
table-row-wise (a row shard on every device of one host) or data-parallel (a replica on every
device, each serving its share of the batch), as TorchRec's proposers offer them.

The caller lists each table's candidate layouts, every piece with its cost (ms on its device,
measured or predicted: the caller's) and its memory (bytes while training, `data.footprint`).
The search is LPT over layouts: the tables that fit no device whole first (by the memory of
their smallest split), then the others by decreasing cost, each given the feasible layout and
devices that leave the lowest bound on the final bottleneck, the larger of the busiest device's
load and the average load once every table is placed (the load so far, this layout's pieces and
the cheapest layout of each table still to place, over the devices). The first term is LPT's;
the second charges a split for the work it adds (every piece pays its kernel's fixed cost), so a
table is split where the balance gained outweighs that, or where it fits no device whole.
A device's load is the sum of its pieces' costs (single-piece costs, as LPT's) and their
communication (`placement.traffic`, charged on each piece's own device), so a split also pays for
what it sends: a row-wise table moves D times its whole output, a data-parallel one all-reduces its
whole gradient. A piece may hold host memory (DDR) too, a table kept there by TorchRec's UVM
caching kernel (`placement.caching`): each device's HBM and DDR are counted apart, each against its
own capacity.
Torch-free and deterministic: ties go to fewer pieces, then to the lower device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from autoshard.core.errors import ConfigError
from autoshard.placement.topology import Topology

KINDS = ("table_wise", "column_wise", "row_wise", "table_row_wise", "data_parallel")


def host_split(sequence: bool, devices: int, local: int) -> bool:
    """Whether a table may go table-row-wise: there is more than one host, and the table is pooled
    (TorchRec's EmbeddingCollection has no table-row-wise sharding)."""
    return not sequence and local < devices


class Piece(NamedTuple):
    """A table's rows [row, row + rows) and columns [column, column + width) (None: all), its
    cost (ms, compute), memory (bytes) and communication (ms) on the device it goes to (a tuple:
    a 96-way split of 2,000 tables makes hundreds of thousands)."""

    row: int
    rows: int | None
    column: int
    width: int | None
    cost: float
    memory: int
    comm: float = 0.0

    @property
    def load(self) -> float:
        """What the piece adds to its device's step time: compute and communication."""
        return self.cost + self.comm


class Layout:
    """One way to shard a table. Table- and column-wise pieces go to any device; row-wise and
    data-parallel ones to devices 0..D-1 in order; table-row-wise ones to the devices of one host,
    in order. The placement reads only each piece's load and memory (`loads`, `memories`), the
    plan file each one's compute and comm apart (`costs`, `comms`); a layout given those may build
    its pieces when they are first asked for (`build`): a 96-way split of 2,000 tables would
    otherwise make hundreds of thousands that are never placed.
    `kernel` is TorchRec's compute kernel for its pieces, `ddrs` the host memory each holds beside
    its `memories` (HBM; none but with the UVM caching kernel)."""

    def __init__(self, kind: str, pieces: tuple[Piece, ...] | None = None, *, loads: np.ndarray | None = None,
                 memories: np.ndarray | None = None, comms: np.ndarray | None = None,
                 costs: np.ndarray | None = None, build: Callable[[], tuple[Piece, ...]] | None = None,
                 kernel: str = "fused", ddrs: np.ndarray | None = None):
        if pieces is None and (build is None or loads is None or memories is None or costs is None):
            raise ValueError("a layout needs its pieces, or their loads, memories, costs and a builder")
        self.kind, self._pieces, self._build, self.kernel = kind, pieces, build, kernel
        self.loads = np.array([p.load for p in pieces]) if loads is None else np.asarray(loads, dtype=float)
        self.memories = (np.array([p.memory for p in pieces], dtype=np.int64) if memories is None else
                         np.asarray(memories, dtype=np.int64))
        self.comms = (np.array([p.comm for p in pieces]) if pieces is not None else
                      np.zeros(len(self.loads)) if comms is None else np.asarray(comms, dtype=float))
        self.costs = (np.array([p.cost for p in pieces]) if pieces is not None else  # each piece's compute
                      np.asarray(costs, dtype=float))
        self._ddrs = None if ddrs is None else np.asarray(ddrs, dtype=np.int64)
        self.cached = self._ddrs is not None and bool(self._ddrs.any())  # its pieces hold host memory

    @property
    def ddrs(self) -> np.ndarray:
        """Each piece's host memory (bytes): none but with TorchRec's UVM caching kernel."""
        return np.zeros(len(self.loads), dtype=np.int64) if self._ddrs is None else self._ddrs

    @property
    def pieces(self) -> tuple[Piece, ...]:
        if self._pieces is None:
            self._pieces = self._build()
        return self._pieces

    def __len__(self) -> int:
        return len(self.loads)

    def __repr__(self) -> str:
        return f"Layout({self.kind!r}, {len(self)} pieces{'' if self.kernel == 'fused' else ', ' + self.kernel})"

    @property
    def load(self) -> float:
        return float(self.loads.sum())

    @property
    def contiguous(self) -> bool:
        """Whether the pieces go to consecutive devices (row-wise, table-row-wise, data-parallel)."""
        return self.kind in ("row_wise", "table_row_wise", "data_parallel")


@dataclass(frozen=True)
class Placed:
    """A table's chosen layout and the device of each of its pieces."""

    layout: Layout
    devices: tuple[int, ...]


def place(candidates: Sequence[Sequence[Layout]], topology: Topology, names: Sequence[str],
          fixed: Sequence[int | None] | None = None) -> list[Placed]:
    """Every table's layout and devices (see the module) on `topology`'s devices: a piece's
    compute divided by its device's speed, each device's memory its own; a table no layout of
    which fits what is left is refused by name. `fixed` pins a table (its one whole layout) to a
    device: pinned tables are placed first, where they are pinned."""
    devices, speeds, caps = topology.devices, topology.speeds, topology.memories
    check_memory(candidates, topology, names)
    loads, used = np.zeros(devices), np.zeros(devices, dtype=np.int64)
    held = np.zeros(devices, dtype=np.int64)  # DDR
    cheapest = np.array([min(layout.load for layout in c) for c in candidates])
    # tables that fit no device whole go first, largest first: they need the room the others would take
    # (a table offered in host memory as well still fits no device whole: its layouts without DDR decide)
    plain = [[layout for layout in c if not layout.cached] or list(c) for c in candidates]
    need = [min(int(layout.memories.max()) for layout in c) for c in plain]
    forced = [not any(len(layout) == 1 and layout.memories[0] <= caps.max() for layout in c) for c in plain]
    pinned = list(fixed) if fixed is not None else [None] * len(candidates)
    order = sorted(range(len(candidates)), key=lambda t: (pinned[t] is None, not forced[t],
                                                          -need[t] if forced[t] else -cheapest[t], t))
    remaining = float(cheapest.sum())
    unit, capacity = bool((speeds == 1).all()), float(speeds.sum())
    done = 0.0  # the work placed so far, at speed 1
    out: list[Placed | None] = [None] * len(candidates)
    for t in order:
        remaining -= cheapest[t]
        best, best_key, best_time = None, None, None
        peak, total = float(loads.max()), float(loads.sum())
        for layout in candidates[t]:
            if best is not None:  # a layout whose key cannot beat the best one's is not fitted at all
                floor = max(peak, (total + layout.load + remaining) / devices * (1 - 1e-12) if unit else
                            (done + layout.load + remaining) / capacity)  # the key's first part, from below
                if floor > best_key[0] or (floor == best_key[0] and len(layout) > len(best.layout)):
                    continue
            spots = _fit(layout, loads, used, held, topology, pinned[t], unit)
            if spots is None:
                continue
            new = loads.copy()
            time = _time(layout.loads, layout.comms, speeds[list(spots)], unit)
            if layout.contiguous:
                new[spots[0]:spots[0] + len(spots)] += time
            else:
                np.add.at(new, list(spots), time)
            average = ((new.sum() + remaining) / devices if unit else  # the work over the devices' capacity
                       (done + layout.load + remaining) / capacity)
            key = (max(new.max(), average), len(layout), spots)
            if best_key is None or key < best_key:
                best, best_key, best_time = Placed(layout, spots), key, time
        if best is None and pinned[t] is not None:
            raise ConfigError(f"table {names[t]}: pinned to device {pinned[t]}, which has "
                              f"{int(caps[pinned[t]] - used[pinned[t]])} bytes left of the "
                              f"{candidates[t][0].memories[0]} it needs")
        if best is None:
            free = caps - used
            whole = min((int(layout.memories[0]) for layout in candidates[t] if len(layout) == 1 and not
                         layout.cached), default=None)
            split = [int(layout.memories.max()) for layout in candidates[t] if len(layout) > 1]
            rows = (f"; split, its largest piece needs {min(split)} (the fullest device has "
                    f"{int(free.min())} left)") if split else ""
            cached = [layout for layout in candidates[t] if layout.cached]
            host = (f"; cached in host memory, {int(cached[0].memories[0])} bytes of HBM and "
                    f"{int(cached[0].ddrs[0])} of DDR (the freest device has {int((topology.ddrs - held).max())} "
                    "of DDR left)") if cached else ""
            said = (f"whole it needs {whole} bytes, the freest device has {int(free.max())}{rows}{host}"
                    if whole is not None else  # its one layout left is cached (`cli.sharding_plan._place`)
                    f"{(rows + host)[2:]}; the freest device has {int(free.max())} of HBM left")
            raise ConfigError(f"table {names[t]}: no sharding of it fits what the devices have left ({said}; more "
                              "memory or devices)")
        np.add.at(loads, list(best.devices), best_time)
        np.add.at(used, list(best.devices), best.layout.memories)
        if best.layout.cached:
            np.add.at(held, list(best.devices), best.layout.ddrs)
        done += best.layout.load
        out[t] = best
    return [p for p in out if p is not None]


def check_memory(candidates: Sequence[Sequence[Layout]], topology: Topology,
                 names: Sequence[str] | None = None) -> None:
    """Refuse, in one line, tables that cannot fit the devices however they are placed: at each
    table's layout of least HBM they need more HBM than the devices have in all, or, where some
    may be kept in host memory, more HBM and DDR together (2 TiB of tables on 8 ranks of 80 GiB HBM
    and 128 GiB DDR), so that the refusal names the model's shortfall, not the first table left
    without room."""
    least = [min(int(layout.memories.sum()) for layout in c) for c in candidates]
    hbm, has_hbm = sum(least), int(topology.memories.sum())
    if any(layout.cached for c in candidates for layout in c):
        both = sum(min(int(layout.memories.sum() + layout.ddrs.sum()) for layout in c) for c in candidates)
        has_both = has_hbm + int(topology.ddrs.sum())
        if both > has_both:
            raise ConfigError(f"the {len(candidates)} tables need at least {both} bytes of HBM and host memory "
                              f"together, each at its smallest sharding, and the {topology.devices} devices have "
                              f"{has_both} ({has_hbm} of HBM, {has_both - has_hbm} of DDR; more memory or devices)")
    if hbm > has_hbm:
        alone = int(np.argmax(least))
        if least[alone] > has_hbm and names is not None:
            raise ConfigError(f"table {names[alone]}: no sharding of it fits the devices (it needs at least "
                              f"{least[alone]} bytes of HBM at its smallest sharding, the {topology.devices} devices "
                              f"have {has_hbm} in all; more memory or devices)")
        raise ConfigError(f"the {len(candidates)} tables need at least {hbm} bytes of HBM, each at its smallest "
                          f"sharding, and the {topology.devices} devices have {has_hbm} in all (more memory or "
                          "devices)")


def _time(loads: np.ndarray | float, comms: np.ndarray | float, speeds: np.ndarray, unit: bool = False) -> np.ndarray:
    """Pieces' times on devices of `speeds`: compute over the speed, comm as it is (at speed 1
    exactly the load, so that a cluster of one generation places as it always did; `unit`:
    every speed is 1)."""
    if unit:
        return loads
    return np.where(speeds == 1, loads, (np.asarray(loads) - comms) / speeds + comms)


def _fit(layout: Layout, loads: np.ndarray, used: np.ndarray, held: np.ndarray, topology: Topology,
         pinned: int | None = None, unit: bool = False) -> tuple[int, ...] | None:
    """The devices `layout`'s pieces go to, the least loaded that fit in HBM (`used`) and DDR
    (`held`) (`pinned`: that device, for a whole table); None if they do not fit."""
    free = topology.memories - used
    host = topology.ddrs - held if layout.cached else None
    if pinned is not None:
        fits = len(layout) == 1 and free[pinned] >= layout.memories[0] and (host is None or
                                                                           host[pinned] >= layout.ddrs[0])
        return (pinned,) if fits else None
    speeds = topology.speeds
    if len(layout) == 1 and host is None and layout.kind == "table_wise":  # most tables: one argmin, no copies
        p = layout.pieces[0]
        fits = np.flatnonzero(free >= p.memory)
        if not len(fits):
            return None
        return (int(fits[np.argmin(loads[fits] + _time(p.load, p.comm, speeds[fits], unit))]),)
    if layout.kind in ("table_wise", "column_wise"):
        spots, load, room = [], loads.copy(), free.copy()
        for k, p in enumerate(layout.pieces):
            fits = np.flatnonzero(room >= p.memory if host is None else (room >= p.memory) & (host >= layout.ddrs[k]))
            if not len(fits):
                return None
            d = int(fits[np.argmin(load[fits] + _time(p.load, p.comm, speeds[fits], unit))])
            spots.append(d)
            load[d] += _time(p.load, p.comm, speeds[d], unit)
            room[d] -= p.memory
            if host is not None:
                host[d] -= layout.ddrs[k]
        return tuple(spots)
    n = len(layout)
    if layout.kind in ("row_wise", "data_parallel"):
        starts = np.array([0])
    else:  # table-row-wise: the hosts of its size
        starts = np.array([s for s, size in zip(topology.host_starts, topology.hosts, strict=True) if size == n],
                          dtype=np.int64)
    starts = starts[starts + n <= len(loads)]
    spans = starts[:, None] + np.arange(n)  # each candidate's devices, one row a start
    fits = (free[spans] >= layout.memories).all(axis=1)
    if host is not None:
        fits &= (host[spans] >= layout.ddrs).all(axis=1)
    if not fits.any():
        return None
    starts, spans = starts[fits], spans[fits]  # only starts that fit can win, whatever their peaks
    peaks = (loads[spans] + _time(layout.loads, layout.comms, speeds[spans], unit)).max(axis=1)
    best = int(starts[np.argmin(peaks)])  # the lowest peak; ties: the first start
    return tuple(range(best, best + n))

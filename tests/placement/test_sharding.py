"""Choosing each table's sharding with its placement (`placement.sharding`): LPT over layouts."""

import numpy as np
import pytest

from autoshard.core.errors import ConfigError
from autoshard.placement.sharding import Layout, Piece, place
from autoshard.placement.topology import Topology


def whole(cost: float, memory: int) -> Layout:
    return Layout("table_wise", (Piece(0, None, 0, None, cost, memory),))


def rows(kind: str, cost: float, memory: int, ways: int) -> Layout:
    return Layout(kind, tuple(Piece(i * 10, 10, 0, None, cost, memory) for i in range(ways)))


def test_tables_stay_whole_where_splitting_adds_work_and_buys_no_balance():
    tables = [[whole(4.0, 10), rows("row_wise", 1.5, 3, 4)] for _ in range(8)]
    placed = place(tables, Topology.uniform(4, 100, 4), [f"t{i}" for i in range(8)])
    assert all(p.layout.kind == "table_wise" for p in placed)
    assert sorted(d for p in placed for d in p.devices) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_a_dominant_table_is_split_by_rows_when_that_lowers_the_bottleneck():
    tables = [[whole(40.0, 10), rows("row_wise", 10.5, 3, 4)]] + [[whole(1.0, 1)] for _ in range(4)]
    placed = place(tables, Topology.uniform(4, 100, 4), [f"t{i}" for i in range(5)])
    assert placed[0].layout.kind == "row_wise" and placed[0].devices == (0, 1, 2, 3)


def test_a_table_too_large_for_one_device_goes_table_row_wise_on_the_freer_host():
    tables = [[whole(5.0, 60)], [whole(8.0, 150), rows("table_row_wise", 4.5, 75, 2)]]
    placed = place(tables, Topology.uniform(4, 100, 2), ["small", "big"])
    assert placed[1].layout.kind == "table_row_wise"
    host = {d // 2 for d in placed[1].devices}
    assert len(host) == 1 and host != {placed[0].devices[0] // 2}


def test_a_table_no_layout_of_which_fits_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"table huge: no sharding of it fits .* \(whole it needs 300 bytes, "
                                          r"the freest device has 100; split, its largest piece needs 150"):
        place([[whole(1.0, 300), rows("row_wise", 0.3, 150, 2)]], Topology.uniform(4, 100, 4), ["huge"])
    with pytest.raises(ConfigError, match=r"table huge: no sharding of it fits the devices \(it needs at least "
                                          r"300 bytes of HBM at its smallest sharding, the 2 devices have 200 in all"):
        place([[whole(1.0, 300), rows("row_wise", 0.3, 150, 2)]], Topology.uniform(2, 100, 2), ["huge"])
    with pytest.raises(ConfigError, match="must divide --devices 4"):
        place([[whole(1.0, 1)]], Topology.uniform(4, 100, 3), ["t"])


def test_a_busy_small_table_is_replicated_on_every_device_where_its_all_reduce_is_cheap():
    """A data-parallel layout puts one replica on each device in order; chosen where a quarter of
    the work on every device (plus its all-reduce) beats the busiest device's load whole, not where
    the all-reduce costs more than that."""
    def replicas(cost: float, comm: float) -> Layout:
        return Layout("data_parallel", tuple(Piece(0, None, 0, None, cost / 4, 5, comm) for _ in range(4)))

    cheap = [[whole(20.0, 5), replicas(20.0, 0.1)]] + [[whole(3.0, 1)] for _ in range(4)]
    placed = place(cheap, Topology.uniform(4, 100, 4), [f"t{i}" for i in range(5)])
    assert placed[0].layout.kind == "data_parallel" and placed[0].devices == (0, 1, 2, 3)
    dear = [[whole(20.0, 5), replicas(20.0, 30.0)]] + [[whole(3.0, 1)] for _ in range(4)]
    assert place(dear, Topology.uniform(4, 100, 4), [f"t{i}" for i in range(5)])[0].layout.kind == "table_wise"


def exhaustive(candidates, topology: Topology) -> list[tuple[str, tuple[int, ...]]]:
    """`place` without its shortcuts (every layout fitted, every host tried in turn): the reference
    that the pruned search must equal, table by table (no pins, no host memory)."""
    import numpy as np

    devices, speeds, caps = topology.devices, topology.speeds, topology.memories
    unit, capacity = bool((speeds == 1).all()), float(speeds.sum())

    def time(loads, comms, at):
        return loads if unit else np.where(at == 1, loads, (np.asarray(loads) - comms) / at + comms)

    def fit(layout, loads, used):
        free = caps - used
        if layout.kind in ("table_wise", "column_wise"):
            spots, load, room = [], loads.copy(), free.copy()
            for p in layout.pieces:
                fits = np.flatnonzero(room >= p.memory)
                if not len(fits):
                    return None
                d = int(fits[np.argmin(load[fits] + time(p.load, p.comm, speeds[fits]))])
                spots.append(d)
                load[d] += time(p.load, p.comm, speeds[d])
                room[d] -= p.memory
            return tuple(spots)
        n = len(layout)
        starts = [0] if layout.kind in ("row_wise", "data_parallel") else [
            int(s) for s, size in zip(topology.host_starts, topology.hosts, strict=True) if size == n]
        best, best_peak = None, None
        for first in starts:
            if first + n <= devices and (free[first:first + n] >= layout.memories).all():
                peak = float((loads[first:first + n] + time(layout.loads, layout.comms, speeds[first:first + n])).max())
                if best_peak is None or peak < best_peak:
                    best, best_peak = first, peak
        return None if best is None else tuple(range(best, best + n))

    cheapest = np.array([min(layout.load for layout in c) for c in candidates])
    forced = [not any(len(x) == 1 and x.memories[0] <= caps.max() for x in c) for c in candidates]
    need = [min(int(x.memories.max()) for x in c) for c in candidates]
    order = sorted(range(len(candidates)), key=lambda t: (not forced[t], -need[t] if forced[t] else -cheapest[t], t))
    loads, used, remaining, done, out = np.zeros(devices), np.zeros(devices, dtype=np.int64), cheapest.sum(), 0.0, {}
    for t in order:
        remaining -= cheapest[t]
        best = None
        for layout in candidates[t]:
            spots = fit(layout, loads, used)
            if spots is None:
                continue
            new, spent = loads.copy(), time(layout.loads, layout.comms, speeds[list(spots)])
            np.add.at(new, list(spots), spent)
            average = (new.sum() + remaining) / devices if unit else (done + layout.load + remaining) / capacity
            key = (max(new.max(), average), len(layout), spots)
            if best is None or key < best[0]:
                best = (key, layout, spots, spent)
        _, layout, spots, spent = best
        np.add.at(loads, list(spots), spent)
        np.add.at(used, list(spots), layout.memories)
        done += layout.load
        out[t] = (layout.kind, spots)
    return [out[t] for t in range(len(candidates))]


@pytest.mark.parametrize("seed", range(40))
def test_the_pruned_search_places_every_table_as_fitting_every_layout_would(seed):
    import numpy as np

    g = np.random.default_rng(seed)
    hosts = (4, 4) if seed % 2 else (2, 2, 2)
    devices = sum(hosts)
    speeds = np.ones(devices) if seed % 3 else g.choice([1.0, 0.5, 0.7], devices)
    caps = g.integers(60, 120, devices) if seed % 5 else np.full(devices, 100)
    topology = Topology(speeds=speeds, memories=caps, hosts=hosts)
    tables = []
    for _ in range(int(g.integers(6, 30))):
        cost, memory, comm = float(g.lognormal(0, 1)), int(g.integers(5, 60)), float(g.uniform(0, 0.2))
        local = hosts[0]
        tables.append([Layout("table_wise", (Piece(0, None, 0, None, cost, memory, comm),)),
                       Layout("column_wise", tuple(Piece(0, None, 4 * i, 4, cost * 0.55, memory // 2, comm / 2)
                                                   for i in range(2))),
                       rows("row_wise", cost / devices * 1.1, -(-memory // devices) + 1, devices),
                       rows("table_row_wise", cost / local * 1.05, -(-memory // local) + 1, local),
                       Layout("data_parallel", tuple(Piece(0, None, 0, None, cost / devices, memory, comm * 3)
                                                     for _ in range(devices)))])
    names = [f"t{i}" for i in range(len(tables))]
    try:
        placed = place(tables, topology, names)
    except ConfigError:
        return
    assert [(p.layout.kind, p.devices) for p in placed] == exhaustive(tables, topology)


def test_tables_larger_than_every_devices_memory_together_are_refused_with_the_shortfall():
    """The refusal names the model's need and the devices' memory in all, not the first table left
    without room; with a table that may be cached, HBM and DDR together."""
    tables = [[whole(1.0, 60), rows("row_wise", 0.5, 30, 2)] for _ in range(4)]
    with pytest.raises(ConfigError, match=r"the 4 tables need at least 240 bytes of HBM, each at its smallest "
                                          r"sharding, and the 2 devices have 200 in all"):
        place(tables, Topology.uniform(2, 100, 2), list("abcd"))
    cached = Layout("table_wise", (Piece(0, None, 0, None, 9.0, 10),), kernel="fused_uvm_caching",
                    ddrs=np.array([500]))
    with pytest.raises(ConfigError, match=r"need at least 690 bytes of HBM and host memory together.* the 2 "
                                          r"devices have 600 \(200 of HBM, 400 of DDR"):
        place([[whole(1.0, 60)]] * 3 + [[whole(1.0, 700), cached]],
              Topology(np.ones(2), np.array([100, 100]), (2,), np.array([200, 200])), list("abcd"))

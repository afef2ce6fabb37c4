"""Choosing each table's sharding with its placement (`placement.sharding`): LPT over layouts."""

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

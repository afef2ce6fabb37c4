"""Placing on unlike devices: a piece's compute over its device's speed, each device's own memory,
hosts of any size; on devices alike, the placement it always was."""

import numpy as np
import pytest

from autoshard.core.errors import ConfigError
from autoshard.placement.sharding import Layout, Piece, place
from autoshard.placement.topology import Topology


def whole(cost: float, memory: int, comm: float = 0.0) -> list[Layout]:
    return [Layout("table_wise", (Piece(0, None, 0, None, cost, memory, comm),))]


def busy(placed, topology: Topology) -> np.ndarray:
    out = np.zeros(topology.devices)
    for p in placed:
        for q, d in zip(p.layout.pieces, p.devices, strict=True):
            out[d] += q.cost / topology.speeds[d] + q.comm
    return out


def test_a_slow_device_gets_less_work_and_a_small_one_less_memory():
    tables = [whole(1.0, 10) for _ in range(6)]
    fast_and_slow = Topology(np.array([1.0, 0.5]), np.array([100, 100]), (2,))
    counts = np.bincount([p.devices[0] for p in place(tables, fast_and_slow, list("abcdef"))], minlength=2)
    assert counts.tolist() == [4, 2], "twice as fast, twice the tables: both busy 4 ms"
    small = Topology(np.ones(2), np.array([100, 25]), (2,))
    counts = np.bincount([p.devices[0] for p in place(tables, small, list("abcdef"))], minlength=2)
    assert counts.tolist() == [4, 2], "the device of 25 bytes holds two tables of 10"


def test_comm_is_not_scaled_by_speed():
    tables = [whole(1.0, 10, comm=3.0), whole(1.0, 10, comm=3.0)]
    topology = Topology(np.array([1.0, 0.25]), np.array([100, 100]), (2,))
    placed = place(tables, topology, ["a", "b"])
    assert sorted(busy(placed, topology).tolist()) == [4.0, 7.0]  # 1 + 3 and 1 / 0.25 + 3, not (1 + 3) / 0.25


def test_devices_alike_place_as_a_uniform_cluster():
    rng = np.random.default_rng(0)
    tables = [whole(float(c), int(m), float(k)) for c, m, k in zip(rng.uniform(0.1, 5, 40), rng.integers(1, 30, 40),
                                                                   rng.uniform(0, 1, 40), strict=True)]
    names = [f"t{i}" for i in range(40)]
    alike = Topology(np.ones(4), np.full(4, 400), (2, 2))
    assert [p.devices for p in place(tables, alike, names)] == \
        [p.devices for p in place(tables, Topology.uniform(4, 400, 2), names)]


def test_table_row_wise_goes_to_a_host_of_its_size():
    rows = [Layout("table_row_wise", (Piece(0, 5, 0, None, 1.0, 10), Piece(5, 5, 0, None, 1.0, 10)))]
    uneven = Topology(np.ones(5), np.full(5, 100), (3, 2))
    assert place([rows], uneven, ["t"])[0].devices == (3, 4)


def test_a_table_that_fits_no_device_names_the_freest():
    with pytest.raises(ConfigError, match="the freest device has 50"):
        place([whole(1.0, 60)], Topology(np.ones(2), np.array([50, 40]), (2,)), ["big"])


def test_uniform_refuses_hosts_that_do_not_divide_the_devices():
    with pytest.raises(ConfigError, match="--devices-per-host: 3 \\(must divide --devices 4\\)"):
        Topology.uniform(4, 100, 3)
    assert Topology.uniform(4, 100, 2).hosts == (2, 2) and Topology.uniform(4, 100).local == 4

"""The communication of a sharded plan's pieces (`placement.traffic`) against TorchRec's own
per-shard comm estimate, and what it makes the placement choose."""

import logging

import pandas as pd
import pytest

from autoshard.placement.sharding import Layout, Piece, place
from autoshard.placement.topology import Topology
from autoshard.placement.traffic import TORCHREC_GIB_PER_S, Links, gradient_bytes, piece_bytes

KINDS = ("table_wise", "column_wise", "row_wise", "table_row_wise")


def test_the_default_bandwidths_are_torchrec_planners():
    from torchrec.distributed.planner.constants import CROSS_NODE_BANDWIDTH, INTRA_NODE_BANDWIDTH

    links = Links.from_gib_per_s(*TORCHREC_GIB_PER_S)
    assert links.intra_bytes_per_ms == pytest.approx(INTRA_NODE_BANDWIDTH)
    assert links.cross_bytes_per_ms == pytest.approx(CROSS_NODE_BANDWIDTH)


def test_a_row_wise_table_moves_what_every_device_would_move_for_it_whole():
    whole = piece_bytes("table_wise", 64, 1.0, False, 4096, 16, 4)
    assert piece_bytes("row_wise", 64, 1.0, False, 4096, 16, 4) == whole  # on each of the 16 devices
    assert piece_bytes("row_wise", 64, 30.0, True, 4096, 16, 4) == pytest.approx(
        tuple(b * 30 / 16 for b in whole))  # a sequence row shard returns only its rows' lookups
    intra, cross = piece_bytes("table_row_wise", 64, 1.0, False, 4096, 16, 4)
    assert cross < whole[1] and intra > whole[0]  # reduced within the host first, then 1/L crosses
    assert piece_bytes("table_wise", 64, 1.0, False, 4096, 1, 1) == (0.0, 0.0)
    assert piece_bytes("table_wise", 64, 1.0, False, 4096, 8, 8)[1] == 0.0  # one host: nothing crosses


@pytest.mark.parametrize("pooling, values", [("pooled", 3.0), ("sequence", 20.0)])
def test_per_piece_comm_ranks_the_shardings_as_torchrecs_estimator_does(pooling, values):
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

    from autoshard.cli.torchrec.method import sharders
    from autoshard.planner.production import model_and_topology

    logging.getLogger("torchrec").setLevel(logging.ERROR)
    world, local, per_rank = 16, 4, 512
    table = pd.DataFrame([{"name": "t", "rows": 100_000, "dim": 64, "pooling_factor": values, "module": "m",
                           "pooling": pooling}])
    model, topology, _ = model_and_topology(table, world, local, 80 * 2**30)
    told = {"t": ParameterConstraints(pooling_factors=[values], compute_kernels=["fused"])}
    links = Links.from_gib_per_s(*TORCHREC_GIB_PER_S)
    ratio = {}
    for option in EmbeddingEnumerator(topology=topology, batch_size=per_rank, constraints=told).enumerate(
            model, sharders()):
        if option.sharding_type in KINDS:
            shard = option.shards[0]
            theirs = shard.perf.fwd_comms + shard.perf.bwd_comms
            ours = links.ms(*piece_bytes(option.sharding_type, shard.size[1], values if pooling == "sequence" else 1.0,
                                         pooling == "sequence", per_rank * world, world, local))
            ratio[option.sharding_type] = ours / theirs
    assert {"table_wise", "row_wise"} <= set(ratio)
    # TorchRec counts a shard's whole output at the slower link; these count what leaves the device at its link
    assert all((world - local) / world * 0.9 <= r <= 1.0 for r in ratio.values()), ratio
    assert max(ratio.values()) / min(ratio.values()) < 1.1, ratio  # the shardings' relative comm agrees


@pytest.mark.parametrize("cross_gib_per_s, chosen", [(1e6, "row_wise"), (12.5, "table_row_wise")])
def test_a_table_that_must_be_split_goes_within_a_host_where_the_network_is_slow(cross_gib_per_s, chosen):
    world, local, batch, dim = 4, 2, 65536, 512
    links = Links.from_gib_per_s(600.0, cross_gib_per_s)

    def layout(kind: str, ways: int, cost: float) -> Layout:
        comm = links.ms(*piece_bytes(kind, dim, 1.0, False, batch, world, local))
        return Layout(kind, tuple(Piece(i, 1, 0, None, cost, 150 // ways, comm) for i in range(ways)))

    big = [Layout("table_wise", (Piece(0, None, 0, None, 10.0, 150),)), layout("row_wise", world, 2.6),
           layout("table_row_wise", local, 5.1)]  # fits no device of 100 whole
    assert place([big], Topology.uniform(world, 100, local), ["big"])[0].layout.kind == chosen


def test_a_replicas_gradient_all_reduce_moves_what_a_hierarchical_ring_moves():
    """One host of 8: a ring all-reduce of S bytes sends 2 (D - 1) / D * S from each device, none
    across. Four hosts of 8: the same within each host, then each device's 1/8 slice all-reduced
    across the 4 hosts, 2 * 3/4 of it."""
    size = 1000 * 64 * 4
    assert gradient_bytes(1000, 64, 8, 8) == pytest.approx((2 * 7 / 8 * size, 0.0))
    assert gradient_bytes(1000, 64, 32, 8) == pytest.approx((2 * 7 / 8 * size, 2 * 3 / 4 * size / 8))
    assert gradient_bytes(1000, 64, 1, 1) == (0.0, 0.0)
    assert gradient_bytes(2000, 64, 32, 8)[1] == pytest.approx(2 * gradient_bytes(1000, 64, 32, 8)[1])

"""The memory a shard takes while training (`data.footprint`), against TorchRec's own storage
estimate of the same shards: table-, column-, row- and table-row-wise, pooled and sequence."""

import math

import pytest

from autoshard.data.footprint import row_split, shard_footprint

WORLD, LOCAL, BATCH = 4, 2, 512  # TorchRec's batch is per rank: the global batch is WORLD * BATCH


def torchrec_storages(tables: list[dict], sequence: bool) -> dict[tuple[str, str], list[tuple[list[int], int]]]:
    """TorchRec's GPU storage estimate (HBM: weights, row-wise Adagrad, input and output buffers)
    of every shard it enumerates, by (table, sharding type): (shard size, bytes) per shard."""
    import torch
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import ParameterConstraints, Topology
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
    from torchrec.optim import RowWiseAdagrad

    config, module, sharder = ((EmbeddingConfig, EmbeddingCollection, EmbeddingCollectionSharder) if sequence else
                               (EmbeddingBagConfig, EmbeddingBagCollection, EmbeddingBagCollectionSharder))
    ebc = module(tables=[config(name=t["name"], embedding_dim=t["dim"], num_embeddings=t["rows"],
                                feature_names=[t["name"]]) for t in tables], device=torch.device("meta"))
    _apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": 0.01})
    types = ["table_wise", "column_wise", "row_wise", "table_row_wise"]
    constraints = {t["name"]: ParameterConstraints(sharding_types=types,
                                                   compute_kernels=[EmbeddingComputeKernel.FUSED.value],
                                                   pooling_factors=[t["pooling"]], min_partition=t["dim"] // 2)
                   for t in tables}
    topology = Topology(world_size=WORLD, local_world_size=LOCAL, compute_device="cuda")
    enumerator = EmbeddingEnumerator(topology=topology, batch_size=BATCH, constraints=constraints,
                                     estimator=[EmbeddingStorageEstimator(topology=topology, constraints=constraints)])
    return {(o.name, o.sharding_type): [(list(s.size), s.storage.hbm) for s in o.shards]
            for o in enumerator.enumerate(ebc, [sharder()])}


TABLES = [{"name": "big", "rows": 10_007, "dim": 64, "pooling": 3.5},
          {"name": "short", "rows": 10, "dim": 16, "pooling": 0.4},
          {"name": "long", "rows": 5_000, "dim": 32, "pooling": 150.0}]


@pytest.mark.parametrize("sequence", [False, True])
def test_the_training_footprint_is_torchrecs_storage_estimate(sequence):
    """Equal to the byte (TorchRec rounds each buffer up) but for one difference, where FBGEMM is
    right: a column shard keeps a row-wise Adagrad state of its own (one fp32 per row), which
    TorchRec's estimate shares out among the column shards by width."""
    ways = {"table_wise": 1, "column_wise": 1, "row_wise": WORLD, "table_row_wise": LOCAL}
    checked = set()
    for t in TABLES:  # one module per table: an EmbeddingCollection's tables share one dim
        found = torchrec_storages([t], sequence)
        for kind, k in ways.items():
            for (rows, width), hbm in found.get((t["name"], kind), []):
                ours = shard_footprint(rows, width, 4, WORLD * BATCH, t["pooling"], sequence, k)
                shared_state = rows * 4 * (1 - width / t["dim"])
                assert ours - shared_state == pytest.approx(hbm, abs=2), (t["name"], kind, rows, width)
                checked.add(kind)
    offered = set(ways) - ({"table_row_wise"} if sequence else set())  # an EmbeddingCollection has no TWRW
    assert checked == offered, "every sharding type TorchRec offers compared"


def test_row_split_is_torchrecs():
    assert row_split(10, 4) == [3, 3, 3, 1]
    assert row_split(5, 4) == [2, 2, 1, 0]
    assert row_split(8, 4) == [2, 2, 2, 2]
    assert sum(row_split(80_000_017, 96)) == 80_000_017


def test_a_sequence_table_holds_an_embedding_per_lookup_and_a_pooled_one_per_sample():
    pooled = shard_footprint(1000, 128, 4, 1024, 1500.0, False)
    sequence = shard_footprint(1000, 128, 4, 1024, 1500.0, True)
    weights = 1000 * 128 * 4 + 1000 * 4
    indices = math.ceil(1024 * 1500.0 * 8)
    assert pooled == weights + indices + 1024 * 128 * 4
    assert sequence == weights + indices + 1024 * 1500 * 128 * 4
    assert shard_footprint(0, 128, 4, 1024, 1500.0, True, ways=8) == 0

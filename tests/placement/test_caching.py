"""TorchRec's UVM caching kernel (`placement.caching`): its slowdown and its HBM and DDR are
TorchRec's own, and the placement counts HBM and DDR apart, each against its own capacity."""

import numpy as np
import pytest

from autoshard.core.errors import ConfigError
from autoshard.placement import caching
from autoshard.placement.sharding import Layout, Piece, place
from autoshard.placement.topology import DDR_BYTES, Topology

WORLD, BATCH = 2, 512  # TorchRec's batch is per rank


@pytest.mark.parametrize("load_factor", [0.05, 0.2, 1.0])
def test_the_slowdown_is_torchrecs_bandwidth_for_the_kernel(load_factor):
    pytest.importorskip("torchrec")
    from torchrec.distributed.planner import constants

    bandwidth = constants.kernel_bw_lookup("cuda", caching.KERNEL, constants.HBM_MEM_BW, constants.DDR_MEM_BW,
                                           constants.HBM_TO_DDR_MEM_BW, load_factor)
    assert caching.slowdown(load_factor) == pytest.approx(constants.HBM_MEM_BW / bandwidth, rel=1e-9)
    assert constants.UVM_CACHING_RATIO == caching.LOAD_FACTOR
    assert constants.DDR_CAP == DDR_BYTES


@pytest.mark.parametrize(("load_factor", "sequence"), [(0.2, False), (0.5, True)])
def test_hbm_and_ddr_are_torchrecs_storage_estimate(load_factor, sequence):
    """TorchRec's storage estimator on a cached table-wise shard, row-wise Adagrad attached."""
    pytest.importorskip("torchrec")
    import torch
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.planner import Topology as TorchRecTopology
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator
    from torchrec.distributed.types import CacheParams
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
    from torchrec.optim import RowWiseAdagrad

    rows, dim, pooling = 100_003, 64, 3.5
    config, module, sharder = ((EmbeddingConfig, EmbeddingCollection, EmbeddingCollectionSharder) if sequence else
                               (EmbeddingBagConfig, EmbeddingBagCollection, EmbeddingBagCollectionSharder))
    ebc = module(tables=[config(name="t", embedding_dim=dim, num_embeddings=rows, feature_names=["t"])],
                 device=torch.device("meta"))
    _apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": 0.01})
    cache = CacheParams(load_factor=load_factor)
    constraints = {"t": ParameterConstraints(sharding_types=["table_wise"], compute_kernels=[caching.KERNEL],
                                             pooling_factors=[pooling], cache_params=cache)}
    topology = TorchRecTopology(world_size=WORLD, compute_device="cuda")
    enumerator = EmbeddingEnumerator(topology=topology, batch_size=BATCH, constraints=constraints,
                                     estimator=[EmbeddingStorageEstimator(topology=topology, constraints=constraints)])
    (option,) = enumerator.enumerate(ebc, [sharder()])
    storage = option.shards[0].storage
    hbm, ddr = caching.memory(rows, dim, 4, WORLD * BATCH, pooling, sequence, load_factor)
    assert (hbm, ddr) == pytest.approx((storage.hbm, storage.ddr), abs=2)
    assert ddr > 4 * hbm > 0 if load_factor == 0.2 else hbm < ddr


def test_ddr_is_counted_apart_from_hbm_each_against_its_own_capacity():
    def cached(cost: float, hbm: int, ddr: int) -> list[Layout]:
        return [Layout("table_wise", (Piece(0, None, 0, None, cost, hbm),), kernel=caching.KERNEL,
                       ddrs=np.array([ddr]))]

    topology = Topology(np.ones(2), np.array([100, 100]), (2,), np.array([1000, 300]))
    placed = place([cached(5.0, 10, 600), cached(4.0, 10, 250), cached(1.0, 10, 350)], topology, list("abc"))
    assert [p.devices[0] for p in placed] == [0, 1, 0], "b alone fits device 1's DDR beside nothing of 350"
    with pytest.raises(ConfigError, match=r"table d: .*cached in host memory, 10 bytes of HBM and 880 of DDR"):
        place([cached(1.0, 10, 600), cached(1.0, 10, 880)], topology, ["c", "d"])


def test_a_table_left_only_its_cached_layout_is_refused_with_its_hbm_and_ddr_apart():
    """The refusal of a table offered cached alone (`cli.sharding_plan._place` forces the coldest)
    says what it needs of each memory, never HBM and DDR summed as if it were whole in HBM."""
    cached = Layout("table_wise", (Piece(0, None, 0, None, 9.0, 10),), kernel=caching.KERNEL, ddrs=np.array([450]))
    topology = Topology(np.ones(2), np.array([100, 100]), (2,), np.array([600, 600]))
    with pytest.raises(ConfigError, match=r"table c: no sharding of it fits what the devices have left \(cached in "
                                          r"host memory, 10 bytes of HBM and 450 of DDR \(the freest device has 150 "
                                          r"of DDR left\); the freest device has 90 of HBM left; more memory"):
        place([[cached]] * 3, topology, list("abc"))

"""TorchRec's table-wise perf estimate written as our formulas (`measure.formulas`) against
TorchRec's own evaluator, and the module importing neither torch nor torchrec."""

import itertools
import subprocess
import sys

import pytest

from autoshard.measure import formulas

DIMS = (4, 16, 31, 32, 33, 63, 64, 100, 127, 128, 256)
POOLING = (0.1, 0.5, 1.0, 1.7, 20.0, 500.0)


def torchrec_perf(dim: int, pooling: float, batch: int, world: int, device: str, dtype_bytes: int):
    """TorchRec's planner's `TableWiseEvaluator` on one standalone table-wise shard with the fused
    kernel, as `EmbeddingShardingPlanner` runs it (one host of `world` ranks)."""
    from torchrec.distributed.planner.constants import DDR_MEM_BW, HBM_MEM_BW, HBM_TO_DDR_MEM_BW, kernel_bw_lookup
    from torchrec.distributed.planner.estimator.config import EmbeddingPerfEstimatorConfig
    from torchrec.distributed.planner.estimator.estimator import TableWiseEvaluator
    from torchrec.distributed.planner.estimator.types import ShardPerfContext
    from torchrec.distributed.planner.types import BasicCommsBandwidths

    ctx = ShardPerfContext(
        sharding_type="table_wise", compute_kernel="fused", hash_size=1, emb_dim=dim, batch_sizes=[batch],
        num_poolings=[1.0], input_lengths=[pooling], world_size=world, local_world_size=world,
        intra_group_size=world, table_data_type_size=dtype_bytes, output_data_type_size=dtype_bytes,
        fwd_a2a_comm_data_type_size=dtype_bytes, bwd_a2a_comm_data_type_size=dtype_bytes,
        device_bw=kernel_bw_lookup(device, "fused", HBM_MEM_BW, DDR_MEM_BW, HBM_TO_DDR_MEM_BW),
        hbm_to_ddr_mem_bw=HBM_TO_DDR_MEM_BW, comms_bandwidths=BasicCommsBandwidths())
    return TableWiseEvaluator().compute_perf(ctx, EmbeddingPerfEstimatorConfig())


@pytest.mark.parametrize("device, dtype_bytes", [("cpu", 4), ("cuda", 4), ("cuda", 2)])
def test_every_field_is_torchrecs_to_1e_6(device, dtype_bytes):
    for dim, pooling, batch, world in itertools.product(DIMS, POOLING, (1, 512, 65536), (1, 2, 8)):
        ours = formulas.table_perf(dim, pooling, batch, world, device, dtype_bytes)
        theirs = torchrec_perf(dim, pooling, batch, world, device, dtype_bytes)
        for field in ("fwd_compute", "bwd_compute", "fwd_comms", "bwd_comms"):
            assert getattr(ours, field) == pytest.approx(getattr(theirs, field), rel=1e-6, abs=1e-15), (
                dim, pooling, batch, world, device, field)


def test_the_rules_a_wrong_formula_would_break():
    """A row is read 32 values wide at least, narrow rows pay a block penalty, a sample with no
    lookup writes no output, and backward is twice forward."""
    at = {d: formulas.table_perf(d, 2.0, 1024, 1, "cpu").fwd_compute for d in (31, 32, 33, 64, 128)}
    assert at[31] < at[32] < at[33]  # the output grows with D, the lookups not below 32
    assert formulas.block_penalty(63) == 1.75 and formulas.block_penalty(64) == 1.15
    assert formulas.block_penalty(127) == 1.15 and formulas.block_penalty(128) == 1.0
    sparse, dense = (formulas.table_perf(16, p, 1024, 2, "cpu") for p in (0.5, 1.0))
    assert sparse.fwd_comms == pytest.approx(dense.fwd_comms / 2)
    assert sparse.bwd_compute == pytest.approx(2 * sparse.fwd_compute)
    with pytest.raises(ValueError, match="device"):
        formulas.table_perf(16, 1.0, 1024, 1, "tpu")


def test_importing_it_loads_neither_torch_nor_torchrec():
    code = ("import sys, autoshard.measure.formulas as f; f.table_perf(64, 2.0, 512, 1); "
            "print(sorted(m for m in ('torch', 'torchrec', 'pandas') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"

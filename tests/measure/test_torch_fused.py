"""The fused pure-torch backend against FBGEMM's TBE: same output, same row-wise Adagrad step."""

import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from autoshard.data.pool import build_pool
from autoshard.measure.backends import BackendConfig, make_backend
from autoshard.measure.base import ShardTooLarge, shard_bytes, table_shapes
from autoshard.measure.timing import one_round
from autoshard.measure.torch_fused import FusedTables, TorchFusedBackend, fused_bytes

FAST = one_round(warmup=1, runs=3)
LIMIT = 8 * 2**30


def tbe(rows, dims):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    return SplitTableBatchedEmbeddingBagsCodegen(
        [(r, d, EmbeddingLocation.HOST, ComputeDevice.CPU) for r, d in zip(rows, dims, strict=True)],
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, pooling_mode=PoolingMode.SUM,
        weights_precision=SparseType.FP32, learning_rate=0.01, device=torch.device("cpu"))


def batch(rows, batch_size, seed):
    """Table-major TBE input with empty bags and repeated rows (few rows, many lookups)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 6, (len(rows) * batch_size,), generator=g)
    lengths[0] = 0
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    indices = torch.cat([torch.randint(0, r, (int(lengths[t * batch_size:(t + 1) * batch_size].sum()),), generator=g)
                         for t, r in enumerate(rows)])
    return indices, offsets, g


@pytest.mark.parametrize(("rows", "dims"), [([40, 9, 70], [8, 8, 8]), ([50, 7, 70, 12], [8, 4, 16, 4])])
def test_forward_and_rowwise_adagrad_step_match_fbgemm_tbe(rows, dims):
    op, ours, b = tbe(rows, dims), FusedTables(rows, dims, torch.device("cpu"), torch.float32), 6
    for grp in ours.groups:  # the same starting weights
        for k, p in enumerate(grp.positions):
            start = int(grp.shifts[k])
            op.split_embedding_weights()[p].copy_(grp.weight[start:start + rows[p]])
    for step in range(2):  # the second step reads the state the first one left
        indices, offsets, g = batch(rows, b, seed=step)
        expected, got = op(indices, offsets), ours.forward(ours.split(indices, offsets, b), b)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
        grad = torch.randn(b, sum(dims), generator=g)
        expected.backward(grad)
        got.backward(grad)
        weights, states = op.split_embedding_weights(), op.split_optimizer_states()
        for grp in ours.groups:
            for k, p in enumerate(grp.positions):
                start = int(grp.shifts[k])
                torch.testing.assert_close(grp.weight[start:start + rows[p]], weights[p], rtol=0, atol=1e-6)
                torch.testing.assert_close(grp.state[start:start + rows[p]], states[p][0], rtol=1e-5, atol=1e-9)
    assert any(float(s.abs().sum()) > 0 for grp in ours.groups for s in [grp.state])  # a step happened


@pytest.fixture(scope="module")
def pool(smoke_params):
    return build_pool(smoke_params["dataset"], smoke_params["pool"], seed=0, progress=False)


def config(backend: str, limit: int = LIMIT) -> BackendConfig:
    return BackendConfig(backend=backend, device="cpu", optimizer="EXACT_ROWWISE_ADAGRAD", batch_size=64,
                         threads=1, timing=FAST, memory_limit_bytes=limit)


def test_the_backend_measures_whole_and_column_shards_under_its_own_name(pool):
    backend = make_backend(pool, config("torch_fused"))
    assert isinstance(backend, TorchFusedBackend) and backend.name == "torch_fused"
    whole, columns = backend.measure([0, 3, 5], 64), backend.measure([0, 3, 5], 64, dims=[1, 1, 1])
    assert whole.forward_ms > 0 and whole.backward_ms > 0 and columns.total_ms > 0


def test_its_memory_counts_what_the_kernel_holds_beyond_weights_and_state(pool):
    tables = [0, 3, 5]
    rows, dims = table_shapes(pool.features, tables)
    held = fused_bytes(rows, dims, 4, batch_size=64, lookups=1000)
    assert held > shard_bytes(rows, dims, 4)
    just_weights = make_backend(pool, config("torch_fused", limit=shard_bytes(rows, dims, 4)))
    with pytest.raises(ShardTooLarge):
        just_weights.measure(tables, 64)


def test_cuda_weights_are_fp16_and_cpu_weights_fp32(pool):
    cpu = TorchFusedBackend(pool, torch.device("cpu"), FAST, LIMIT, 1)
    assert cpu.weight_dtype == torch.float32
    cuda = TorchFusedBackend(pool, torch.device("cuda"), FAST, LIMIT, 1)  # built, never run, here
    assert cuda.weight_dtype == torch.float16


def test_it_imports_and_measures_where_fbgemm_gpu_is_absent(pool):
    code = ("import sys; sys.modules['fbgemm_gpu'] = None\n"
            "import numpy as np, torch\n"
            "from autoshard.measure.timing import one_round\n"
            "from autoshard.measure.torch_fused import TorchFusedBackend\n"
            "from autoshard.data.traces import from_lengths\n"
            "class P: pass\n"
            "p = P(); p.features = {'rows': np.array([30, 20]), 'dim': np.array([4, 4])}\n"
            "lengths = np.full((2, 8), 2); p.traces = from_lengths(np.arange(32) % 20, lengths)\n"
            "b = TorchFusedBackend(p, torch.device('cpu'), one_round(1, 2), 2**30, 1)\n"
            "print(b.measure([0, 1], 8).total_ms > 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


def test_fused_and_fbgemm_rank_shards_alike(pool):
    """Bigger shards cost more under both; a planner sees the same order (a coarse check: the
    profile's Kendall tau is the figure)."""
    fused, fbgemm = make_backend(pool, config("torch_fused")), make_backend(pool, config("fbgemm"))
    small, large = [0], list(range(24))
    for b in (fused, fbgemm):
        assert b.measure(large, 64).total_ms > b.measure(small, 64).total_ms


def test_it_refuses_an_optimizer_it_does_not_run(pool):
    from autoshard.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"profile.optimizer: 'EXACT_SGD' \(the torch_fused backend runs "
                                          r"EXACT_ROWWISE_ADAGRAD only\)"):
        make_backend(pool, replace(config("torch_fused"), optimizer="EXACT_SGD"))

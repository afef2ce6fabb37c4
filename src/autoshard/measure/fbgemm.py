"""FBGEMM backend: the shard as one fused table-batched embedding (TBE) operator.

`SplitTableBatchedEmbeddingBagsCodegen` with the optimizer fused into the backward pass,
fed with the pool's real traces. CPU: weights in host memory, fp32. CUDA: weights on the
device, fp16 (as in AutoShard), timed with CUDA events after an L2 flush.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from autoshard.core.errors import ConfigError
from autoshard.core.seeding import threads as pinned
from autoshard.measure.base import Feeds, ShardCost, ShardTooLarge, shard_bytes, shard_dims, table_shapes
from autoshard.measure.timing import TimingConfig, time_steps

if TYPE_CHECKING:  # only a type here: the portable worker (no pandas) imports this module
    from autoshard.data.pool import Pool

OPTIMIZERS = ("EXACT_ROWWISE_ADAGRAD", "EXACT_SGD", "EXACT_ADAGRAD")


class FbgemmBackend:
    name = "fbgemm"

    def __init__(self, pool: Pool, device: torch.device, optimizer: str, timing: TimingConfig,
                 memory_limit_bytes: int, threads: int):
        from fbgemm_gpu.split_embedding_configs import EmbOptimType

        if optimizer not in OPTIMIZERS:
            raise ConfigError(f"profile.optimizer: {optimizer!r} (expected one of {', '.join(OPTIMIZERS)}"
                              "; the others are refused by FBGEMM's CPU kernels)")
        self.pool = pool
        self.torch_device = device
        self.device = device.type
        self.optimizer = getattr(EmbOptimType, optimizer)
        self.timing = timing
        self.memory_limit_bytes = memory_limit_bytes
        self.threads = threads  # every measurement runs on these, whatever the caller set (the store's key says them)
        self.weight_bytes = 2 if device.type == "cuda" else 4
        self.feeds = Feeds(timing.rotate)

    def _operator(self, rows: list[int], dims: list[int]):
        from fbgemm_gpu.split_embedding_configs import SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )

        cuda = self.torch_device.type == "cuda"
        location = EmbeddingLocation.DEVICE if cuda else EmbeddingLocation.HOST
        compute = ComputeDevice.CUDA if cuda else ComputeDevice.CPU
        specs = [(r, d, location, compute) for r, d in zip(rows, dims, strict=True)]
        return SplitTableBatchedEmbeddingBagsCodegen(
            specs, optimizer=self.optimizer, pooling_mode=PoolingMode.SUM,
            weights_precision=SparseType.FP16 if cuda else SparseType.FP32,
            learning_rate=0.01, device=self.torch_device)

    def measure(self, tables: Sequence[int], batch_size: int, dims: Sequence[int] | None = None) -> ShardCost:
        """A shard's forward and backward; `dims` measures column shards (see `base.CostBackend`)."""
        runs = self.feeds.take(self.pool.traces, tables, batch_size, self.timing.warmup + self.timing.runs)
        rows, full = table_shapes(self.pool.features, tables)
        dims = shard_dims(full, dims)
        if shard_bytes(rows, dims, self.weight_bytes) > self.memory_limit_bytes:
            raise ShardTooLarge(f"shard of {len(rows)} tables needs more than "
                                f"{self.memory_limit_bytes / 2**30:.1f} GiB")
        try:
            with pinned(self.threads):
                op = self._operator(rows, dims)
                runs = [(i.to(self.torch_device), o.to(self.torch_device)) for i, o in runs]
                grad = output_grad(batch_size, sum(dims), self.torch_device)
                return time_steps(lambda run: op(*runs[run]), lambda out: out.backward(grad),
                                  self.timing, self.torch_device)
        except (torch.OutOfMemoryError, MemoryError) as exc:
            raise ShardTooLarge(str(exc).splitlines()[0]) from None


def output_grad(batch_size: int, width: int, device: torch.device) -> torch.Tensor:
    """A fixed pseudo-random fp32 output gradient (its values do not change the kernels' work);
    made once per shape and device, since backward only reads it (drawing it again for every
    measurement took about 5% of a round)."""
    return _output_grad(batch_size, width, str(device))


@functools.lru_cache(maxsize=16)  # a few MiB each
def _output_grad(batch_size: int, width: int, device: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(batch_size, width, generator=g).to(device)

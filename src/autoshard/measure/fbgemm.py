"""FBGEMM backend: the shard as one fused table-batched embedding (TBE) operator.

`SplitTableBatchedEmbeddingBagsCodegen` with the optimizer fused into the backward pass,
fed with the pool's real traces. CPU: weights in host memory, fp32. CUDA: weights on the
device, fp16 (as in AutoShard), timed with CUDA events after an L2 flush.

`fbgemm_gpu` is imported only when this backend is built (`FbgemmMissing` where it is not
installed), so every module imports on a machine with torch alone.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from autoshard.core.errors import ConfigError
from autoshard.core.seeding import threads as pinned
from autoshard.measure.base import Feeds, ShardCost, ShardTooLarge, shard_bytes, shard_dims, table_shapes
from autoshard.measure.harness import keep_freed_memory
from autoshard.measure.timing import TimingConfig, time_steps

if TYPE_CHECKING:  # only a type here: the portable worker (no pandas) imports this module
    from autoshard.data.pool import Pool

OPTIMIZERS = ("EXACT_ROWWISE_ADAGRAD", "EXACT_SGD", "EXACT_ADAGRAD")


class FbgemmMissing(ConfigError, ImportError):
    """`fbgemm_gpu` cannot be imported here: one line for the user (a ConfigError), and an
    ImportError for a caller that falls back to another backend (`portable.worker_backend`)."""


def fbgemm_module(name: str, what: str = "profile.backend: 'fbgemm'"):
    """The `fbgemm_gpu` module `name` (a dotted path under it), or `FbgemmMissing` saying that
    `what` (the field and value that asked for it) needs it."""
    try:
        return importlib.import_module(f"fbgemm_gpu.{name}")
    except ImportError as exc:
        raise FbgemmMissing(f"{what} needs fbgemm_gpu, which is not importable here ({exc}): install fbgemm-gpu "
                            "(its CUDA build on a GPU), or measure with backend torch_fused or torch") from None


def tbe_placement(device: torch.device) -> tuple[str, str, str]:
    """Where a TBE keeps and runs its tables, as the names of FBGEMM's enums: host memory, CPU
    kernels and fp32 weights on the CPU; device memory, CUDA kernels and fp16 weights on CUDA."""
    if device.type == "cuda":
        return "DEVICE", "CUDA", "FP16"
    return "HOST", "CPU", "FP32"


class FbgemmBackend:
    name = "fbgemm"

    def __init__(self, pool: Pool, device: torch.device, optimizer: str, timing: TimingConfig,
                 memory_limit_bytes: int, threads: int):
        configs = fbgemm_module("split_embedding_configs")
        if optimizer not in OPTIMIZERS:
            raise ConfigError(f"profile.optimizer: {optimizer!r} (expected one of {', '.join(OPTIMIZERS)}"
                              "; the others are refused by FBGEMM's CPU kernels)")
        self.pool = pool
        self.torch_device = device
        self.device = device.type
        self.optimizer = getattr(configs.EmbOptimType, optimizer)
        self.timing = timing
        self.memory_limit_bytes = memory_limit_bytes
        self.threads = threads  # every measurement runs on these, whatever the caller set (the store's key says them)
        self.weight_bytes = 2 if device.type == "cuda" else 4
        self.feeds = Feeds(timing.rotate)
        if device.type == "cpu":
            # FBGEMM's CPU backward allocates and frees its CSC buffers on every call; glibc's default
            # trim hands their pages back, so how many the next call faults in depended on the heap's
            # history (0 to 2,000 per harness backward): keep them, so every call times the kernels alone
            keep_freed_memory()

    def _operator(self, rows: list[int], dims: list[int]):
        from fbgemm_gpu.split_embedding_configs import SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )

        location, compute, precision = tbe_placement(self.torch_device)
        specs = [(r, d, EmbeddingLocation[location], ComputeDevice[compute]) for r, d in zip(rows, dims, strict=True)]
        return SplitTableBatchedEmbeddingBagsCodegen(
            specs, optimizer=self.optimizer, pooling_mode=PoolingMode.SUM, weights_precision=SparseType[precision],
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
    """A fixed pseudo-random fp32 output gradient (its values do not change the kernels' work),
    drawn on `device` by a seeded generator of its own there (drawing 65,536 bags on the CPU and
    copying them took most of a second per shard); made once per shape and device, since
    backward only reads it."""
    return _output_grad(batch_size, width, str(device))


@functools.lru_cache(maxsize=4)  # up to a few hundred MiB each at 65,536 bags; drawing one on a GPU takes ~1 ms
def _output_grad(batch_size: int, width: int, device: str) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(0)
    return torch.randn(batch_size, width, generator=g, device=device)

"""Torch backend: the shard as one `nn.EmbeddingBag` per table, run together.

For a machine with torch but no matching FBGEMM build (for example a CUDA machine). Forward
runs every table's bag and concatenates the pooled outputs, as a model would; backward
includes the optimizer step (sparse Adagrad), which FBGEMM fuses into its backward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from autoshard.core.seeding import threads as pinned
from autoshard.measure.base import Feeds, ShardCost, ShardTooLarge, shard_bytes, shard_dims, table_shapes
from autoshard.measure.fbgemm import output_grad
from autoshard.measure.timing import TimingConfig, time_steps

if TYPE_CHECKING:  # only a type here: the portable worker (no pandas) imports this module
    from autoshard.data.pool import Pool


class TorchBackend:
    name = "torch"

    def __init__(self, pool: Pool, device: torch.device, timing: TimingConfig, memory_limit_bytes: int,
                 threads: int):
        self.pool = pool
        self.torch_device = device
        self.device = device.type
        self.timing = timing
        self.memory_limit_bytes = memory_limit_bytes
        self.threads = threads  # every measurement runs on these, whatever the caller set (the store's key says them)
        self.feeds = Feeds(timing.rotate)

    def measure(self, tables: Sequence[int], batch_size: int, dims: Sequence[int] | None = None) -> ShardCost:
        """A shard's forward and backward; `dims` measures column shards (see `base.CostBackend`)."""
        runs = self.feeds.take(self.pool.traces, tables, batch_size, self.timing.warmup + self.timing.runs)
        rows, full = table_shapes(self.pool.features, tables)
        dims = shard_dims(full, dims)
        if shard_bytes(rows, dims, 4) > self.memory_limit_bytes:
            raise ShardTooLarge(f"shard of {len(rows)} tables needs more than "
                                f"{self.memory_limit_bytes / 2**30:.1f} GiB")
        try:
            with pinned(self.threads):
                return self._time(rows, dims, runs, batch_size)
        except (torch.OutOfMemoryError, MemoryError) as exc:
            raise ShardTooLarge(str(exc).splitlines()[0]) from None

    def _time(self, rows, dims, runs, batch_size) -> ShardCost:
        dev = self.torch_device
        bags = torch.nn.ModuleList(
            torch.nn.EmbeddingBag(r, d, mode="sum", sparse=True, device=dev)
            for r, d in zip(rows, dims, strict=True))
        optimizer = torch.optim.Adagrad(bags.parameters(), lr=0.01)
        inputs = [per_table(indices, offsets, len(rows), batch_size, dev) for indices, offsets in runs]
        grad = output_grad(batch_size, sum(dims), dev)

        def forward(run: int) -> torch.Tensor:
            return torch.cat([bag(i, o) for bag, (i, o) in zip(bags, inputs[run], strict=True)], dim=1)

        def backward(out: torch.Tensor) -> None:
            out.backward(grad)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return time_steps(forward, backward, self.timing, dev)


def per_table(indices: torch.Tensor, offsets: torch.Tensor, tables: int, batch_size: int,
              device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per table: its slice of the flat indices and its B offsets, rebased to 0."""
    out = []
    for t in range(tables):
        start, end = offsets[t * batch_size], offsets[(t + 1) * batch_size]
        out.append((indices[start:end].to(device), (offsets[t * batch_size:(t + 1) * batch_size] - start).to(device)))
    return out

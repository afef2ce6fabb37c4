"""Torch backend: the shard as one `nn.EmbeddingBag` per table, run together.

For a machine with torch but no matching FBGEMM build (for example a CUDA machine). Forward
runs every table's bag and concatenates the pooled outputs (fp32, as TBE's), as a model would;
backward includes the optimizer step, which FBGEMM fuses into its backward: the configured one
(`profile.optimizer`), run per table on its sparse gradient, duplicates summed first, as FBGEMM's
EXACT optimizers do:

    EXACT_ROWWISE_ADAGRAD: state[r] += mean(g_r ** 2);  w[r] -= lr * g_r / (sqrt(state[r]) + eps)
    EXACT_ADAGRAD:         state[r] += g_r ** 2;        w[r] -= lr * g_r / (sqrt(state[r]) + eps)
    EXACT_SGD:                                          w[r] -= lr * g_r

Weights are fp32 on the CPU and fp16 on CUDA (as the `fbgemm` backend's); optimizer state fp32.
A shard is refused as too large by what this kernel holds (`footprint`), not by the pool's
weights alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from autoshard.core.errors import ConfigError
from autoshard.measure.base import Run, ShardCost, TorchShards
from autoshard.measure.fbgemm import OPTIMIZERS, output_grad
from autoshard.measure.timing import TimingConfig, time_steps

if TYPE_CHECKING:  # only a type here: the portable worker (no pandas) imports this module
    from autoshard.data.pool import Pool

LEARNING_RATE = 0.01  # as the fbgemm backend's operator
EPS = 1e-8            # FBGEMM's default
STATE_BYTES = 4       # fp32 optimizer state
INDEX_BYTES = 8       # int64 indices and offsets


class TorchBackend(TorchShards):
    name = "torch"

    def __init__(self, pool: Pool, device: torch.device, timing: TimingConfig, memory_limit_bytes: int,
                 threads: int, optimizer: str = "EXACT_ROWWISE_ADAGRAD"):
        if optimizer not in OPTIMIZERS:
            raise ConfigError(f"profile.optimizer: {optimizer!r} (expected one of {', '.join(OPTIMIZERS)})")
        super().__init__(pool, device, timing, memory_limit_bytes, threads)
        self.optimizer = optimizer  # the one its backward runs, as its rows' settings say

    def footprint(self, rows: list[int], dims: list[int], runs: list[Run], batch_size: int) -> int:
        lookups = [max(int(o[(t + 1) * batch_size] - o[t * batch_size]) for _, o in runs) for t in range(len(rows))]
        inputs = sum((i.numel() + o.numel()) * INDEX_BYTES for i, o in runs)
        return footprint(rows, dims, lookups, batch_size, self.weight_dtype.itemsize, self.optimizer, inputs)

    def timed(self, rows: list[int], dims: list[int], runs: list[Run], batch_size: int) -> ShardCost:
        dev = self.torch_device
        bags, states = self.build(rows, dims)
        inputs = [per_table(indices, offsets, len(rows), batch_size, dev) for indices, offsets in runs]
        grad = output_grad(batch_size, sum(dims), dev)

        def forward(run: int) -> torch.Tensor:
            return pooled(bags, inputs[run])

        def backward(out: torch.Tensor) -> None:
            out.backward(grad)
            for bag, state in zip(bags, states, strict=True):
                step(bag.weight, state, self.optimizer)

        return time_steps(forward, backward, self.timing, dev)

    def build(self, rows: Sequence[int], dims: Sequence[int]) -> tuple[torch.nn.ModuleList, list[torch.Tensor]]:
        """One bag per table (sparse gradients, this backend's weight type) and its optimizer state
        (`optimizer_state`)."""
        dev = self.torch_device
        bags = torch.nn.ModuleList(
            torch.nn.EmbeddingBag(r, d, mode="sum", sparse=True, device=dev, dtype=self.weight_dtype)
            for r, d in zip(rows, dims, strict=True))
        return bags, [optimizer_state(self.optimizer, r, d, dev) for r, d in zip(rows, dims, strict=True)]


def optimizer_state(optimizer: str, rows: int, dim: int, device: torch.device) -> torch.Tensor:
    """One table's fp32 optimizer state: a sum per row (row-wise Adagrad), per weight (Adagrad),
    or none (SGD: an empty tensor)."""
    shape = {"EXACT_ROWWISE_ADAGRAD": (rows,), "EXACT_ADAGRAD": (rows, dim), "EXACT_SGD": (0,)}[optimizer]
    return torch.zeros(shape, dtype=torch.float32, device=device)


def pooled(bags: torch.nn.ModuleList, inputs: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Every table's pooled bags side by side, (batch, sum of dims), fp32."""
    return torch.cat([bag(i, o) for bag, (i, o) in zip(bags, inputs, strict=True)], dim=1).float()


@torch.no_grad()
def step(weight: torch.Tensor, state: torch.Tensor, optimizer: str) -> None:
    """Apply `optimizer` to the rows of `weight` its sparse gradient touches (summed per row
    first), then drop the gradient."""
    if weight.grad is None:  # no bag of the batch looked it up
        return
    grad = weight.grad.coalesce()
    weight.grad = None
    rows, g = grad.indices()[0], grad.values().float()
    if optimizer == "EXACT_ROWWISE_ADAGRAD":
        state.index_add_(0, rows, g.square().mean(dim=1))
        g = g / (state[rows].sqrt() + EPS).unsqueeze(1)
    elif optimizer == "EXACT_ADAGRAD":
        state.index_add_(0, rows, g.square())
        g = g / (state[rows].sqrt() + EPS)
    weight.index_add_(0, rows, (g * -LEARNING_RATE).to(weight.dtype))


def footprint(rows: Sequence[int], dims: Sequence[int], lookups: Sequence[int], batch_size: int,
              weight_bytes: int, optimizer: str, input_bytes: int) -> int:
    """Bytes this backend holds at most while it measures a shard: the weights, the optimizer
    state, every run's inputs (`input_bytes`, all on the device from the start), the outputs of
    two runs (a run's output lives until the next forward has made its own: per-table outputs, their
    concatenation and its fp32 copy), the output gradient, what autograd keeps per table (the
    lookup-to-bag map and bag sizes), every table's sparse gradient (a value row and an index per
    lookup, `lookups` per table), and the largest table's optimizer temporaries (its coalesced
    gradient and three fp32 arrays of the same shape)."""
    width = int(sum(dims))
    state = {"EXACT_ROWWISE_ADAGRAD": lambda r, d: r, "EXACT_ADAGRAD": lambda r, d: r * d,
             "EXACT_SGD": lambda r, d: 0}[optimizer]
    held = sum(r * d * weight_bytes + state(r, d) * STATE_BYTES for r, d in zip(rows, dims, strict=True))
    outputs = 2 * batch_size * width * (2 * weight_bytes + 4) + batch_size * width * 4
    per_lookup = sum(n * (d * weight_bytes + INDEX_BYTES) + (n + 2 * batch_size) * INDEX_BYTES
                     for n, d in zip(lookups, dims, strict=True))
    temporaries = max(n * (d * (weight_bytes + 3 * 4) + INDEX_BYTES) for n, d in zip(lookups, dims, strict=True))
    return int(held + input_bytes + outputs + per_lookup + temporaries)


def per_table(indices: torch.Tensor, offsets: torch.Tensor, tables: int, batch_size: int,
              device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per table: its slice of the flat indices and its B offsets, rebased to 0."""
    out = []
    for t in range(tables):
        start, end = offsets[t * batch_size], offsets[(t + 1) * batch_size]
        out.append((indices[start:end].to(device), (offsets[t * batch_size:(t + 1) * batch_size] - start).to(device)))
    return out

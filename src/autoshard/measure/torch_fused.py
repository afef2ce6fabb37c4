"""Fused pure-torch backend: a shard as one TBE-like operator, for machines without `fbgemm_gpu`.

Built like FBGEMM's table-batched embedding: the shard's tables of one dim share one weight
table of (sum of their rows) x dim (fp16 on CUDA, fp32 on CPU), each table's indices shifted by
its row offset in it, and one row-wise Adagrad state per row (fp32). The forward is one
`embedding_bag` per dim group over all bags of its tables in TBE's table-major layout; the output
is TBE's, (batch, sum of dims) in the shard's table order, fp32. The backward is fused with the
optimizer as in TBE: it gathers each lookup's gradient (its bag's output gradient), sums them per
unique row, and applies EXACT_ROWWISE_ADAGRAD to those rows only:

    state[r] += mean(g_r ** 2);   w[r] -= lr * g_r / (sqrt(state[r]) + eps)

A shard of one dim is a single group, so a single operator; mixed dims give one per dim, as
TorchRec groups its lookups. The per-lookup `torch` backend (`torch_bag`), by contrast, runs one
`nn.EmbeddingBag` and optimizer per table, a near sum over tables that hides fusion. Its rows are
named `torch_fused`, never `fbgemm`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from autoshard.core.errors import ConfigError
from autoshard.measure.base import Run, ShardCost, TorchShards
from autoshard.measure.fbgemm import output_grad
from autoshard.measure.timing import TimingConfig, time_steps

if TYPE_CHECKING:  # only a type here: the portable worker (no pandas) imports this module
    from autoshard.data.pool import Pool

OPTIMIZER = "EXACT_ROWWISE_ADAGRAD"  # the one it runs, as its rows' settings say
LEARNING_RATE = 0.01  # as the fbgemm backend's operator
EPS = 1e-8            # FBGEMM's default for row-wise Adagrad
STATE_BYTES = 4       # one fp32 Adagrad sum per row


@dataclass
class Group:
    """The tables of one dim: their weight rows stacked, their row offsets, their output columns."""

    dim: int
    positions: list[int]      # the tables' places in the shard
    shifts: list[int]         # per table of the group, its first row in `weight` (host ints: no device sync)
    weight: torch.Tensor      # (sum of rows, dim)
    state: torch.Tensor       # (sum of rows,) fp32


@dataclass
class GroupInput:
    """One run's input of a group: shifted flat indices and table-major offsets (T_g * B + 1)."""

    indices: torch.Tensor
    offsets: torch.Tensor


class FusedTables:
    """The weights and optimizer state of a shard's tables, one group per dim, and their step."""

    def __init__(self, rows: Sequence[int], dims: Sequence[int], device: torch.device,
                 dtype: torch.dtype, seed: int = 0):
        g = torch.Generator(device=device).manual_seed(seed)  # drawn where they live: GiBs at 65,536 bags
        self.device = device
        self.groups: list[Group] = []
        for dim in sorted(set(dims)):
            positions = [i for i, d in enumerate(dims) if d == dim]
            counts = [int(rows[i]) for i in positions]
            starts = torch.tensor([0] + counts[:-1], dtype=torch.int64).cumsum(0).tolist()
            # TBE's initial weights are uniform in +-sqrt(1/rows); the values do not change the work
            weight = (torch.rand(sum(counts), dim, generator=g, device=device) - 0.5) * 0.02
            self.groups.append(Group(dim, positions, starts, weight.to(dtype),
                                     torch.zeros(sum(counts), dtype=torch.float32, device=device)))
        # the output's column of each (group, table) slot, in the shard's table order
        starts = [0]
        for d in dims[:-1]:
            starts.append(starts[-1] + int(d))
        self.columns = torch.cat([
            torch.arange(starts[p], starts[p] + grp.dim) for grp in self.groups for p in grp.positions
        ]).to(device)

    def split(self, indices: torch.Tensor, offsets: torch.Tensor, batch_size: int) -> list[GroupInput]:
        """A shard's flat input (TBE's layout) as each group's input, indices shifted to its rows.
        This is the input distribution's job (TorchRec hands each group its own features), done
        outside the timed span."""
        out = []
        for grp in self.groups:
            parts, lengths = [], []
            for k, p in enumerate(grp.positions):
                bags = offsets[p * batch_size:(p + 1) * batch_size + 1]
                parts.append(indices[bags[0]:bags[-1]] + grp.shifts[k])
                lengths.append(bags.diff())
            flat = torch.zeros(len(grp.positions) * batch_size + 1, dtype=torch.int64)
            torch.cumsum(torch.cat(lengths), 0, out=flat[1:])
            out.append(GroupInput(torch.cat(parts).to(self.device), flat.to(self.device)))
        return out

    def forward(self, inputs: Sequence[GroupInput], batch_size: int) -> torch.Tensor:
        """TBE's pooled output, (batch, width) fp32, a differentiable function of nothing but
        wired to `_Step`, whose backward is the fused optimizer step."""
        return _Step.apply(self, inputs, batch_size, _anchor(self.device))

    def pooled(self, inputs: Sequence[GroupInput], batch_size: int) -> torch.Tensor:
        outs = []
        for grp, inp in zip(self.groups, inputs, strict=True):
            bags = torch.nn.functional.embedding_bag(inp.indices, grp.weight, inp.offsets, mode="sum",
                                                     include_last_offset=True)
            # (T_g * B, dim) table-major -> (B, T_g * dim), tables side by side
            outs.append(bags.float().view(len(grp.positions), batch_size, grp.dim).transpose(0, 1)
                        .reshape(batch_size, -1))
        grouped = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        if len(self.groups) == 1:
            return grouped
        out = torch.empty_like(grouped)
        out[:, self.columns] = grouped
        return out

    def step(self, inputs: Sequence[GroupInput], grad: torch.Tensor, batch_size: int,
             lr: float = LEARNING_RATE, eps: float = EPS) -> None:
        """The fused backward: per-lookup gradients summed per unique row, row-wise Adagrad on
        those rows only."""
        grouped = grad if len(self.groups) == 1 else grad[:, self.columns]
        at = 0
        for grp, inp in zip(self.groups, inputs, strict=True):
            width = len(grp.positions) * grp.dim
            # (B, T_g * dim) -> one gradient row per bag, table-major as the offsets
            per_bag = grouped[:, at:at + width].reshape(batch_size, len(grp.positions), grp.dim) \
                .transpose(0, 1).reshape(-1, grp.dim)
            at += width
            lookups = inp.indices.numel()
            bag_of = torch.repeat_interleave(torch.arange(inp.offsets.numel() - 1, device=grad.device),
                                             inp.offsets.diff(), output_size=lookups)
            # lookups sorted by row: each unique row's lookups are one segment, whose bags' gradients
            # one `embedding_bag` gathers and sums (no (lookups x dim) gradient is materialised)
            by_row, order = torch.sort(inp.indices)
            rows, counts = torch.unique_consecutive(by_row, return_counts=True)
            segments = torch.zeros(rows.numel() + 1, dtype=torch.int64, device=grad.device)
            torch.cumsum(counts, 0, out=segments[1:])
            row_grad = torch.nn.functional.embedding_bag(bag_of[order], per_bag, segments, mode="sum",
                                                         include_last_offset=True)
            state = grp.state.index_select(0, rows) + row_grad.pow(2).mean(dim=1)
            grp.state.index_copy_(0, rows, state)
            update = row_grad * (lr / (state.sqrt() + eps)).unsqueeze(1)
            new = grp.weight.index_select(0, rows).float() - update
            grp.weight.index_copy_(0, rows, new.to(grp.weight.dtype))


class _Step(torch.autograd.Function):
    """Forward: the pooled lookup. Backward: the optimizer step, as TBE fuses it (no weight
    gradient is ever materialised)."""

    @staticmethod
    def forward(ctx, tables: FusedTables, inputs, batch_size: int, anchor: torch.Tensor) -> torch.Tensor:
        ctx.tables, ctx.inputs, ctx.batch_size = tables, inputs, batch_size
        return tables.pooled(inputs, batch_size)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.tables.step(ctx.inputs, grad.float(), ctx.batch_size)
        return None, None, None, None


_ANCHORS: dict[str, torch.Tensor] = {}


def _anchor(device: torch.device) -> torch.Tensor:
    """An empty tensor that requires grad, so that autograd calls `_Step.backward`."""
    key = str(device)
    if key not in _ANCHORS:
        _ANCHORS[key] = torch.empty(0, device=device, requires_grad=True)
    return _ANCHORS[key]


def fused_bytes(rows: Sequence[int], dims: Sequence[int], weight_bytes: int, batch_size: int,
                lookups: int, inputs: int = 1) -> int:
    """What the operator holds while it runs: weights and row-wise state, `inputs` runs' int64
    indices of `lookups` each (an upper bound: the busiest run's), the fp32 output and its
    gradient, and the backward's temporaries of its largest dim group (one at a time): per lookup
    its bag, its sorted row and order, and its bag in row order; per unique row (at most one per
    lookup and one per row) its summed gradient, state and weight update."""
    tables = sum(int(r) * int(d) * weight_bytes + int(r) * STATE_BYTES for r, d in zip(rows, dims, strict=True))
    outputs = 2 * batch_size * int(sum(dims)) * 4
    group_rows: dict[int, int] = {}
    for r, d in zip(rows, dims, strict=True):
        group_rows[int(d)] = group_rows.get(int(d), 0) + int(r)
    backward = max(lookups * 4 * 8 + min(lookups, n) * (4 * d * 4 + 3 * 8) for d, n in group_rows.items())
    return int(tables + inputs * lookups * 8 + outputs + backward)


class TorchFusedBackend(TorchShards):
    name = "torch_fused"

    def __init__(self, pool: Pool, device: torch.device, timing: TimingConfig, memory_limit_bytes: int,
                 threads: int, optimizer: str = OPTIMIZER):
        if optimizer != OPTIMIZER:
            raise ConfigError(f"profile.optimizer: {optimizer!r} (the torch_fused backend runs {OPTIMIZER} only)")
        super().__init__(pool, device, timing, memory_limit_bytes, threads)

    def footprint(self, rows: list[int], dims: list[int], runs: list[Run], batch_size: int) -> int:
        windows = {id(i) for i, _ in runs}  # a window fed twice is one tensor (`Feeds.take`)
        return fused_bytes(rows, dims, self.weight_dtype.itemsize, batch_size, max(int(i.numel()) for i, _ in runs),
                           len(windows))

    def timed(self, rows: list[int], dims: list[int], runs: list[Run], batch_size: int) -> ShardCost:
        fused = FusedTables(rows, dims, self.torch_device, self.weight_dtype)
        windows = {id(i): (i, o) for i, o in runs}
        split = {key: fused.split(i, o, batch_size) for key, (i, o) in windows.items()}
        inputs = [split[id(i)] for i, _ in runs]
        grad = output_grad(batch_size, sum(dims), self.torch_device)
        return time_steps(lambda run: fused.forward(inputs[run], batch_size),
                          lambda out: out.backward(grad), self.timing, self.torch_device)

"""The per-table `torch` backend: it runs the optimizer its rows are filed under, and refuses a
shard by what its kernel holds (weights, optimizer state, inputs, outputs, gradients)."""

import pytest
import torch

from autoshard.core.errors import ConfigError
from autoshard.measure.base import ShardTooLarge, shard_bytes, table_shapes
from autoshard.measure.fbgemm import OPTIMIZERS
from autoshard.measure.timing import one_round
from autoshard.measure.torch_bag import EPS, LEARNING_RATE, TorchBackend, footprint, per_table, pooled, step

FAST = one_round(warmup=0, runs=2)
CPU = torch.device("cpu")


def one_table(optimizer: str) -> tuple[TorchBackend, torch.nn.ModuleList, list[torch.Tensor]]:
    """A backend's bag and state for one table of 5 rows and dim 4, weights 0..19 row by row."""
    backend = TorchBackend(None, CPU, FAST, 2**30, 1, optimizer)
    bags, states = backend.build([5], [4])
    with torch.no_grad():
        bags[0].weight.copy_(torch.arange(20.0).reshape(5, 4))
    return backend, bags, states


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_the_step_is_the_named_optimizer_on_the_rows_looked_up(optimizer):
    """Two bags: [1, 1, 3] and [3]; output gradient g per bag. Row 1 gets 2*g0, row 3 g0 + g1
    (duplicates summed first, as FBGEMM's EXACT optimizers do); the other rows are untouched."""
    _, bags, states = one_table(optimizer)
    before = bags[0].weight.detach().clone()
    grad = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 0.0, 2.0]])
    out = pooled(bags, [(torch.tensor([1, 1, 3, 3]), torch.tensor([0, 3]))])
    out.backward(grad)
    step(bags[0].weight, states[0], optimizer)
    g = {1: 2 * grad[0], 3: grad[0] + grad[1]}
    expected = before.clone()
    for row, gr in g.items():
        if optimizer == "EXACT_ROWWISE_ADAGRAD":
            expected[row] -= LEARNING_RATE * gr / ((gr ** 2).mean().sqrt() + EPS)
        elif optimizer == "EXACT_ADAGRAD":
            expected[row] -= LEARNING_RATE * gr / ((gr ** 2).sqrt() + EPS)
        else:
            expected[row] -= LEARNING_RATE * gr
    assert torch.allclose(bags[0].weight, expected, atol=1e-6)
    assert bags[0].weight.grad is None, "the gradient is dropped after the step"
    shapes = {"EXACT_ROWWISE_ADAGRAD": (5,), "EXACT_ADAGRAD": (5, 4), "EXACT_SGD": (0,)}
    assert tuple(states[0].shape) == shapes[optimizer]
    if optimizer == "EXACT_ROWWISE_ADAGRAD":
        assert states[0].tolist() == pytest.approx([0, float((g[1] ** 2).mean()), 0, float((g[3] ** 2).mean()), 0])


def test_an_optimizer_fbgemm_does_not_name_is_refused():
    with pytest.raises(ConfigError, match=r"profile.optimizer: 'ADAM'"):
        TorchBackend(None, CPU, FAST, 2**30, 1, "ADAM")
    assert TorchBackend(None, CPU, FAST, 2**30, 1).optimizer == "EXACT_ROWWISE_ADAGRAD", "the study's default"


def held_bytes(backend: TorchBackend, pool, tables: list[int], batch: int) -> tuple[int, int]:
    """What the kernel holds after one forward and backward on `tables` (before its step), by
    summing its tensors; and the footprint the backend estimates for it."""
    rows, dims = table_shapes(pool.features, tables)
    runs = backend.feeds.take(pool.traces, tables, batch, 1)
    bags, states = backend.build(rows, dims)
    inputs = per_table(*runs[0], len(rows), batch, CPU)
    out = pooled(bags, inputs)
    grad = torch.randn(out.shape)
    out.backward(grad)

    def size(t: torch.Tensor) -> int:
        if t.is_sparse:
            return size(t._indices()) + size(t._values())
        return t.numel() * t.element_size()

    held = sum(size(b.weight) + size(b.weight.grad) for b in bags) + sum(map(size, states))
    held += sum(size(i) + size(o) for i, o in runs) + size(out) + size(grad)
    lookups = [int(i.numel()) for i, _ in inputs]
    estimate = footprint(rows, dims, lookups, batch, 4, backend.optimizer,
                         sum(size(i) + size(o) for i, o in runs))
    return held, estimate


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_the_footprint_counts_every_tensor_the_kernel_holds(pool, optimizer):
    busiest = pool.features["lookups"].nlargest(4).index.tolist()
    largest = pool.features["rows"].nlargest(2).index.tolist()
    for tables in (busiest, largest):
        held, estimate = held_bytes(TorchBackend(pool, CPU, FAST, 2**30, 1, optimizer), pool, tables, 256)
        assert held <= estimate <= 3 * held, (tables, held, estimate)


def test_dense_adagrad_state_is_as_large_as_the_weights(pool):
    rows, dims = table_shapes(pool.features, [0, 1])
    weights = sum(r * d * 4 for r, d in zip(rows, dims, strict=True))
    assert footprint(rows, dims, [0, 0], 1, 4, "EXACT_ADAGRAD", 0) >= 2 * weights
    assert footprint(rows, dims, [0, 0], 1, 4, "EXACT_ROWWISE_ADAGRAD", 0) >= shard_bytes(rows, dims, 4)


def test_a_shard_whose_weights_fit_but_whose_kernel_does_not_is_too_large(pool):
    """The former check let through any shard whose weights and row-wise state fit the limit; with
    dense Adagrad the state alone doubles that."""
    tables = pool.features["rows"].nlargest(3).index.tolist()
    rows, dims = table_shapes(pool.features, tables)
    limit = shard_bytes(rows, dims, 4) + 1
    with pytest.raises(ShardTooLarge, match=r"shard of 3 tables needs \d+\.\d+ GiB"):
        TorchBackend(pool, CPU, FAST, limit, 1, "EXACT_ADAGRAD").measure(tables, 64)
    cost = TorchBackend(pool, CPU, FAST, 2**30, 1, "EXACT_ADAGRAD").measure(tables, 64)
    assert cost.forward_ms > 0 and cost.backward_ms > 0

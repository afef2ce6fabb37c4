"""Local search on the cost model: move one table or swap two while the bottleneck improves.

Each round evaluates every move of a table off the bottleneck device and every swap of such
a table with a table of another device, and applies the best one if it lowers the predicted
bottleneck and respects memory. A device's cost is the cost model's head on the sum of its
tables' encodings; the head's first layer is linear, so each table's share of it is computed
once, and a candidate costs the head's remaining layers on the two devices it changes.

The search runs in float64 NumPy on copies of the model's weights (of the torch model, or of
the NumPy planner exported from it: the same numbers), with `einsum`'s own loops rather than a
multi-threaded BLAS, and sums in a fixed order: the same plan whatever the number of threads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from autoshard.core.errors import ConfigError
from autoshard.data.features import FEATURE_COLUMNS, LOG_COLUMNS, check_features
from autoshard.data.tasks import Task

if TYPE_CHECKING:  # the search itself needs no torch
    from autoshard.costmodel.model import CostModel


class NumpyNetwork(Protocol):
    """The NumPy copy of the cost model that `rl.numpy_planner.NumpyModels` holds (the search reads
    its layer stacks and arrays, so `autoshard plan --refine` needs no torch)."""

    stacks: dict
    arrays: dict
    scale: float

Layer = tuple[np.ndarray, np.ndarray, bool]  # weight, bias, followed by a ReLU


def _network(model: CostModel | NumpyNetwork) -> tuple[list[Layer], list[Layer], np.ndarray, np.ndarray, float]:
    """(encoder, head, mean, std, scale) of the cost model, in float64."""
    if hasattr(model, "log_fusion"):
        raise ConfigError("local search: the hybrid cost model's head is not linear in the tables' shares "
                          "(it takes the log of their summed single costs); refine with the feature-only model")
    if hasattr(model, "stacks"):  # the NumPy planner's copy
        def layers(stack) -> list[Layer]:
            return [(w.astype(np.float64), b.astype(np.float64), r)
                    for w, b, r in zip(stack.weights, stack.biases, stack.relu, strict=True)]

        a = model.arrays
        return (layers(model.stacks["cost_model.encoder"]), layers(model.stacks["cost_model.head"]),
                a["cost_model.mean"].astype(np.float64), a["cost_model.std"].astype(np.float64), float(model.scale))
    return (_layers(model.encoder), _layers(model.head), model.mean.double().numpy(), model.std.double().numpy(),
            float(model.scale))


def _layers(sequential) -> list[Layer]:
    """The Linear layers of a Sequential of Linear and ReLU, in float64."""
    out: list[Layer] = []
    for module in sequential:
        kind = type(module).__name__
        if kind == "Linear":
            out.append((module.weight.detach().double().numpy(), module.bias.detach().double().numpy(), False))
        elif kind == "ReLU":
            out[-1] = (*out[-1][:2], True)
        else:
            raise TypeError(f"local search: cannot evaluate a {kind} layer")
    return out


def _apply(layers: list[Layer], x: np.ndarray) -> np.ndarray:
    for w, b, relu in layers:
        x = np.einsum("...i,oi->...o", x, w) + b
        if relu:
            x = np.maximum(x, 0.0)
    return x


class _Costs:
    """The cost model in float64: table shares of the head's first layer, and device costs."""

    def __init__(self, model: CostModel | NumpyNetwork, features: np.ndarray):
        encoder, head, mean, std, self.scale = _network(model)
        x = check_features(features).astype(np.float64)  # the float32 values the model sees
        for name in LOG_COLUMNS:
            i = FEATURE_COLUMNS.index(name)
            x[:, i] = np.log1p(x[:, i])
        enc = _apply(encoder, (x - mean) / std)
        (w, self.bias, self.relu), self.rest = head[0], head[1:]
        self.share = np.einsum("te,he->th", enc, w)  # (T, H): what each table adds to a device

    def of(self, pre: np.ndarray) -> np.ndarray:
        """Predicted cost (ms) of devices from their first-layer sums (..., H)."""
        hidden = np.maximum(pre, 0.0) if self.relu else pre
        return np.logaddexp(0.0, _apply(self.rest, hidden)).sum(-1) * self.scale


def local_search(model: CostModel | NumpyNetwork, features: np.ndarray, task: Task, placement: np.ndarray,
                 max_rounds: int = 1000) -> np.ndarray:
    """An improved copy of `placement` (device per `task.tables` entry) under the cost model
    (a torch `CostModel` or the NumPy planner)."""
    tables = list(task.tables)
    costs = _Costs(model, np.asarray(features)[tables])
    sizes = np.asarray(features[tables, FEATURE_COLUMNS.index("size_bytes")]).astype(np.int64)
    place = np.asarray(placement, dtype=np.int64).copy()
    d = task.devices
    for _ in range(max_rounds):
        pre = np.tile(costs.bias, (d, 1))
        np.add.at(pre, place, costs.share)  # in table order: a fixed summation order
        counts = np.bincount(place, minlength=d)
        memory = np.zeros(d, dtype=np.int64)
        np.add.at(memory, place, sizes)
        device_costs = np.where(counts > 0, costs.of(pre), 0.0)
        best = _Best(float(device_costs.max()) * (1 - 1e-6))
        _moves(best, costs, pre, counts, device_costs, memory, sizes, place, task.memory_bytes)
        _swaps(best, costs, pre, device_costs, memory, sizes, place, task.memory_bytes)
        if best.moves is None:
            break
        for table, device in best.moves:
            place[table] = device
    return place


class _Best:
    """The best candidate so far: the lowest new bottleneck under `bound` (the current one, less
    a margin), ties to the lowest key (moves before swaps, then in table order)."""

    def __init__(self, bound: float):
        self.bound, self.key, self.moves = bound, (), None

    def offer(self, bottlenecks: np.ndarray, keys: np.ndarray, moves_of) -> None:
        if not len(bottlenecks):
            return
        low = bottlenecks.min()
        if low > self.bound:
            return
        tied = np.flatnonzero(bottlenecks == low)
        c = int(tied[np.lexsort(keys[tied].T[::-1])[0]])
        key = tuple(int(k) for k in keys[c])
        if low < self.bound or key < self.key:
            self.bound, self.key, self.moves = float(low), key, moves_of(c)


def _others_max(device_costs: np.ndarray) -> tuple[int, np.ndarray]:
    """The bottleneck device b and, per device k, the highest cost among the devices other
    than b and k (those a candidate between b and k leaves alone)."""
    order = np.argsort(-device_costs, kind="stable")
    padded = np.concatenate([device_costs[order], [0.0, 0.0]])
    out = np.full(len(device_costs), padded[1])
    out[order[1:2]] = padded[2]
    return int(order[0]), out


def _moves(best: _Best, costs: _Costs, pre, counts, device_costs, memory, sizes, place, capacity) -> None:
    """Offer every move of a table off the bottleneck device to another device with room."""
    b, rest = _others_max(device_costs)
    on_b = np.flatnonzero(place == b)
    others = np.array([k for k in range(len(device_costs)) if k != b], dtype=np.int64)
    i, dest = (a.ravel() for a in np.meshgrid(on_b, others, indexing="ij"))
    ok = memory[dest] + sizes[i] <= capacity
    i, dest = i[ok], dest[ok]
    left = costs.of(pre[b] - costs.share[i]) if counts[b] > 1 else np.zeros(len(i))
    bottlenecks = np.maximum(np.maximum(left, costs.of(pre[dest] + costs.share[i])), rest[dest])
    keys = np.stack([np.zeros_like(i), i, dest], axis=1)
    best.offer(bottlenecks, keys, lambda c: [(int(i[c]), int(dest[c]))])


def _swaps(best: _Best, costs: _Costs, pre, device_costs, memory, sizes, place, capacity) -> None:
    """Offer every swap of a table on the bottleneck device with a table of another device,
    one device at a time; a candidate whose other device alone already exceeds the best so
    far is not evaluated on the bottleneck device."""
    b, rest = _others_max(device_costs)
    on_b = np.flatnonzero(place == b)
    without_i = pre[b] - costs.share[on_b]                                     # (I, H)
    for k in range(len(device_costs)):
        on_k = np.flatnonzero(place == k)
        if k == b or not len(on_k) or rest[k] > best.bound:
            continue
        fits = ((memory[k] - sizes[on_k][None, :] + sizes[on_b][:, None] <= capacity)
                & (memory[b] - sizes[on_b][:, None] + sizes[on_k][None, :] <= capacity))   # (I, J)
        gains = (pre[k] - costs.share[on_k])[None, :, :] + costs.share[on_b][:, None, :]  # k: j out, i in
        cost_k = np.where(fits, costs.of(gains), np.inf)
        ii, jj = np.nonzero(cost_k <= best.bound)
        if not len(ii):
            continue
        cost_b = costs.of(without_i[ii] + costs.share[on_k[jj]])
        bottlenecks = np.maximum(np.maximum(cost_b, cost_k[ii, jj]), rest[k])
        keys = np.stack([np.ones_like(ii), on_k[jj], on_b[ii]], axis=1)
        best.offer(bottlenecks, keys,
                   lambda c, ii=ii, jj=jj, on_k=on_k, k=k: [(int(on_b[ii[c]]), k), (int(on_k[jj[c]]), b)])

"""What a placement costs, kept apart from the searches that lower it (as TorchRec keeps its
estimator apart from its partitioner): `placement.heuristics.objective_greedy`, `placement.search` and
`placement.milp` each take an objective, so each idea is written once for every objective.

A device's state is the sum of its tables' rows of `share` on top of an empty device's `base`;
`stages` maps states to per-stage costs; a placement costs the sum over stages of its slowest
device in each. Three kinds:

- `Model`: one stage, the cost model's head on the sum of the device's table encodings (the
  head's first layer is linear, so a table's share of it is computed once; an empty device
  costs 0): `max_device` under the neural cost model.
- `Speeds`: another objective on devices of different speeds (each device's costs over its speed).
- `Linear`: each stage the device's summed per-table values plus an offset, never below 0. With
  one stage of measured single costs it is `max_device` on the linear surrogate (LPT, `milp`);
  with four it is DreamShard's synchronized stages (`synchronized`: forward compute, the forward
  and backward all-to-all as lines in the device's summed width, backward compute). A linear
  objective is one the MILP solves exactly.

Float64 NumPy with einsum's own loops (no multi-threaded BLAS) and sums in table order: the same
numbers, so the same plans, whatever the number of threads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from autoshard.core.errors import ConfigError
from autoshard.data.features import FEATURE_COLUMNS, LOG_COLUMNS, check_features

if TYPE_CHECKING:  # the objectives themselves need no torch
    from autoshard.costmodel.model import CostModel
    from autoshard.measure.commmodel import CommModel


class Objective:
    """Per-table `share` (T, K) of a device's state over an empty device's `base` (K,), and the
    per-stage costs (..., S) of states (..., K) from `stages`."""

    share: np.ndarray
    base: np.ndarray

    def stages(self, state: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def empty(self, devices: int) -> np.ndarray:
        """(D, K): the states of `devices` empty devices."""
        return np.tile(self.base, (devices, 1))

    def states(self, placement: np.ndarray, devices: int) -> np.ndarray:
        """(D, K): each device's state under `placement` (a device per table), summed in table order."""
        out = self.empty(devices)
        np.add.at(out, np.asarray(placement, np.int64), self.share)
        return out

    def cost(self, placement: np.ndarray, devices: int) -> float:
        """The placement's cost: the sum over stages of the slowest device in each."""
        return float(self.stages(self.states(placement, devices)).max(axis=0).sum())


class Linear(Objective):
    """Stages that are sums of per-table values (`share`, (T, S)) plus `base`, clipped at 0."""

    def __init__(self, share: np.ndarray, base: np.ndarray):
        self.share = np.asarray(share, dtype=np.float64)
        self.base = np.asarray(base, dtype=np.float64)
        if self.share.ndim != 2 or self.base.shape != self.share.shape[1:]:
            raise ValueError(f"share {self.share.shape} and base {self.base.shape}: need (T, S) and (S,)")

    def stages(self, state: np.ndarray) -> np.ndarray:
        return np.maximum(state, 0.0)

    @classmethod
    def max_device(cls, costs: np.ndarray) -> Linear:
        """One stage: the device's summed per-table `costs` (measured single costs, or a heuristic's key)."""
        costs = np.asarray(costs, dtype=np.float64)
        if costs.ndim != 1:
            raise ValueError(f"costs {costs.shape}: need a vector")
        return cls(costs[:, None], np.zeros(1))

    @classmethod
    def synchronized(cls, forward: np.ndarray, backward: np.ndarray, dims: np.ndarray,
                     lines: np.ndarray) -> Linear:
        """DreamShard's four stages: summed single forward costs, the forward and backward
        all-to-all as the comm `lines` (`comm_lines`) in the summed width, summed backward costs."""
        forward, backward, dims = (np.asarray(v, dtype=np.float64) for v in (forward, backward, dims))
        share = np.column_stack([forward, lines[0, 1] * dims, lines[1, 1] * dims, backward])
        return cls(share, np.array([0.0, lines[0, 0], lines[1, 0], 0.0]))


def comm_lines(model: CommModel, devices: int, batch_size: int, total_width: float) -> np.ndarray:
    """(2, 2): per direction (forward, backward), the intercept and slope of a device's predicted
    all-to-all ms in its summed width, for a placement of total width `total_width`: the comm
    model's `predict_arrays` rewritten (sent and received MB are linear in the device's width)."""
    from autoshard.measure.commmodel import BYTES_PER_VALUE, MB

    scale = (batch_size // devices) * BYTES_PER_VALUE / MB
    a, b, c = model.coefficients(devices, "forward")  # sends (D-1)·scale·w, receives scale·(W-w)
    forward = (a + c * scale * total_width, b * (devices - 1) * scale - c * scale)
    a, b, c = model.coefficients(devices, "backward")  # the two swap
    backward = (a + b * scale * total_width, c * (devices - 1) * scale - b * scale)
    return np.array([forward, backward], dtype=float)


class NumpyNetwork(Protocol):
    """The NumPy copy of the cost model that `rl.numpy_planner.NumpyModels` holds (`Model` reads
    its layer stacks and arrays, so `autoshard plan --refine` needs no torch)."""

    stacks: dict
    arrays: dict
    scale: float


Layer = tuple[np.ndarray, np.ndarray, bool]  # weight, bias, followed by a ReLU


class Model(Objective):
    """The cost model's predicted device cost (ms), one stage. The state is the head's first
    layer's pre-activation, then the device's table count (an empty device costs 0)."""

    def __init__(self, model: CostModel | NumpyNetwork, features: np.ndarray):
        encoder, head, mean, std, self.scale = _network(model)
        x = check_features(features).astype(np.float64)  # the float32 values the model sees
        for name in LOG_COLUMNS:
            i = FEATURE_COLUMNS.index(name)
            x[:, i] = np.log1p(x[:, i])
        encodings = _apply(encoder, (x - mean) / std)
        (w, bias, self.relu), self.rest = head[0], head[1:]
        first = np.einsum("te,he->th", encodings, w)
        self.share = np.column_stack([first, np.ones(len(first))])
        self.base = np.append(bias, 0.0)

    def stages(self, state: np.ndarray) -> np.ndarray:
        pre = state[..., :-1]
        hidden = np.maximum(pre, 0.0) if self.relu else pre
        cost = np.logaddexp(0.0, _apply(self.rest, hidden)).sum(-1) * self.scale
        return np.where(state[..., -1] > 0, cost, 0.0)[..., None]


class Speeds(Objective):
    """`inner` on devices of different speeds (GPU generations mixed in one cluster, or devices
    shared with other jobs): device k's stage costs are `inner`'s over `speeds[k]`, plus, where
    given, the per-table `comm` (T, S) the device's tables add whatever its speed (the modelled
    exchange of their outputs over the links). A device's state is `inner`'s, then its summed comm,
    then 1 / its speed, which no table changes."""

    def __init__(self, inner: Objective, speeds: np.ndarray, comm: np.ndarray | None = None):
        self.inner, self.speeds = inner, np.asarray(speeds, dtype=np.float64)
        if self.speeds.ndim != 1 or not (self.speeds > 0).all():
            raise ValueError(f"speeds {self.speeds}: need a positive speed per device")
        self.comm = None if comm is None else np.asarray(comm, dtype=np.float64)
        extra = [] if self.comm is None else [self.comm]
        self.share = np.column_stack([inner.share, *extra, np.zeros(len(inner.share))])
        self.base = np.concatenate([inner.base, *(np.zeros(c.shape[1]) for c in extra), [1.0]])
        self.width = inner.share.shape[1]

    def empty(self, devices: int) -> np.ndarray:
        if devices != len(self.speeds):
            raise ValueError(f"{devices} devices, {len(self.speeds)} speeds")
        out = np.tile(self.base, (devices, 1))
        out[:, -1] = 1.0 / self.speeds
        return out

    def stages(self, state: np.ndarray) -> np.ndarray:
        timed = self.inner.stages(state[..., :self.width]) * state[..., -1:]
        return timed if self.comm is None else timed + state[..., self.width:-1]


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


def slowest_others(values: np.ndarray, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """(C, S): per candidate and stage, the highest of `values` (D, S) over the devices other
    than `first[c]` and `second[c]` (-inf where there are none): what a change to those two
    devices leaves as it is."""
    k = min(3, len(values))
    order = np.argsort(-values, axis=0, kind="stable")[:k]                # (k, S)
    top = np.take_along_axis(values, order, axis=0)
    free = (order[None] != first[:, None, None]) & (order[None] != second[:, None, None])  # (C, k, S)
    return np.where(free, top[None], -np.inf).max(axis=1)

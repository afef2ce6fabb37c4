"""The hybrid cost model: measured single-table costs times a learnt fusion factor.

    cost(shard) = (sum of its tables' measured single costs) x exp(g(shard))

Profiling a table alone is cheap (every pool table is measured by the profile stage), and on
the machines measured so far a shard's fused cost is within tens of percent of the sum of its
tables' single costs; the feature-only model (`model.CostModel`, AutoShard's) has to learn that
whole magnitude from 21 features and misses unseen tables by more than the plain sum does.
The hybrid takes the sum as given and learns only what fusion changes: g, the log of the
fusion factor, starts at 0 (the last layer is zero-initialised, so an untrained hybrid *is*
the sum of singles) and is fitted by log-MSE, the loss that matches a multiplicative error.

g has the same shape as AutoShard's network, so that every planner can use the hybrid
unchanged: a shared table encoder over the 21 features plus log1p of the table's own single
cost, the encodings summed over the shard, a head over the sum and the log of the summed
single costs. A table's `encode` output ends with its single cost (in units of
`scale`, the median training cost), so summing encodings -- what the RL environment, the
greedy and the exact search do -- also sums the single costs, and `cost_ms` of a summed
encoding is the shard's cost. The single cost travels as a 22nd feature column
(`with_single_costs`); the feature-only model ignores that column, so one features array
serves both models.
"""

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn

from autoshard.core.errors import ConfigError
from autoshard.core.params import bounded
from autoshard.costmodel.model import (
    SINGLE_COST_COLUMN,
    PooledCostNetwork,
    check_features,
    load_network,
    save_network,
    transform,
)
from autoshard.data.features import FEATURE_COLUMNS

FORMAT = "autoshard-hybrid-cost-model/1"
WIDTH = len(FEATURE_COLUMNS) + 1  # the 21 features and the measured single cost


@dataclass(frozen=True)
class HybridConfig:
    """The network and its training (the `cost_model.hybrid` section, less the stage's
    switch and target). `encoding` counts the single-cost channel too, so that a policy sized
    by `cfg.encoding` sees the encodings' real width."""

    hidden: int
    encoding: int = bounded(lo=2)
    head_hidden: int
    learning_rate: float = bounded(lo=0, lo_open=True)
    weight_decay: float = bounded(lo=0)
    batch_size: int
    max_epochs: int
    patience: int
    heuristic_weight: float = bounded(lo=0, lo_open=True)


@dataclass(frozen=True)
class ActiveConfig:
    """The `cost_model.active` section, less its switch: how many shards `costmodel.active`
    measures for the hybrid, and how it chooses them."""

    rounds: int            # choose, measure, refit
    shards_per_round: int  # per arm and round
    ensemble: int = bounded(lo=2)    # bootstrap hybrids whose spread is the uncertainty
    candidates: int = bounded(lo=3)  # unmeasured shards to choose from
    seeds: int             # fits of each arm's hybrid for the comparison


def with_single_costs(features: np.ndarray, single_ms: pd.Series) -> np.ndarray:
    """The pool's features (N, 21) with each table's measured single cost (ms) as a 22nd column;
    a table without a measurement is an error (the hybrid cannot price it)."""
    missing = sorted(set(range(len(features))) - set(map(int, single_ms.index)))
    if missing:
        raise ConfigError(f"profile: table {missing[0]} was not measured alone "
                          f"({len(missing)} of {len(features)} pool tables lack a single cost)")
    return np.column_stack([np.asarray(features, dtype=np.float64),
                            single_ms.loc[list(range(len(features)))].to_numpy(dtype=np.float64)])


class HybridCostModel(PooledCostNetwork):
    """Shard cost = summed measured single costs x exp(head(summed encodings))."""

    def __init__(self, cfg: HybridConfig, mean: torch.Tensor, std: torch.Tensor,
                 scale: torch.Tensor | float = 1.0):
        super().__init__()
        self.cfg = cfg
        self.encoder = nn.Sequential(nn.Linear(WIDTH, cfg.hidden), nn.ReLU(),
                                     nn.Linear(cfg.hidden, cfg.encoding - 1), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(cfg.encoding, cfg.head_hidden), nn.ReLU(),
                                  nn.Linear(cfg.head_hidden, 1))
        nn.init.zeros_(self.head[-1].weight)
        nn.init.zeros_(self.head[-1].bias)
        self.register_buffer("mean", mean.float())
        self.register_buffer("std", std.float())
        self.register_buffer("scale", torch.as_tensor(scale, dtype=torch.float32).reshape(()))

    @classmethod
    def fitted_to(cls, cfg: HybridConfig, train_features: np.ndarray, scale: float = 1.0) -> "HybridCostModel":
        """A fresh model normalised with `train_features` (N, 22) and an output `scale` (ms)."""
        x = transform(cls.checked(train_features))
        std = x.std(dim=0, unbiased=False)
        return cls(cfg, x.mean(dim=0), torch.where(std > 1e-8, std, torch.ones_like(std)), scale)

    def encode(self, features: torch.Tensor) -> torch.Tensor:
        """Encodings (N, encoding) of features with single costs (N, 22): the learnt part, then
        the single cost / scale."""
        learnt = self.encoder((transform(features) - self.mean) / self.std)
        return torch.cat([learnt, (features[..., -1:] / self.scale).to(learnt.dtype)], dim=-1)

    def log_fusion(self, pooled: torch.Tensor) -> torch.Tensor:
        """g: log of the factor between a shard's cost and its summed single costs (...,)."""
        total = pooled[..., -1:].clamp_min(1e-9)
        return self.head(torch.cat([pooled[..., :-1], torch.log(total)], dim=-1)).squeeze(-1)

    def cost_ms(self, pooled: torch.Tensor) -> torch.Tensor:
        """Predicted cost (ms) of shards from their summed encodings; an empty shard costs 0."""
        return pooled[..., -1] * self.scale * torch.exp(self.log_fusion(pooled))

    def head_ms(self, pooled: torch.Tensor) -> torch.Tensor:
        """The cost as the one head (..., 1), like the feature-only model's `heads: total`."""
        return self.cost_ms(pooled)[..., None]

    @staticmethod
    def checked(features: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Features with single costs (`with_single_costs`) as a float32 tensor (N, 22)."""
        x = check_features(features)
        if x.shape[1] != WIDTH:
            raise ConfigError(f"hybrid cost model: features need the measured single cost as column "
                              f"{SINGLE_COST_COLUMN!r} (22 values per table), got shape {tuple(x.shape)}")
        return x


def save_hybrid(model: HybridCostModel, path) -> None:
    """State dict, config and format tag in one file, written at once."""
    save_network(model, path, FORMAT)


def load_hybrid(path) -> HybridCostModel:
    """Load a model written by `save_hybrid` (weights_only=True: no code runs on load)."""
    return load_network(path, FORMAT, "hybrid cost model", HybridCostModel, HybridConfig, WIDTH)

"""The neural multi-table cost model (AutoShard), with DreamShard's per-stage heads as an option.

A shared table encoder (21 -> 128 -> 32, ReLU) encodes every table of a shard; the encodings
are summed (so the order of tables never matters and any shard size works); a head
(32 -> 64 -> outputs) predicts the fused shard cost: one output (`heads: total`, AutoShard)
or forward and backward compute (`heads: stages`, DreamShard's split). Outputs are
softplus(head) x `scale` ms, `scale` being the median training cost, so a head that is close
to linear in the summed encodings (costs that add up) is easy to learn. Features are
log-scaled where they span orders of magnitude and standardised with statistics of the
train-pool tables; both are stored in the model as buffers.
"""

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from autoshard.core.checkpoints import load_tagged, save_tagged
from autoshard.core.errors import ConfigError
from autoshard.core.inputs import check_state
from autoshard.core.params import bounded, choice
from autoshard.data.features import FEATURE_COLUMNS, LOG_COLUMNS
from autoshard.data.features import check_features as check_feature_array

FORMAT = "autoshard-cost-model/1"
SINGLE_COST_COLUMN = "single_ms"  # an optional 22nd feature: the table's measured cost alone (the hybrid's)
HEADS = {"total": ("total_ms",), "stages": ("forward_ms", "backward_ms")}
LOSSES = ("mse", "log_mse")


@dataclass(frozen=True)
class CostModelConfig:
    """The network and its training (the `cost_model` section, less the study's own keys)."""

    heads: str = choice(HEADS)
    loss: str = choice(LOSSES)
    hidden: int
    encoding: int
    head_hidden: int
    learning_rate: float = bounded(lo=0, lo_open=True)
    weight_decay: float = bounded(lo=0)
    batch_size: int
    max_epochs: int
    patience: int
    single_cost_input: bool  # a 22nd input, the measured single cost: the hybrid's information, not its form


def input_width(cfg: CostModelConfig) -> int:
    """The feature columns a model of `cfg` reads: the 21, and the single cost where it is an input."""
    return len(FEATURE_COLUMNS) + int(cfg.single_cost_input)


def transform(x: torch.Tensor) -> torch.Tensor:
    """log1p of rows, pooling factor, size and (when given) the measured single cost; the rest
    as they are."""
    out = x.clone()
    for name in LOG_COLUMNS:
        i = FEATURE_COLUMNS.index(name)
        out[..., i] = torch.log1p(out[..., i])
    if x.shape[-1] > len(FEATURE_COLUMNS):
        out[..., len(FEATURE_COLUMNS)] = torch.log1p(out[..., len(FEATURE_COLUMNS)])
    return out


def check_features(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Features as a float32 tensor (N, 21), or (N, 22) with each table's measured single cost
    (ms, positive) last, as the hybrid model takes them; see `data.features.check_features`."""
    x = np.asarray(x, dtype=np.float64)
    width = len(FEATURE_COLUMNS)
    if x.ndim != 2 or x.shape[1] != width + 1:
        return torch.from_numpy(check_feature_array(x))
    single = x[:, width].astype(np.float32)
    bad = np.flatnonzero(~(np.isfinite(single) & (single > 0)))
    if len(bad):
        raise ConfigError(f"table features: {float(x[bad[0], width])} in table {bad[0]}, column "
                          f"{SINGLE_COST_COLUMN} (a measured cost must be positive)")
    return torch.from_numpy(np.column_stack([check_feature_array(x[:, :width]), single]))


class PooledCostNetwork(nn.Module):
    """What the cost models share: a shard's cost is `head_ms` of the sum of its tables'
    `encode`d features (so the order of tables never matters and any shard size works)."""

    def encode(self, features: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def head_ms(self, pooled: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @staticmethod
    def checked(features: np.ndarray | torch.Tensor) -> torch.Tensor:
        """The features this model takes, as a float32 tensor; see `check_features`."""
        return check_features(features)

    def forward(self, features: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Cost per head (S, heads) in ms of shards given as padded table indices (S, T), -1 = none."""
        enc = self.encode(features)
        padded = torch.cat([enc, enc.new_zeros(1, enc.shape[1])])
        return self.head_ms(padded[index].sum(dim=1))

    @torch.no_grad()
    def predict_ms(self, features: np.ndarray | torch.Tensor, shards: Sequence[Sequence[int]]) -> np.ndarray:
        """Predicted total cost (ms) of each shard; `features` are the pool's raw features."""
        x = self.checked(features)
        return self(x, pad_shards(shards, len(x))).sum(-1).numpy()


RANGE_COLUMNS = ("dim", "rows", "pooling_factor")  # the features a table outside the training range is named by


def feature_range(features: np.ndarray) -> dict[str, list[float]]:
    """[lowest, highest] of each of RANGE_COLUMNS over raw `features` (tables x 21)."""
    return {c: [float(features[:, FEATURE_COLUMNS.index(c)].min()), float(features[:, FEATURE_COLUMNS.index(c)].max())]
            for c in RANGE_COLUMNS}


class CostModel(PooledCostNetwork):
    """Shard cost from the sum of its tables' encodings; `trained_range` (`feature_range` of the
    tables it was fitted on, saved with it) says where its predictions were checked."""

    def __init__(self, cfg: CostModelConfig, mean: torch.Tensor, std: torch.Tensor,
                 scale: torch.Tensor | float = 1.0):
        super().__init__()
        self.cfg = cfg
        self.width = width = input_width(cfg)
        self.encoder = nn.Sequential(nn.Linear(width, cfg.hidden), nn.ReLU(),
                                     nn.Linear(cfg.hidden, cfg.encoding), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(cfg.encoding, cfg.head_hidden), nn.ReLU(),
                                  nn.Linear(cfg.head_hidden, len(HEADS[cfg.heads])))
        self.register_buffer("mean", mean.float())
        self.register_buffer("std", std.float())
        self.register_buffer("scale", torch.as_tensor(scale, dtype=torch.float32).reshape(()))
        self.trained_range: dict[str, list[float]] | None = None

    @classmethod
    def fitted_to(cls, cfg: CostModelConfig, train_features: np.ndarray, scale: float = 1.0) -> "CostModel":
        """A fresh model normalised with `train_features` (zero spread -> 1) and an output `scale` (ms),
        its `trained_range` theirs."""
        raw = _inputs(check_features(train_features), input_width(cfg))
        x = transform(raw)
        std = x.std(dim=0, unbiased=False)
        model = cls(cfg, x.mean(dim=0), torch.where(std > 1e-8, std, torch.ones_like(std)), scale)
        model.trained_range = feature_range(raw[:, :len(FEATURE_COLUMNS)].numpy())
        return model

    def encode(self, features: torch.Tensor) -> torch.Tensor:
        """Encodings (N, encoding) of raw table features (N, 21; a 22nd column, the single cost, is
        ignored unless `cfg.single_cost_input`)."""
        return self.encoder((transform(_inputs(features, self.width)) - self.mean) / self.std)

    def head_ms(self, pooled: torch.Tensor) -> torch.Tensor:
        """Each head's cost (..., heads) in ms from summed encodings (..., encoding)."""
        return nn.functional.softplus(self.head(pooled)) * self.scale

    def cost_ms(self, pooled: torch.Tensor) -> torch.Tensor:
        """Total predicted cost (ms) of non-empty shards from their summed encodings."""
        return self.head_ms(pooled).sum(-1)



def _inputs(features: torch.Tensor, width: int) -> torch.Tensor:
    """The first `width` feature columns; a model that reads the single cost refuses features without it."""
    if features.shape[-1] < width:
        raise ConfigError(f"table features: {features.shape[-1]} columns, but this cost model reads the measured "
                          f"single cost too ({width}; see costmodel.hybrid.with_single_costs)")
    return features[..., :width]


def pad_shards(shards: Sequence[Sequence[int]], num_tables: int) -> torch.Tensor:
    """Shards as a (S, longest) index tensor padded with -1, checked against the pool."""
    longest = max((len(s) for s in shards), default=0)
    index = torch.full((len(shards), max(1, longest)), -1, dtype=torch.long)
    for i, shard in enumerate(shards):
        if len(shard) == 0:
            raise ConfigError(f"shard {i}: empty")
        ids = torch.as_tensor(list(shard), dtype=torch.long)
        if ids.min() < 0 or ids.max() >= num_tables:
            raise ConfigError(f"shard {i}: table ids must be in [0, {num_tables}), got {list(shard)}")
        index[i, : len(ids)] = ids
    return index


def save_model(model: CostModel, path) -> None:
    """State dict, config and format tag in one file, written at once."""
    save_network(model, path, FORMAT)


def load_model(path) -> CostModel:
    """Load a model written by `save_model` (weights_only=True: no code runs on load)."""
    return load_network(path, FORMAT, "cost model", CostModel, CostModelConfig, input_width)


def save_network(model: nn.Module, path, fmt: str) -> None:
    """A cost network (with `cfg`, `mean`, `std`, `scale`) as format tag, config, feature
    columns and state dict, written at once."""
    save_tagged(path, fmt, {"config": asdict(model.cfg), "feature_columns": FEATURE_COLUMNS,
                            "state_dict": model.state_dict(), "trained_range": getattr(model, "trained_range", None)})


def load_network(path, fmt: str, what: str, network: type, config: type, width):
    """A `network(config(...), mean, std, scale)` from a `save_network` file of format `fmt`,
    its tensors checked against a blank one of input `width` (or `width(config)`); in eval mode."""
    payload = load_tagged(path, fmt, what, "cost_model")
    if payload["feature_columns"] != FEATURE_COLUMNS:
        raise ConfigError(f"{path}: built for other table features than this version's")
    state = payload["state_dict"]
    cfg = config(**payload["config"])
    width = width(cfg) if callable(width) else width
    blank = network(cfg, torch.zeros(width), torch.ones(width))
    check_state(path, what, blank.state_dict(), state)
    model = network(blank.cfg, state["mean"], state["std"], state["scale"])
    model.load_state_dict(state)
    model.trained_range = payload.get("trained_range")
    return model.eval()

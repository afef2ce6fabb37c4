"""Fitting the cost model: Adam on MSE of ms or of log-cost, early stopping on validation."""

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from autoshard.core.params import Fields, Section, bounded, inline, read
from autoshard.core.seeding import one_thread
from autoshard.costmodel.dataset import SEEN_MULTI, UNSEEN_MULTI, with_costs
from autoshard.costmodel.hybrid import ActiveConfig, HybridConfig, HybridCostModel
from autoshard.costmodel.model import HEADS, CostModel, CostModelConfig, check_features, pad_shards


@dataclass(frozen=True)
class CostStageConfig(Section):
    """The `cost_model` section: the network, the data split, the study's extras, the
    neural model's MAPE targets per test set (`mape_targets.seen` / `.unseen`), and the hybrid
    model (None when `hybrid.enabled` is false) with its MAPE target on both test sets, and the
    active selection of more shards for it (`active`, None when off)."""

    section = "cost_model"
    model: CostModelConfig = inline()
    val_share: float = bounded(lo=0, hi=0.5, lo_open=True)
    test_share: float = bounded(lo=0, hi=0.5, lo_open=True)
    learning_curve: tuple[float, ...] = bounded(lo=0.01, hi=1.0)
    compare_stage_heads: bool
    mape_targets: dict[str, float]
    hybrid: HybridConfig | None
    hybrid_mape_target: float
    active: ActiveConfig | None  # None: `active.enabled` false, or no hybrid

    @classmethod
    def from_params(cls, values: dict) -> "CostStageConfig":
        """`parse`, with the MAPE targets by test set, and the hybrid and its active selection
        read from their sections less their switches (`enabled`) and the hybrid's target."""
        f = Fields(cls.section, values)
        t = f.sub("mape_targets")
        targets = {SEEN_MULTI: t.number("seen", lo=0, lo_open=True),
                   UNSEEN_MULTI: t.number("unseen", lo=0, lo_open=True)}
        h, a = f.sub("hybrid"), f.sub("active")
        enabled, hybrid_target = h.boolean("enabled"), h.number("mape_target", lo=0, lo_open=True)
        hybrid, active_on, active = read(HybridConfig, h), a.boolean("enabled"), read(ActiveConfig, a)
        cfg = read(cls, f, mape_targets=targets, hybrid=hybrid if enabled else None,
                   hybrid_mape_target=hybrid_target, active=active if enabled and active_on else None)
        for section in (t, h, a, f):
            section.done()
        return cfg


@dataclass
class Fitted:
    model: CostModel | HybridCostModel
    history: pd.DataFrame  # epoch, train_loss, val_loss
    best_epoch: int


def _targets(shards: pd.DataFrame, cfg: CostModelConfig) -> torch.Tensor:
    return torch.tensor(shards[list(HEADS[cfg.heads])].to_numpy(dtype=np.float32))


def _loss(pred: torch.Tensor, target: torch.Tensor, kind: str, scale: torch.Tensor) -> torch.Tensor:
    if kind == "log_mse":
        return torch.mean((torch.log(pred.clamp_min(1e-9)) - torch.log(target)) ** 2)
    return torch.mean(((pred - target) / scale) ** 2)


def fit(cfg: CostModelConfig, features: np.ndarray, train_tables: np.ndarray, train: pd.DataFrame,
        val: pd.DataFrame, seed: int, progress: bool = True) -> Fitted:
    """Train a model on `train` shards; keep the weights of the best validation epoch."""
    with one_thread():
        return _fit(cfg, features, train_tables, train, val, seed, progress)


def _fit(cfg: CostModelConfig, features: np.ndarray, train_tables: np.ndarray, train: pd.DataFrame,
         val: pd.DataFrame, seed: int, progress: bool) -> Fitted:
    torch.manual_seed(seed)
    x = check_features(features)
    scale = float(np.median(train[list(HEADS[cfg.heads])].to_numpy()))
    model = CostModel.fitted_to(cfg, features[np.asarray(train_tables)], scale)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.learning_rate,
                                 weight_decay=cfg.weight_decay)
    index, target = pad_shards(train["tables"].tolist(), len(x)), _targets(train, cfg)
    val_index, val_target = pad_shards(val["tables"].tolist(), len(x)), _targets(val, cfg)
    return _descend(model, optimizer, len(index), cfg.batch_size, cfg.max_epochs, cfg.patience, seed,
                    lambda batch: _loss(model(x, index[batch]), target[batch], cfg.loss, model.scale),
                    lambda: _loss(model(x, val_index), val_target, cfg.loss, model.scale), progress,
                    "fit cost model")


def _descend(model: torch.nn.Module, optimizer: torch.optim.Optimizer, rows: int, batch_size: int,
             max_epochs: int, patience: int, seed: int, batch_loss, val_loss, progress: bool,
             desc: str) -> Fitted:
    """Mini-batch epochs over `rows` training shards in a seeded order; early stopping on
    `val_loss()`, keeping the weights of the best validation epoch."""
    g = torch.Generator().manual_seed(seed)
    best, best_epoch, history = float("inf"), 0, []
    best_state = {k: v.clone() for k, v in model.state_dict().items()}
    for epoch in tqdm(range(max_epochs), desc=desc, disable=not progress):
        model.train()
        losses = []
        for batch in torch.randperm(rows, generator=g).split(batch_size):
            loss = batch_loss(batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        model.eval()
        with torch.no_grad():
            val = val_loss().item()
        history.append({"epoch": epoch, "train_loss": float(np.mean(losses)), "val_loss": val})
        if val < best:
            best, best_epoch = val, epoch
            best_state = {k: v.clone() for k, v in model.state_dict().items()}
        elif epoch - best_epoch >= patience:
            break
    model.load_state_dict(best_state)
    return Fitted(model.eval(), pd.DataFrame(history), best_epoch)


def shard_weights(shards: pd.DataFrame, heuristic_weight: float) -> torch.Tensor:
    """Per-shard loss weights: shards of heuristic plans (what planners produce, the devices
    whose cost decides a placement) weigh `heuristic_weight`, every other shard 1."""
    heuristic = shards["kind"].astype(str).str.contains("heuristic").to_numpy()
    return torch.tensor(np.where(heuristic, heuristic_weight, 1.0), dtype=torch.float32)


def fit_hybrid(cfg: HybridConfig, features: np.ndarray, train_tables: np.ndarray, train: pd.DataFrame,
               val: pd.DataFrame, seed: int, progress: bool = True) -> Fitted:
    """Train the hybrid on `train` shards (`features` with single costs, see
    `hybrid.with_single_costs`) by weighted log-MSE; keep the best validation epoch's weights."""
    with one_thread():
        torch.manual_seed(seed)
        x = check_features(features)
        scale = float(np.median(train["total_ms"].to_numpy()))
        model = HybridCostModel.fitted_to(cfg, x.numpy()[np.asarray(train_tables)], scale)
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        data = {name: (pad_shards(s["tables"].tolist(), len(x)),
                       torch.log(torch.tensor(s["total_ms"].to_numpy(dtype=np.float32))),
                       shard_weights(s, cfg.heuristic_weight)) for name, s in (("train", train), ("val", val))}

        def loss(name: str, rows=slice(None)) -> torch.Tensor:
            index, log_target, weight = (t[rows] for t in data[name])
            err = torch.log(model(x, index).squeeze(-1).clamp_min(1e-9)) - log_target
            return (weight * err ** 2).sum() / weight.sum()

        return _descend(model, optimizer, len(train), cfg.batch_size, cfg.max_epochs, cfg.patience, seed,
                        lambda batch: loss("train", batch), lambda: loss("val"), progress, "fit hybrid cost model")


def learning_curve(cfg: CostModelConfig, features: np.ndarray, train_tables: np.ndarray,
                   splits: dict[str, pd.DataFrame], fractions: list[float], seed: int) -> pd.DataFrame:
    """Test error of models fitted on growing shares of the training shards (same seed)."""
    from autoshard.costmodel.accuracy import mape
    from autoshard.costmodel.dataset import test_sets

    rows = []
    for fraction in fractions:
        train = splits["train"].sample(frac=fraction, random_state=seed) if fraction < 1 else splits["train"]
        fitted = fit(cfg, features, train_tables, train, splits["val"], seed, progress=False)
        row = {"fraction": fraction, "train_shards": len(train)}
        for name, shards in test_sets(splits).items():
            pred = fitted.model.predict_ms(features, shards["tables"].tolist())
            row[f"{name} MAPE"] = mape(pred, shards["total_ms"].to_numpy())
        rows.append(row)
    return pd.DataFrame(rows)


def fit_replicates(cfg: CostModelConfig, features: np.ndarray, train_tables: np.ndarray,
                   splits: dict[str, pd.DataFrame], seed: int, replicates: int,
                   remeasured: pd.DataFrame | None = None) -> list[Fitted]:
    """The stochastic part of the chain again: the same shards and split, fitted from seeds
    `seed + 1 .. seed + replicates - 1` (replicate 0 is the stage's own fit). With `remeasured`
    (`measured_shards` of the profile's independent second pass) the last replicate fits on
    those measurements of the same shards instead: its spread includes one re-measurement."""
    out = []
    for r in range(1, replicates):
        train, val = splits["train"], splits["val"]
        if remeasured is not None and r == replicates - 1:
            train, val = with_costs(train, remeasured), with_costs(val, remeasured)
        out.append(fit(cfg, features, train_tables, train, val, seed + r, progress=False))
    return out

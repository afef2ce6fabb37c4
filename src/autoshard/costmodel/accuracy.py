"""How well cost estimators predict measured shard costs, and how well they rank shards.

Estimators compared on the same test shards: the sum of the tables' measured single costs,
a linear regression on summed (normalised) table features, TorchRec's analytic estimate (as
is, and scaled by one factor fitted on the training shards), and the neural model; then the
hybrid model against the two it has to beat (`compare_models`).
"""

from collections.abc import Callable
from typing import Any, NotRequired, TypedDict

import numpy as np
import pandas as pd
import torch
from scipy.stats import kendalltau

from autoshard.core.schema import Number, StageTime
from autoshard.costmodel.dataset import SEEN_MULTI, UNSEEN_MULTI
from autoshard.costmodel.hybrid import HybridCostModel, with_single_costs
from autoshard.costmodel.model import CostModel, transform
from autoshard.measure.analytic import AnalyticBackend


class EstimatorScores(TypedDict):
    mape: Number
    r2: Number
    tau_similar_size: Number


class HybridMetrics(TypedDict):
    """The hybrid cost model against the feature-only model and the rescaled sum of single
    costs, on multi-table shards of seen and of unseen tables (MAPE, a share)."""

    mape_seen: Number
    mape_unseen: Number
    rescaled_sum_mape_seen: Number
    rescaled_sum_mape_unseen: Number
    feature_only_mape_seen: Number
    feature_only_mape_unseen: Number
    mape_target: float
    targets_met: dict[str, bool]
    beats_rescaled_sum: dict[str, bool]
    mape: dict[str, Number]
    best_epoch: int


class PairedDifference(TypedDict):
    """A paired difference of absolute percentage error, test shard by test shard: its mean,
    95% bootstrap interval and Wilcoxon signed-rank p-value."""

    difference: Number
    ci_low: Number
    ci_high: Number
    p_value: Number
    shards: int


class ActiveMetrics(TypedDict):
    """The hybrid's active selection (`costmodel.active`): what was measured, each arm's MAPE
    (mean and sd over `seeds` fits; arm -> seen | unseen) and the paired differences
    ("active - uniform | unseen", ...)."""

    rounds: int
    shards_per_round: int
    ensemble: int
    seeds: int
    candidates: int
    shards_measured: int
    mape: dict[str, dict[str, Number]]
    mape_sd: dict[str, dict[str, Number]]
    paired: dict[str, PairedDifference]


class MeasurementFloor(TypedDict):
    """Seen-table test shards measured in both profile passes: the pass-to-pass MAPE (the
    second pass as the prediction of the main one) and each model's MAPE on exactly those
    shards against the main pass and against the mean of the two passes (shares)."""

    shards: int
    pass_to_pass_mape: Number
    pass_to_pass_mape_rescaled: Number  # the second pass times one factor fitted on train shards measured twice
    mape_vs_main: dict[str, Number]
    mape_vs_mean: dict[str, Number]


class DimError(TypedDict):
    """The neural cost model's MAPE on the test shards whose tables all have one dim."""

    mape: Number
    shards: int


class WideCostModel(TypedDict):
    """The cost models on the wide pool (`data.wide`: dims to 1024), measured by the profile."""

    shards: dict[str, int]                     # split -> shards
    dims: list[int]                            # the dims its tables have
    mape: dict[str, dict[str, Number]]         # estimator -> test set -> MAPE
    error_by_dim: dict[str, dict[str, dict[str, DimError]]]  # estimator -> test set -> widest dim -> error
    best_epoch: int                            # of the model fitted on it


class CostModelScores(StageTime):
    """reports/metrics/cost_model.json. Built by `costmodel.accuracy.cost_model_metrics`."""

    shards: dict[str, int]
    comparison: dict[str, EstimatorScores]
    neural_mape: dict[str, Number]
    mape_targets: dict[str, float]
    targets_met: dict[str, bool]
    noise_floor_cv: Number
    learning_curve: list[dict[str, Any]]
    best_epoch: int
    predict_10k_shards_seconds: float
    hybrid: NotRequired[HybridMetrics]
    measurement_floor: NotRequired[MeasurementFloor]
    active: NotRequired[ActiveMetrics]
    error_by_dim: NotRequired[dict[str, dict[str, DimError]]]  # test set -> dim (or "mixed") -> error
    wide: NotRequired[WideCostModel]           # the wide pool's fitted and transferred models


SIZE_BINS = [0, 1, 2, 4, 8, 16, 32, 10**9]
SCORES = ("mape", "r2", "tau_similar_size")


def mape(pred: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - measured) / measured))


def r2(pred: np.ndarray, measured: np.ndarray) -> float:
    return float(1 - np.sum((measured - pred) ** 2) / np.sum((measured - measured.mean()) ** 2))


def tau_similar_size(pred: np.ndarray, measured: np.ndarray, num_tables: np.ndarray) -> float:
    """Kendall's tau within groups of shards of similar size (1, 2, 3-4, 5-8, ... tables),
    averaged with each group weighted by its number of pairs: does the estimator rank
    shards a planner must choose between the same way the measurements do?"""
    groups = pd.cut(num_tables, SIZE_BINS)
    total, weight = 0.0, 0
    for key in groups.unique():
        sel = np.asarray(groups == key)
        n = int(sel.sum())
        if n < 3:
            continue
        tau = kendalltau(pred[sel], measured[sel]).statistic
        if np.isfinite(tau):
            total += tau * n * (n - 1) / 2
            weight += n * (n - 1) // 2
    return total / weight if weight else float("nan")


def scores(pred: np.ndarray, shards: pd.DataFrame) -> dict[str, float]:
    """MAPE, R2 and similar-size Kendall's tau (NaN for an empty test set)."""
    if len(shards) == 0:
        return {"mape": float("nan"), "r2": float("nan"), "tau_similar_size": float("nan")}
    measured = shards["total_ms"].to_numpy()
    return {"mape": mape(pred, measured), "r2": r2(pred, measured),
            "tau_similar_size": tau_similar_size(pred, measured, shards["num_tables"].to_numpy())}


Estimator = Callable[[pd.DataFrame], np.ndarray]


def sum_of_singles(single_ms: pd.Series, train: pd.DataFrame | None = None) -> Estimator:
    """Predict a shard's cost as the sum of its tables' measured single-table costs; scaled
    by one least-squares factor fitted on `train` if given (fusion makes the sum too high)."""
    def raw(shards: pd.DataFrame) -> np.ndarray:
        return shards["tables"].map(lambda t: float(single_ms.loc[list(t)].sum())).to_numpy()

    return raw if train is None else _rescaled(raw, train)


def linear_on_summed_features(features: np.ndarray, train_tables: np.ndarray,
                              train: pd.DataFrame) -> Estimator:
    """Least squares of cost on the shard's summed standardised features (log-scaled like the
    model's), its table count and an intercept; standardised with train-pool statistics."""
    x = transform(torch.as_tensor(np.asarray(features, dtype=np.float64))).numpy()
    ref = x[np.asarray(train_tables)]
    std = ref.std(axis=0)
    x = (x - ref.mean(axis=0)) / np.where(std > 1e-8, std, 1.0)

    def design(shards: pd.DataFrame) -> np.ndarray:
        summed = np.stack([x[list(t)].sum(axis=0) for t in shards["tables"]])
        return np.column_stack([summed, shards["num_tables"], np.ones(len(shards))])

    coef, *_ = np.linalg.lstsq(design(train), train["total_ms"].to_numpy(), rcond=None)
    return lambda shards: design(shards) @ coef


def analytic(backend: AnalyticBackend, batch_size: int, train: pd.DataFrame | None = None) -> Estimator:
    """TorchRec's estimate; scaled by one least-squares factor fitted on `train` if given."""
    def raw(shards: pd.DataFrame) -> np.ndarray:
        return np.array([backend.measure(list(t), batch_size).total_ms for t in shards["tables"]])

    return raw if train is None else _rescaled(raw, train)


def _rescaled(estimate: Estimator, train: pd.DataFrame) -> Estimator:
    """`estimate` times the one factor that fits `train` best (least squares)."""
    a, y = estimate(train), train["total_ms"].to_numpy()
    scale = float(a @ y / (a @ a))
    return lambda shards: scale * estimate(shards)


def neural(model: CostModel | HybridCostModel, features: np.ndarray) -> Estimator:
    return lambda shards: model.predict_ms(features, shards["tables"].tolist())


FEATURE_ONLY, RESCALED_SUM, HYBRID = "feature-only (AutoShard)", "sum of single costs, rescaled", "hybrid"
# the architecture comparison: both read each table's measured single cost, fitted on the same shards
INFORMED, EQUAL_HYBRID = "feature-only + single costs", "hybrid, same shards"


def compare_architectures(hybrid: HybridCostModel, informed: CostModel, hybrid_features: np.ndarray,
                          test_sets: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The hybrid against AutoShard's architecture given the same single costs as a 22nd input
    (`CostModelConfig.single_cost_input`), both fitted on the same training shards: what the hybrid's
    form (the sum of singles times a learnt factor) adds beyond the information it reads."""
    return compare({EQUAL_HYBRID: neural(hybrid, hybrid_features), INFORMED: neural(informed, hybrid_features)},
                   test_sets)


def compare_models(feature_model: CostModel, hybrid: HybridCostModel, features: np.ndarray,
                   single_ms: pd.Series, train: pd.DataFrame, test_sets: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The feature-only model, the rescaled sum of measured single costs (its factor fitted on
    `train`) and the hybrid on the same `test_sets`: one row per (estimator, test set)."""
    return compare({FEATURE_ONLY: neural(feature_model, features),
                    RESCALED_SUM: sum_of_singles(single_ms, train),
                    HYBRID: neural(hybrid, with_single_costs(features, single_ms))}, test_sets)


def hybrid_metrics(models: pd.DataFrame, target: float, best_epoch: int,
                   architectures: pd.DataFrame | None = None) -> HybridMetrics:
    """`compare_models`' MAPEs as metrics: the hybrid's on seen and unseen multi-table shards,
    the two references', whether the hybrid meets `target` and beats the rescaled sum there
    (a NaN MAPE meets nothing), every (estimator | test set) MAPE, and with `architectures`
    (`compare_architectures`) the equal-data hybrid's and the single-cost-informed model's."""
    table = models.set_index(["estimator", "test set"])["mape"]
    if architectures is not None and len(architectures):
        table = pd.concat([table, architectures.set_index(["estimator", "test set"])["mape"]])

    def get(estimator: str, test_set: str) -> float:
        return float(table.get((estimator, test_set), float("nan")))

    sets = {"seen": SEEN_MULTI, "unseen": UNSEEN_MULTI}
    return {
        "mape_seen": get(HYBRID, SEEN_MULTI), "mape_unseen": get(HYBRID, UNSEEN_MULTI),
        "rescaled_sum_mape_seen": get(RESCALED_SUM, SEEN_MULTI),
        "rescaled_sum_mape_unseen": get(RESCALED_SUM, UNSEEN_MULTI),
        "feature_only_mape_seen": get(FEATURE_ONLY, SEEN_MULTI),
        "feature_only_mape_unseen": get(FEATURE_ONLY, UNSEEN_MULTI),
        "informed_mape_seen": get(INFORMED, SEEN_MULTI), "informed_mape_unseen": get(INFORMED, UNSEEN_MULTI),
        "equal_data_hybrid_mape_seen": get(EQUAL_HYBRID, SEEN_MULTI),
        "equal_data_hybrid_mape_unseen": get(EQUAL_HYBRID, UNSEEN_MULTI),
        "mape_target": float(target),
        "targets_met": {k: bool(get(HYBRID, s) <= target) for k, s in sets.items()},
        "beats_rescaled_sum": {k: bool(get(HYBRID, s) < get(RESCALED_SUM, s)) for k, s in sets.items()},
        "mape": {f"{e} | {s}": float(v) for (e, s), v in table.items()},
        "best_epoch": int(best_epoch),
    }


def compare(estimators: dict[str, Estimator], test_sets: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per (estimator, test set): MAPE, R2, Kendall's tau over similar-size shards."""
    rows = []
    for name, estimate in estimators.items():
        for set_name, shards in test_sets.items():
            rows.append({"estimator": name, "test set": set_name, "shards": len(shards),
                         **scores(estimate(shards), shards)})
    return pd.DataFrame(rows)


def prediction_speed(model: CostModel, features: np.ndarray, shards: int = 10_000,
                     max_tables: int = 20, repeats: int = 5, seed: int = 0) -> dict[str, float]:
    """Median seconds to predict `shards` random shards of 1..max_tables tables in one call."""
    import time

    g = np.random.default_rng(seed)
    batch = [g.choice(len(features), g.integers(1, max_tables + 1), replace=False).tolist()
             for _ in range(shards)]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.predict_ms(features, batch)
        times.append(time.perf_counter() - start)
    return {"shards": shards, "median_seconds": float(np.median(times)),
            "threads": torch.get_num_threads()}


MIXED = "mixed"  # `error_by_dim`'s group of shards whose tables differ in dim


def error_by_dim(estimate: Estimator, test_sets: dict[str, pd.DataFrame], dims: np.ndarray,
                 widest: bool = False) -> dict[str, dict]:
    """Per test set and embedding dim (`dims`, per pool table): `estimate`'s MAPE and the shards
    it is over, the shards grouped by the one dim all their tables have (MIXED where they differ),
    or with `widest` by their widest table's dim (a pool of many dims has few shards of one):
    where a pool spans many dims, which of them the model predicts badly (issue 30)."""
    dims = np.asarray(dims)
    out: dict[str, dict] = {}
    for set_name, shards in test_sets.items():
        if not len(shards):
            continue
        pred = estimate(shards)
        measured = shards["total_ms"].to_numpy()
        group = np.array([str(int(d.max())) if widest or len(set(d)) == 1 else MIXED
                          for d in (dims[list(t)] for t in shards["tables"])])
        out[set_name] = {g: {"mape": mape(pred[group == g], measured[group == g]), "shards": int((group == g).sum())}
                         for g in sorted(set(group), key=lambda g: (g == MIXED, int(g) if g != MIXED else 0))}
    return out


def dim_table(by_dim: dict[str, dict[str, dict]]) -> pd.DataFrame:
    """Per estimator, test set and dim group (`error_by_dim`'s entries, by estimator): MAPE and shards."""
    rows = [{"estimator": e, "test set": s, "dim": g, **v}
            for e, sets in by_dim.items() for s, groups in sets.items() for g, v in groups.items()]
    return pd.DataFrame(rows, columns=["estimator", "test set", "dim", "mape", "shards"]).set_index(
        ["estimator", "test set", "dim"])


def wide_metrics(estimators: dict[str, Estimator], test_sets: dict[str, pd.DataFrame],
                 splits: dict[str, pd.DataFrame], dims: np.ndarray, best_epoch: int) -> WideCostModel:
    """The wide pool's entry of cost_model.json: its shards per split, each estimator's MAPE per
    test set, and its error by the widest table's dim (`error_by_dim`)."""
    return {"shards": {name: len(part) for name, part in splits.items()},
            "dims": sorted(int(d) for d in set(np.asarray(dims).tolist())),
            "mape": {name: {s: mape(estimate(shards), shards["total_ms"].to_numpy())
                            for s, shards in test_sets.items() if len(shards)}
                     for name, estimate in estimators.items()},
            "error_by_dim": {name: error_by_dim(estimate, test_sets, dims, widest=True)
                             for name, estimate in estimators.items()},
            "best_epoch": int(best_epoch)}


def predictions_frame(estimators: dict[str, Estimator], test_sets: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Long table of every estimator's prediction for every test shard (for figures)."""
    frames = []
    for name, estimate in estimators.items():
        for set_name, shards in test_sets.items():
            pred = estimate(shards)
            frames.append(pd.DataFrame({
                "estimator": name, "test set": set_name, "num_tables": shards["num_tables"],
                "measured_ms": shards["total_ms"], "predicted_ms": pred,
                "abs_pct_error": np.abs(pred - shards["total_ms"]) / shards["total_ms"] * 100}))
    return pd.concat(frames, ignore_index=True)


def against_targets(comparison: pd.DataFrame, estimator: str, targets: dict[str, float],
                    noise_floor: float) -> pd.DataFrame:
    """Per test set: `estimator`'s MAPE, its target (NaN where none is set) and the MAPE over
    the measurement noise floor (the profile's median CV): error a model cannot remove."""
    rows = comparison[comparison["estimator"] == estimator].set_index("test set")
    return pd.DataFrame({"MAPE": rows["mape"], "target": pd.Series(targets, dtype=float),
                         "MAPE / noise floor (CV)": rows["mape"] / noise_floor})


def cost_model_metrics(splits: dict[str, pd.DataFrame], comparison: pd.DataFrame, estimator: str,
                       targets: dict[str, float], noise_floor: float, curve: pd.DataFrame, best_epoch: int,
                       predict_seconds: float, seconds: float,
                       replicate_mape: pd.DataFrame | None = None,
                       hybrid: HybridMetrics | None = None,
                       floor: MeasurementFloor | None = None,
                       active: ActiveMetrics | None = None,
                       by_dim: dict[str, dict] | None = None, wide: WideCostModel | None = None) -> CostModelScores:
    """The cost-model stage's metrics: shards per split, every estimator's scores per test set,
    the neural `estimator`'s MAPE against `targets` (a target on an empty test set is not met),
    the noise floor, the learning curve, the best epoch, the prediction time of 10k shards and,
    when fitted, the hybrid model's comparison (`hybrid_metrics`) and, when the profile measured
    the shards twice, the measurement floor (`floor.measurement_floor`) and, when it ran, the
    hybrid's active selection (`active.active_metrics`), the neural model's error by dim
    (`error_by_dim`) and, where the wide pool was measured, its entry (`wide_metrics`)."""
    mapes = comparison[comparison["estimator"] == estimator].set_index("test set")["mape"]
    metrics: CostModelScores = {
        "shards": {name: len(s) for name, s in splits.items()},
        "comparison": {f"{r['estimator']} | {r['test set']}": {k: float(r[k]) for k in SCORES}
                       for _, r in comparison.iterrows()},
        "neural_mape": {str(k): float(v) for k, v in mapes.items()},
        "mape_targets": dict(targets),
        "targets_met": {k: bool(mapes.get(k, float("nan")) <= v) for k, v in targets.items()},
        "noise_floor_cv": float(noise_floor),
        "learning_curve": curve.to_dict("records"),
        "best_epoch": int(best_epoch),
        "predict_10k_shards_seconds": float(predict_seconds),
        "replicate_mape": {} if replicate_mape is None else {
            str(k): {"mean": float(r["mean"]), "std": float(r["std"]), "n": int(r["n"])}
            for k, r in replicate_mape.iterrows()},
        "seconds": seconds,
    }
    if hybrid is not None:
        metrics["hybrid"] = hybrid
    if floor is not None:
        metrics["measurement_floor"] = floor
    if active is not None:
        metrics["active"] = active
    if by_dim is not None:
        metrics["error_by_dim"] = by_dim
    if wide is not None:
        metrics["wide"] = wide
    return metrics


def replicate_spread(models: list[CostModel], features: np.ndarray, test_sets: dict[str, pd.DataFrame]
                     ) -> pd.DataFrame:
    """Per test set: each replicate's MAPE, then their mean, standard deviation and count."""
    table = pd.DataFrame({f"replicate {r}": compare({"m": neural(m, features)}, test_sets).set_index("test set")["mape"]
                          for r, m in enumerate(models)})
    return table.assign(mean=table.mean(axis=1), std=table.std(axis=1, ddof=1), n=table.shape[1])

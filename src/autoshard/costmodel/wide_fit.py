"""The cost models on the wide pool (`data.wide`: dims 4 to 1024): the model architecture fitted on
the wide pool's train tables, beside the pool's own model applied there (outside the dims it was
trained on) and the sum of measured single costs, on shards of the wide pool's unseen test tables."""

from autoshard.core.paths import Paths
from autoshard.costmodel import accuracy as cost_eval
from autoshard.costmodel.dataset import measured_shards, single_costs, split_shards, test_sets
from autoshard.costmodel.model import CostModel
from autoshard.costmodel.train import CostStageConfig, fit
from autoshard.data.features import feature_matrix
from autoshard.data.wide import load_wide
from autoshard.measure.collect import load_profile

FITTED = "neural, fitted on the wide pool"
TRANSFERRED = "neural, fitted on the pool"
SINGLES = "sum of single costs"


def wide_entry(cfg: CostStageConfig, paths: Paths, backend: str, pool_model: CostModel, seed: int
               ) -> cost_eval.WideCostModel | None:
    """cost_model.json's `wide` entry (`evaluate.wide_metrics`), or None where the profile measured
    no wide shards (an imported measurements space)."""
    if not paths.wide_profile.exists():
        return None
    pool, train, test = load_wide(paths.wide)
    features = feature_matrix(pool.features)
    shards = measured_shards(load_profile(paths.wide_profile), backend)
    splits = split_shards(shards, train, test, cfg.val_share, cfg.test_share, seed)
    fitted = fit(cfg.model, features, train, splits["train"], splits["val"], seed)
    estimators = {FITTED: cost_eval.neural(fitted.model, features), TRANSFERRED: cost_eval.neural(pool_model, features),
                  SINGLES: cost_eval.sum_of_singles(single_costs(shards))}
    return cost_eval.wide_metrics(estimators, test_sets(splits), splits, pool.features["dim"].to_numpy(),
                                  fitted.best_epoch)

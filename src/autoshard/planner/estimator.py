"""A TorchRec `ShardEstimator` that fills each shard's perf from measurements, not formulas.

Every distinct shard of the proposed sharding options (a whole table, or its column or row
block) is measured alone on this machine, as `autoshard plan` measures tables on a fresh clone
(`cli.singles`: the profile's backend, interleaved rounds, cached per shard under its
measurement key), at the options' per-rank batch, on a synthetic trace of the table's pooling
factor. The measured forward and backward go to `Perf.fwd_compute` and `Perf.bwd_compute`;
communication is left at 0 (what the study's compute-only objective ranks). With
`costs="predicted"` the study's trained cost model predicts each shard instead (its total goes to
`fwd_compute`: the feature-only model predicts one fused cost), measuring nothing. `source` says
how the perfs were made: where they were measured, or which model files predicted them.

    estimator = AutoShardEstimator(topology)
    enumerator = EmbeddingEnumerator(topology, batch_size, estimator=[estimator, EmbeddingStorageEstimator(topology)])
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torchrec.distributed.planner.types import Perf, ShardEstimator

from autoshard.cli import service
from autoshard.cli.defaults import study_defaults
from autoshard.cli.singles import cache_folder, measure_singles, study_backend
from autoshard.core.errors import ConfigError
from autoshard.data.features import feature_matrix
from autoshard.data.pool import Pool
from autoshard.measure.timing import TimingConfig
from autoshard.methods.registry import GREEDY
from autoshard.planner.options import as_tables, items


class AutoShardEstimator(ShardEstimator):
    """Perf of every shard measured alone here (see the module). `backend` and `runs` default to
    the study's (`profile.backend`; `evaluate.timing`), `cache` to `cli.singles.cache_folder`."""

    def __init__(self, topology, constraints=None, *, costs: str = "measured", backend: str | None = None,
                 runs: int | None = None, cache: Path | None = None, models: Path | None = None,
                 progress: bool = False) -> None:
        if costs not in ("measured", "predicted"):
            raise ConfigError(f"costs: {costs!r} (expected 'measured' or 'predicted')")
        study = study_defaults()
        self.costs = costs
        self.models = (service.load_models(GREEDY, None, None, folder=service.models_folder(models))
                       if costs == "predicted" else None)
        self.topology = topology
        self.constraints = constraints
        self.backend = backend or study["profile.backend"]
        self.timing = TimingConfig(warmup=study["evaluate.timing.warmup"], runs=runs or study["evaluate.timing.runs"],
                                   rounds=study["evaluate.timing.rounds"], drift_limit=1.0, retries=0)
        self.cache = cache_folder(cache)
        self.progress = progress
        self.source: dict = {}

    def estimate(self, sharding_options: list, sharder_data_map=None) -> None:
        """Set every shard's perf (in place), measuring the shards not yet in the cache."""
        shards = items(sharding_options)
        for s in (s for s in shards if s.rows == 0):  # a row shard with no rows does no work
            sharding_options[s.option].shards[s.shard].perf = Perf(fwd_compute=0.0, fwd_comms=0.0, bwd_compute=0.0,
                                                                 bwd_comms=0.0)
        shards = [s for s in shards if s.rows > 0]
        if not shards:
            return
        batch = max(int(o.batch_size) for o in sharding_options)
        tables = as_tables(shards, 4, batch)
        if self.models is not None:
            self._predict(sharding_options, shards, tables)
            return
        cfg = study_backend(self.backend, batch, self.timing)
        singles = measure_singles(Pool(features=tables.features, traces=tables.traces), cfg, self.cache,
                                  self.progress)
        index = {name: i for i, name in enumerate(tables.names)}
        for s in shards:
            i = index[s.name]
            if not np.isfinite(singles.costs[i]):
                raise ConfigError(f"sharding option {sharding_options[s.option].name}: its shard of {s.rows} x {s.dim} "
                                  "is too large to measure on this machine")
            forward = float(singles.forward[i])
            sharding_options[s.option].shards[s.shard].perf = Perf(
                fwd_compute=forward, fwd_comms=0.0, bwd_compute=float(singles.costs[i]) - forward, bwd_comms=0.0)
        self.source = singles.source()

    def _predict(self, sharding_options: list, shards: list, tables) -> None:
        """Every shard's total predicted by the cost model, as `fwd_compute`."""
        index = {name: i for i, name in enumerate(tables.names)}
        predicted = self.models.shard_costs(feature_matrix(tables.features), [[i] for i in range(len(tables.names))])
        service.finite_predictions(predicted, self.models)
        for s in shards:
            sharding_options[s.option].shards[s.shard].perf = Perf(
                fwd_compute=float(predicted[index[s.name]]), fwd_comms=0.0, bwd_compute=0.0, bwd_comms=0.0)
        self.source = {"kind": "predicted", "what": "the cost model's predicted cost of each shard alone (ms)",
                       "model_files": self.models.files, "engine": self.models.engine}

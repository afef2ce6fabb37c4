"""The evaluate stage's two long steps, called by its notebook: plan every method (and every
replicate of the trained chain) on the test tasks, then measure all those plans in one pass.

`plan` builds the registry's methods once and the chain's methods once per replicate; methods
that are no arm of a primary endpoint are planned on the exploratory share of the tasks only.
`measure` scores every plan of a task, every replicate's included, in one interleaved batch,
then a fixed subset of tasks again in a second pass: the noise floor and the quality figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pandas as pd

from autoshard.core.compute import ComputeConfig, measuring_engine
from autoshard.core.paths import Paths
from autoshard.data.pool import Pool
from autoshard.data.tasks import Task, tight_tasks
from autoshard.measure.backends import make_backend
from autoshard.methods import artifacts as bundle
from autoshard.methods import registry
from autoshard.placement import surrogate
from autoshard.studies import endpoints, findings
from autoshard.studies import evaluate as evaluation
from autoshard.studies import measured as scoring
from autoshard.studies import stats as results


@dataclass
class Planned:
    """Every plan of the evaluate stage: the tasks, the pre-registered family, the built methods,
    their plans and planning times (replicate 0's and the other replicates' apart), and the MILP
    solves on measured single costs (`milp`, `sync_milp`)."""

    tasks: list[Task]
    decide: endpoints.PrimaryConfig
    built: registry.Built
    chained: tuple[str, ...]
    plans: dict[str, list[np.ndarray | None]]
    seconds: pd.DataFrame
    replica_plans: dict[str, list[np.ndarray | None]]
    replica_seconds: pd.DataFrame
    milp: pd.DataFrame
    sync_milp: pd.DataFrame


def plan(trained: bundle.Artifacts, settings: bundle.Settings, pool: Pool, all_tasks: list[Task],
         test_tables: np.ndarray, p: SimpleNamespace, cfg: evaluation.EvaluateConfig, paths: Paths) -> Planned:
    """Plan every method on the evaluated tasks, and the chain's methods once per replicate
    (replicate 0 is `trained`; replicates 1.. are read from `paths`) on the protocols whose
    endpoints use them."""
    tasks = evaluation.evaluated_tasks(all_tasks, tight_tasks(pool.features, p.tasks, p.seed), pool.features,
                                       test_tables, cfg, p.seed)
    decide = endpoints.PrimaryConfig.from_params(p.primary, registry.METHODS, evaluation.PROTOCOLS,
                                                 cfg.backend.timing.drift_limit)  # the pre-registered family
    arms = {m for e in decide.endpoints for m in (e.method, e.reference)}
    built = registry.build(registry.METHODS, trained, settings)
    explore = evaluation.exploratory_rule(tasks, arms, cfg.exploratory_share)
    plans, seconds = evaluation.plan_all(built.planners, tasks, trained.sizes, objective=cfg.objective, skip=explore)
    chained = registry.ids("replicate")
    replicas = [registry.build(chained, bundle.replicate(trained, paths, r), settings).planners
                for r in range(1, p.replicates)]
    replica_plans, replica_seconds = evaluation.replicate_plans(
        replicas, tasks, evaluation.arms_by_protocol(decide.endpoints, chained), trained.sizes, cfg.objective)
    milp, sync_milp = (surrogate.solve_table(built.solves.get(m, {})) for m in registry.ids("solver"))
    return Planned(tasks, decide, built, chained, plans, seconds, replica_plans, replica_seconds, milp, sync_milp)


def task_frame(tasks: list[Task]) -> pd.DataFrame:
    """The evaluated tasks per protocol: how many, and the range of their shapes."""
    return pd.DataFrame([{"protocol": t.protocol, "tables": len(t.tables), "devices": t.devices,
                          "memory_gib": t.memory_bytes / 2**30, "unseen_ratio": t.unseen_ratio} for t in tasks]
                        ).groupby("protocol").agg(["count", "min", "max"])


@dataclass
class Measured:
    """The one measuring pass and what it gives: per plan (`ratios_all`, replicates' rows too;
    `ratios`, replicate 0's), per device (`devices`), the summary table, the repeat pass's noise
    (`repeat`) and the measurement's quality figures."""

    ratios_all: pd.DataFrame
    ratios: pd.DataFrame
    devices: pd.DataFrame
    table: pd.DataFrame
    repeat: pd.DataFrame
    quality: dict


def measure(planned: Planned, trained: bundle.Artifacts, pool: Pool, p: SimpleNamespace, cfg: evaluation.EvaluateConfig,
            paths: Paths) -> Measured:
    """Measure every plan of `planned` in one pass (each task's plans, every replicate's, in one
    batch), then `cfg.noise_tasks` tasks per protocol again: the noise floor."""
    backend = make_backend(pool, cfg.backend)
    store = scoring.measurement_store(paths.measurements, cfg.backend, pool,
                                      p.profile.get("measurements_space"))  # shared with every stage
    engine = measuring_engine(ComputeConfig.from_params(p.compute))  # None: here (compute.measure_workers: 1)
    on_engine = {"engine": engine, "pool_source": {"folder": str(paths.pool.resolve())},
                 "comm_model": trained.comm_model,
                 "measured_comm": cfg.comm}  # all-to-all measured for the protocols ranked by synchronized_stages
    tasks, plans = planned.tasks, planned.plans
    try:
        measured = scoring.score(backend, pool.features, tasks, plans | planned.replica_plans, cfg.backend, store,
                                 p.seed, tag="evaluate", **on_engine)
        measured["predicted_ms"] = scoring.predict_devices(measured, trained.cost_model, trained.features)
        ratios_all = results.with_ratios(scoring.plan_frame(
            measured, tasks, pd.concat([planned.seconds, planned.replica_seconds]), cfg.objective))
        ratios = ratios_all[~ratios_all["method"].str.contains(endpoints.REPLICA, regex=False)].copy()
        devices = measured[~measured["method"].str.contains(endpoints.REPLICA, regex=False)].copy()
        if trained.hybrid is not None:
            devices["hybrid_predicted_ms"] = scoring.predict_devices(devices, trained.hybrid,
                                                                     trained.hybrid_features)
        table = results.summary(ratios, cfg.bootstrap, p.seed)
        again_tasks, again_plans = evaluation.repeat_subset(tasks, plans, cfg.noise_tasks)
        again = scoring.bottlenecks(scoring.score(backend, pool.features, again_tasks, again_plans, cfg.backend,
                                                  store, p.seed, tag="again", **on_engine), cfg.objective)
    finally:
        if engine is not None:
            engine.close()
    repeat = results.noise(ratios, again)
    repeat_max = results.noise(ratios, again, "max_device_ms")  # the compute bottleneck's: the headroom's floor
    quality = findings.measurement_quality(devices, repeat, cfg.noise_targets, repeat_max)
    return Measured(ratios_all, ratios, devices, table, repeat, quality)

"""The ablation study: which parts of the method matter, by retraining without each.

A variant is the study's RL configuration with one thing changed: the policy's actions
without the cost model's estimates, an MLP instead of the LSTM, the other reward, a separate
trainable table encoder, the table features without the reuse histogram or without the pooling
factor (held constant for every table, the cost model refitted on them, so the whole method
runs blind to them), or measurement refresh rounds (part of the policy updates spent on a cost
model refitted on the policy's measured plans). Every variant trains with the same short budget
and the same seeds, places the same test tasks greedily, and each plan is measured. The full
variant is also run with best-of-N sampling and with local search (inference ablation).

Training runs and cost-model refits are independent single-threaded jobs of an engine
(`core.compute`: local processes or Ray tasks, results in job order whatever the engine); each
run resumes from its checkpoint, which sits in a folder keyed by its inputs (`rl.run_key`).
"""

from dataclasses import dataclass, replace
from pathlib import Path
from typing import NotRequired, TypedDict

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from autoshard.core.compute import Engine
from autoshard.core.digest import array_digest, file_digest, key, source_digest
from autoshard.core.errors import invalid
from autoshard.core.params import Fields, choice, read
from autoshard.core.schema import Number, StageTime
from autoshard.core.seeding import rng
from autoshard.costmodel.dataset import measured_shards, split_shards
from autoshard.costmodel.model import load_model, save_model
from autoshard.costmodel.train import CostStageConfig, fit
from autoshard.data.features import FEATURE_COLUMNS, REUSE_COLUMNS
from autoshard.data.tasks import PROTOCOLS, Task
from autoshard.measure.backends import BackendConfig
from autoshard.measure.collect import load_profile
from autoshard.methods.registry import GREEDY, POLICY, REFINED, SAMPLED
from autoshard.placement.heuristics import HEURISTICS
from autoshard.rl.ppo import RLConfig, RLStageConfig, load_policy, run_key, train
from autoshard.studies import paired
from autoshard.studies.evaluate import measuring_backend


class AblationVariant(TypedDict):
    """One variant's measured ratios across seeds (also one `seed N` key per seed)."""

    variant: str
    label: str
    mean: Number
    std: Number
    min: Number
    max: Number
    vs_full: NotRequired[Number]


class Ablation(StageTime):
    """reports/metrics/ablation.json. Built by `studies.ablation.ablation_metrics`."""

    variants: list[AblationVariant]
    seeds: list[int]
    iterations: int
    protocols: list[str]
    test_tasks: int
    shards_measured: int


FEATURE_GROUPS = {"reuse_histogram": tuple(REUSE_COLUMNS), "pooling_factor": ("pooling_factor",)}
VARIANTS = ("full", "no_cost_features", "no_lstm", "other_reward", "separate_encoder",
            "no_reuse_histogram", "no_pooling_factor", "refresh")
# Other methods on the full variant's models (row name -> registry id): the policy sampled best of N,
# refined by local search, and greedy placement on its cost model without the policy.
INFERENCE = {"best_of_n": SAMPLED, "local_search": REFINED, GREEDY: GREEDY}


@dataclass(frozen=True)
class Variant:
    """One configuration to retrain: its RL settings, the feature columns it cannot see, and
    its refresh rounds (each of `refresh_iterations`, taken out of `rl.iterations`)."""

    name: str
    label: str
    rl: RLConfig
    dropped: tuple[str, ...] = ()
    refresh_rounds: int = 0


@dataclass(frozen=True)
class AblationConfig:
    variants: tuple[str, ...] = choice(VARIANTS)
    seeds: int
    protocols: tuple[str, ...] = choice(PROTOCOLS)
    iterations: int
    tasks_per_batch: int
    test_tasks: int
    refresh_rounds: int
    refresh_iterations: int
    refresh_tasks: int
    rl: RLStageConfig  # the `rl` section: the full variant's settings
    backend: BackendConfig

    @classmethod
    def from_params(cls, ablation: dict, rl: dict, profile: dict, evaluate: dict) -> "AblationConfig":
        """From the `ablation` section (`parse`), the `rl` section (the full variant's settings),
        the profile's backend settings and `evaluate.timing` (how plans are measured)."""
        f = Fields("ablation", ablation)
        keys = ("backend", "device", "optimizer", "batch_size", "threads", "memory_limit_gib")
        timing = Fields("evaluate", evaluate).sub("timing")
        backend = measuring_backend(Fields("profile", {k: profile[k] for k in keys if k in profile}), timing)
        cfg = read(cls, f, rl=RLStageConfig.from_params(rl), backend=backend)
        f.done()
        if "refresh" in cfg.variants and cfg.refresh_rounds * cfg.refresh_iterations >= cfg.iterations:
            raise invalid("ablation.refresh_iterations", cfg.refresh_iterations,
                          f"{cfg.refresh_rounds} rounds of it leave no iterations of the {cfg.iterations} "
                          "before the first refresh")
        return cfg

    def variant(self, name: str) -> Variant:
        """The named variant of the configured RL settings, with the ablation's budget."""
        base = replace(self.rl.train, iterations=self.iterations, tasks_per_batch=self.tasks_per_batch)
        policy = base.policy
        if name == "full":
            return Variant(name, "full method", base)
        if name == "no_cost_features":
            return Variant(name, "actions without cost estimates", replace(base, policy=replace(
                policy, use_cost_features=not policy.use_cost_features)))
        if name == "no_lstm":
            return Variant(name, "MLP state (no LSTM)" if policy.use_lstm else "LSTM state",
                           replace(base, policy=replace(policy, use_lstm=not policy.use_lstm)))
        if name == "other_reward":
            reward = "balance" if base.reward == "bottleneck" else "bottleneck"
            return Variant(name, f"reward: {reward}", replace(base, reward=reward))
        if name == "separate_encoder":
            encoder = "separate" if policy.state_encoder == "cost_model" else "cost_model"
            return Variant(name, f"state encoder: {encoder}",
                           replace(base, policy=replace(policy, state_encoder=encoder)))
        if name.startswith("no_") and name[3:] in FEATURE_GROUPS:
            return Variant(name, f"features without {name[3:].replace('_', ' ')}", base,
                           dropped=FEATURE_GROUPS[name[3:]])
        if name == "refresh":
            return Variant(name, f"{self.refresh_rounds} measurement refresh round(s)",
                           replace(base, iterations=self.iterations - self.refresh_rounds * self.refresh_iterations),
                           refresh_rounds=self.refresh_rounds)
        raise invalid("ablation.variants", name, f"expected one of {', '.join(VARIANTS)}")

    def labels(self) -> dict[str, str]:
        """What each row of the results is, in words."""
        out = {name: self.variant(name).label for name in self.variants}
        return out | {"best_of_n": f"full method, best of {self.rl.best_of}",
                      "local_search": "full method + local search",
                      GREEDY: f"{GREEDY} on the full method's cost model"}

    def seed_list(self, seed: int) -> list[int]:
        """The policy seeds every variant trains with: the study seed and the ones after it."""
        return [seed + k for k in range(self.seeds)]


def masked(features: np.ndarray, dropped: tuple[str, ...]) -> np.ndarray:
    """The feature matrix with the `dropped` columns set to their median for every table: after
    standardisation they are zero, so neither the cost model nor the policy can use them."""
    out = features.copy()
    for column in dropped:
        i = FEATURE_COLUMNS.index(column)
        out[:, i] = np.median(out[:, i])
    return out


def split_tasks(tasks: list[Task], cfg: AblationConfig) -> tuple[list[Task], list[Task]]:
    """Training tasks and the first `test_tasks` test tasks of each ablated protocol (for
    AutoShard's, taken in turn across the unseen-ratio groups so every ratio is represented)."""
    train = [t for t in tasks if t.split == "train" and t.protocol in cfg.protocols]
    test: list[Task] = []
    for protocol in cfg.protocols:
        groups: dict[float, list[Task]] = {}
        for t in tasks:
            if t.split == "test" and t.protocol == protocol:
                groups.setdefault(t.unseen_ratio, []).append(t)
        interleaved = [g[k] for k in range(max(map(len, groups.values()), default=0))
                       for g in groups.values() if k < len(g)]
        if len(interleaved) < cfg.test_tasks:
            raise invalid("ablation.test_tasks", cfg.test_tasks,
                          f"only {len(interleaved)} {protocol} test tasks exist")
        test += interleaved[:cfg.test_tasks]
    return train, test


@dataclass(frozen=True)
class Job:
    """One training run, everything a worker process needs."""

    variant: str
    seed: int
    rl: RLConfig
    model_path: str
    features: np.ndarray
    tasks: tuple[Task, ...]
    checkpoint: str


def fit_masked(cost_model: dict, features: np.ndarray, dropped: tuple[str, ...], data_dir: str,
               backend: str, seed: int, out: str) -> str:
    """Refit the cost model (the `cost_model` section's network and split) on features without
    `dropped`, save it to `out` and return the path (a worker-process function)."""
    from autoshard.data.tasks import load_tasks

    if Path(out).exists():
        return out
    cfg = CostStageConfig.from_params(cost_model)
    _, train_tables, test_tables = load_tasks(Path(data_dir) / "tasks.json")
    shards = measured_shards(load_profile(Path(data_dir) / "profile"), backend)
    splits = split_shards(shards, train_tables, test_tables, cfg.val_share, cfg.test_share, seed)
    model = fit(cfg.model, masked(features, dropped), train_tables, splits["train"], splits["val"], seed,
                progress=False).model
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    save_model(model, out)
    return out


def refit_key(cost_model: dict, features: np.ndarray, dropped: tuple[str, ...], data_dir: str | Path,
              backend: str, seed: int) -> str:
    """What a refitted cost model depends on: the `cost_model` parameters, the feature matrix and
    the dropped columns, the profile data and the task split (file contents), the backend whose
    rows it fits, the seed and the fitting code (the import closure of `fit_masked`'s modules)."""
    data = Path(data_dir)
    return key(cost_model, array_digest(features), list(dropped), file_digest(data / "profile" / "shards.parquet"),
               file_digest(data / "tasks.json"), backend, seed,
               source_digest(*(f.__module__ for f in (fit, measured_shards, save_model, load_profile))))


def refit_job(args: tuple) -> str:
    """`fit_masked` on one tuple of its arguments (an engine job)."""
    return fit_masked(*args)


def run_job(job: Job) -> list[dict]:
    """Train (or resume) one run; returns its history rows (a worker-process function)."""
    model = load_model(job.model_path)
    _, history = train(model, job.features, list(job.tasks), job.rl, job.seed, job.checkpoint, progress=False)
    return history.to_dict("records")


def cost_models(cfg: AblationConfig, engine: Engine, features: np.ndarray, full_model: str | Path,
                cost_model: dict, data_dir: str | Path, seed: int, work: Path) -> dict[tuple[str, ...], str]:
    """A cost model per set of dropped columns: the stage's model for none, refits for the rest
    (jobs of `engine`, saved under `work`, reused only for the same inputs: `refit_key`). Paths
    are absolute: a job's working folder is not this process's on every engine."""
    wanted = sorted({cfg.variant(v).dropped for v in cfg.variants} - {()})
    keys = {d: refit_key(cost_model, features, d, data_dir, cfg.backend.backend, seed) for d in wanted}
    jobs = [(cost_model, features, d, str(Path(data_dir).resolve()), cfg.backend.backend, seed,
             str(work.resolve() / "cost_models" / f"{keys[d]}.pt")) for d in wanted]
    paths = engine.map(refit_job, jobs, progress="refitting cost models")
    return {(): str(Path(full_model).resolve())} | dict(zip(wanted, paths, strict=True))


def train_all(cfg: AblationConfig, engine: Engine, features: np.ndarray, models: dict[tuple[str, ...], str],
              train_tasks: list[Task], seed: int, work: Path
              ) -> tuple[pd.DataFrame, dict[tuple[str, int], tuple[str, str]]]:
    """Train every (variant, seed) as a job of `engine`; returns all history rows, labelled, and
    (policy checkpoint, cost model) per (variant, seed). The refresh variant's first phase
    trains here; its rounds follow in `refresh_all`."""
    runs = run_paths(cfg, features, models, train_tasks, seed, work.resolve())
    jobs = [Job(name, s, cfg.variant(name).rl, str(Path(model_path).resolve()),
                masked(features, cfg.variant(name).dropped), tuple(train_tasks), checkpoint)
            for (name, s), (checkpoint, model_path) in runs.items()]
    histories = engine.map(run_job, jobs, progress="training variants")
    rows = [{"variant": job.variant, "seed": job.seed, **r} for job, history in zip(jobs, histories, strict=True)
            for r in history]
    return pd.DataFrame(rows), runs


def run_paths(cfg: AblationConfig, features: np.ndarray, models: dict[tuple[str, ...], str],
              train_tasks: list[Task], seed: int, work: Path) -> dict[tuple[str, int], tuple[str, str]]:
    """(policy checkpoint, cost model) of every (variant, seed) that `train_all` trained."""
    out = {}
    for name in cfg.variants:
        v = cfg.variant(name)
        model, x = load_model(models[v.dropped]), masked(features, v.dropped)
        for s in cfg.seed_list(seed):
            run = run_key(v.rl, model, train_tasks, x, s)
            out[name, s] = (str(work / "runs" / run / f"seed_{s}.pt"), models[v.dropped])
    return out


def refresh_all(cfg: AblationConfig, runs: dict[tuple[str, int], tuple[str, str]], pool, train_tasks: list[Task],
                params: dict, data_dir: str | Path) -> tuple[dict[tuple[str, int], tuple[str, str]], pd.DataFrame]:
    """`runs` with the refresh variant's entries replaced by their refreshed policy and cost
    model (one seed after the other, in this process: the rounds measure), and the rounds' rows."""
    runs, rows = dict(runs), []
    for (name, s), (policy_path, model_path) in runs.items():
        if cfg.variant(name).refresh_rounds:
            policy_out, model_out, rounds = refresh(cfg, name, s, Path(policy_path), model_path, pool, train_tasks,
                                                    params, data_dir)
            runs[name, s] = (policy_out, model_out)
            rows.append(rounds)
    return runs, pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def refresh(cfg: AblationConfig, name: str, seed: int, policy_path: Path, model_path: str, pool, train_tasks:
            list[Task], params: dict, data_dir: str | Path) -> tuple[str, str, pd.DataFrame]:
    """The refresh variant's rounds for one seed, in this process (they measure): measure the
    policy's plans of the first `refresh_tasks` training tasks per protocol, refit, train on.
    Returns the final policy's and cost model's paths and the rounds' summary."""
    from autoshard.rl.refresh import refresh_rounds

    v = cfg.variant(name)
    model = load_model(model_path)
    policy = load_policy(policy_path, model)
    stage = replace(cfg.rl, train=v.rl, validation_tasks=1, refresh_rounds=v.refresh_rounds,
                    refresh_iterations=cfg.refresh_iterations)
    measure = [t for p in cfg.protocols for t in [t for t in train_tasks if t.protocol == p][:cfg.refresh_tasks]]
    folder = policy_path.parent / f"refresh_seed_{seed}"
    policy, model, rounds = refresh_rounds(policy, model, pool, train_tasks, params, stage, data_dir, folder, None,
                                           seed, measure_tasks=measure)
    model_out = folder / "cost_model.pt"
    save_model(model, model_out)
    return str(folder / f"round_{v.refresh_rounds}.pt"), str(model_out), rounds.assign(seed=seed)


def plans(cfg: AblationConfig, runs: dict[tuple[str, int], tuple[str, str]], features: np.ndarray,
          pool_features: pd.DataFrame, tasks: list[Task], seed: int) -> dict[str, list[np.ndarray]]:
    """Every run's greedy plans of the test tasks (named `variant|seed`), the full variant's
    `INFERENCE` plans (`best_of_n|seed`, `local_search|seed`, and cost_greedy on the full variant's
    cost model, the baseline every variant must beat, `cost_greedy|0`), and the heuristics' plans,
    all built by the registry."""
    from autoshard.methods.artifacts import Artifacts, Settings
    from autoshard.methods.registry import build
    from autoshard.placement.heuristics import heuristic_plans

    out: dict[str, list[np.ndarray]] = dict(heuristic_plans(pool_features, tasks, seed))
    for (name, s), (policy_path, model_path) in tqdm(runs.items(), desc="planning"):
        model = load_model(model_path)
        bundle = Artifacts(pool_features=pool_features, features=masked(features, cfg.variant(name).dropped),
                           cost_model=model, policy=load_policy(policy_path, model))
        rows = {f"{name}|{s}": POLICY}
        if name == "full":
            rows |= {f"{row}|{0 if row == GREEDY else s}": method for row, method in INFERENCE.items()}
        rows = {row: method for row, method in rows.items() if row not in out}
        sample = lambda t, s=s: int(rng(s, "ablation", "best_of", t.name).integers(2**31))  # noqa: E731
        built = build(tuple(rows.values()), bundle, Settings(seed=s, batch_size=0, best_of=cfg.rl.best_of,
                                                             sample_seed=sample))
        with torch.inference_mode():
            out |= {row: [built.planners[method](t) for t in tasks] for row, method in rows.items()}
    return out


def ratios(measured: pd.DataFrame, predicted: pd.Series) -> pd.DataFrame:
    """Per (task, run): the measured bottleneck over the task's best heuristic's, with the
    variant and seed split out of the run name. The best heuristic is chosen on its predicted
    bottleneck (`predicted`, per (task, method): the stage's cost model, fit on the profile) and
    scored on this pass (`paired.chosen`), not picked as the lowest of this pass's measurements."""
    frame = measured.merge(predicted.rename(paired.CHOSEN_BY).reset_index(), on=["task", "method"], how="left")
    best = frame.loc[paired.chosen(frame, HEURISTICS)].set_index("task")["measured_ms"]
    runs = frame[~frame["method"].isin(HEURISTICS)].copy()
    runs["ratio"] = runs["measured_ms"] / runs["task"].map(best)
    runs[["variant", "seed"]] = runs["method"].str.split("|", expand=True)
    runs["seed"] = runs["seed"].astype(int)
    return runs


def summary(per_task: pd.DataFrame, labels: dict[str, str]) -> pd.DataFrame:
    """One row per variant: the median ratio over the test tasks for each seed, then the mean,
    standard deviation, min and max of those medians across seeds, the change against the full
    method's mean (negative: the variant is better), and whether that change is a finding: the
    Wilcoxon signed-rank p-value of the per-task ratios (mean over seeds) against the full
    method's, raw and Holm-corrected over the variants."""
    per_seed = per_task.groupby(["variant", "seed"])["ratio"].median().unstack("seed")
    per_seed.columns = [f"seed {c}" for c in per_seed.columns]
    stats = per_seed.agg(["mean", "std", "min", "max"], axis=1)
    out = pd.concat([stats, per_seed], axis=1)
    if "full" in out.index:
        out["vs_full"] = out["mean"] - out.loc["full", "mean"]
        by_task = per_task.groupby(["variant", "task"])["ratio"].mean().unstack("variant")
        others = [v for v in out.index if v != "full"]
        raw = [paired.wilcoxon_p(np.log(by_task[v] / by_task["full"]).dropna().to_numpy()) for v in others]
        out["p_vs_full"] = pd.Series(raw, index=others, dtype=float)
        out["p_holm"] = pd.Series(paired.holm(raw), index=others, dtype=float)
    order = [v for v in (*VARIANTS, *INFERENCE) if v in out.index]
    out = out.loc[order]
    out.insert(0, "label", [labels.get(v, v) for v in out.index])
    return out


def ablation_metrics(table: pd.DataFrame, cfg: AblationConfig, seed: int, test_tasks: int, shards_measured: int,
                     seconds: float) -> Ablation:
    """The ablation stage's metrics: `summary`'s table as one record per variant, and the
    budget every variant had (seeds, iterations, protocols, test tasks)."""
    return {
        "variants": table.rename_axis("variant").reset_index().to_dict("records"),
        "seeds": cfg.seed_list(seed),
        "iterations": cfg.iterations,
        "protocols": list(cfg.protocols),
        "test_tasks": test_tasks,
        "shards_measured": int(shards_measured),
        "seconds": seconds,
    }

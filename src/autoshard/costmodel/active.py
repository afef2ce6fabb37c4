"""Active selection: more shards for the hybrid, measured where it is least sure.

An ensemble of hybrids, each fitted on a bootstrap resample of the training shards, predicts
every candidate shard (`placement.profile_shards.candidate_shards`: pairs, small shards and the
devices of heuristic plans, all of train-pool tables and not measured yet); the spread of their
log predictions is the model's uncertainty. Each round measures the `shards_per_round` most
uncertain candidates (the **active** arm), refits the ensemble on them and chooses again.

Whether choosing helps is tested, not assumed: a **uniform** arm measures as many candidates
drawn at random from the same list, round for round. The hybrid is then fitted on the base
shards alone, on base + active and on base + uniform, from `seeds` seeds each, and the arms are
compared paired, test shard by test shard (the fit luck averaged over seeds). The hybrid the
later stages use is fitted on every shard measured (`final`): more data, whichever arm won.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy import stats
from tqdm.auto import tqdm

from autoshard.core.seeding import one_thread, rng
from autoshard.costmodel.accuracy import ActiveMetrics
from autoshard.costmodel.dataset import COSTS, SEEN_MULTI, UNSEEN_MULTI, measured_shards
from autoshard.costmodel.hybrid import ActiveConfig, HybridConfig
from autoshard.costmodel.train import Fitted, fit_hybrid
from autoshard.data.pool import Pool
from autoshard.measure.base import CostBackend
from autoshard.measure.collect import Job, ProfileConfig, collect

ARMS = ("base", "active", "uniform")
Measure = Callable[[list[tuple[int, ...]], str], pd.DataFrame]


@dataclass
class ActiveResult:
    final: Fitted              # the hybrid on every shard measured (the stage's hybrid)
    rounds: pd.DataFrame       # per round and arm: shards measured, their mean uncertainty, sources
    errors: pd.DataFrame       # arm, seed, test set, MAPE
    paired: pd.DataFrame       # active vs uniform and active vs base, per test set
    measured: pd.DataFrame     # the new shards (measured_shards rows) with arm and source


def store_measure(pool: Pool, backend: CostBackend, cfg: ProfileConfig, store_root: str | Path,
                  seed: int) -> Measure:
    """Measure shards as the profile does (`collect`: interleaved chunks filed in the
    measurement store under the profile's settings), so a rerun reads them and an interrupted
    run resumes; returns `measured_shards` rows. An imported space (`profile.measurements_space`)
    cannot hold shards chosen here: `collect` refuses to measure into it."""
    def measure(shards: list[tuple[int, ...]], kind: str) -> pd.DataFrame:
        threads = torch.get_num_threads()
        try:
            table = collect(pool, [Job(kind, tuple(s)) for s in shards], backend, cfg, store_root, progress=False,
                            seed=seed, what="the cost model's active selection")
        finally:
            torch.set_num_threads(threads)  # collect measures on `profile.threads`; the fits here pin their own
        return measured_shards(table, backend.name) if len(table) else pd.DataFrame(columns=["tables", *COSTS])
    return measure


def uncertainty(cfg: HybridConfig, features: np.ndarray, train_tables: np.ndarray, train: pd.DataFrame,
                val: pd.DataFrame, shards: list[tuple[int, ...]], members: int, seed: int) -> np.ndarray:
    """Standard deviation over `members` hybrids, each fitted on a bootstrap resample of `train`
    from its own seed, of the log predicted cost of each of `shards`."""
    logs = []
    for m in range(members):
        resample = train.iloc[rng(seed, "active", "bootstrap", m).integers(0, len(train), len(train))]
        model = fit_hybrid(cfg, features, train_tables, resample.reset_index(drop=True), val, seed + 1000 + m,
                           progress=False).model
        with one_thread():
            logs.append(np.log(np.maximum(model.predict_ms(features, shards), 1e-9)))
    return np.std(np.stack(logs), axis=0)


def choose(cfg: ActiveConfig, hybrid: HybridConfig, features: np.ndarray, train_tables: np.ndarray,
           splits: dict[str, pd.DataFrame], candidates: pd.DataFrame, measure: Measure, seed: int,
           progress: bool = True) -> pd.DataFrame:
    """`cfg.rounds` rounds of both arms; the measured new shards with `arm`, `source`, `round`
    and `uncertainty` (of the active arm's ensemble when chosen; NaN for the uniform arm)."""
    keys = list(candidates["tables"].map(tuple))
    source = dict(zip(keys, candidates["source"], strict=True))
    taken: dict[str, set] = {"active": set(), "uniform": set()}
    new: list[pd.DataFrame] = []
    for r in tqdm(range(1, cfg.rounds + 1), desc="active selection", disable=not progress):
        train = _with_arm(splits["train"], new, "active")
        left = [k for k in keys if k not in taken["active"]]
        pool = [k for k in keys if k not in taken["uniform"]]
        if not left or not pool:
            break  # the candidates ran out
        spread = uncertainty(hybrid, features, train_tables, train, splits["val"], left, cfg.ensemble, seed + r)
        picks = {"active": [left[i] for i in np.argsort(-spread, kind="stable")[:cfg.shards_per_round]]}
        spread_of = dict(zip(left, spread, strict=True))
        g = rng(seed, "active", "uniform", r)
        picks["uniform"] = [pool[i] for i in sorted(g.choice(len(pool), min(cfg.shards_per_round, len(pool)),
                                                             replace=False))]
        measured = measure(sorted(set(picks["active"]) | set(picks["uniform"])), f"active_round_{r}")
        by_key = measured.set_index(measured["tables"].map(tuple))
        for arm, chosen in picks.items():
            taken[arm] |= set(chosen)
            ok = [k for k in chosen if k in by_key.index]
            rows = by_key.loc[ok].reset_index(drop=True)
            # A plan's device is a heuristic shard wherever it comes from: it weighs `heuristic_weight`.
            kinds = [f"{arm} {'heuristic' if source[k] == 'planner' else 'shard'}" for k in ok]
            new.append(rows.assign(kind=kinds, arm=arm, round=r, source=[source[k] for k in ok],
                                   uncertainty=[spread_of[k] if arm == "active" else np.nan for k in ok]))
    columns = ["tables", *COSTS, "kind", "arm", "round", "source", "uncertainty"]
    return pd.concat(new, ignore_index=True) if new else pd.DataFrame(columns=columns)


def _with_arm(train: pd.DataFrame, new: list[pd.DataFrame] | pd.DataFrame, *arms: str) -> pd.DataFrame:
    """`train` plus the new shards of `arms`, each shard once."""
    frames = [new] if isinstance(new, pd.DataFrame) else new
    extra = [f[f["arm"].isin(arms)] for f in frames if len(f)]
    if not extra:
        return train
    out = pd.concat([train, *(e[train.columns.intersection(e.columns)] for e in extra)], ignore_index=True)
    return out[~out["tables"].map(tuple).duplicated()].reset_index(drop=True)


def compare_arms(cfg: ActiveConfig, hybrid: HybridConfig, features: np.ndarray, train_tables: np.ndarray,
                 splits: dict[str, pd.DataFrame], new: pd.DataFrame, tests: dict[str, pd.DataFrame],
                 seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each arm's hybrid from `cfg.seeds` seeds scored on `tests`: the MAPEs (arm, seed, test
    set, mape) and the paired comparisons (per test shard, absolute percentage error averaged
    over seeds; active - uniform and active - base: mean difference, its BCa 95% bootstrap
    interval and the Wilcoxon signed-rank p-value)."""
    trains = {"base": splits["train"], "active": _with_arm(splits["train"], new, "active"),
              "uniform": _with_arm(splits["train"], new, "uniform")}
    errors, ape = [], {}
    for arm, train in trains.items():
        per_seed = []
        for s in range(cfg.seeds):
            model = fit_hybrid(hybrid, features, train_tables, train, splits["val"], seed + s, progress=False).model
            for name, shards in tests.items():
                measured = shards["total_ms"].to_numpy()
                err = np.abs(model.predict_ms(features, shards["tables"].tolist()) - measured) / measured
                errors.append({"arm": arm, "seed": seed + s, "test set": name, "shards": len(shards),
                               "train shards": len(train), "mape": float(err.mean())})
                per_seed.append((name, err))
        ape[arm] = {name: np.mean([e for n, e in per_seed if n == name], axis=0) for name in tests}
    rows = []
    for other in ("uniform", "base"):
        for name in tests:
            diff = ape["active"][name] - ape[other][name]
            ci_low, ci_high, p = _paired_test(diff, rng(seed, "active", "bootstrap-ci", other, name))
            rows.append({"comparison": f"active - {other}", "test set": name, "shards": len(diff),
                         "mape_active": float(ape["active"][name].mean()), "mape_other": float(ape[other][name].mean()),
                         "difference": float(diff.mean()), "ci_low": ci_low, "ci_high": ci_high, "p_value": p})
    return pd.DataFrame(errors), pd.DataFrame(rows)


def _paired_test(diff: np.ndarray, g: np.random.Generator) -> tuple[float, float, float]:
    """The BCa 95% bootstrap interval of the mean of `diff` and the Wilcoxon signed-rank p-value;
    NaN where the data cannot give them (fewer than 2 differences, or all equal)."""
    if len(diff) < 2 or np.all(diff == diff[0]):
        return float("nan"), float("nan"), 1.0 if len(diff) and not np.any(diff) else float("nan")
    ci = stats.bootstrap((diff,), np.mean, n_resamples=2000, confidence_level=0.95, method="BCa",
                         random_state=g).confidence_interval
    return float(ci.low), float(ci.high), float(stats.wilcoxon(diff).pvalue)


def run(cfg: ActiveConfig, hybrid: HybridConfig, features: np.ndarray, train_tables: np.ndarray,
        splits: dict[str, pd.DataFrame], tests: dict[str, pd.DataFrame], candidates: pd.DataFrame,
        measure: Measure, seed: int, progress: bool = True) -> ActiveResult:
    """Choose and measure (`choose`), compare the arms (`compare_arms`) and fit the stage's
    hybrid on every shard measured, with `seed`."""
    new = choose(cfg, hybrid, features, train_tables, splits, candidates, measure, seed, progress)
    errors, paired = compare_arms(cfg, hybrid, features, train_tables, splits, new,
                                  {k: tests[k] for k in (SEEN_MULTI, UNSEEN_MULTI)}, seed)
    final = fit_hybrid(hybrid, features, train_tables, _with_arm(splits["train"], new, "active", "uniform"),
                       splits["val"], seed, progress=False)
    rounds = (new.groupby(["round", "arm"])
              .agg(shards=("tables", "size"), mean_uncertainty=("uncertainty", "mean"),
                   **{f"{s}s": ("source", lambda x, s=s: int((x == s).sum())) for s in ("pair", "small", "planner")})
              .reset_index())
    return ActiveResult(final=final, rounds=rounds, errors=errors, paired=paired, measured=new)


def active_metrics(result: ActiveResult, cfg: ActiveConfig, candidates: int) -> ActiveMetrics:
    """The selection as metrics: per arm and test set the MAPE's mean and sd over seeds, the
    paired differences, and what was measured."""
    summary = result.errors.groupby(["arm", "test set"])["mape"].agg(["mean", "std"])
    sets = {"seen": SEEN_MULTI, "unseen": UNSEEN_MULTI}
    return {
        "rounds": cfg.rounds, "shards_per_round": cfg.shards_per_round, "ensemble": cfg.ensemble,
        "seeds": cfg.seeds, "candidates": int(candidates),
        "shards_measured": int(result.measured["tables"].map(tuple).nunique()),
        "mape": {arm: {k: float(summary.loc[(arm, s), "mean"]) for k, s in sets.items()} for arm in ARMS},
        "mape_sd": {arm: {k: float(summary.loc[(arm, s), "std"]) for k, s in sets.items()} for arm in ARMS},
        "paired": {f"{row['comparison']} | {key}": {
            "difference": row["difference"], "ci_low": row["ci_low"], "ci_high": row["ci_high"],
            "p_value": row["p_value"], "shards": int(row["shards"])}
            for row in result.paired.to_dict("records") for key, s in sets.items() if row["test set"] == s},
    }

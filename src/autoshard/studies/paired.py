"""Paired comparison of two methods over the same tasks.

Two methods' bottlenecks on one task share that task's difficulty, so the study compares them
task by task: the log ratio method/reference per task, its median with a bootstrap interval
that resamples tasks (within strata, such as the unseen ratio, when the protocol has them),
a Wilcoxon signed-rank test, how often the two placements are the very same split of the
tables, and the smallest effect the measurement noise lets this many tasks detect.
"""

import math
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from autoshard.core.seeding import rng

KEYS = ("tasks", "median_ratio", "ci_low", "ci_high", "p_value", "identical_share", "mde")
PERMUTATION_MAX_TASKS = 13  # SciPy's `wilcoxon` enumerates every sign pattern up to this many observations


def canonical(placement: np.ndarray) -> tuple[int, ...]:
    """`placement` with devices renumbered in the order they first get a table: two placements
    are the same split of the tables (identical devices, so the same cost) iff these are equal."""
    first: dict[int, int] = {}
    return tuple(first.setdefault(int(d), len(first)) for d in placement)


def same_split(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """True when both placements put the same tables together (or neither method has a plan)."""
    return _split(a) == _split(b)


def minimum_detectable_effect(noise_sd: float, tasks: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true ratio change (as a fraction, 0.03 = 3%) that `tasks` paired tasks detect
    with `power` at two-sided level `alpha`, when one measurement's log has sd `noise_sd` (about
    its CV). A task's log ratio carries two measurements, so its noise sd is sqrt(2) * noise_sd,
    and by the normal approximation the effect is exp((z_{1-alpha/2} + z_power) * sqrt(2) *
    noise_sd / sqrt(tasks)) - 1, with z_{0.975} + z_{0.8} = 2.80. Wilcoxon needs about 5% more
    tasks than this t-test approximation; true per-task heterogeneity widens it further."""
    if tasks < 1:
        raise ValueError(f"tasks: {tasks} (need at least one)")
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    return float(math.expm1(z * math.sqrt(2) * noise_sd / math.sqrt(tasks)))


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family of p-values (statsmodels); None or NaN stays None
    and is not counted in the family."""
    from statsmodels.stats.multitest import multipletests

    known = [i for i, p in enumerate(p_values) if p is not None and not math.isnan(p)]
    out: list[float | None] = [None] * len(p_values)
    if known:
        for i, p in zip(known, multipletests([p_values[i] for i in known], method="holm")[1], strict=True):
            out[i] = float(p)
    return out


def wilcoxon_p(log_ratios: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p-value of the log ratios; 1.0 when every one is zero.
    Where SciPy would run its exact permutation test (13 or fewer tasks with zeros or ties),
    `sign_flip_p` gives the same p-value, vectorised instead of one statistic per sign pattern."""
    if not np.any(log_ratios != 0):
        return 1.0
    if len(log_ratios) <= PERMUTATION_MAX_TASKS and (np.any(log_ratios == 0) or has_ties(np.abs(log_ratios))):
        return sign_flip_p(log_ratios)
    p = stats.wilcoxon(log_ratios, zero_method="wilcox").pvalue
    return 1.0 if math.isnan(p) else float(p)


def has_ties(values: np.ndarray) -> bool:
    """True when two of `values` are exactly equal."""
    return len(np.unique(values)) < len(values)


def sign_flip_p(log_ratios: np.ndarray) -> float:
    """The two-sided p-value of `stats.wilcoxon(log_ratios, zero_method="wilcox")` where SciPy
    runs an exact permutation test: the signed-rank sum (zeros left out, average ranks for ties)
    of every one of the 2**n sign patterns, compared with the observed sum within SciPy's
    relative tolerance. Rank sums are multiples of 0.5, so every sum is exact in float64."""
    d = np.asarray(log_ratios, dtype=float)
    nonzero = d != 0
    ranks = np.zeros(len(d))
    ranks[nonzero] = stats.rankdata(np.abs(d[nonzero]))
    flips = (np.arange(2 ** len(d))[:, None] >> np.arange(len(d))) & 1 == 1
    null = np.where(flips, d < 0, d > 0) @ ranks
    observed = float(ranks[d > 0].sum())
    gamma = abs(np.finfo(float).eps * 100 * observed)
    less = np.count_nonzero(null <= observed + gamma) / len(null)
    greater = np.count_nonzero(null >= observed - gamma) / len(null)
    return float(np.clip(min(less, greater) * 2, 0.0, 1.0))


def bootstrap_median(log_ratios: np.ndarray, strata: np.ndarray | None, resamples: int,
                     generator: np.random.Generator) -> tuple[float, float]:
    """95% percentile interval of the median log ratio, tasks resampled with replacement within
    each stratum (so every resample keeps the strata's task counts)."""
    groups = [np.arange(len(log_ratios))] if strata is None else \
        [np.flatnonzero(strata == s) for s in pd.unique(strata)]
    draws = np.concatenate([g[generator.integers(0, len(g), size=(resamples, len(g)))] for g in groups], axis=1)
    medians = np.median(log_ratios[draws], axis=1)
    return float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


def compare(method: np.ndarray, reference: np.ndarray, *, strata: np.ndarray | None = None,
            identical: np.ndarray | None = None, noise_sd: float | None = None,
            resamples: int = 2000, seed: int = 0, keys: Iterable[str] = ()) -> dict[str, int | float | None]:
    """The paired statistics of `method` against `reference` (bottlenecks per task, aligned).
    Tasks where either has no positive finite value are left out. `identical` flags the tasks
    (aligned too) where the two placements are the same split; `noise_sd` is one measurement's log-noise sd.
    `tasks` is a count; every other value is a float or None, never NaN, so the result is strict JSON."""
    method, reference = np.asarray(method, dtype=float), np.asarray(reference, dtype=float)
    if method.shape != reference.shape:
        raise ValueError(f"method {method.shape} and reference {reference.shape} must align by task")
    ok = np.isfinite(method) & np.isfinite(reference) & (method > 0) & (reference > 0)
    out: dict[str, int | float | None] = dict.fromkeys(KEYS)
    out["tasks"] = int(ok.sum())
    if not ok.any():
        return out
    if identical is not None:
        out["identical_share"] = float(np.mean(np.asarray(identical, dtype=bool)[ok]))
    logs = np.log(method[ok] / reference[ok])
    groups = None if strata is None else np.asarray(strata)[ok]
    lo, hi = bootstrap_median(logs, groups, resamples, rng(seed, "paired", *keys))
    out |= {"median_ratio": float(np.exp(np.median(logs))), "ci_low": float(np.exp(lo)),
            "ci_high": float(np.exp(hi)), "p_value": wilcoxon_p(logs)}
    if noise_sd is not None:
        out["mde"] = minimum_detectable_effect(noise_sd, int(ok.sum()))
    return out


def one_pass(frame: pd.DataFrame, by: str = "task") -> None:
    """Refuse a frame whose rows of one `by` group (a task: what is divided or differenced) come
    from more than one measuring pass (column `pass`): two numbers are compared only when they were
    measured in the same interleaved pass. A frame without the column names no pass to check."""
    if "pass" not in frame or frame.empty:
        return
    passes = frame.groupby(by)["pass"].nunique()
    if (passes > 1).any():
        first = passes[passes > 1].index[0]
        seen = sorted(frame.loc[frame[by] == first, "pass"].unique())
        raise ValueError(f"{by} {first} has plans from different passes ({', '.join(map(str, seen))}); "
                         "a ratio needs both measured in one pass")


CHOSEN_BY = "predicted_ms"  # the best heuristic's chooser: the cost model's prediction, not this pass's measurement


def chosen(results: pd.DataFrame, methods: Iterable[str], value: str = "measured_ms",
           by: str = CHOSEN_BY) -> pd.Series:
    """Per task, the row index of the plan of `methods` lowest in `by` among those with a
    `value`: the reference is chosen on a number independent of the pass that scores it (the
    cost model's prediction, fit on the profile's measurements), so this pass's noise cannot
    pick its luckiest plan (the minimum of several noisy measurements is biased low)."""
    pool = results[results["method"].isin(list(methods))].dropna(subset=[value, by])
    return pool.groupby("task", sort=False)[by].idxmin()


def with_best(results: pd.DataFrame, methods: Iterable[str], name: str,
              value: str = "measured_ms", by: str = CHOSEN_BY) -> pd.DataFrame:
    """`results` plus, per task, a row for the virtual method `name`: the plan of `methods`
    chosen by `by` (`chosen`: for example the best heuristic), scored by its `value`."""
    best = results.loc[chosen(results, methods, value, by)].assign(method=name)
    return pd.concat([results, best], ignore_index=True)


def selection_bias(results: pd.DataFrame, methods: Iterable[str], value: str = "measured_ms",
                   by: str = CHOSEN_BY) -> dict[str, float | int | str]:
    """What choosing on this pass's own measurement would have flattered the reference by: the
    median over tasks of (lowest measured `value` of `methods` / the chosen one's) - 1 (at most 0),
    and on how many tasks the two differ. Both from one pass."""
    one_pass(results)
    pool = results[results["method"].isin(list(methods))].dropna(subset=[value, by])
    picked = pool.loc[chosen(results, methods, value, by)].set_index("task")[value]
    oracle = pool.groupby("task", sort=False)[value].min().reindex(picked.index)
    share = oracle / picked - 1
    return {"chosen_by": by, "oracle_over_chosen_median": float(share.median()) if len(share) else float("nan"),
            "tasks_differing": int((share < 0).sum()), "tasks": int(len(share))}


def all_pairs(results: pd.DataFrame, references: Sequence[str], *, value: str = "measured_ms",
              strata: str | None = None, noise_sd: float | dict[str, float] | None = None,
              resamples: int = 2000, seed: int = 0) -> dict[str, dict[str, dict[str, float | None]]]:
    """Per protocol, `compare` of every method against each of `references` that it is not,
    named `method__vs__reference`. `results` has one row per (task, method) with `protocol`,
    `value` and optionally `strata` and a `placement` column (an array, or None: no plan);
    `noise_sd` may be given per protocol."""
    one_pass(results)
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for protocol, frame in results.groupby("protocol", sort=False):
        table = frame.pivot(index="task", columns="method", values=value)
        splits = {(t, m): _split(plan) for t, m, plan in zip(frame["task"], frame["method"], frame["placement"],
                                                              strict=True)} if "placement" in frame else None
        groups = frame.groupby("task", sort=False)[strata].first().reindex(table.index).to_numpy() \
            if strata else None
        noise = noise_sd.get(protocol) if isinstance(noise_sd, dict) else noise_sd
        pairs = out.setdefault(str(protocol), {})
        for reference in references:
            if reference not in table:
                continue
            for method in frame["method"].unique():
                if method == reference:
                    continue
                identical = None if splits is None else np.array(
                    [splits.get((t, method)) == splits.get((t, reference)) for t in table.index])
                pairs[f"{method}__vs__{reference}"] = compare(
                    table[method].to_numpy(), table[reference].to_numpy(), strata=groups, identical=identical,
                    noise_sd=noise, resamples=resamples, seed=seed, keys=(str(protocol), method, reference))
    return out


def _split(plan: np.ndarray | float | None) -> tuple[int, ...] | None:
    """`canonical` of a placement, None when there is none (None or NaN): computed once per
    (task, method), so that comparing two plans' splits, as `same_split` does, is one tuple equality."""
    return None if plan is None or np.ndim(plan) == 0 else canonical(np.asarray(plan))

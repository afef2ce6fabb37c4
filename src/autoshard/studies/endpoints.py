"""The pre-registered primary endpoints: the few comparisons the study decides on.

`params.yaml` declares them (`primary`) before the run, with the smallest effect of interest
(`sesoi`, a ratio change such as 0.05). Each endpoint compares a method's measured bottleneck with
a reference's, task by task, on one protocol and one cost (compute only unless declared). Per
endpoint: the per-task log ratio; the median ratio with a BCa bootstrap interval that resamples
tasks within strata (`scipy.stats.bootstrap`; percentile where BCa is undefined, and `interval`
says which); three one-sided Wilcoxon signed-rank tests on the log ratios shifted by the margin
log(1 + sesoi) (zeros, a log ratio exactly at a margin, kept: `zsplit`). The tests are about the
pseudo-median of the log ratios, the interval and the reported ratio about their median; with
the symmetric per-task noise of these measurements the two agree, and the report shows both
the verdict and the interval:

- better: H0 median >= -margin (rejecting it: faster by more than the smallest effect),
- worse: H0 median <= +margin,
- equivalent: both H0 median <= -margin and H0 median >= +margin (two one-sided tests, TOST;
  its p-value the larger of the two).

All the family's p-values (three claims per endpoint) are Holm-adjusted together (statsmodels),
so the chance of any wrong claim across the family stays below `alpha`; an endpoint is
**better**, **worse** or **equivalent** when that claim's adjusted p is below `alpha`, else
**inconclusive**. A declared endpoint without a single task where both arms were measured is an
error, not an inconclusive row; tasks where either arm found no plan are counted (`failed`).
Nothing outside the family gets a verdict word.

The headroom gate (issue 30): an endpoint of a learned method (registry kind `rl`) against
cost_greedy is decided only where its protocol's headroom (`studies.headroom`: cost_greedy's
predicted gap to the best placement known under the same cost model, the most any planner could
gain there) exceeds HEADROOM_NOISE_MULTIPLE times the protocol's noise floor (`has_headroom`).
Elsewhere no planner could move the measured ratio by more than the noise: the endpoint's
verdict is **no headroom**, it leaves the Holm family (exploratory) and keeps its interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from autoshard.core.errors import ConfigError, invalid
from autoshard.core.params import Fields
from autoshard.core.seeding import rng
from autoshard.methods.registry import GREEDY, KIND
from autoshard.studies import paired

NO_HEADROOM = "no headroom"  # a gated endpoint's verdict: exploratory, outside the family
VERDICTS = ("better", "worse", "equivalent", "inconclusive", NO_HEADROOM)
CLAIMS = ("better", "worse", "equivalent")
COSTS = ("max_device_ms", "synchronized_ms")  # compute only; the synchronized stages (honest comm only)
HEADROOM_NOISE_MULTIPLE = 2.0  # a learned-vs-greedy endpoint is decided where the headroom exceeds this x noise
MIN_TASKS = 5  # a one-sided signed-rank test on fewer tasks cannot reach p < 0.05 (its smallest p is 2**-n)


@dataclass(frozen=True)
class Endpoint:
    """One declared comparison: `method` against `reference` on `protocol`, by `cost`."""

    method: str
    reference: str
    protocol: str
    cost: str  # one of COSTS

    @property
    def name(self) -> str:
        return f"{self.method}__vs__{self.reference}__{self.protocol}"


@dataclass(frozen=True)
class PrimaryConfig:
    """The `primary` section: the family of endpoints, the smallest effect of interest, the level
    and the bootstrap's resamples."""

    sesoi: float
    alpha: float
    resamples: int
    endpoints: tuple[Endpoint, ...]

    @classmethod
    def from_params(cls, primary: dict, methods: tuple[str, ...], protocols: tuple[str, ...],
                    drift_limit: float) -> PrimaryConfig:
        """From the `primary` section; each endpoint's ids must be registry methods and protocols,
        and the measuring pass's `drift_limit` (`evaluate.timing`) must lie below `sesoi`: a pass
        may not drift by as much as the smallest effect it is to decide."""
        f = Fields("primary", primary)
        cfg = cls(sesoi=f.number("sesoi", lo=0, lo_open=True, hi=1), alpha=f.number("alpha", lo=0, lo_open=True, hi=1),
                  resamples=f.integer("resamples", lo=100), endpoints=())
        if not drift_limit < cfg.sesoi:
            raise invalid("evaluate.timing.drift_limit", drift_limit,
                          f"must lie below primary.sesoi ({cfg.sesoi:g}): a pass drifting by the smallest effect "
                          "of interest cannot decide it")
        raw = f.values.get("endpoints")
        f.used.add("endpoints")
        f.done()
        if not isinstance(raw, list) or not raw:
            raise invalid("primary.endpoints", raw, "expected a non-empty list of endpoints")
        endpoints = []
        for i, item in enumerate(raw):
            e = Fields(f"primary.endpoints[{i}]", item)
            endpoints.append(Endpoint(method=e.text("method", methods), reference=e.text("reference", methods),
                                      protocol=e.text("protocol", protocols),
                                      cost=e.text("cost", COSTS)))
            e.done()
        names = [x.name for x in endpoints]
        if len(set(names)) < len(names):
            raise invalid("primary.endpoints", names, "an endpoint is declared twice")
        return cls(cfg.sesoi, cfg.alpha, cfg.resamples, tuple(endpoints))


def has_headroom(greedy_gap: float | None, noise_floor: float | None) -> bool:
    """Whether a protocol's headroom (cost_greedy's predicted gap to the best placement known, a
    share) exceeds HEADROOM_NOISE_MULTIPLE times its noise floor; False where either is unknown."""
    return greedy_gap is not None and noise_floor is not None and greedy_gap > HEADROOM_NOISE_MULTIPLE * noise_floor


def gated(endpoint: Endpoint) -> bool:
    """Whether `endpoint` is decided only where there is headroom: a learned method against cost_greedy."""
    return KIND.get(endpoint.method) == "rl" and endpoint.reference == GREEDY


def decided(endpoint: Endpoint, headroom: dict[str, dict] | None) -> bool:
    """Whether `endpoint` joins the family: always without `headroom` (`studies.headroom.headroom`)
    or when it is not `gated`; else where its protocol `has_headroom`."""
    if headroom is None or not gated(endpoint):
        return True
    if endpoint.protocol not in headroom:
        raise ConfigError(f"primary.endpoints: {endpoint.name} is decided by its protocol's headroom, and "
                          f"{endpoint.protocol} has none computed")
    entry = headroom[endpoint.protocol]
    return has_headroom(entry["greedy_gap"], entry["noise_floor"])


def log_ratios(ratios: pd.DataFrame, endpoint: Endpoint) -> pd.DataFrame:
    """Per task of the endpoint's protocol where both have a measured plan: the log ratio of the
    method's cost to the reference's, the stratum (unseen ratio) and the one pass both came from.
    Two plans of one task from different passes are refused: their ratio mixes two clocks."""
    rows = ratios[(ratios["protocol"] == endpoint.protocol) & ratios["method"].isin([endpoint.method,
                                                                                      endpoint.reference])]
    paired.one_pass(rows)
    table = rows.pivot_table(index="task", columns="method", values=endpoint.cost, aggfunc="first")
    if endpoint.method not in table or endpoint.reference not in table:
        return pd.DataFrame(columns=["task", "log_ratio", "stratum", "pass"])
    both = table[[endpoint.method, endpoint.reference]].dropna()
    both = both[(both > 0).all(axis=1)]
    first = rows.groupby("task").first()
    return pd.DataFrame({"task": both.index, "log_ratio": np.log(both[endpoint.method] / both[endpoint.reference]),
                         "stratum": first["unseen_ratio"].reindex(both.index).to_numpy(),
                         "pass": (first["pass"] if "pass" in first else pd.Series("", index=first.index)
                                  ).reindex(both.index).to_numpy()}).reset_index(drop=True)


def failed(ratios: pd.DataFrame, endpoint: Endpoint) -> int:
    """Tasks of the endpoint's protocol left out of its comparison: where either arm has no measured
    plan (it failed, or broke the memory cap). On a tight protocol these are the hard tasks, so the
    comparison holds for the others only; the report shows the count beside it."""
    tasks = ratios.loc[ratios["protocol"] == endpoint.protocol, "task"].unique()
    both = ratios[(ratios["protocol"] == endpoint.protocol) & ratios["method"].isin([endpoint.method,
                                                                                     endpoint.reference])]
    measured = both.dropna(subset=[endpoint.cost]).groupby("task")["method"].nunique()
    return int(len(tasks) - (measured == 2).sum())


def bca_interval(logs: np.ndarray, strata: np.ndarray, resamples: int, seed: int,
                 *keys: str) -> tuple[float, float, str]:
    """95% BCa interval of the median log ratio, tasks resampled within strata (a stratum of one
    task joins the largest), and how it was found: "BCa", or "percentile" where BCa is undefined
    (its jackknife degenerates, as it can for a median). Every log ratio equal gives that value twice."""
    if len(logs) == 0:
        return float("nan"), float("nan"), "none"
    if np.ptp(logs) == 0:
        return float(logs[0]), float(logs[0]), "degenerate"
    groups = [logs[strata == s] for s in pd.unique(strata)]
    singles = [g for g in groups if len(g) < 2]
    groups = [g for g in groups if len(g) >= 2]
    if singles and groups:
        largest = int(np.argmax([len(g) for g in groups]))
        groups[largest] = np.concatenate([groups[largest], *singles])
    elif singles:
        groups = [np.concatenate(singles)]

    def median_of_all(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.median(np.concatenate(samples, axis=axis), axis=axis)

    result = stats.bootstrap(tuple(groups), median_of_all, n_resamples=resamples, method="BCa", vectorized=True,
                             random_state=rng(seed, "primary", *keys))
    low, high = result.confidence_interval
    if math.isfinite(low) and math.isfinite(high):
        return float(low), float(high), "BCa"
    low, high = np.percentile(result.bootstrap_distribution, [2.5, 97.5])
    return float(low), float(high), "percentile"


def one_sided_p(logs: np.ndarray, shift: float, alternative: str) -> float:
    """Wilcoxon signed-rank p-value of `logs - shift` against zero, one-sided; zeros kept (zsplit)
    rather than dropped, so they count against the claim."""
    d = logs - shift
    if not np.any(d != 0):
        return 1.0
    p = stats.wilcoxon(d, zero_method="zsplit", alternative=alternative).pvalue
    return 1.0 if math.isnan(p) else float(p)


def claim_p_values(logs: np.ndarray, sesoi: float) -> dict[str, float | None]:
    """Unadjusted p-values of the three claims (None with fewer than MIN_TASKS tasks)."""
    if len(logs) < MIN_TASKS:
        return dict.fromkeys(CLAIMS)
    margin = math.log1p(sesoi)
    return {"better": one_sided_p(logs, -margin, "less"), "worse": one_sided_p(logs, margin, "greater"),
            "equivalent": max(one_sided_p(logs, -margin, "greater"), one_sided_p(logs, margin, "less"))}


def verdict(adjusted: dict[str, float | None], alpha: float) -> str:
    """The claim whose adjusted p is below `alpha` (at most one can be: they exclude each other
    at any level below 0.5), else inconclusive."""
    met = [c for c in CLAIMS if adjusted[c] is not None and adjusted[c] < alpha]
    return met[0] if len(met) == 1 else "inconclusive"


def primary(ratios: pd.DataFrame, cfg: PrimaryConfig, seed: int,
            headroom: dict[str, dict] | None = None) -> dict[str, dict]:
    """`primary.<endpoint>`: verdict, median_ratio, ci_low, ci_high, p_holm (of the verdict's
    claim; the smallest of the three when inconclusive), the claims' adjusted p-values, sesoi,
    tasks, the pass, the per-task ratios (the headline figure's points) and `in_family`. With
    `headroom` (protocol -> `studies.headroom` entry), an endpoint not `decided` there gets
    NO_HEADROOM, its claims' raw p-values and no adjusted ones."""
    frames = {e.name: log_ratios(ratios, e) for e in cfg.endpoints}
    empty = [name for name, f in frames.items() if f.empty]
    if empty:
        raise ConfigError(f"primary.endpoints: {empty[0]} has no task where both arms were measured (a method left "
                          "out, not planned on that protocol, or failing everywhere); declare only what runs")
    raw = {name: claim_p_values(f["log_ratio"].to_numpy(), cfg.sesoi) for name, f in frames.items()}
    members = {e.name for e in cfg.endpoints if decided(e, headroom)}
    family = [(name, claim) for name in frames if name in members for claim in CLAIMS]  # every decided claim
    adjusted: dict[str, dict[str, float | None]] = {name: dict.fromkeys(CLAIMS) for name in frames}
    for (name, claim), p in zip(family, paired.holm([raw[n][c] for n, c in family]), strict=True):
        adjusted[name][claim] = p
    out = {}
    for e in cfg.endpoints:
        f = frames[e.name]
        logs = f["log_ratio"].to_numpy()
        lo, hi, how = bca_interval(logs, f["stratum"].to_numpy(), cfg.resamples, seed, e.name)
        word = verdict(adjusted[e.name], cfg.alpha) if e.name in members else NO_HEADROOM
        known = [p for p in adjusted[e.name].values() if p is not None]
        p_holm = adjusted[e.name][word] if word in CLAIMS else (min(known) if known else None)
        passes = sorted(set(f["pass"]))
        out[e.name] = {
            "method": e.method, "reference": e.reference, "protocol": e.protocol, "cost": e.cost,
            "verdict": word, "median_ratio": float(np.exp(np.median(logs))) if len(logs) else None,
            "ci_low": float(np.exp(lo)) if len(logs) else None, "ci_high": float(np.exp(hi)) if len(logs) else None,
            "interval": how, "p_holm": p_holm, "p_claims": adjusted[e.name], "p_raw": raw[e.name], "sesoi": cfg.sesoi,
            "alpha": cfg.alpha, "tasks": int(len(logs)), "failed": failed(ratios, e),
            "pass": passes[0] if len(passes) == 1 else None,
            "identical_share": float(np.mean(logs == 0)) if len(logs) else None, "in_family": e.name in members,
            "per_task": dict(zip(f["task"], np.exp(logs).tolist(), strict=True))}
    return out


def frame(decided: dict[str, dict]) -> pd.DataFrame:
    """The primary endpoints as a table, one row each (the report's first table)."""
    keys = ("method", "reference", "protocol", "verdict", "median_ratio", "ci_low", "ci_high", "p_holm", "sesoi",
            "tasks", "pass")
    return pd.DataFrame([{k: e[k] for k in keys} for e in decided.values()])

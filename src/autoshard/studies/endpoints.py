"""The pre-registered primary endpoints: the few comparisons the study decides on.

`params.yaml` declares them (`primary`) with the smallest effect of interest (`sesoi`, a ratio
change such as 0.05), the commit that registered them (`registered`) and every later change
(`amendments`: date, commit, what changed, why, whether results had been seen, and the family's
digest after it where the change altered the family). A family whose digest differs from the
last one on record is refused: a change needs an amendment (`Registration.check`).

Each endpoint compares a method's measured bottleneck with a reference's, task by task, on one
protocol and one cost, and holds for the method, not one trained policy: the chain (cost-model
fit, policy training) is replicated from several seeds, and a method that depends on it (registry
tag `replicate`) is planned by each replicate r as `replica(method, r)`. Per task, the endpoint's
value is the mean over replicates of the log ratio, each replicate's ratio formed within the one
pass both arms were measured in (`paired.one_pass`). On those per-task values:

- the median ratio, with a two-level percentile bootstrap interval (replicates resampled, then
  tasks within strata, as `rliable` does for RL benchmarks) and the Monte Carlo error of its ends;
- three one-sided Wilcoxon signed-rank tests shifted by the margin log(1 + sesoi) (zeros kept:
  `zsplit`): better (H0 median >= -margin), worse (H0 median <= +margin) and equivalent (both
  H0 median <= -margin and H0 median >= +margin, TOST; its p the larger of the two).

All the family's p-values (three claims per endpoint) are Holm-adjusted together (statsmodels);
an endpoint is **better**, **worse** or **equivalent** when that claim's adjusted p is below
`alpha`, else **inconclusive**. Every declared endpoint gets one of these four words. Beside it:
each replicate's median ratio and the share of (replicate, task) pairs whose two plans are the
same split (measured once, so their ratio is exactly 1): an endpoint decided mostly by identical
plans says so (`note`). A declared endpoint without a task where both arms were measured is an
error; tasks where either arm found no plan are counted (`failed`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy import stats

from autoshard.core.digest import value_digest
from autoshard.core.errors import ConfigError, invalid
from autoshard.core.params import Fields
from autoshard.core.seeding import rng
from autoshard.studies import paired

VERDICTS = ("better", "worse", "equivalent", "inconclusive")
CLAIMS = ("better", "worse", "equivalent")
COSTS = ("max_device_ms", "synchronized_ms")  # compute only; the synchronized stages (honest comm only)
MIN_TASKS = 5  # a one-sided signed-rank test on fewer tasks cannot reach p < 0.05 (its smallest p is 2**-n)
REPLICA = "@"  # replica(method, r): the method as replicate r of the chain planned it
INTERVAL = "two-level percentile bootstrap (replicates, then tasks within strata)"
MOSTLY_IDENTICAL = 0.5  # an identical-plan share above this: the verdict rests mostly on identity
RECORD_KEYS = ("registered", "amendments")  # the entries of `primary` that are not endpoints


def replica(method: str, r: int) -> str:
    """The name of `method`'s plans by replicate `r` of the chain (0: the stage's own models)."""
    return method if r == 0 else f"{method}{REPLICA}{r}"


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


def family_digest(endpoints: tuple[Endpoint, ...], sesoi: float, alpha: float) -> str:
    """The family's fingerprint (its endpoints in order, the smallest effect and the level): what
    an amendment must record when it changes them."""
    return value_digest([[e.method, e.reference, e.protocol, e.cost] for e in endpoints], sesoi, alpha)[:12]


@dataclass(frozen=True)
class Amendment:
    """One change to the pre-registration after it was made."""

    date: str
    commit: str
    change: str
    why: str
    results_seen: bool
    family: str | None  # the family's digest after the change; None where the family stayed as it was


@dataclass(frozen=True)
class Registration:
    """When the family was registered (`commit`, `date`, its digest then) and every amendment since."""

    commit: str
    date: str
    family: str
    amendments: tuple[Amendment, ...]

    @property
    def expected(self) -> str:
        """The family digest on record: the last amendment's that changed it, else the registered one."""
        changed = [a.family for a in self.amendments if a.family is not None]
        return changed[-1] if changed else self.family

    def check(self, digest: str) -> None:
        """Refuse a family that differs from the one on record: every change is an amendment."""
        if digest != self.expected:
            raise invalid("primary.endpoints", digest,
                          f"the family (endpoints, sesoi, alpha) differs from the one on record ({self.expected}); "
                          "add an entry to primary.amendments saying what changed, why, whether results had been "
                          f"seen, and family: {digest}")

    def record(self) -> dict:
        """The `registered` and `amendments` entries of `primary` in evaluate.json."""
        return {"registered": {"commit": self.commit, "date": self.date, "family": self.family},
                "amendments": [asdict(a) for a in self.amendments]}

    @classmethod
    def from_params(cls, registered: object, amendments: object) -> Registration:
        r = Fields("primary.registered", registered)
        out = cls(commit=r.text("commit"), date=r.text("date"), family=r.text("family"), amendments=())
        r.done()
        if not isinstance(amendments, list):
            raise invalid("primary.amendments", amendments, "expected a list (empty when nothing changed)")
        parsed = []
        for i, item in enumerate(amendments):
            a = Fields(f"primary.amendments[{i}]", item)
            family = a.values.get("family")
            a.used.add("family")
            if family is not None and not isinstance(family, str):
                raise invalid(f"primary.amendments[{i}].family", family, "expected a digest or null")
            parsed.append(Amendment(date=a.text("date"), commit=a.text("commit"), change=a.text("change"),
                                    why=a.text("why"), results_seen=a.boolean("results_seen"), family=family))
            a.done()
        return cls(out.commit, out.date, out.family, tuple(parsed))


@dataclass(frozen=True)
class PrimaryConfig:
    """The `primary` section: the family of endpoints, the smallest effect of interest, the level,
    the bootstrap's resamples and the registration record."""

    sesoi: float
    alpha: float
    resamples: int
    endpoints: tuple[Endpoint, ...]
    registration: Registration | None = None

    @classmethod
    def from_params(cls, primary: dict, methods: tuple[str, ...], protocols: tuple[str, ...],
                    drift_limit: float) -> PrimaryConfig:
        """From the `primary` section; each endpoint's ids must be registry methods and protocols,
        the measuring pass's `drift_limit` (`evaluate.timing`) must lie below `sesoi` (a pass may not
        drift by as much as the smallest effect it is to decide), and the family must be the one
        on record (`Registration.check`)."""
        f = Fields("primary", primary)
        cfg = cls(sesoi=f.number("sesoi", lo=0, lo_open=True, hi=1), alpha=f.number("alpha", lo=0, lo_open=True, hi=1),
                  resamples=f.integer("resamples", lo=100), endpoints=())
        if not drift_limit < cfg.sesoi:
            raise invalid("evaluate.timing.drift_limit", drift_limit,
                          f"must lie below primary.sesoi ({cfg.sesoi:g}): a pass drifting by the smallest effect "
                          "of interest cannot decide it")
        raw = f.values.get("endpoints")
        registration = Registration.from_params(f.values.get("registered"), f.values.get("amendments", []))
        f.used.update(("endpoints", "registered", "amendments"))
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
        registration.check(family_digest(tuple(endpoints), cfg.sesoi, cfg.alpha))
        return cls(cfg.sesoi, cfg.alpha, cfg.resamples, tuple(endpoints), registration)


def arms(endpoint: Endpoint, r: int, chained: frozenset[str]) -> tuple[str, str]:
    """The method and reference names replicate `r` compares: a chained method's replica, any other as is."""
    return tuple(replica(m, r) if m in chained else m for m in (endpoint.method, endpoint.reference))


def log_ratios(ratios: pd.DataFrame, endpoint: Endpoint, replicates: int = 1,
               chained: frozenset[str] = frozenset()) -> pd.DataFrame:
    """Per task of the endpoint's protocol where every replicate has both arms measured: the log
    ratio of the method's cost to the reference's in each replicate (`log_ratio_<r>`), their mean
    (`log_ratio`), the stratum (unseen ratio) and the pass. Two plans of one task from different
    passes are refused: their ratio mixes two clocks."""
    rows = ratios[ratios["protocol"] == endpoint.protocol]
    names = {n for r in range(replicates) for n in arms(endpoint, r, chained)}
    rows = rows[rows["method"].isin(names)]
    paired.one_pass(rows)
    columns = ["task", "log_ratio", "stratum", "pass", *(f"log_ratio_{r}" for r in range(replicates))]
    table = rows.pivot_table(index="task", columns="method", values=endpoint.cost, aggfunc="first")
    if not names <= set(table):
        return pd.DataFrame(columns=columns)
    per = pd.DataFrame({f"log_ratio_{r}": np.log(table[m] / table[ref])
                        for r, (m, ref) in ((r, arms(endpoint, r, chained)) for r in range(replicates))})
    per = per[np.isfinite(per).all(axis=1)]
    first = rows.groupby("task").first()
    return per.assign(log_ratio=per.mean(axis=1),
                      stratum=first["unseen_ratio"].reindex(per.index).to_numpy(),
                      **{"pass": (first["pass"] if "pass" in first else pd.Series("", index=first.index)
                                  ).reindex(per.index).to_numpy()}).rename_axis("task").reset_index()[columns]


def failed(ratios: pd.DataFrame, endpoint: Endpoint, replicates: int = 1,
           chained: frozenset[str] = frozenset()) -> int:
    """Tasks of the endpoint's protocol left out of its comparison: where an arm of any replicate
    has no measured plan (it failed, or broke the memory cap). On a tight protocol these are the
    hard tasks, so the comparison holds for the others only; the report shows the count beside it."""
    tasks = ratios.loc[ratios["protocol"] == endpoint.protocol, "task"].unique()
    return int(len(tasks) - len(log_ratios(ratios, endpoint, replicates, chained)))


def strata_groups(strata: np.ndarray) -> list[np.ndarray]:
    """Task indices per stratum, a stratum of one task joined to the largest (a resample of one
    task alone never varies)."""
    groups = [np.flatnonzero(strata == s) for s in pd.unique(strata)]
    singles = [g for g in groups if len(g) < 2]
    groups = [g for g in groups if len(g) >= 2]
    if singles and groups:
        largest = int(np.argmax([len(g) for g in groups]))
        groups[largest] = np.concatenate([groups[largest], *singles])
    elif singles:
        groups = [np.concatenate(singles)]
    return groups


def two_level_interval(logs: np.ndarray, strata: np.ndarray, resamples: int, seed: int,
                       *keys: str) -> tuple[float, float, float | None, str]:
    """95% interval of the median over tasks of the mean over replicates of the log ratio
    (`logs`: replicates x tasks): each resample draws the replicates with replacement, then the
    tasks with replacement within strata. Returns the ends, their Monte Carlo error (the larger
    end's: half the spread between the bootstrap quantiles one binomial sd either side, so a
    rerun with another seed moves an end by about this much) and the interval's method."""
    logs = np.atleast_2d(np.asarray(logs, dtype=float))
    if logs.shape[1] == 0:
        return float("nan"), float("nan"), None, "none"
    if np.ptp(logs) == 0:
        return float(logs[0, 0]), float(logs[0, 0]), 0.0, "degenerate (every value equal)"
    g = rng(seed, "primary", *keys)
    n_rep = logs.shape[0]
    reps = g.integers(0, n_rep, size=(resamples, n_rep))
    tasks = np.concatenate([grp[g.integers(0, len(grp), size=(resamples, len(grp)))]
                            for grp in strata_groups(np.asarray(strata))], axis=1)
    means = logs[reps[:, :, None], tasks[:, None, :]].mean(axis=1)  # resample x task
    medians = np.sort(np.median(means, axis=1))
    ends = np.percentile(medians, [2.5, 97.5])
    errors = []
    for q in (0.025, 0.975):
        s = math.sqrt(q * (1 - q) / resamples)
        lo, hi = np.quantile(medians, [max(q - s, 0.0), min(q + s, 1.0)])
        errors.append(float(hi - lo) / 2)
    how = INTERVAL if n_rep > 1 else "percentile bootstrap (tasks within strata)"
    return float(ends[0]), float(ends[1]), max(errors), how


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


def note(word: str, identical_share: float | None, replicate_medians: list[float], sesoi: float) -> str:
    """What the verdict line adds to the word: identity where it decides, and replicates that
    disagree about the side of the margin."""
    parts = []
    if identical_share is not None and identical_share > MOSTLY_IDENTICAL:
        parts.append(f"{identical_share:.0%} of the plans are identical to the reference's: "
                     f"{word} mostly by identity, not by measurement")
    if replicate_medians and (min(replicate_medians) < 1 - sesoi < max(replicate_medians)
                              or min(replicate_medians) < 1 + sesoi < max(replicate_medians)):
        parts.append("the replicates' medians straddle a margin")
    return "; ".join(parts)


def primary(ratios: pd.DataFrame, cfg: PrimaryConfig, seed: int, replicates: int = 1,
            chained: frozenset[str] = frozenset()) -> dict:
    """`primary` of evaluate.json: per endpoint, verdict, median_ratio, ci_low, ci_high, interval,
    mc_error, p_holm (of the verdict's claim; the smallest of the three when inconclusive), the
    claims' adjusted and raw p-values, sesoi, alpha, tasks, failed, replicates, replicate_medians,
    identical_share, note, the pass and the per-task ratios (the headline figure's points); then
    the registration record (`registered`, `amendments`) where `cfg` has one. `ratios` holds replicate r's plans of a
    method in `chained` as `replica(method, r)`."""
    frames = {e.name: log_ratios(ratios, e, replicates, chained) for e in cfg.endpoints}
    empty = [name for name, f in frames.items() if f.empty]
    if empty:
        raise ConfigError(f"primary.endpoints: {empty[0]} has no task where both arms were measured (a method left "
                          "out, not planned on that protocol, or failing everywhere); declare only what runs")
    raw = {name: claim_p_values(f["log_ratio"].to_numpy(dtype=float), cfg.sesoi) for name, f in frames.items()}
    family = [(name, claim) for name in frames for claim in CLAIMS]
    adjusted: dict[str, dict[str, float | None]] = {name: dict.fromkeys(CLAIMS) for name in frames}
    for (name, claim), p in zip(family, paired.holm([raw[n][c] for n, c in family]), strict=True):
        adjusted[name][claim] = p
    out: dict = {}
    for e in cfg.endpoints:
        f = frames[e.name]
        logs = f["log_ratio"].to_numpy(dtype=float)
        per = f[[f"log_ratio_{r}" for r in range(replicates)]].to_numpy(dtype=float).T  # replicate x task
        lo, hi, mc, how = two_level_interval(per, f["stratum"].to_numpy(), cfg.resamples, seed, e.name)
        word = verdict(adjusted[e.name], cfg.alpha)
        known = [p for p in adjusted[e.name].values() if p is not None]
        passes = sorted(set(f["pass"]))
        medians = [float(np.exp(np.median(row))) for row in per]
        identical = float(np.mean(per == 0))
        out[e.name] = {
            "method": e.method, "reference": e.reference, "protocol": e.protocol, "cost": e.cost,
            "verdict": word, "median_ratio": float(np.exp(np.median(logs))),
            "ci_low": float(np.exp(lo)), "ci_high": float(np.exp(hi)), "interval": how,
            "mc_error": None if mc is None else float(mc), "resamples": cfg.resamples,
            "p_holm": adjusted[e.name][word] if word in CLAIMS else (min(known) if known else None),
            "p_claims": adjusted[e.name], "p_raw": raw[e.name], "sesoi": cfg.sesoi, "alpha": cfg.alpha,
            "tasks": int(len(logs)), "failed": failed(ratios, e, replicates, chained),
            "replicates": replicates, "replicate_medians": medians,
            "identical_share": identical, "note": note(word, identical, medians, cfg.sesoi),
            "pass": passes[0] if len(passes) == 1 else None,
            "per_task": dict(zip(f["task"], np.exp(logs).tolist(), strict=True))}
    return out | (cfg.registration.record() if cfg.registration is not None else {})


def entries(decided: dict) -> dict[str, dict]:
    """The endpoints of a `primary` result, without its registration record."""
    return {k: v for k, v in decided.items() if k not in RECORD_KEYS}


def frame(decided: dict) -> pd.DataFrame:
    """The primary endpoints as a table, one row each (the report's first table)."""
    keys = ("method", "reference", "protocol", "verdict", "median_ratio", "ci_low", "ci_high", "p_holm", "sesoi",
            "tasks", "replicates", "identical_share", "pass")
    rows = [{k: e[k] for k in keys} | {"replicate_range": f"{min(e['replicate_medians']):.3f}-"
                                                           f"{max(e['replicate_medians']):.3f}"}
            for e in entries(decided).values()]
    return pd.DataFrame(rows)


def amendments_frame(decided: dict) -> pd.DataFrame:
    """The amendments on record, one row each (printed under the primary table)."""
    return pd.DataFrame(decided.get("amendments", []), columns=["date", "commit", "change", "why", "results_seen",
                                                                "family"])

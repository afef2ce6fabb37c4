"""What the profile data says: fusion non-linearity, repeatability, summary metrics."""

import math
import resource
from typing import Any, NotRequired

import numpy as np
import pandas as pd

from autoshard.core.schema import Number, StageTime
from autoshard.measure.commmodel import CommMetrics
from autoshard.measure.protocols import FeedScores, ProtocolScores


class Profile(StageTime):
    """reports/metrics/profile.json. Built by `measure.analysis.profile_metrics`."""

    shards_measured: int
    shards_unmeasurable: int
    shards_by_kind: dict[str, int]
    backend: str
    device: str
    threads: int
    batch_size: int
    median_cv: Number
    cv_target: float
    cv_target_met: bool
    rounds_for_cv_target: int
    noise: dict[str, Number]   # median_cv, round_drift(_max), remeasured_share of the interleaved rounds
    fused_over_sum_median: Number
    fused_over_sum_p10_p90: list[Number]
    torch_over_fbgemm_median_ratio: Number
    torch_fbgemm_kendall_tau: Number
    torch_fused_over_fbgemm_median_ratio: Number  # the fused pure-torch backend on the same shards
    torch_fused_fbgemm_kendall_tau: Number
    harness_check: dict[str, dict[str, Any]]
    comm_measured_processes: int
    comm: NotRequired[CommMetrics]
    protocol_check: NotRequired[dict[str, ProtocolScores]]  # sequential and interleaved, measured side by side
    feeds_check: NotRequired[dict[str, FeedScores]]  # fixed or rotated bags, warm or evicted cache (protocols.FEEDS)
    torch_threads: int
    peak_rss_gib: float
    machine: NotRequired[dict[str, Any]]  # measure.harness.MachineFacts: CPU, flags, FBGEMM's ISA path
    calibration: NotRequired[dict[str, dict[str, Any]]]  # measure.harness.calibration: default and kept heap
    effort: NotRequired[dict[str, Any]]  # pipeline.effort.Effort.summary: the rounds this machine measures with


def measured(table: pd.DataFrame) -> pd.DataFrame:
    """First-round rows that were measured (not repeats, not unmeasurable)."""
    return table[(table["round"] == 0) & (table["status"] == "ok")]


def fusion_gap(table: pd.DataFrame) -> pd.DataFrame:
    """Fused cost of each multi-table shard against the sum of its tables' single costs."""
    ok = measured(table)
    single = ok[ok["kind"] == "single"].set_index(ok.loc[ok["kind"] == "single", "tables"].map(
        lambda t: int(t[0])))["total_ms"]
    multi = ok[ok["num_tables"] > 1].copy()
    multi["sum_of_singles_ms"] = multi["tables"].map(lambda ts: float(single.reindex(list(ts)).sum()))
    multi["fused_over_sum"] = multi["total_ms"] / multi["sum_of_singles_ms"]
    return multi[["shard_id", "kind", "num_tables", "total_ms", "sum_of_singles_ms", "fused_over_sum"]]


def repeatability(table: pd.DataFrame) -> pd.DataFrame:
    """Per repeated shard: its total cost in each round, mean, and coefficient of variation."""
    repeated = set(map(tuple, table.loc[table["kind"] == "repeat", "tables"]))
    rows = table[table["tables"].map(tuple).isin(repeated) & (table["status"] == "ok")]
    grouped = rows.groupby(rows["tables"].map(tuple))["total_ms"]
    out = pd.DataFrame({"rounds": grouped.size(), "mean_ms": grouped.mean(),
                        "cv": grouped.std(ddof=1) / grouped.mean()}).reset_index(drop=True)
    return out[out["rounds"] > 1]


def rounds_needed(median_cv: float, target: float) -> int:
    """Rounds whose mean reaches the CV target, if rounds are independent (CV / sqrt(k))."""
    if not math.isfinite(median_cv) or median_cv <= target:
        return 1
    return math.ceil((median_cv / target) ** 2)


def backend_agreement(versus: pd.DataFrame) -> tuple[float, float]:
    """Median cost ratio of the second backend to the first, and Kendall's tau of their totals
    (`versus` as `crosscheck.compare_backends` returns it): do they rank shards alike?"""
    totals = versus.filter(like="_total_ms")
    tau = float(totals.corr("kendall").iloc[0, 1]) if len(versus) > 1 else float("nan")
    return float(versus["ratio"].median()), tau


def peak_rss_gib() -> float:
    """Peak resident memory of this process so far (GiB; Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def round_noise(table: pd.DataFrame) -> dict[str, float]:
    """How noisy the interleaved rounds were: the median CV of a shard's cost across its
    chunk's rounds, the median and largest drift between rounds of the chunks, and the share of
    shards whose chunk drifted past the limit and was measured again (NaN without those
    columns: a profile from before the rounds)."""
    ok = table[table["status"] == "ok"]
    if not {"cv", "drift", "attempts"} <= set(ok.columns) or ok.empty:
        nan = float("nan")
        return {"median_cv": nan, "round_drift": nan, "round_drift_max": nan, "remeasured_share": nan}
    return {"median_cv": float(ok["cv"].median()), "round_drift": float(ok["drift"].median()),
            "round_drift_max": float(ok["drift"].max()),
            "remeasured_share": float((ok["attempts"] > 1).mean())}


def profile_metrics(table: pd.DataFrame, versus: pd.DataFrame, fused_versus: pd.DataFrame, harness: pd.DataFrame,
                    cv_target: float, comm_processes: int, torch_threads: int, seconds: float, peak_gib: float,
                    comm: dict | None = None, protocol_check: dict | None = None,
                    feeds_check: dict | None = None, machine: dict | None = None,
                    calibration: dict | None = None, effort: dict | None = None) -> Profile:
    """The profile stage's metrics: what was measured and how, repeatability against the CV
    target (across separate passes: `median_cv`; across a chunk's interleaved rounds: `noise`),
    the fusion gap, and the cross-checks (`versus`: the torch backend against the profile's;
    `fused_versus`: the fused pure-torch backend against the profile's;
    `harness`: FBGEMM's benchmark harness against our timing loop; `comm`: the comm model's
    fit, from `measure.commmodel.profile_comm`, with its MAPE target; `protocol_check`: the timing
    protocols compared, from `measure.protocols.protocol_scores`; `feeds_check`: the same for the
    inputs and cache of each run, `measure.protocols.compare_feeds`; `machine` and `calibration`:
    this machine's facts and FBGEMM's harness figures, `measure.harness`; `effort`: the rounds
    decided from them, `pipeline.effort`)."""
    rep = repeatability(table)
    median_cv = float(rep["cv"].median()) if len(rep) else float("nan")
    gap = fusion_gap(table)
    ratio, tau = backend_agreement(versus)
    fused_ratio, fused_tau = backend_agreement(fused_versus)
    return {
        "shards_measured": int((table["status"] == "ok").sum()),
        "shards_unmeasurable": int((table["status"] != "ok").sum()),
        "shards_by_kind": {str(k): int(v) for k, v in table["kind"].value_counts().sort_index().items()},
        "backend": str(table["backend"].iloc[0]),
        "device": str(table["device"].iloc[0]),
        "threads": int(table["threads"].iloc[0]),
        "batch_size": int(table["batch_size"].iloc[0]),
        "median_cv": median_cv,
        "cv_target": cv_target,
        "cv_target_met": bool(median_cv <= cv_target),
        "rounds_for_cv_target": rounds_needed(median_cv, cv_target),
        "noise": round_noise(table),
        "fused_over_sum_median": float(gap["fused_over_sum"].median()) if len(gap) else float("nan"),
        "fused_over_sum_p10_p90": [float(x) for x in np.nanpercentile(gap["fused_over_sum"], [10, 90])]
        if len(gap) else [],
        "torch_over_fbgemm_median_ratio": ratio,
        "torch_fbgemm_kendall_tau": tau,
        "torch_fused_over_fbgemm_median_ratio": fused_ratio,
        "torch_fused_fbgemm_kendall_tau": fused_tau,
        "harness_check": harness.set_index("component").to_dict("index"),
        "comm_measured_processes": comm_processes,
        **({"comm": comm} if comm is not None else {}),
        **({"protocol_check": protocol_check} if protocol_check is not None else {}),
        **({"feeds_check": feeds_check} if feeds_check is not None else {}),
        **({"machine": machine} if machine is not None else {}),
        **({"calibration": calibration} if calibration is not None else {}),
        **({"effort": effort} if effort is not None else {}),
        "torch_threads": torch_threads,
        "seconds": seconds,
        "peak_rss_gib": peak_gib,
    }

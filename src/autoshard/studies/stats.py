"""The evaluate stage's statistics: ratios to the best heuristic per task, bootstrap intervals,
win rates, gaps to the optimum and the targets, from the per-plan frame of `scoring`."""

from __future__ import annotations

import numpy as np
import pandas as pd

from autoshard.core.seeding import rng
from autoshard.methods.registry import KIND, MAX_DEVICE, METHODS, OPTIMUM, POLICY, REFINED, ids
from autoshard.studies import memory, paired
from autoshard.studies.evaluate import Evaluation, Targets


def bootstrap_median(values: np.ndarray, resamples: int, seed: int, *keys: str) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the median of `values` (tasks resampled, NaNs left out):
    `paired.bootstrap_median` without strata, on a stream named by `keys`."""
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    if len(values) == 0:
        return float("nan"), float("nan")
    return paired.bootstrap_median(values, None, resamples, rng(seed, "bootstrap", *keys))


def with_ratios(plans: pd.DataFrame) -> pd.DataFrame:
    """`plans` plus, per task, each plan's ratio to the best heuristic's plan (the heuristic
    chosen by `paired.chosen`: lowest predicted, scored by this pass) for the measured,
    with-communication and predicted bottlenecks, and to the exact optimum where one was found."""
    paired.one_pass(plans)
    out = plans.copy()
    best = out.loc[paired.chosen(out, ids(kind="heuristic"))].set_index("task")
    for column, name in [("measured_ms", "ratio"), ("with_comm_ms", "ratio_with_comm"),
                         ("predicted_ms", "predicted_ratio")]:
        out[name] = out[column] / out["task"].map(best[column])
    optimum = out[out["method"] == OPTIMUM].set_index("task")
    out["measured_vs_optimum"] = out["measured_ms"] / out["task"].map(optimum["measured_ms"])
    out["predicted_gap"] = out["predicted_ms"] / out["task"].map(optimum["predicted_ms"]) - 1
    return out


def summary(ratios: pd.DataFrame, resamples: int, seed: int) -> pd.DataFrame:
    """One row per (protocol, method): plans found, mean and median measured bottleneck,
    median ratio to the best heuristic with its 95% bootstrap interval, win rate against it,
    the same ratio with communication and as predicted, gap to the optimum, memory, time."""
    rows = []
    for (protocol, method), g in ratios.groupby(["protocol", "method"], sort=False):
        lo, hi = bootstrap_median(g["ratio"].to_numpy(), resamples, seed, protocol, method)
        rows.append({
            "protocol": protocol, "method": method, "kind": KIND[method], "plans": len(g),
            "mean_ms": g["measured_ms"].mean(), "median_ms": g["measured_ms"].median(),
            "ratio_median": g["ratio"].median(), "ratio_lo": lo, "ratio_hi": hi,
            "win_rate": float((g["ratio"] < 1).mean()),
            "ratio_with_comm_median": g["ratio_with_comm"].median(),
            "predicted_ratio_median": g["predicted_ratio"].median(),
            "predicted_gap_median": g["predicted_gap"].median(), "predicted_gap_max": g["predicted_gap"].max(),
            "measured_vs_optimum_median": g["measured_vs_optimum"].median(),
            "memory_share_max": g["memory_share"].max(), "seconds_median": g["seconds"].median()})
    out = pd.DataFrame(rows)
    order = {m: i for i, m in enumerate(METHODS)}
    return out.sort_values(["protocol", "method"], key=lambda s: s.map(order) if s.name == "method" else s,
                           ignore_index=True)


def targets(table: pd.DataFrame, goal: Targets) -> pd.DataFrame:
    """The issue's targets against the results: met or not, per protocol."""
    rows = []
    for protocol, g in table.groupby("protocol", sort=False):
        by = g.set_index("method")
        checks = [(POLICY, "ratio_median", goal.rl, "measured median ratio to the best heuristic"),
                  (REFINED, "ratio_median", goal.refined, "measured median ratio to the best heuristic")]
        if protocol == "small":  # tiny tasks: the goal is the optimum, not the heuristics
            checks = [(m, "predicted_gap_median", goal.optimum_gap, "predicted median gap to the optimum")
                       for m in ids(kind="rl", objective=MAX_DEVICE)]
        for method, column, target, what in checks:
            if method in by.index:
                value = float(by.loc[method, column])
                rows.append({"protocol": protocol, "method": method, "statistic": what, "value": value,
                             "target": f"<= {target:g}", "met": bool(value <= target)})
    return pd.DataFrame(rows)


def noise(first: pd.DataFrame, again: pd.DataFrame, value: str = "measured_ms") -> pd.DataFrame:
    """Plans measured twice (`again` holds task, method and `value` of the second time): both
    costs (`value`, the headline by default; as `measured_ms`), the relative change, and the change
    of the RL plan's ratio to the heuristic's."""
    calibrated = ["calibrated"] if "calibrated" in first and "calibrated" in again else []
    first = first[["task", "protocol", "method", value, *calibrated]].rename(columns={value: "measured_ms"})
    again = again[["task", "method", value, *calibrated]].rename(columns={value: "measured_ms"})
    both = first.merge(again, on=["task", "method"], suffixes=("", "_again"))
    both["relative_change"] = both["measured_ms_again"] / both["measured_ms"] - 1
    if {"calibrated", "calibrated_again"} <= set(both):  # the same change with the machine's speed divided out
        both["calibrated_change"] = both["calibrated_again"] / both["calibrated"] - 1
    rl = both[both["method"] == POLICY].set_index("task")
    other = both[both["method"] != POLICY].set_index("task")
    ratio = (rl["measured_ms"] / other["measured_ms"]).rename("ratio")
    ratio_again = (rl["measured_ms_again"] / other["measured_ms_again"]).rename("ratio_again")
    both = both.merge(pd.concat([ratio, ratio_again], axis=1), left_on="task", right_index=True, how="left")
    return both[["task", "protocol", "method", "measured_ms", "measured_ms_again", "relative_change", "ratio",
                 "ratio_again", *(["calibrated_change"] if "calibrated_change" in both else [])]]


def device_errors(devices: pd.DataFrame, predicted: str = "predicted_ms") -> pd.Series:
    """Absolute relative error of a cost model's prediction (column `predicted`) on the measured,
    non-empty device shards."""
    busy = devices[devices["tables"] > 0]
    return (busy[predicted] / busy["compute_ms"] - 1).abs()


def evaluate_metrics(table: pd.DataFrame, target_table: pd.DataFrame, device_errors: pd.Series,
                     repeat_noise: pd.DataFrame, speed_table: pd.DataFrame, numpy_same: dict[str, float],
                     tasks: list, devices: pd.DataFrame, quality: dict, pairs: dict, answer: list[str],
                     milp_table: pd.DataFrame, seconds: float, replicates: dict | None = None, *,
                     plans: dict[str, list], sizes: np.ndarray, plan_status: pd.DataFrame, objective: dict[str, str],
                     paired_synchronized: dict, paired_max_device: dict,
                     hybrid_device_errors: pd.Series | None = None, device_error_target: float | None = None,
                     primary: dict | None = None, reference: dict | None = None,
                     headroom: dict | None = None, families: dict) -> Evaluation:
    """reports/metrics/evaluate.json: the `primary` endpoints first (`endpoints.primary`: the
    verdicts the study decides on, with the registration record), `headroom` per protocol
    (`studies.headroom.headroom`: bounds on what a planner could gain over cost_greedy, context beside
    the verdicts), `families`
    (`studies.regimes.families`: the candidate regimes' predicted headroom), `noise`
    (the measurement quality), then the `paired`
    comparisons per protocol (`<method>__vs__<reference>`), the plain `answer`,
    `replicates.<protocol>.rl_greedy__vs__cost_greedy` (mean_ratio, std, n: each
    replicate within its pass), the per-method `results`, the targets,
    the cost model's device error (median per protocol; the hybrid's too, where there is one; and
    their target), the MILP's gaps and the sharding speed; then `failed` (`memory.failed_counts`
    of `plans` with `plan_status`, `evaluate.plan_all`'s frame), the headline `objective` per protocol
    (`studies.evaluate.HeadlineObjective`), `paired_synchronized` and `paired_max_device` (the same
    comparisons on synchronized_ms and on max_device_ms, for every protocol), `comm_source` per
    protocol (where the all-to-all came from: readers rely on these keys) and `reference` (how the
    best heuristic was chosen and the selection bias that removed: `findings.reference_bias`)."""
    return {
        "primary": primary or {}, "headroom": headroom or {}, "families": families, "noise": quality,
        "reference": reference or {},
        "paired": pairs, "answer": answer,
        "replicates": replicates or {},
        "results": {proto: g.drop(columns="protocol").set_index("method").to_dict("index")
                    for proto, g in table.groupby("protocol")},
        "targets": target_table.to_dict("records"),
        "cost_model_device_error_median": device_errors.to_dict(),  # per protocol, the feature-only model's
        "hybrid_device_error_median": {} if hybrid_device_errors is None else hybrid_device_errors.to_dict(),
        "device_error_target": device_error_target,
        "measurement_repeat": repeat_noise.to_dict("index"),
        "milp": {"gap_median": float(milp_table["gap"].median()) if len(milp_table) else None,
                 "gap_max": float(milp_table["gap"].max()) if len(milp_table) else None,
                 "status": milp_table["status"].value_counts().to_dict() if len(milp_table) else {},
                 "seconds_median": float(milp_table["seconds"].median()) if len(milp_table) else None},
        "sharding_seconds": speed_table.pivot(index="method", columns="tables", values="seconds").to_dict("index"),
        "numpy_planner_same_plan_share": numpy_same,
        "tasks": pd.Series([t.protocol for t in tasks]).value_counts().to_dict(),
        "shards_measured": int(devices["shard"].nunique()),
        "seconds": seconds,
        "failed": memory.failed_counts(tasks, plans, sizes, plan_status),  # per protocol and method
        "objective": objective,
        "paired_synchronized": paired_synchronized,  # <protocol>.<method>__vs__<reference> on synchronized_ms
        "paired_max_device": paired_max_device,  # the same on max_device_ms (the compute bottleneck)
        "comm_source": devices.groupby("protocol")["comm_source"].first().to_dict(),
    }

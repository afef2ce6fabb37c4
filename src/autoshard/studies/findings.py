"""What the evaluate stage concludes, and how sure it can be: the measurement quality against its
targets, paired comparisons of every method with the references, the spread across replicates of
the chain, and the exploratory summary drawn from them (intervals, unadjusted, no verdict words:
those belong to the pre-registered primary endpoints of `studies.endpoints`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from autoshard.core.metrics import finite
from autoshard.methods.registry import BEST_HEURISTIC, GREEDY, POLICY, SYNCHRONIZED, ids
from autoshard.studies import paired
from autoshard.studies.endpoints import replica
from autoshard.studies.evaluate import NoiseTargets
from autoshard.studies.measured import MEASURED_SOURCES

REFERENCES = (BEST_HEURISTIC, *ids("reference"))
# the baselines that optimise the synchronized-stages cost: references of `paired_synchronized` too
SYNC_REFERENCES = ids(kind="baseline", objective=SYNCHRONIZED)
SYNC_POLICY_METHODS = ids(kind="rl", objective=SYNCHRONIZED)  # the policy trained on the synchronized stages
REPLICATED = f"{POLICY}__vs__{GREEDY}"  # the per-task ratio the replicates of the chain are compared by


def measurement_quality(devices: pd.DataFrame, repeat: pd.DataFrame, targets: NoiseTargets,
                        repeat_max_device: pd.DataFrame | None = None) -> dict:
    """How far the measurements under the results can be trusted, against the targets:
    `median_cv` (CV across interleaved rounds, median over distinct shards), `round_drift`
    (median over tasks of the largest shift of a round against the first, over the task's shards:
    `interleaved.round_drift`), `remeasured_share` (tasks
    measured again because of drift), `plan_repeat_change` (median |change| of a plan's
    bottleneck measured in a later, separate pass), `plan_repeat_change_calibrated` (the same
    with each pass's calibration-shard time divided out: what is left once the machine's overall
    change of speed between the passes is taken away), `noise_sd` per protocol (the standard
    deviation of one bottleneck's log measurement, for the detectable effect), with
    `repeat_max_device` (`stats.noise` on max_device_ms) `noise_sd_max_device` (the same for the
    compute bottleneck: the headroom's noise floor), `met`, and where
    plans' all-to-alls were measured, `comm_round_cv` (median over their devices of the CV of a
    device's all-to-all time across rounds) and `comm_plans` (how many plans)."""
    shards = devices[devices["tables"] > 0].drop_duplicates(["task", "shard"])
    tasks = devices.drop_duplicates("task")
    change = repeat["relative_change"].abs()
    noise_sd = log_noise_sd(repeat)
    measured = devices[devices["comm_source"].isin(MEASURED_SOURCES)] if "comm_cv" in devices else devices.iloc[:0]
    out = {"median_cv": finite(shards["cv"].median()), "round_drift": finite(tasks["drift"].median()),
           "remeasured_share": float(tasks["remeasured"].mean()), "plan_repeat_change": finite(change.median()),
           "plan_repeat_change_calibrated": finite(repeat["calibrated_change"].abs().median())
           if "calibrated_change" in repeat else None,
           **({"comm_round_cv": finite(measured["comm_cv"].median()),
               "comm_plans": int(measured.groupby(["task", "method"]).ngroups)} if len(measured) else {}),
           "noise_sd": noise_sd,
           **({} if repeat_max_device is None else {"noise_sd_max_device": log_noise_sd(repeat_max_device)}),
           "targets": {"median_cv": targets.median_cv, "plan_repeat_change": targets.plan_repeat_change}}
    out["met"] = bool(out["median_cv"] is not None and out["median_cv"] <= targets.median_cv
                      and out["plan_repeat_change"] is not None
                      and out["plan_repeat_change"] <= targets.plan_repeat_change)
    return out


def log_noise_sd(repeat: pd.DataFrame) -> dict[str, float | None]:
    """Per protocol, the standard deviation of one measurement's log cost, from plans measured
    twice (`stats.noise`): what the minimum detectable effect is computed from."""
    log_change = np.log1p(repeat["relative_change"])
    return {str(p): float(g.std(ddof=1) / np.sqrt(2)) if len(g) > 1 else None
            for p, g in log_change.groupby(repeat["protocol"])}


def paired_comparisons(ratios: pd.DataFrame, plans: dict[str, list[np.ndarray | None]], task_names: list[str],
                       noise_sd: dict[str, float | None], resamples: int, seed: int,
                       references: tuple[str, ...] = REFERENCES, value: str = "measured_ms") -> dict:
    """`paired.all_pairs` of every method against each of `references` (among them the best
    heuristic, chosen per task on its predicted cost: `paired.chosen`), stratified by unseen
    ratio, per protocol, on the column `value` of `ratios` (the headline `measured_ms` by default)."""
    index = {name: i for i, name in enumerate(task_names)}
    columns = ["task", "protocol", "method", value, paired.CHOSEN_BY, "unseen_ratio"]
    frame = ratios[columns + (["pass"] if "pass" in ratios else [])].copy()
    frame["placement"] = [plans[m][index[t]] for t, m in zip(frame["task"], frame["method"], strict=True)]
    frame = paired.with_best(frame, ids(kind="heuristic"), BEST_HEURISTIC, value=value)
    return paired.all_pairs(frame, references, value=value, strata="unseen_ratio", noise_sd=noise_sd,
                            resamples=resamples, seed=seed)


def reference_bias(ratios: pd.DataFrame, value: str = "max_device_ms") -> dict[str, dict]:
    """Per protocol, `paired.selection_bias` of the heuristics on `value`: how much lower the
    former reference (the lowest of the heuristics' measurements, chosen on the numbers it is
    scored by) sat than the one chosen on predicted costs, within the evaluate pass."""
    return {str(protocol): paired.selection_bias(g, ids(kind="heuristic"), value)
            for protocol, g in ratios.groupby("protocol", sort=False)}


def paired_synchronized(ratios: pd.DataFrame, plans: dict[str, list[np.ndarray | None]], task_names: list[str],
                        noise_sd: dict[str, float | None], resamples: int, seed: int) -> dict:
    """`paired_comparisons` on each plan's synchronized-stages cost (`synchronized_ms`: the sum
    over the four stages of the slowest device: measured compute, and measured or modelled comm as
    `comm_source` says) instead of the slowest device's compute, against REFERENCES and
    SYNC_REFERENCES (the baselines that optimise this cost, where they were planned). `noise_sd`
    is as given, per protocol its headline's repeat noise: the synchronized cost's, measured comm
    included, where that is the headline; elsewhere the compute bottleneck's (a comm model adds
    no noise of its own: it is a fitted function)."""
    return paired_comparisons(ratios, plans, task_names, noise_sd, resamples, seed, REFERENCES + SYNC_REFERENCES,
                              value="synchronized_ms")


def paired_max_device(ratios: pd.DataFrame, plans: dict[str, list[np.ndarray | None]], task_names: list[str],
                      noise_sd: dict[str, float | None], resamples: int, seed: int) -> dict:
    """`paired_comparisons` on each plan's compute bottleneck (`max_device_ms`: the slowest
    device's measured compute) for every protocol, whatever its headline objective: the same as
    `paired` where that is max_device. `noise_sd` should be that cost's own repeat noise
    (`log_noise_sd` of `stats.noise(..., "max_device_ms")`)."""
    return paired_comparisons(ratios, plans, task_names, noise_sd, resamples, seed, value="max_device_ms")


def paired_frame(pairs: dict, methods: tuple[str, ...], references: tuple[str, ...] = REFERENCES) -> pd.DataFrame:
    """The paired statistics of `methods` against `references` as one table."""
    rows = []
    for protocol, entries in pairs.items():
        for method in methods:
            for reference in references:
                stats = entries.get(f"{method}__vs__{reference}")
                if stats:
                    rows.append({"protocol": protocol, "method": method, "reference": reference, **stats})
    return pd.DataFrame(rows)


def plain_answer(pairs: dict, quality: dict,
                 methods: tuple[str, ...] = ids("headline"),
                 references: tuple[str, ...] = (*ids("reference"), BEST_HEURISTIC), replicates: dict | None = None,
                 regime: str = "") -> list[str]:
    """One exploratory sentence per protocol and method: against each reference, the median ratio
    with its unadjusted 95% interval and where that lies (`direction`), no verdict. With
    `replicates` (`replicate_summary`), each protocol also states the spread of rl_greedy over
    cost_greedy across replicates of the whole chain. `regime` names the cost `pairs` compare when
    it is not the protocols' headline objective (e.g. `paired_synchronized`'s); the sentences then
    say so, and the warning about noisy measurements is left to the headline's call."""
    lines = []
    if not quality["met"] and not regime:
        lines.append("The measurements under these results are noisier than the targets; read every "
                     "difference below against that.")
    for protocol, entries in pairs.items():
        if protocol == "small":
            continue
        for method in methods:
            parts = []
            for reference in references:
                s = entries.get(f"{method}__vs__{reference}")
                if not s or s["median_ratio"] is None:
                    continue
                parts.append(f"/ {reference} {s['median_ratio']:.3f} [{s['ci_low']:.3f}, {s['ci_high']:.3f}] "
                             f"({direction(s)}, {s['tasks']} tasks)")
            if parts:
                lines.append(f"{protocol}{f' ({regime})' if regime else ''}, {method}: " + "; ".join(parts) + ".")
        spread = (replicates or {}).get(protocol, {}).get(REPLICATED)
        if spread and spread["n"] > 1:
            lines.append(f"{protocol}, across {spread['n']} replicates of the chain (cost model and policy seeds): "
                         f"{POLICY} / {GREEDY} median {spread['mean_ratio']:.3f} ± {spread['std']:.3f} (mean ± sd; "
                         f"replicates {', '.join(f'{v:.3f}' for v in spread['values'])}).")
    return lines


def sync_policy_protocols(pairs_sync: dict) -> tuple[str, ...]:
    """The protocols of `paired_synchronized` where rl_sync_greedy was planned (has compared tasks)."""
    return tuple(protocol for protocol, entries in pairs_sync.items()
                 if any(pair.startswith(f"{SYNC_POLICY_METHODS[0]}__") and s["tasks"] for pair, s in entries.items()))


def synchronized_answer(pairs_sync: dict, quality: dict) -> list[str]:
    """The plain answer on the synchronized-stages cost (`paired_synchronized`) for the question of
    issue 16: does the policy trained on that cost (rl_sync_greedy, rl_sync_local_search), or the main one, beat the
    baselines that optimise it? Only on the protocols where rl_sync_greedy was planned (those the
    synchronized stages rank)."""
    planned = {protocol: pairs_sync[protocol] for protocol in sync_policy_protocols(pairs_sync)}
    return plain_answer(planned, quality, (*SYNC_POLICY_METHODS, POLICY),
                        (*SYNC_REFERENCES, GREEDY, BEST_HEURISTIC), regime="synchronized stages")


def direction(s: dict) -> str:
    """Where a comparison's 95% interval lies, unadjusted: 'below 1', 'above 1' or 'spans 1'.
    Exploratory wording: only the pre-registered primary endpoints (`studies.endpoints`) get a
    verdict, after an equivalence test and multiplicity correction."""
    if s["ci_high"] is not None and s["ci_high"] < 1:
        return "below 1"
    if s["ci_low"] is not None and s["ci_low"] > 1:
        return "above 1"
    return "spans 1"


def per_task_ratios(ratios: pd.DataFrame, pairs: list[tuple[str, str]]) -> pd.DataFrame:
    """Per task and (method, reference) pair, the measured bottleneck ratio: what the paired
    statistics summarise, for a figure of every task's difference."""
    frame = paired.with_best(ratios[["task", "protocol", "method", "measured_ms", paired.CHOSEN_BY]],
                             ids(kind="heuristic"), BEST_HEURISTIC)
    table = frame.pivot_table(index=["protocol", "task"], columns="method", values="measured_ms")
    rows = [pd.DataFrame({"pair": f"{m} / {r}", "ratio": table[m] / table[r]}).reset_index()
            for m, r in pairs if m in table and r in table]
    return pd.concat(rows, ignore_index=True).dropna(subset=["ratio"])


def replicate_summary(ratios: pd.DataFrame, replicates: int) -> dict:
    """`replicates.<protocol>.rl_greedy__vs__cost_greedy`: the median over tasks of the policy's
    measured bottleneck over cost_greedy's, for each replicate r of the chain (both planned by it:
    `endpoints.replica(method, r)`, every one measured in the one pass of `ratios`), its mean across
    replicates, standard deviation and count; every replicate over the same tasks (those every
    replicate planned), small tasks left out."""
    paired.one_pass(ratios)
    table = ratios.pivot_table(index="task", columns="method", values="measured_ms", aggfunc="first")
    protocol = ratios.groupby("task")["protocol"].first()
    pairs = [(replica(POLICY, r), replica(GREEDY, r)) for r in range(replicates)]
    if not all(m in table and g in table for m, g in pairs):
        return {}
    per = pd.DataFrame({r: table[m] / table[g] for r, (m, g) in enumerate(pairs)}).dropna()
    out = {}
    for proto, rows in per.groupby(protocol.reindex(per.index)):
        if proto == "small":
            continue
        v = [float(rows[r].median()) for r in range(replicates)]
        out[str(proto)] = {REPLICATED: {"mean_ratio": float(np.mean(v)),
                                        "std": float(np.std(v, ddof=1)) if len(v) > 1 else None, "n": len(v),
                                        "values": v}}
    return out


def repeat_summary(repeat: pd.DataFrame) -> pd.DataFrame:
    """Per protocol, from the plans measured twice (`stats.noise`): `plan_change`, the median
    |relative change| of a plan's cost; `rl_ratio_change`, the median |change| of rl_greedy's ratio
    to the best heuristic; and `selection_flattery`, the median over tasks of ratio / ratio_again - 1.
    The best heuristic is picked per task as the lowest of several noisy first-pass measurements,
    so noise flatters it there; measured again it loses that luck while rl_greedy, picked by no
    measurement, has none to lose. A positive value is how much the first pass favoured it; `tasks`
    says on how many tasks (a handful: read it as a sign, not a correction)."""
    per_task = repeat.drop_duplicates("task")
    flattery = (per_task["ratio"] / per_task["ratio_again"] - 1).groupby(per_task["protocol"])
    return pd.DataFrame({
        "plan_change": repeat["relative_change"].abs().groupby(repeat["protocol"]).median(),
        "rl_ratio_change": (repeat["ratio_again"] - repeat["ratio"]).abs().groupby(repeat["protocol"]).median(),
        "selection_flattery": flattery.median(), "tasks": flattery.count()})

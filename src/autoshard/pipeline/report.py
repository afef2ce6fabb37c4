"""The report stage: every executed notebook as self-contained HTML, the key curves as DVC
plot files, and `reports/README.md` with the headline results generated from the metrics
files (never typed), the figures, the environment and each stage's wall time.

Run as `python -m autoshard.pipeline.report` (what `dvc.yaml` does).
"""

import argparse
import json
import math
import os
import platform
import sys
from pathlib import Path

import pandas as pd
import yaml

from autoshard.core.atomic import atomic_dir, atomic_file
from autoshard.core.errors import ConfigError
from autoshard.core.metrics import read_metrics
from autoshard.core.params import Fields, load_params
from autoshard.core.schema import (
    ComputeOnlyPairs,
    EvaluateMetrics,
    HeadlineObjective,
    StageTime,
    check,
    read_checked,
)
from autoshard.costmodel.dataset import UNSEEN_MULTI
from autoshard.costmodel.evaluate import CostModelScores as CostModelMetrics
from autoshard.measure.commmodel import CommMetrics
from autoshard.methods.registry import BEST_HEURISTIC, GREEDY, METHODS, POLICY, ids
from autoshard.studies.ablation import Ablation as AblationMetrics
from autoshard.studies.columns import Columns as ColumnsMetrics
from autoshard.studies.findings import SYNC_POLICY_METHODS, SYNC_REFERENCES, direction, sync_policy_protocols
from autoshard.studies.transfer import Transfer as TransferMetrics


def notebook_stages(dvc_file: str | Path) -> list[tuple[str, str]]:
    """(stage, notebook stem) of every notebook stage in `dvc.yaml`, in pipeline order."""
    stages = yaml.safe_load(Path(dvc_file).read_text())["stages"]
    out = []
    for name, spec in stages.items():
        notebooks = [d for d in spec.get("deps", []) if str(d).startswith("notebooks/")]
        if notebooks:
            out.append((name, Path(notebooks[0]).stem))
    return out


def render_html(notebook: Path, out: Path) -> None:
    """The executed notebook as one HTML file with its figures embedded and code hidden (the
    notebook itself, with its code, sits next to it in `reports/notebooks/`)."""
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab", exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nbformat.read(notebook, as_version=4))
    out.write_text(body, encoding="utf-8")


def _interval(row: pd.Series) -> str:
    return f"{row['ratio_median']:.3f} [{row['ratio_lo']:.3f}, {row['ratio_hi']:.3f}]"


def headline(evaluate: dict) -> str:
    """Markdown: per protocol, each method's measured median ratio to the best heuristic with
    its 95% interval, win rate, mean measured bottleneck and median sharding time, under the
    protocol's objective (`evaluate.objective`)."""
    objective = check(evaluate, HeadlineObjective, "evaluate.json")["objective"]
    parts = []
    for protocol, methods in evaluate["results"].items():
        table = pd.DataFrame.from_dict(methods, orient="index")
        table = table.loc[sorted(table.index, key=lambda m: METHODS.index(m) if m in METHODS else len(METHODS))]
        shown = pd.DataFrame({
            "plans": table["plans"].astype(int),
            "ratio to best heuristic, median [95% CI]": table.apply(_interval, axis=1),
            "win rate": table["win_rate"].map("{:.0%}".format),
            "mean bottleneck (ms, measured)": table["mean_ms"].map("{:.2f}".format),
            "predicted ratio (median)": table["predicted_ratio_median"].map("{:.3f}".format),
            "sharding time (s, median)": table["seconds_median"].map("{:.4f}".format)})
        if protocol == "small":
            shown["gap to optimum (predicted, median)"] = table["predicted_gap_median"].map("{:.2%}".format)
        parts.append(f"**{protocol}** ({int(table['plans'].max())} tasks; bottleneck: "
                     f"{objective.get(protocol, 'max_device')})\n\n"
                     + shown.rename_axis("method").to_markdown())
    return "\n\n".join(parts)


def targets(evaluate: dict) -> str:
    """Markdown: the evaluate stage's targets, met or not; measured and predicted in separate tables."""
    table = pd.DataFrame(evaluate["targets"])
    table["value"] = table["value"].map("{:.3f}".format)
    table["met"] = table["met"].map({True: "met", False: "**not met**"})
    predicted = table["statistic"].str.contains("predicted")
    parts = []
    for name, rows in (("Measured", table[~predicted]), ("Predicted (cost model)", table[predicted])):
        if len(rows):
            parts.append(f"{name}:\n\n" + rows[["protocol", "method", "statistic", "value", "target", "met"]]
                         .to_markdown(index=False))
    return "\n\n".join(parts)


def quality(evaluate: dict, profile: dict | None = None) -> list[str]:
    """Markdown lines that open the report: the measurement noise against its targets, in bold
    when the run is noisier than they allow; then the profile's noise (what the cost model
    learnt from) against its CV target."""
    lines = _plan_quality(evaluate)
    noise = (profile or {}).get("noise")
    if noise:
        cv, target = noise.get("median_cv"), (profile or {}).get("cv_target")

        def share(key: str) -> str:
            return percent(noise.get(key))

        text = (f"profile (the cost model's data): median CV of a shard across interleaved rounds {share('median_cv')}"
                f"{'' if target is None else f' (target {target:.0%})'}; drift between rounds "
                f"{share('round_drift')} (median over chunks); {share('remeasured_share')} of chunks "
                "measured again because the machine drifted.")
        noisy = cv is None or (target is not None and cv > target)
        lines += ["", f"**Profile noise above its target:** {text}" if noisy else f"Profile noise: {text}"]
    return lines


def percent(value: float | None, digits: int = 1) -> str:
    """`value` (a fraction) as a percentage with `digits` decimals, "n/a" when there is none."""
    return "n/a" if value is None else f"{value:.{digits}%}"


def floor_line(cost_model: CostModelMetrics) -> str:
    """Markdown: the cost models' MAPE on the seen-table test shards measured twice next to the
    pass-to-pass MAPE there (a re-measurement as the prediction), and what a noise-free model
    would score if the two passes are equally and independently noisy (that over sqrt 2)."""
    floor = cost_model.get("measurement_floor")
    if floor is None:
        return "This run measured no shard twice (`profile.collect.remeasure` off): no measurement floor."
    if not floor["shards"]:
        return "The profile measured no seen-table test shard twice (`profile.collect.remeasure`): no floor."

    rescaled = floor.get("pass_to_pass_mape_rescaled")
    base = rescaled if rescaled is not None else floor["pass_to_pass_mape"]
    models = "; ".join(f"{name} {percent(value)} ({percent(floor['mape_vs_mean'].get(name))} against the mean of the "
                       "two passes)" for name, value in floor["mape_vs_main"].items())
    return (f"On the {floor['shards']} seen-table test shards measured in both profile passes, MAPE against the "
            f"main pass: a re-measurement (the second pass as the prediction) {percent(floor['pass_to_pass_mape'])} "
            f"({percent(rescaled)} once the passes' overall change of speed is divided out); a noise-free model would "
            f"score about {percent(None if base is None else base / 2**0.5)} if the two passes are equally and "
            f"independently noisy, and none can be shown better; {models}.")


def hybrid_label(profile: dict | None) -> str:
    """What the hybrid's numbers measure: it reads every table's measured single cost, so the
    profile times each pool table alone before it can price a shard; its "unseen" tables are unseen
    by its training, not by the profile."""
    singles = ((profile or {}).get("shards_by_kind") or {}).get("single")
    seconds = (profile or {}).get("seconds")
    cost = "" if singles is None else (f" (here {singles} single-table measurements, part of the profile stage's "
                                       f"{seconds / 60:.1f} min)" if seconds else f" (here {singles})")
    return ("The hybrid model (and `hybrid_greedy`) reads each table's measured single cost: every table is profiled "
            f"alone first{cost}. Its error on \"unseen\" tables measures profiling plus a learnt fusion factor, not "
            "generalisation to tables never measured; the feature-only model is the one that has not seen them.")


def architecture_line(cost_model: CostModelMetrics) -> str:
    """Markdown: what the hybrid's form adds beyond the single costs it reads, at equal data (issue 29):
    its MAPE beside AutoShard's architecture given the same single costs, and the feature-only model's."""
    h = cost_model.get("hybrid") or {}
    if h.get("informed_mape_seen") is None or h.get("equal_data_hybrid_mape_seen") is None:
        return ""

    def pair(key: str) -> str:
        seen, unseen = h.get(f"{key}_seen"), h.get(f"{key}_unseen")
        return f"{_share(seen)} / {_share(unseen)}"
    return ("What the hybrid's form adds, at equal data (the profile's training shards; MAPE on multi-table shards "
            f"of seen / unseen tables): the hybrid {pair('equal_data_hybrid_mape')}; AutoShard's architecture given "
            f"the same single costs as an input {pair('informed_mape')}; the feature-only model, without them, "
            f"{pair('feature_only_mape')}.")


def _share(value: float | None) -> str:
    return "n/a" if value is None or value != value else f"{value:.1%}"


WIDE_SET = UNSEEN_MULTI  # the wide pool's test set shown by dim


def wide_table(cost_model: CostModelMetrics) -> str | None:
    """Markdown: each estimator's MAPE on the wide pool's shards of unseen tables, in all and by the
    dim of the shard's widest table (`cost_model.json`'s `wide`), with the shards behind each
    column; None where the wide pool was not measured."""
    wide = cost_model.get("wide")
    if not wide or not wide["error_by_dim"]:
        return None
    dims = [str(d) for d in wide["dims"]]
    counts = next(iter(wide["error_by_dim"].values())).get(WIDE_SET, {})
    head = ["estimator", f"all ({sum(g['shards'] for g in counts.values())})",
            *(f"dim {d} ({counts[d]['shards']})" for d in dims if d in counts)]
    rows = [[name, percent(wide["mape"][name].get(WIDE_SET)),
             *(percent(groups[WIDE_SET][d]["mape"]) for d in dims if d in counts)]
            for name, groups in wide["error_by_dim"].items() if WIDE_SET in groups]
    return pd.DataFrame(rows, columns=head).to_markdown(index=False)


def active_line(cost_model: CostModelMetrics) -> str:
    """Markdown: the hybrid's active selection (`costmodel.active`): what was measured, each arm's
    MAPE on seen and unseen multi-table test shards, and whether choosing where the model is least
    sure beat choosing at random (exploratory, so no verdict words): "lower error" or "higher error"
    only when the paired interval excludes 0,
    the Wilcoxon p-value is under 0.05 and the difference exceeds either arm's spread over fits
    (the test's randomness is the test shards only; fit luck it averages over a few seeds)."""
    if "active" not in cost_model:
        return ("This run's cost_model stage measured no shards for the hybrid beyond the profile's "
                "(`cost_model.active`).")
    a = cost_model["active"]

    def arm(name: str) -> str:
        return " | ".join(f"{percent(a['mape'][name][k])} ± {percent(a['mape_sd'][name][k])}"
                          for k in ("seen", "unseen"))

    def verdict(key: str) -> str:
        d = a["paired"][key]
        if not all(_number(d[k]) for k in ("difference", "ci_low", "ci_high", "p_value")):
            return f"{key}: n/a"
        arms, test_set = key.split(" | ")
        spread = max(a["mape_sd"][arm].get(test_set) or 0.0 for arm in arms.split(" - "))
        shown = d["p_value"] < 0.05 and (d["ci_high"] < 0 or d["ci_low"] > 0)
        word = ("no difference shown" if not shown else
                "within the fits' spread" if abs(d["difference"]) <= spread else
                "lower error" if d["difference"] < 0 else "higher error")
        return (f"{key} {d['difference'] * 100:+.1f} points [{d['ci_low'] * 100:+.1f}, {d['ci_high'] * 100:+.1f}], "
                f"p {d['p_value']:.3f} ({d['shards']} shards): {word}")

    return (f"Active selection: {a['shards_measured']} more train-table shards measured for the hybrid, "
            f"{a['rounds']} rounds of {a['shards_per_round']} per arm, from {a['candidates']} candidates. "
            f"Hybrid MAPE, seen | unseen multi-table shards (mean ± sd over {a['seeds']} fits): base {arm('base')}; "
            f"+ shards where a {a['ensemble']}-model bootstrap ensemble is least sure {arm('active')}; "
            f"+ as many drawn at random {arm('uniform')}. Paired, per test shard: "
            + "; ".join(verdict(k) for k in a["paired"])
            + ". The stage's hybrid is fitted on every shard measured.")


def device_error_line(evaluate: dict) -> str:
    """Markdown: each cost model's median error on the evaluated plans' device shards, per protocol
    (predicted from the profile pass, measured in the evaluate pass, so it carries the machine's
    change of speed between them), against `device_error_target` where the run recorded one."""
    models = {"feature-only": evaluate.get("cost_model_device_error_median") or {},
              "hybrid": evaluate.get("hybrid_device_error_median") or {}}
    if not models["feature-only"]:
        return "This run's evaluate stage recorded no device-level error."
    target = evaluate.get("device_error_target")
    parts = []
    for name, errors in models.items():
        if not errors:
            continue
        known = [v for v in errors.values() if _number(v)]
        met = "" if target is None or not known else (" — target met" if len(known) == len(errors)
                                                     and max(known) <= target else " — target not met")
        parts.append(f"{name}: " + ", ".join(f"{p} {percent(v)}" for p, v in errors.items()) + met)
    goal = "" if target is None else f" Target: at most {target:.0%} on every protocol."
    return ("Device-level error on the evaluated plans (median |predicted / measured - 1| over their non-empty "
            "devices; the prediction rests on the profile pass and the measurement on the evaluate pass, so the "
            f"machine's change of speed between the passes is in it): {'; '.join(parts)}.{goal}")


def _number(value: object) -> bool:
    """True for a finite int or float (metrics write a missing figure as null)."""
    return isinstance(value, int | float) and math.isfinite(value)


def selection_line(reference: dict) -> str:
    """A sentence on how the best heuristic was chosen (`findings.reference_bias`, the metrics'
    `reference`) and how much choosing it on the pass's own measurements would have flattered it."""
    parts = [f"{protocol} {entry['oracle_over_chosen_median']:+.1%} ({entry['tasks_differing']} of "
             f"{entry['tasks']} tasks differ)" for protocol, entry in reference.items()
             if _number(entry.get("oracle_over_chosen_median"))]
    if not parts:
        return ""
    chooser = next(iter(reference.values()))["chosen_by"]
    return (f" The best heuristic of a task is chosen on `{chooser}` (the cost model's prediction) and scored on "
            "this pass; the lowest of its measurements instead would have lowered the reference by (median of "
            f"lowest / chosen - 1, compute only): {', '.join(parts)}.")


def _plan_quality(evaluate: dict) -> list[str]:
    noise = evaluate.get("noise")
    if not noise:
        return ["**The evaluate stage recorded no measurement quality: do not trust these numbers.**"]

    facts = (f"median CV of a shard across interleaved rounds {percent(noise['median_cv'], 2)} (target "
             f"{noise['targets']['median_cv']:.0%}); a plan measured again in a separate pass moved "
             f"{percent(noise['plan_repeat_change'], 2)} (median, target {noise['targets']['plan_repeat_change']:.0%}; "
             f"{percent(noise.get('plan_repeat_change_calibrated'), 2)} once each pass's calibration-shard time is "
             "divided out, i.e. without the machine's overall change of speed between the passes); "
             f"drift between rounds {percent(noise.get('round_drift'), 2)} (median over tasks); "
             f"{percent(noise['remeasured_share'], 2)} of tasks measured again because the machine drifted."
             + (f" Measured all-to-alls ({noise['comm_plans']} plans): median CV of a device's all-to-all time "
                f"across rounds {percent(noise['comm_round_cv'], 2)}." if noise.get("comm_plans") else "")
             + selection_line(evaluate.get("reference", {})))
    if noise["met"]:
        return [f"Measurement quality: within the targets. {facts}"]
    return [f"**Measurement quality: this run is noisier than its targets; a difference smaller than the noise "
            f"below is not a finding, and the run should be repeated on a quieter machine.** {facts}"]


def objectives(evaluate: dict) -> dict[str, str]:
    """Protocol -> the objective its headline and `paired` entries rank by (`evaluate.objective`,
    checked as `headline` checks it); {} for metrics that carry none."""
    return check(evaluate, HeadlineObjective, "evaluate.json")["objective"] if "objective" in evaluate else {}


def answer(evaluate: dict) -> str:
    """Markdown: the evaluate stage's plain answer, one line per protocol and learned method,
    after the objective each protocol's lines compare (`evaluate.objective`)."""
    lines = "\n".join(f"- {line}" for line in evaluate.get("answer", [])) or "(no paired comparisons)"
    ranked_by = objectives(evaluate)
    if not ranked_by:
        return lines
    ranked = "; ".join(f"{protocol}: {objective}" for protocol, objective in ranked_by.items())
    return f"Each protocol's lines compare its headline objective ({ranked}).\n\n{lines}"


def paired_table(evaluate: dict, methods: tuple[str, ...] = ids("shown")) -> str:
    """Markdown: the paired comparisons of the learned methods and the solver baselines."""
    rows = []
    for protocol, entries in evaluate.get("paired", {}).items():
        if protocol == "small":
            continue
        for pair, s in entries.items():
            method, reference = pair.split("__vs__")
            if method in methods and s["median_ratio"] is not None:
                rows.append({"protocol": protocol, "method": method, "reference": reference, "tasks": s["tasks"],
                             "median ratio [95% CI]": f"{s['median_ratio']:.3f} [{s['ci_low']:.3f}, "
                                                      f"{s['ci_high']:.3f}]",
                             "Wilcoxon p": f"{s['p_value']:.3g}" if s["p_value"] is not None else "n/a",
                             "same split": f"{s['identical_share']:.0%}" if s["identical_share"] is not None
                             else "n/a",
                             "detectable effect": f"{s['mde']:.1%}" if s["mde"] is not None else "n/a"})
    return pd.DataFrame(rows).to_markdown(index=False) if rows else "(no paired comparisons)"


def transfer_table(transfer: TransferMetrics) -> str:
    """Markdown: per transfer axis and point, the policy's and the cost-model greedy's measured
    median ratio to the best heuristic with its 95% interval."""
    rows = []
    for axis, methods in transfer["axes"].items():
        for method, points in methods.items():
            for value, row in points.items():
                bounded = row.get("bounded_share") or 0.0
                note = ", ".join(n for n, on in (
                    ("same tasks as the " + str(row.get("shared_with")) + " axis", row.get("shared_with")),
                    ("every method ties", row.get("trivial")),
                    (f"largest table bounds {bounded:.0%} of tasks", not row.get("trivial") and bounded >= 0.5)) if on)
                rows.append({"axis": axis, "value": float(value), "method": method, "cell": _interval(pd.Series(row)),
                             "tasks": int(row["tasks"]), "note": note})
    if not rows:
        return "(no transfer results)"
    frame = pd.DataFrame(rows)
    table = frame.pivot_table(index=["axis", "value"], columns="method", values="cell", aggfunc="first")
    table["tasks"] = frame.groupby(["axis", "value"])["tasks"].min()
    table["note"] = frame.groupby(["axis", "value"])["note"].first()
    table.index = [f"{axis} = {value:g}" for axis, value in table.index]
    return table.rename_axis("point").to_markdown()


def ablation_table(ablation: AblationMetrics) -> str:
    """Markdown: per ablation variant, the mean over seeds of the measured median ratio to the
    best heuristic, its spread across seeds, the change against the full method and its
    Holm-corrected Wilcoxon p-value."""
    table = pd.DataFrame(ablation["variants"])
    scores = [c for c in ("mean", "std", "min", "max", "vs_full", "p_holm") if c in table]
    table[scores] = table[scores].astype(float)
    shown = pd.DataFrame({
        "variant": table["label"],
        "ratio (mean of seeds)": table["mean"].map("{:.3f}".format),
        "std across seeds": table["std"].map("{:.3f}".format),
        "range": table.apply(lambda r: f"[{r['min']:.3f}, {r['max']:.3f}]", axis=1),
        "vs full method": table["vs_full"].map("{:+.3f}".format) if "vs_full" in table else "n/a",
        "p (Holm)": table["p_holm"].map(lambda v: "n/a" if pd.isna(v) else f"{v:.3g}") if "p_holm" in table
        else "n/a"})
    return shown.to_markdown(index=False, disable_numparse=True).replace("nan", "n/a")


def stage_times(metrics_dir: Path, stages: list[tuple[str, str]], budget_minutes: float | None = None) -> str:
    """Markdown: the wall time each stage's notebook recorded in its metrics file, and their sum
    against the study's time budget (`budget_minutes` in params.yaml) when one is given."""
    rows = []
    for stage, _ in stages:
        path = metrics_dir / f"{stage}.json"
        if path.exists():
            rows.append((stage, read_checked(path, StageTime)["seconds"]))
    total = sum(seconds for _, seconds in rows)
    if rows:
        rows.append(("**all notebook stages**", total))
    table = pd.DataFrame([{"stage": stage, "wall time (s)": f"{seconds:.0f}"} for stage, seconds in rows]
                         ).to_markdown(index=False)
    if budget_minutes is None or not rows:
        return table
    verdict = "within" if total <= budget_minutes * 60 else "**over**"
    left = (f" The whole `make repro` also spends DVC's own time and the kernels' start-up, which this sum leaves "
            f"out: it meets the budget only if they fit in the {budget_minutes - total / 60:.1f} min left."
            if total <= budget_minutes * 60 else "")
    return (f"{table}\n\nAll notebook stages together: {total / 60:.1f} min, {verdict} the study's budget of "
            f"{budget_minutes:g} min (`budget_minutes`: `make repro` from a fresh clone on 2 idle cores).{left}")


def environment() -> dict[str, str]:
    """Where the study ran: CPU, cores, GPU, library versions, torch threads."""
    import torch

    versions = {}
    for module in ("torch", "fbgemm_gpu", "torchrec", "pandas", "dvc", "papermill"):
        try:
            versions[module] = __import__(module).__version__
        except ImportError:
            versions[module] = "absent"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return {"cpu": platform.processor() or platform.machine(), "cores": str(os.cpu_count()), "gpu": gpu,
            "python": platform.python_version(), "torch threads": str(torch.get_num_threads()), **versions}


def plot_files(data_dir: Path, plots: Path) -> None:
    """Wide CSVs of the key curves for `dvc plots show`: sharding time against the number of
    tables, and each method's median measured ratio per protocol."""
    speed = pd.read_csv(data_dir / "evaluate" / "speed.csv")
    speed.pivot(index="tables", columns="method", values="seconds").reset_index().to_csv(
        plots / "sharding_time.csv", index=False)
    ratios = pd.read_csv(data_dir / "evaluate" / "plans.csv")
    ratios.groupby(["protocol", "method"], sort=False)["ratio"].median().unstack("protocol").reset_index().to_csv(
        plots / "ratios.csv", index=False)


REGIMES = (("compute only", "paired_max_device", ("autoshard", "dreamshard")),
           ("synchronized stages with communication", "paired_synchronized", ("autoshard", "dreamshard")),
           ("tight memory", "paired", ("tight",)),
           ("few tables per device", "paired", ("few",)))


def compute_only(evaluate: dict) -> dict[str, dict]:
    """Protocol -> its paired comparisons on the slowest device's compute: `paired_max_device`
    (checked, `ComputeOnlyPairs`)."""
    return check(evaluate, ComputeOnlyPairs, "evaluate.json")["paired_max_device"]


def regime_table(evaluate: dict, method: str | tuple[str, ...] = POLICY,
                 references: tuple[str, ...] = (*ids("reference"), BEST_HEURISTIC),
                 regimes: tuple[tuple[str, str, tuple[str, ...]], ...] = REGIMES) -> str:
    """Markdown, exploratory: per regime and protocol, `method`'s paired median ratio [unadjusted
    95% CI] against each reference and where the interval lies (`findings.direction`); several
    methods get a row each (a `method` column). The compute-only regime reads `paired_max_device`
    (see `compute_only`), whatever objective ranks the protocol's headline."""
    methods = (method,) if isinstance(method, str) else method
    rows = []
    for regime, key, protocols in regimes:
        block = compute_only(evaluate) if key == "paired_max_device" else evaluate.get(key, {})
        for protocol, name in ((p, m) for p in protocols for m in methods):
            entries = block.get(protocol)
            row = {"regime": regime, "protocol": protocol, **({"method": name} if len(methods) > 1 else {})}
            if not entries or not any(pair.startswith(f"{name}__") for pair in entries):
                continue
            for reference in references:
                s = entries.get(f"{name}__vs__{reference}")
                if not s or s["median_ratio"] is None:
                    row[reference] = "n/a"
                    continue
                row[reference] = f"{s['median_ratio']:.3f} [{s['ci_low']:.3f}, {s['ci_high']:.3f}] {direction(s)}"
            rows.append(row)
    return pd.DataFrame(rows).to_markdown(index=False) if rows else "(no paired comparisons)"


COMM_SOURCES = {"measured": "the all-to-all measured across one process per device",
                "measured-oversubscribed": "the all-to-all measured across more processes than cores: "
                                           "oversubscribed, mostly scheduling",
                "measured-model": "the comm model at a device count it was fitted on",
                "oversubscribed-model": "the comm model at a device count it was fitted on, from oversubscribed "
                                        "timings (more processes than cores)",
                "extrapolated-model": "the comm model extrapolated to another device count",
                "analytic": "TorchRec's analytic all-to-all estimate"}


def _units(device: str | None) -> str:
    """What one process per device needs of its own: a GPU on CUDA, else a core."""
    return "GPUs" if (device or "cpu").startswith("cuda") else "cores"


def crowded(world: int | str, limit: int, device: str | None) -> str:
    """How an oversubscribed all-to-all was measured, in words."""
    return f"measured across {world} processes on {limit} {_units(device)}: oversubscribed, mostly scheduling"


def oversubscribed_counts(comm: dict) -> list[int]:
    """The measured device counts above the honest limit (none in metrics that predate it)."""
    limit = comm.get("honest_limit")
    return [] if limit is None else [w for w in comm["device_counts"] if w > limit]


def comm_sources(evaluate: dict, profile: dict | None = None) -> str:
    """Where each protocol's all-to-all came from (`comm_source` in the metrics), in words; with
    the profile's comm metrics, an oversubscribed measurement names its processes and cores."""
    comm = (profile or {}).get("comm") or {}
    over = oversubscribed_counts(comm) if comm else []
    words = dict(COMM_SOURCES)
    if over:
        words["measured-oversubscribed"] = "the all-to-all " + crowded(" or ".join(map(str, over)),
                                                                     comm["honest_limit"], profile.get("device"))
    by_source: dict[str, list[str]] = {}
    for protocol, source in evaluate.get("comm_source", {}).items():
        by_source.setdefault(source, []).append(protocol)
    return "; ".join(f"{words.get(source, source)} ({', '.join(protocols)})"
                     for source, protocols in by_source.items()) or "the all-to-all (source not recorded)"


def comm_model_lines(profile: dict) -> list[str]:
    """Markdown lines on the comm model (`profile.json` `comm`): which device counts were measured
    honestly (one process per core or GPU) and why, the held-out MAPE target's verdict on them,
    each oversubscribed count's MAPE labelled so, and the pooled and across-count figures. Beside
    the honest verdict the measurement floor, where recorded."""
    comm = profile["comm"]
    by_world, target = comm["mape_heldout_by_world"], comm["mape_target"]
    met = "met" if comm["mape_target_met"] else "**not met**"
    counts = ", ".join(map(str, comm["device_counts"]))
    lines = [f"{comm['placements']} random placements per device count ({counts}), their forward and backward "
             f"all-to-all measured with one torchrun process per device; {comm['heldout_share']:.0%} held out."]
    limit, honest, units = comm["honest_limit"], comm["honest_device_counts"], _units(profile.get("device"))
    lines += ["", f"Honest device counts: {', '.join(map(str, honest)) or 'none'}. This machine lets the "
                  f"stage use {limit} {units}, so a launch of at most {limit} processes runs one per "
                  f"{units[:-1]}; above that the ranks wait for a {units[:-1]} and the times mostly measure "
                  "scheduling (oversubscribed)."]
    if comm["mape_heldout_honest"] is None:
        why = comm.get("mape_target_note") or "the honest counts' MAPE is not a finite number"
        lines += ["", f"Held-out MAPE target ({target:.0%}) {met}: {why}."]
    else:
        floor, noise_free = comm.get("mape_floor_honest"), comm.get("mape_noise_free_honest")
        floor = "" if floor is None or noise_free is None else (
            f"; one round of a held-out placement against the median of its other rounds scores {percent(floor)}, "
            f"so a noise-free model would score about {percent(noise_free)} against the "
            f"median of {comm['rounds']} rounds (rounds independently and normally noisy), and none can be shown "
            "better")
        lines += ["", f"Held-out MAPE over the honest counts {percent(comm['mape_heldout_honest'])} "
                      f"(target {target:.0%}): {met}{floor}."]
    for world in oversubscribed_counts(comm):
        lines += ["", f"Oversubscribed, {world} devices: held-out MAPE {percent(by_world.get(str(world)))} "
                      f"({crowded(world, limit, profile.get('device'))}; not judged against the target)."]
    lines += ["", f"Pooled over all counts {percent(comm['mape_heldout'])}; the fit across counts alone (what "
                  f"extrapolation to unmeasured counts uses) {percent(comm['mape_heldout_across'])}."]
    return lines


def sync_policy_table(evaluate: dict) -> str:
    """Markdown: the policy trained on the synchronized-stages cost (rl_sync_greedy, and
    rl_sync_local_search from its plan) against the baselines that optimise that cost, on it,
    where it was planned (the protocols it ranks)."""
    protocols = sync_policy_protocols(evaluate.get("paired_synchronized", {}))
    if not protocols:
        return "(rl_sync_greedy was not evaluated: no policy trained on the synchronized stages)"
    block = evaluate.get("paired_synchronized", {})
    references, notes = shown_once((*SYNC_REFERENCES, GREEDY, BEST_HEURISTIC), block, protocols)
    table = regime_table(evaluate, SYNC_POLICY_METHODS, references,
                         (("synchronized stages with communication", "paired_synchronized", protocols),))
    return "\n\n".join([table, *notes])


TWIN_SHARE = 0.5  # a reference that chose another's very plan on at least this share of tasks is shown once


def shown_once(references: tuple[str, ...], block: dict, protocols: tuple[str, ...]
               ) -> tuple[tuple[str, ...], list[str]]:
    """`references` without those that placed exactly as an earlier one on at least TWIN_SHARE of
    the tasks of every protocol (`identical_share` of their pair in `block`), and a line naming
    each one left out: one baseline is not counted twice."""
    kept: list[str] = []
    notes = []
    for reference in references:
        twin = None
        for earlier in kept:
            shares = [(block.get(p, {}).get(f"{reference}__vs__{earlier}") or {}).get("identical_share")
                      for p in protocols]
            if shares and all(x is not None and x >= TWIN_SHARE for x in shares):
                twin = (earlier, shares)
                break
        if twin is None:
            kept.append(reference)
            continue
        where = ", ".join(f"{p} {x:.0%}" for p, x in zip(protocols, twin[1], strict=True))
        notes.append(f"`{reference}` placed exactly as `{twin[0]}` on most tasks ({where} of them): shown once, "
                     f"as `{twin[0]}`.")
    return tuple(kept), notes


def failed_table(evaluate: dict) -> str:
    """Markdown: per protocol, the methods that failed to place some tasks (no plan, or a device
    over the memory cap), with how many; a protocol where every method placed every task says so."""
    rows = []
    for protocol, methods in evaluate.get("failed", {}).items():
        failed = {m: n for m, n in methods.items() if n}
        rows.append({"protocol": protocol, "failed placements": ", ".join(f"{m}: {n}" for m, n in failed.items())
                     or "none: every method placed every task"})
    return pd.DataFrame(rows).to_markdown(index=False) if rows else "(no placement counts)"


def columns_table(columns: ColumnsMetrics) -> str:
    """Markdown, exploratory: per protocol and pair, a column-wise method against its table-wise
    twin, paired; beside each ratio the share of tasks where a split was chosen (elsewhere the
    two are one plan)."""
    rows = []
    for protocol, by_method in columns["protocols"].items():
        for method, c in by_method.items():
            rows.append({"protocol": protocol, "pair": f"{method} / {c['twin']}", "tasks": c["tasks"],
                         "column-wise / table-wise [95% CI]": "n/a" if c["median_ratio"] is None else _interval(
                             pd.Series({"ratio_median": c["median_ratio"], "ratio_lo": c["ci_low"],
                                        "ratio_hi": c["ci_high"]})),
                         "interval": c["direction"], "tasks split": f"{c['split_share']:.0%}",
                         "largest table / bottleneck": f"{c['bound_share_median']:.2f}"})
    return pd.DataFrame(rows).to_markdown(index=False) if rows else "(no column-wise results)"


def primary_intro(evaluate: dict) -> str:
    """The sentence above the primary table: what was declared and how a verdict is reached."""
    entries = list(evaluate.get("primary", {}).values())
    if not entries:
        return "**This run declared no primary endpoints (`primary` in params.yaml): nothing below is decided.**"
    first = entries[0]
    costs = ", ".join(sorted({COSTS_SAID.get(e["cost"], e["cost"]) for e in entries}))
    return (f"Declared in `params.yaml` (`primary`) before the run: {len(entries)} comparisons ({costs}), each "
            f"within one measuring pass. Smallest effect of interest (sesoi) {first['sesoi']:.0%}: **better** or "
            "**worse** when a one-sided signed-rank test rejects a change smaller than that, **equivalent** when "
            "both one-sided tests against ±sesoi reject (TOST), every claim of every endpoint Holm-adjusted as one "
            f"family at {first['alpha']:g}; otherwise **inconclusive**. Intervals: BCa bootstrap over tasks (within "
            "unseen-ratio strata; `interval` in the metrics says where BCa was undefined). \"failed\": tasks where "
            "either arm found no plan, left out of the comparison. A learned method against cost_greedy is decided "
            "only where its protocol's headroom (cost_greedy's predicted gap to the best placement known, the most "
            "any planner could gain there: the table below) exceeds twice the noise floor; elsewhere its verdict is "
            "**no headroom**, outside the family, its interval still shown.")


COSTS_SAID = {"max_device_ms": "compute only: the slowest device's measured compute",
              "synchronized_ms": "synchronized stages"}


def primary_table(evaluate: dict) -> str:
    """Markdown: one row per primary endpoint (verdict, median ratio, BCa interval, Holm p, sesoi,
    tasks, pass) and, beside an endpoint against cost_greedy, its protocol's headroom: cost_greedy's
    predicted gap to the best placement known against twice the noise floor."""
    room = evaluate["headroom"]
    rows = [{"method / reference": f"{e['method']} / {e['reference']}", "protocol": e["protocol"],
             "verdict": f"**{e['verdict']}**",
             "median ratio [95% BCa]": "n/a" if e["median_ratio"] is None else
             f"{e['median_ratio']:.3f} [{e['ci_low']:.3f}, {e['ci_high']:.3f}]",
             "p (Holm)": "n/a" if e["p_holm"] is None else f"{e['p_holm']:.3g}", "sesoi": f"{e['sesoi']:g}",
             "tasks": e["tasks"], "failed": e["failed"], "identical plans": percent(e["identical_share"], 0),
             **({"headroom (predicted) / 2 x noise": headroom_cell(room.get(e["protocol"]))
                 if e["reference"] == GREEDY else ""} if room else {}),
             "pass": e["pass"]}
            for e in evaluate.get("primary", {}).values()]
    return pd.DataFrame(rows).to_markdown(index=False) if rows else "(no primary endpoints)"


def headroom_cell(entry: dict | None) -> str:
    """cost_greedy's predicted gap to the best placement known, against twice the noise floor."""
    if not entry:
        return "n/a"
    floor = entry["noise_floor"]
    return f"{percent(entry['greedy_gap'], 2)} / {'n/a' if floor is None else percent(2 * floor)}"


def headroom_table(evaluate: dict) -> str:
    """Markdown: per protocol, the most any planner could gain over cost_greedy (`headroom`):
    predicted under the cost model, on the measured single costs (LPT against the MILP's bound) and
    measured; then, per method, the median share of the predicted headroom its plan captured."""
    room = evaluate["headroom"]
    if not room:
        return "(no protocol evaluated)"
    rows = [{"protocol": p, "tasks": e["tasks"],
             "cost_greedy over the best known, predicted: median (max)":
                 f"{percent(e['greedy_gap'], 2)} ({percent(e['greedy_gap_max'], 2)})",
             "tasks above 0.5%": percent(e["greedy_gap_above_share"], 0), "best known": e["how"],
             "LPT over the MILP bound (measured singles)": percent(e["lpt_gap"], 2),
             "MILP optimal": percent(e["lpt_gap_optimal_share"], 0),
             "cost_greedy over the best measured plan, measured": percent(e["measured_gap"], 2),
             "that plan (tasks)": ", ".join(f"{m} {n}" for m, n in e["measured_of"].items()),
             "noise floor": f"{percent(e['noise_floor'])} (`{e['noise_key']}`)",
             "exceeds 2 x noise": "yes" if e["exceeds_noise"] else "**no**"} for p, e in room.items()]
    captured = pd.DataFrame({p: e["captured"] for p, e in room.items()})
    captured = captured.loc[sorted(captured.index, key=lambda m: METHODS.index(m) if m in METHODS else len(METHODS))]
    return (pd.DataFrame(rows).to_markdown(index=False)
            + "\n\nShare of the predicted headroom each method's plan captured (median over the tasks with a gap; "
            "1: the best known, 0: cost_greedy's, below 0: worse than cost_greedy):\n\n"
            + captured.map(lambda v: "n/a" if v is None or pd.isna(v) else f"{v:.2f}").rename_axis("method")
            .to_markdown(disable_numparse=True))


def families_table(evaluate: dict) -> str:
    """Markdown: the candidate regimes searched for headroom under the cost model (`families`),
    each family's predicted greedy gap against twice the noise floor it is held to."""
    entry = evaluate["families"]
    if not entry.get("families"):
        return "(no candidate regimes searched: `evaluate.families.tasks` is 0)"
    floor = entry["noise_floor"]
    rows = [{"family": f["family"], "tasks": f["tasks"],
             "greedy over the best known: median (p90, max)": f"{percent(f['greedy_gap'], 2)} "
                 f"({percent(f['greedy_gap_p90'], 2)}, {percent(f['greedy_gap_max'], 2)})",
             "speed-blind greedy: median": percent(f["blind_gap"], 2) if f["speeds"] != "equal" else "–",
             "exceeds 2 x noise": "yes" if f["exceeds_noise"] else "no"} for f in entry["families"]]
    kept = [f["family"] for f in entry["families"] if f["exceeds_noise"]]
    held = "n/a" if floor is None else f"{percent(2 * floor)} (twice `{entry['noise_key']}`)"
    return (f"Candidate regimes, searched under the cost model before any is measured (predicted only, "
            f"{entry['seconds']:.1f} s of search; `evaluate.families`). Each is held to {held}: "
            + (f"kept as candidates for a measured protocol: {', '.join(kept)}." if kept else
               "**none exceeds it**, so none is made a measured protocol.")
            + "\n\n" + pd.DataFrame(rows).to_markdown(index=False))


def quality_line(evaluate: dict) -> str:
    """One line on the measurements' quality, linking to its section."""
    noise = evaluate.get("noise") or {}
    if not noise:
        return "**No measurement quality was recorded: do not trust these numbers.**"
    state = "within its targets" if noise["met"] else "**noisier than its targets**"
    return (f"Measurement quality {state}: shard CV across rounds {percent(noise['median_cv'])} (target "
            f"{noise['targets']['median_cv']:.0%}), a plan measured again moved {percent(noise['plan_repeat_change'])} "
            "(another pass: never divided into these ratios). [Details](#measurement-quality).")


def readme(reports: Path, stages: list[tuple[str, str]], budget_minutes: float | None = None) -> str:
    """The text of `reports/README.md`: `readme_template.TEMPLATE` filled from the metrics files,
    each read through its schema (`budget_minutes`: the study's time budget, see `stage_times`)."""
    import jinja2

    from autoshard.pipeline.readme_template import TEMPLATE

    metrics = reports / "metrics"

    def read(stage: str, schema: type | None = None) -> dict | None:
        path = metrics / f"{stage}.json"
        if not path.exists():
            return None
        return read_checked(path, schema) if schema else read_metrics(path)

    profile, evaluate = read("profile"), read("evaluate", EvaluateMetrics)
    cost_model, transfer = read("cost_model", CostModelMetrics), read("transfer", TransferMetrics)
    ablation, columns = read("ablation", AblationMetrics), read("columns", ColumnsMetrics)
    if profile and profile.get("comm"):
        check(profile["comm"], CommMetrics, "profile.json: comm")
    context = {
        "evaluate": evaluate and {
            "primary_intro": primary_intro(evaluate), "primary_table": primary_table(evaluate),
            "headroom_table": headroom_table(evaluate), "families_table": families_table(evaluate),
            "quality_line": quality_line(evaluate), "answer": answer(evaluate),
            "comm_sources": comm_sources(evaluate, profile), "regime_table": regime_table(evaluate),
            "sync_policy_table": sync_policy_table(evaluate), "paired_table": paired_table(evaluate),
            "failed_table": failed_table(evaluate), "headline": headline(evaluate), "targets": targets(evaluate),
            "quality": quality(evaluate, profile)},
        "cost_model": cost_model and {
            "floor": floor_line(cost_model), "hybrid": hybrid_label(profile),
            "architecture": architecture_line(cost_model), "active": active_line(cost_model),
            "wide": wide_table(cost_model),
            "wide_dims": ", ".join(map(str, (cost_model.get("wide") or {}).get("dims", []))),
            "device_error": device_error_line(evaluate) if evaluate else None},
        "comm": comm_model_lines(profile) if profile and profile.get("comm") else None,
        "transfer": transfer and transfer_table(transfer),
        "ablation": ablation and {"iterations": ablation["iterations"], "seeds": ablation["seeds"],
                                  "test_tasks": ablation["test_tasks"], "protocols": ", ".join(ablation["protocols"]),
                                  "table": ablation_table(ablation)},
        "columns": columns and {"ways": columns["ways"], "table": columns_table(columns)},
        "notebooks": [(stage, stem) for stage, stem in stages if (reports / "html" / f"{stem}.html").exists()],
        "figures": [(stage, f.name, f.stem) for stage, _ in stages
                    for f in sorted((reports / "figures" / stage).glob("*.png"))],
        "stage_times": stage_times(metrics, stages, budget_minutes),
        "environment": pd.Series(environment()).rename("value").rename_axis("").to_markdown()}
    template = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                                  autoescape=False).from_string(TEMPLATE)  # Markdown, not HTML: nothing to escape
    return template.render(**context)


def build(reports: str | Path, data_dir: str | Path, dvc_file: str | Path,
          params_file: str | Path | None = None) -> None:
    """Render the HTML, the plot files and the README under `reports` (each written whole);
    `params_file` gives the study's time budget (`budget_minutes`)."""
    reports = Path(reports)
    budget = (Fields("", load_params(params_file)).number("budget_minutes", lo=0, lo_open=True)
              if params_file is not None else None)
    stages = notebook_stages(dvc_file)
    missing = [stem for _, stem in stages if not (reports / "notebooks" / f"{stem}.ipynb").exists()]
    if missing:
        raise ConfigError(f"reports/notebooks: {missing[0]}.ipynb is missing (run its stage first)")
    with atomic_dir(reports / "html") as html:
        for _, stem in stages:
            render_html(reports / "notebooks" / f"{stem}.ipynb", html / f"{stem}.html")
    with atomic_dir(reports / "plots") as plots:
        plot_files(Path(data_dir), plots)
    text = readme(reports, stages, budget)
    with atomic_file(reports / "README.md") as tmp:
        tmp.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autoshard.pipeline.report", description=__doc__.split("\n")[0])
    parser.add_argument("--reports", type=Path, default=Path("reports"))
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--dvc-file", type=Path, default=Path("dvc.yaml"))
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="for `budget_minutes`")
    args = parser.parse_args(argv)
    try:
        build(args.reports, args.data, args.dvc_file, args.params)
    except ConfigError as exc:
        print(f"report: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"written": [str(args.reports / "README.md"), str(args.reports / "html"),
                                  str(args.reports / "plots")]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

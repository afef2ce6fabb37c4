"""reports/evaluate.md: the primary endpoints in full (decision, interval, chains, registration),
the headroom as bounds, the measurements' quality, then the exploratory comparisons as method x
reference tables, every method's results, the cost model's error on the evaluated plans, the
targets and the failed placements, each figure beside what it supports."""

from autoshard.pipeline.report import exploratory, primary, quality
from autoshard.pipeline.report.alltoall import comm_sources
from autoshard.pipeline.report.format import (
    Figures,
    heading,
    item,
    join,
    method_order,
    number,
    paragraph,
    percent,
    table,
)
from autoshard.pipeline.report.results import Results
from autoshard.studies.evaluate import Evaluation, Headroom

TITLE = "Evaluate: held-out tasks, measured"


def headroom_tables(evaluate: Evaluation) -> str:
    """Per protocol the bounds on what a planner could gain over cost_greedy, then what they rest on
    (predicted, on the measured single costs, measured), then each method's share of it captured."""
    room: dict[str, Headroom] = evaluate["headroom"]
    if not room:
        return "(no protocol evaluated)"
    bounds = [{"protocol": p, "tasks": str(h["tasks"]), "at least (lower)": percent(h["lower"], 2),
               "at most (upper)": percent(h["upper"], 2),
               "better reachable": "yes" if h["better_reachable"] else "**no**"}
              for p, h in room.items()]
    evidence = [{"protocol": p,
                 "greedy over best known, predicted: median (max)":
                     f"{percent(h['greedy_gap'], 2)} ({percent(h['greedy_gap_max'], 2)})",
                 "tasks above 0.5%": percent(h["greedy_gap_above_share"], 0),
                 "LPT over MILP bound (singles)": percent(h["lpt_gap"], 2),
                 "MILP optimal": percent(h["lpt_gap_optimal_share"], 0),
                 "greedy over best measured": percent(h["measured_gap"], 2),
                 "noise floor": percent(h["noise_floor"])} for p, h in room.items()]
    methods = method_order(sorted({m for h in room.values() for m in h["captured"]}))
    captured = [{"method": m, **{p: "n/a" if not number(h["captured"].get(m)) else f"{h['captured'][m]:.2f}"
                                 for p, h in room.items()}} for m in methods]
    how = [item(f"{p}: the upper bound {h['upper_why']}; the best known placement: {h['how']}; the measured best: "
                + ", ".join(f"{m} {n}" for m, n in h["measured_of"].items()) + " tasks.") for p, h in room.items()]
    return join(table(bounds), "\n".join(how), "What the bounds rest on:\n\n" + table(evidence),
                paragraph("Share of the predicted headroom each method's plan captured (median over the tasks with a "
                          "gap; 1: the best known, 0: cost_greedy's, below 0: worse than cost_greedy):"),
                table(captured))


def families_table(evaluate: Evaluation) -> str:
    """The candidate regimes searched for headroom under the cost model before any is measured."""
    entry = evaluate["families"]
    if not entry["families"]:
        return "(no candidate regimes searched: `evaluate.families.tasks` is 0)"
    rows = [{"family": f["family"], "tasks": str(f["tasks"]),
             "greedy over the best known: median (p90, max)": f"{percent(f['greedy_gap'], 2)} "
                 f"({percent(f['greedy_gap_p90'], 2)}, {percent(f['greedy_gap_max'], 2)})",
             "speed-blind greedy: median": percent(f["blind_gap"], 2) if f["speeds"] != "equal" else "-",
             "exceeds the margin": "yes" if f["exceeds_sesoi"] else "no"} for f in entry["families"]]
    kept = [f["family"] for f in entry["families"] if f["exceeds_sesoi"]]
    return join(paragraph(f"Candidate regimes, searched under the cost model before any is measured (predicted only, "
                          f"{entry['seconds']:.1f} s of search; `evaluate.families`), each held to the margin "
                          f"{entry['sesoi']:.0%}: " + (f"room for a **better** verdict in {', '.join(kept)}." if kept
                                                       else "**none exceeds it**.")), table(rows))


def device_error_line(evaluate: Evaluation) -> str:
    """Each cost model's median error on the evaluated plans' device shards, per protocol, against
    `device_error_target` where the run recorded one."""
    models = {"feature-only": evaluate.get("cost_model_device_error_median") or {},
              "hybrid": evaluate.get("hybrid_device_error_median") or {}}
    if not models["feature-only"]:
        return "This run's evaluate stage recorded no device-level error."
    target = evaluate.get("device_error_target")
    parts = []
    for name, errors in models.items():
        if not errors:
            continue
        known = [v for v in errors.values() if number(v)]
        met = "" if target is None or not known else (" - target met" if len(known) == len(errors)
                                                     and max(known) <= target else " - target not met")
        parts.append(f"{name}: " + ", ".join(f"{p} {percent(v)}" for p, v in errors.items()) + met)
    goal = "" if target is None else f" Target: at most {target:.0%} on every protocol."
    return paragraph("Device-level error on the evaluated plans (median |predicted / measured - 1| over their "
                     "non-empty devices; the prediction rests on the profile pass and the measurement on the evaluate "
                     f"pass, so the machine's change of speed between the passes is in it): {'; '.join(parts)}.{goal}")


def page(results: Results, figures: Figures) -> str | None:
    """The evaluate page's text, or None without evaluate metrics."""
    evaluate = results.evaluate
    if evaluate is None:
        return None
    shown = figures.inline
    return join(
        heading(TITLE),
        "## Primary endpoints",
        paragraph(*primary.sentences(evaluate)),
        shown("evaluate", "primary", "every task's ratio per primary endpoint (forest plot)"),
        table(primary.decision_rows(evaluate), "(no primary endpoints)"),
        "How each interval was found and what it rests on (one median per trained chain):",
        table(primary.measurement_rows(evaluate), "(no primary endpoints)"),
        "\n".join(primary.notes(evaluate)), "### Registration and amendments", "\n".join(primary.record(evaluate)),
        "## Headroom: bounds on what a planner could gain over cost_greedy",
        paragraph("Context beside the verdicts, not a gate. The lower bound is cost_greedy's predicted gap to the best "
                  "placement known (a search, so the true gap is at least this); the upper bound exists only where "
                  "something proves it."),
        headroom_tables(evaluate), families_table(evaluate),
        "## Measurement quality", quality.full(evaluate),
        "## Exploratory comparisons",
        paragraph("Each learned method and solver baseline against each reference on the same tasks, per protocol and "
                  "cost. The all-to-all in the synchronized cost: " + comm_sources(evaluate, results.profile) + "."),
        shown("evaluate", "paired", "paired ratios per method and reference"),
        exploratory.comparisons(evaluate),
        "## Every method on held-out tasks, against the best heuristic",
        shown("evaluate", "ratios", "measured ratio to the best heuristic per method and protocol"),
        exploratory.results_table(evaluate),
        shown("evaluate", "sharding_time", "sharding time against the number of tables"),
        "## Where the cost model's error enters",
        device_error_line(evaluate),
        shown("evaluate", "predicted_vs_measured", "predicted against measured bottleneck of the evaluated plans"),
        paragraph("One task, every method: per device the measured forward and backward compute and the all-to-all."),
        shown("evaluate", "device_breakdown", "one task's devices under every method"),
        "## Targets", exploratory.targets_table(evaluate),
        "## Failed placements", exploratory.failed_table(evaluate))

"""The evaluate stage's exploratory comparisons as tables: per protocol and cost, each method (rows)
against each reference (columns), paired over the same tasks; then every method's results against
the best heuristic, the targets and the failed placements."""

from autoshard.methods.registry import BEST_HEURISTIC, GREEDY, ids
from autoshard.pipeline.report.format import LEGEND, interval, join, method_order, percent, side, table
from autoshard.studies.evaluate import Evaluation, PairedComparison
from autoshard.studies.findings import SYNC_POLICY_METHODS, SYNC_REFERENCES

BLOCKS = (("paired_max_device", "compute only: the slowest device's measured compute"),
          ("paired_synchronized", "synchronized stages: the sum over DreamShard's four stages of the slowest device, "
                                  "compute plus all-to-all"))
TWIN_SHARE = 0.5  # a reference that chose another's very plan on at least this share of tasks is shown once


def cell(s: PairedComparison | None) -> str:
    if not s or s["median_ratio"] is None:
        return "n/a"
    return interval(s["median_ratio"], s["ci_low"], s["ci_high"]) + side(s["ci_low"], s["ci_high"])


def shown_once(references: tuple[str, ...], entries: dict[str, PairedComparison]) -> tuple[list[str], list[str]]:
    """`references` without those that placed exactly as an earlier one on at least TWIN_SHARE of
    the tasks, and a line naming each one left out: one baseline is not counted twice."""
    kept: list[str] = []
    notes = []
    for reference in references:
        twin = next((earlier for earlier in kept if ((entries.get(f"{reference}__vs__{earlier}") or {})
                                                     .get("identical_share") or 0.0) >= TWIN_SHARE), None)
        if twin is None:
            kept.append(reference)
            continue
        share = entries[f"{reference}__vs__{twin}"]["identical_share"]
        notes.append(f"`{reference}` placed exactly as `{twin}` on {percent(share, 0)} of the tasks: shown once, "
                     f"as `{twin}`.")
    return kept, notes


def grid(entries: dict[str, PairedComparison], methods: tuple[str, ...], references: tuple[str, ...]) -> str:
    """Method x reference: each cell the paired median ratio with its interval and where it lies."""
    present = {pair.split("__vs__")[0] for pair in entries}
    refs = [r for r in references if any(p.endswith(f"__vs__{r}") for p in entries)]
    refs, notes = shown_once(tuple(refs), entries)
    rows = [{"method": m, **{r: "-" if r == m else cell(entries.get(f"{m}__vs__{r}")) for r in refs},
             "tasks": str(max((entries[p]["tasks"] for p in entries if p.startswith(f"{m}__vs__")), default=0))}
            for m in method_order([m for m in methods if m in present])]
    return join(table(rows, "(no paired comparisons)"), "\n".join(notes))


def comparisons(evaluate: Evaluation) -> str:
    """Per cost and protocol, the learned methods and solver baselines against the references."""
    methods = (*ids("shown"), *SYNC_POLICY_METHODS)
    parts = [LEGEND]
    for key, said in BLOCKS:
        block: dict[str, dict[str, PairedComparison]] = evaluate[key]
        references = (GREEDY, *ids("reference"), BEST_HEURISTIC,
                      *(SYNC_REFERENCES if key == "paired_synchronized" else ()))
        for protocol, entries in block.items():
            parts.append(f"**{protocol}**, {said}:\n\n" + grid(entries, methods, tuple(dict.fromkeys(references))))
    return join(*parts)


def results_table(evaluate: Evaluation) -> str:
    """Per protocol, every method's measured median ratio to the best heuristic with its interval,
    win rate, mean measured bottleneck and median sharding time, under the protocol's objective."""
    parts = []
    for protocol, methods in evaluate["results"].items():
        rows = [{"method": m, "plans": str(int(r["plans"])),
                 "ratio to best heuristic [95% CI]": interval(r["ratio_median"], r["ratio_lo"], r["ratio_hi"]),
                 "win rate": percent(r["win_rate"], 0), "mean ms (measured)": f"{r['mean_ms']:.2f}",
                 "predicted ratio": f"{r['predicted_ratio_median']:.3f}",
                 "sharding s (median)": f"{r['seconds_median']:.4f}",
                 **({"gap to optimum (predicted)": percent(r.get("predicted_gap_median"), 2)}
                    if protocol == "small" else {})}
                for m, r in ((m, methods[m]) for m in method_order(list(methods)))]
        plans = max(int(r["plans"]) for r in methods.values())
        parts.append(f"**{protocol}** ({plans} tasks; bottleneck: {evaluate['objective'].get(protocol, 'max_device')})"
                     "\n\n" + table(rows))
    return join(*parts)


def targets_table(evaluate: Evaluation) -> str:
    """The evaluate stage's targets, met or not; measured and predicted in separate tables."""
    rows = [{"protocol": t["protocol"], "method": t["method"], "statistic": t["statistic"],
             "value": f"{t['value']:.3f}", "target": str(t["target"]), "met": "met" if t["met"] else "**not met**"}
            for t in evaluate["targets"]]
    measured = [r for r in rows if "predicted" not in r["statistic"]]
    predicted = [r for r in rows if "predicted" in r["statistic"]]
    return join("Measured:\n\n" + table(measured) if measured else "",
                "Predicted (cost model):\n\n" + table(predicted) if predicted else "")


def failed_table(evaluate: Evaluation) -> str:
    """Per protocol, the methods that failed to place some tasks, with how many."""
    rows = [{"protocol": protocol, "failed placements": ", ".join(f"{m}: {n}" for m, n in methods.items() if n)
             or "none: every method placed every task"} for protocol, methods in evaluate["failed"].items()]
    return table(rows, "(no placement counts)")

"""reports/transfer.md: the trained policy on other task shapes, not fine-tuned: per axis, each
point x method, beside that axis's figure."""

from autoshard.pipeline.report.format import Figures, heading, interval, join, method_order, paragraph, table
from autoshard.pipeline.report.results import Results
from autoshard.studies.transfer import Transfer, TransferPoint

TITLE = "Transfer: the policy on other task shapes, not fine-tuned"


def note(point: TransferPoint) -> str:
    bounded = point.get("bounded_share") or 0.0
    shared = point.get("shared_with")  # optional keys the metrics may carry
    return ", ".join(text for text, on in ((f"same tasks as the {shared} axis", shared),
                                          ("every method ties", point.get("trivial")),
                                          (f"largest table bounds {bounded:.0%} of tasks",
                                           not point.get("trivial") and bounded >= 0.5)) if on)


def axis_table(transfer: Transfer, axis: str) -> str:
    """Point x method: the measured median ratio to the best heuristic [95% CI], the tasks, a note."""
    methods = transfer["axes"][axis]
    names = method_order(list(methods))
    values = sorted({v for points in methods.values() for v in points}, key=float)
    rows = []
    for value in values:
        cells = {m: methods[m].get(value) for m in names}
        known = [p for p in cells.values() if p]
        rows.append({"point": f"{axis} = {float(value):g}",
                     **{m: interval(p["ratio_median"], p["ratio_lo"], p["ratio_hi"]) if p else "n/a"
                        for m, p in cells.items()},
                     "tasks": str(min(p["tasks"] for p in known)) if known else "0",
                     "note": note(known[0]) if known else ""})
    return table(rows)


def page(results: Results, figures: Figures) -> str | None:
    """The transfer page's text, or None without its metrics."""
    t = results.transfer
    if t is None:
        return None
    worst = t["rl_greedy_worst"]
    worst_text = "" if worst is None else (f" Its worst point: {worst['axis']} = {worst['value']:g}, median ratio "
                                           f"{worst['ratio_median']:.3f}.")
    parts = [heading(TITLE),
             paragraph(f"Measured median ratio to the best heuristic [95% bootstrap CI over tasks] at {t['points']} "
                       f"points ({t['tasks_measured']} tasks, {t['shards_measured']} shards measured); lower is "
                       "better. "
                       f"rl_greedy is below 1 at {t['rl_greedy_points_below_1']} of them.{worst_text} The unseen-ratio "
                       "axis is the evaluate stage's AutoShard protocol.")]
    for axis in t["axes"]:
        parts += [f"## {axis}", figures.inline("transfer", axis, f"ratio to the best heuristic along {axis}"),
                  axis_table(t, axis)]
    return join(*parts)

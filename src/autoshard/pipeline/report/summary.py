"""reports/README.md, the summary: the answer first (its bottom line, a sentence per protocol, the
forest plot, a seven-column table with the registration's record under it), then the measurements'
quality in brief, then one link per stage page. At most `MAX_LINES` lines."""

from collections.abc import Sequence

from autoshard.pipeline.report import primary, quality
from autoshard.pipeline.report.format import Figures, item, join, paragraph, table
from autoshard.pipeline.report.results import Results

MAX_LINES = 200
TITLE = "# AutoShard study: results"


def answer(results: Results, figures: Figures) -> str:
    """The first screen: the verdicts in words, the forest plot, the primary table and its record."""
    evaluate = results.evaluate
    if evaluate is None:
        return paragraph("**This run has no evaluate metrics (`reports/metrics/evaluate.json`): nothing is decided.**")
    decided = primary.endpoints(evaluate)
    if not decided:
        return paragraph("**This run declared no primary endpoints (`primary` in params.yaml): nothing is decided.**")
    first = next(iter(decided.values()))
    legend = paragraph(
        "Ratio: the method's measured bottleneck over the reference's on the same task, in the same pass; lower is "
        f"better. Verdicts over {len(decided)} pre-registered endpoints, every claim Holm-adjusted as one family at "
        f"{first['alpha']:g}, margin ±{first['sesoi']:.0%}: the per-task value is the mean over trained chains of the "
        "log ratio, its interval a bootstrap over chains and tasks. Chains' medians: the lowest and highest trained "
        "chain's median ratio (how many chains). The interval is the endpoint's own 95%; the verdict is adjusted over "
        "every claim of the family, so an interval inside the margin can still be inconclusive. "
        "[Every column, the headroom and the exploratory comparisons]"
        "(evaluate.md).")
    room = [primary.bound_line(p, h) for p, h in evaluate["headroom"].items() if p in primary.protocols(evaluate)]
    return join(paragraph(primary.bottom_line(evaluate)), paragraph(*primary.sentences(evaluate)),
                figures.inline("evaluate", "primary", "every task's ratio per primary endpoint (forest plot)"),
                table(primary.short_rows(evaluate)), legend, "\n".join(primary.record(evaluate)),
                "Headroom, predicted under the cost model (context beside the verdicts, not a gate):\n\n"
                + "\n".join(item(line + ".") for line in room) if room else "")


def page(results: Results, figures: Figures, pages: Sequence[tuple[str, str, str]]) -> str:
    """The summary's text; `pages` is (file, title, what it holds) of each stage page written."""
    measured = ("## Measurement quality\n\n" + "\n".join(quality.brief(results.evaluate, results.profile))
                if results.evaluate is not None else "")
    links = "## The stages, one page each\n\n" + "\n".join(
        item(f"[{title}]({file}): {what}") for file, title, what in pages)
    notebooks = [stem for _, stem in results.stages if (results.reports / "html" / f"{stem}.html").exists()]
    rendered = ("The executed notebooks, rendered: " + ", ".join(f"[{stem}](html/{stem}.html)" for stem in notebooks)
                + ".") if notebooks else ""
    return join(TITLE, answer(results, figures), measured, links, paragraph(rendered))

"""reports/columns.md: column-wise sharding against table-wise, like with like: per protocol each
column-wise method against its table-wise twin, paired, beside the per-task figure."""

from autoshard.pipeline.report.format import LEGEND, Figures, heading, interval, join, paragraph, percent, side, table
from autoshard.pipeline.report.results import Results
from autoshard.studies.columns import Columns

TITLE = "Columns: column-wise sharding against table-wise"


def protocol_table(columns: Columns, protocol: str) -> str:
    """Method x its twin on one protocol: the paired ratio, where its interval lies, splits."""
    return table([{"column-wise method": method, "table-wise twin": c["twin"], "tasks": str(c["tasks"]),
                   "ratio to the twin": interval(c["median_ratio"], c["ci_low"], c["ci_high"])
                   + side(c["ci_low"], c["ci_high"]),
                   "tasks split": percent(c["split_share"], 0), "identical plans": percent(c["identical_share"], 0),
                   "largest table / bottleneck": f"{c['bound_share_median']:.2f}"}
                  for method, c in columns["protocols"][protocol].items()], "(no column-wise results)")


def page(results: Results, figures: Figures) -> str | None:
    """The columns page's text, or None without its metrics."""
    c = results.columns
    if c is None:
        return None
    parts = [heading(TITLE),
             paragraph(f"Tables split into {', '.join(map(str, c['ways']))} column shards where the planner chooses "
                       "to; each column-wise method's measured bottleneck over its table-wise twin's (the same planner "
                       f"on the same task with every table whole), per task, paired, in one pass "
                       f"(`{c['measuring_pass']}`, {c['shards_measured']} shards). \"Largest table / bottleneck\": "
                       "the median share of the twin's "
                       "bottleneck the costliest table alone takes (near 1, splitting is the only way down)."),
             LEGEND, figures.inline("columns", "paired", "column-wise over table-wise per task")]
    for protocol in c["protocols"]:
        parts += [f"## {protocol} ({c['tasks'].get(protocol, 0)} tasks)", protocol_table(c, protocol)]
    return join(*parts)

"""reports/synthesize.md: the table pool and the tasks drawn from it, the reuse calibration against
the published statistics beside its figure, and the wide pool's ranges."""

from autoshard.pipeline.report.format import Figures, heading, join, paragraph, percent, table
from autoshard.pipeline.report.results import Results

TITLE = "Synthesize: the table pool and the tasks"
GIB = 2**30


def page(results: Results, figures: Figures) -> str | None:
    """The synthesize page's text, or None without its metrics."""
    s = results.synthesize
    if s is None:
        return None
    pool = [{"source": s["source"], "tables": str(s["tables"]), "bags per table": str(s["batch_size"]),
             "lookups per bag (mean)": f"{s['lookups_per_bag']:.1f}", "indices": f"{s['indices']:,}",
             "distinct rows": f"{s['distinct']:,}", "pool": f"{s['pool_bytes'] / GIB:.2f} GiB",
             "largest table": f"{s['largest_table_bytes'] / GIB:.3f} GiB"}]
    reuse = [{"uses of a row in a batch": bucket, "share of lookups": percent(share)}
             for bucket, share in s["reuse_share"].items()]
    tasks = [{"protocol and split": name, "tasks": str(n)} for name, n in s["tasks"].items()]
    wide = s.get("wide")
    wide_text = "" if not wide else paragraph(
        f"The wide pool (`wide`): {wide['tables']} tables ({wide['train_tables']} for training), dims "
        f"{', '.join(map(str, wide['dims']))}, hash sizes {wide['rows'][0]:,} to {wide['rows'][1]:,}, mean lookups "
        f"per bag {wide['lookups_per_bag'][0]:.2f} to {wide['lookups_per_bag'][1]:.1f}, largest table "
        f"{wide['largest_table_bytes'] / GIB:.3f} GiB.")
    return join(heading(TITLE), table(pool),
                "## Reuse against the published statistics",
                paragraph(f"L1 distance of the pool's reuse shares from the published ones: "
                          f"{s['reuse_l1_to_published']:.3f} (0: identical, 2: disjoint)."),
                figures.inline("synthesize", "reuse_vs_published", "reuse shares against the published ones"),
                table(reuse),
                "## The pool's distributions",
                figures.inline("synthesize", "pool_distributions",
                               "hash sizes, dims, pooling and skew across the pool"),
                "## Tasks", table(tasks), wide_text)

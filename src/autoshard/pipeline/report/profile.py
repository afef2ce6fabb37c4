"""reports/profile.md: what was measured and how well (repeatability against the CV target, the
timing protocols side by side), the fusion gap, the backends' agreement, and the comm model, each
beside its figure."""

from autoshard.pipeline.report.alltoall import comm_model_lines
from autoshard.pipeline.report.format import Figures, heading, join, paragraph, percent, ratio, table
from autoshard.pipeline.report.quality import profile_line
from autoshard.pipeline.report.results import Results

TITLE = "Profile: shards measured on this machine"


def page(results: Results, figures: Figures) -> str | None:
    """The profile page's text, or None without its metrics."""
    p = results.profile
    if p is None:
        return None
    shown = figures.inline
    kinds = ", ".join(f"{kind} {n}" for kind, n in p["shards_by_kind"].items())
    checks = [{"protocol": name, "shards": str(s["shards"]),
               "pass-to-pass change (median)": percent(s["pass_change_median"]),
               "CV within a pass (median)": percent(s["within_pass_cv_median"]),
               "cost over the former protocol": ratio(s.get("cost_ratio_to_former")), "seconds": f"{s['seconds']:.1f}"}
              for block in ("protocol_check", "feeds_check") for name, s in (p.get(block) or {}).items()]
    harness = [{"pass": name, **{k: ratio(v) for k, v in entry.items()}} for name, entry in p["harness_check"].items()]
    lo, hi = p["fused_over_sum_p10_p90"]
    comm = [paragraph(line) for line in comm_model_lines(p) if line] if p.get("comm") else [
        "This run fitted no comm model."]
    return join(heading(TITLE),
                paragraph(f"{p['shards_measured']} shards measured ({kinds}; {p['shards_unmeasurable']} too large to "
                          f"measure) with the {p['backend']} backend on {p['device']}, {p['threads']} thread(s), "
                          f"{p['batch_size']} bags per batch; peak memory {p['peak_rss_gib']:.2f} GiB."),
                "## Repeatability", profile_line(p),
                paragraph(f"Across separate passes: median CV {percent(p['median_cv'])} against the target "
                          f"{p['cv_target']:.0%} ({'met' if p['cv_target_met'] else '**not met**'}; "
                          f"{p['rounds_for_cv_target']} round(s) would reach it)."),
                shown("profile", "repeatability", "each shard's CV across rounds"),
                "Timing protocols and feeds measured side by side:", table(checks, "(no protocol check in this run)"),
                "Our timing against FBGEMM's own benchmark harness (ms):", table(harness),
                "## Single tables", shown("profile", "single_table_costs", "single-table cost against lookups x dim"),
                "## Fused cost is not the sum of single costs",
                paragraph("Fused cost over the sum of the tables' single costs: median "
                          f"{ratio(p['fused_over_sum_median'])} "
                          f"(p10 {ratio(lo)}, p90 {ratio(hi)})."),
                shown("profile", "fusion_gap", "fused over summed cost against shard size"),
                "## Backends against each other",
                paragraph("The pure-torch backend over FBGEMM on the same shards: median "
                          f"{ratio(p['torch_over_fbgemm_median_ratio'])}, "
                          f"Kendall tau {ratio(p['torch_fbgemm_kendall_tau'])}; the fused pure-torch backend "
                          f"{ratio(p['torch_fused_over_fbgemm_median_ratio'])}, "
                          f"tau {ratio(p['torch_fused_fbgemm_kendall_tau'])}."),
                shown("profile", "fbgemm_vs_torch", "torch against FBGEMM per shard"),
                shown("profile", "fbgemm_vs_torch_fused", "fused torch against FBGEMM per shard"),
                "## The four stages of a placement", shown("profile", "device_stages", "one plan's stages per device"),
                "## Communication model against held-out placements", *comm,
                shown("profile", "comm_model", "comm model against measured all-to-alls"))

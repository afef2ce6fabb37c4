"""reports/ablation.md: each part of the method retrained without it, the measured ratio per
variant across seeds beside its figure."""

from autoshard.pipeline.report.format import Figures, heading, join, number, paragraph, table
from autoshard.pipeline.report.results import Results
from autoshard.studies.ablation import Ablation

TITLE = "Ablation: each part of the method, retrained without it"


def ablation_table(ablation: Ablation) -> str:
    """Per variant: the mean over seeds of the measured median ratio to the best heuristic, its
    spread across seeds, the change against the full method and its Holm-adjusted p-value."""
    def num(value: object, fmt: str) -> str:
        return format(value, fmt) if number(value) else "n/a"

    return table([{"variant": v["label"], "ratio (mean of seeds)": num(v["mean"], ".3f"),
                   "std across seeds": num(v["std"], ".3f"),
                   "range": f"[{num(v['min'], '.3f')}, {num(v['max'], '.3f')}]",
                   "vs full method": num(v.get("vs_full"), "+.3f"), "p (Holm)": num(v.get("p_holm"), ".3g")}
                  for v in ablation["variants"]])


def page(results: Results, figures: Figures) -> str | None:
    """The ablation page's text, or None without its metrics."""
    a = results.ablation
    if a is None:
        return None
    return join(heading(TITLE),
                paragraph(f"Short runs ({a['iterations']} iterations), seeds {', '.join(map(str, a['seeds']))}, "
                          f"{a['test_tasks']} test tasks ({', '.join(a['protocols'])}); per seed the measured median "
                          "ratio to the best heuristic, measured in the ablation's own pass, then its mean and spread "
                          "across seeds. A change smaller than the spread is not a finding."),
                figures.inline("ablation", "ratios", "measured ratio per variant and seed"), ablation_table(a),
                "## Retraining", figures.inline("ablation", "training", "each variant's training curve"))

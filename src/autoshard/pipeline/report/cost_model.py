"""reports/cost_model.md: every estimator's error on held-out shards (estimator x test set), the
neural model against its targets and a re-measurement, the hybrid's form and active selection, the
wide pool by dim, each beside its figure."""

from autoshard.costmodel.accuracy import CostModelScores
from autoshard.costmodel.dataset import UNSEEN_MULTI
from autoshard.measure.analysis import Profile
from autoshard.pipeline.report.format import Figures, heading, join, number, paragraph, percent, ratio, table
from autoshard.pipeline.report.results import Results

TITLE = "Cost model: predicted against measured shard costs"
WIDE_SET = UNSEEN_MULTI  # the wide pool's test set shown by dim


def comparison_table(c: CostModelScores) -> str:
    """Estimator x test set: MAPE (and R2, Kendall tau among similar-size shards) on held-out shards."""
    rows: dict[str, dict[str, str]] = {}
    for key, s in c["comparison"].items():
        estimator, test_set = key.split(" | ")
        rows.setdefault(estimator, {"estimator": estimator})[test_set] = (
            f"{percent(s['mape'])} (R2 {ratio(s['r2'], 2)}, tau {ratio(s['tau_similar_size'], 2)})")
    return table(list(rows.values()))


def floor_line(c: CostModelScores) -> str:
    """The models' MAPE on the seen-table test shards measured twice beside the pass-to-pass MAPE
    there, and what a noise-free model would score (that over sqrt 2, passes equally noisy)."""
    floor = c.get("measurement_floor")
    if floor is None:
        return "This run measured no shard twice (`profile.collect.remeasure` off): no measurement floor."
    if not floor["shards"]:
        return "The profile measured no seen-table test shard twice (`profile.collect.remeasure`): no floor."
    rescaled = floor.get("pass_to_pass_mape_rescaled")
    base = rescaled if rescaled is not None else floor["pass_to_pass_mape"]
    models = "; ".join(f"{name} {percent(value)} ({percent(floor['mape_vs_mean'].get(name))} against the mean of the "
                       "two passes)" for name, value in floor["mape_vs_main"].items())
    return paragraph(
        f"On the {floor['shards']} seen-table test shards measured in both profile passes, MAPE against the main pass: "
        f"a re-measurement (the second pass as the prediction) {percent(floor['pass_to_pass_mape'])} "
        f"({percent(rescaled)} once the passes' overall change of speed is divided out); a noise-free model would "
        f"score about {percent(None if base is None else base / 2**0.5)} if the two passes are equally and "
        f"independently noisy, and none can be shown better; {models}.")


def hybrid_label(profile: Profile | None) -> str:
    """What the hybrid's numbers measure: it reads every table's measured single cost."""
    singles = (profile or {}).get("shards_by_kind", {}).get("single")
    seconds = (profile or {}).get("seconds")
    cost = "" if singles is None else (f" (here {singles} single-table measurements, part of the profile stage's "
                                       f"{seconds / 60:.1f} min)" if seconds else f" (here {singles})")
    return paragraph("The hybrid model (and `hybrid_greedy`) reads each table's measured single cost: every table is "
                     f"profiled alone first{cost}. Its error on \"unseen\" tables measures profiling plus a learnt "
                     "fusion factor, not generalisation to tables never measured; the feature-only model is the one "
                     "that has not seen them.")


def architecture_table(c: CostModelScores) -> str:
    """What the hybrid's form adds beyond the single costs it reads, at equal data."""
    h = c.get("hybrid") or {}
    if h.get("informed_mape_seen") is None or h.get("equal_data_hybrid_mape_seen") is None:
        return ""
    rows = [{"model, at equal data": name, "seen tables": percent(h.get(f"{key}_seen")),
             "unseen tables": percent(h.get(f"{key}_unseen"))}
            for name, key in (("the hybrid", "equal_data_hybrid_mape"),
                              ("AutoShard's architecture given the single costs", "informed_mape"),
                              ("the feature-only model, without them", "feature_only_mape"))]
    return "What the hybrid's form adds (MAPE on multi-table shards, the profile's training shards):\n\n" + table(rows)


def active_table(c: CostModelScores) -> str:
    """The hybrid's active selection: each arm's MAPE (mean ± sd over fits) and the paired
    differences, "lower error" or "higher error" only when the interval excludes 0, p < 0.05 and the
    difference exceeds either arm's spread over fits (exploratory: no verdict)."""
    a = c.get("active")
    if a is None:
        return ("This run's cost_model stage measured no shards for the hybrid beyond the profile's "
                "(`cost_model.active`).")
    arms = [{"arm": name, **{k: f"{percent(a['mape'][name][k])} ± {percent(a['mape_sd'][name][k])}"
                             for k in ("seen", "unseen")}} for name in a["mape"]]
    diffs = []
    for key, d in a["paired"].items():
        pair, test_set = key.split(" | ")
        known = all(number(d[k]) for k in ("difference", "ci_low", "ci_high", "p_value"))
        spread = max(a["mape_sd"][arm].get(test_set) or 0.0 for arm in pair.split(" - "))
        shown = known and d["p_value"] < 0.05 and (d["ci_high"] < 0 or d["ci_low"] > 0)
        word = ("n/a" if not known else "no difference shown" if not shown else "within the fits' spread"
                if abs(d["difference"]) <= spread else "lower error" if d["difference"] < 0 else "higher error")
        diffs.append({"difference": pair, "test set": test_set, "points [95% CI]": "n/a" if not known else
                      f"{d['difference'] * 100:+.1f} [{d['ci_low'] * 100:+.1f}, {d['ci_high'] * 100:+.1f}]",
                      "p": "n/a" if not known else f"{d['p_value']:.3f}", "shards": str(d["shards"]), "reading": word})
    return join(paragraph(f"Active selection: {a['shards_measured']} more train-table shards measured for the hybrid, "
                          f"{a['rounds']} rounds of {a['shards_per_round']} per arm from {a['candidates']} candidates; "
                          f"MAPE mean ± sd over {a['seeds']} fits (active: where a {a['ensemble']}-model ensemble is "
                          "least sure; uniform: as many drawn at random)."), table(arms), table(diffs))


def wide_table(c: CostModelScores) -> str:
    """Each estimator's MAPE on the wide pool's unseen-table shards, in all and by widest dim."""
    wide = c.get("wide")
    if not wide or not wide["error_by_dim"]:
        return ""
    dims = [str(d) for d in wide["dims"]]
    counts = next(iter(wide["error_by_dim"].values())).get(WIDE_SET, {})
    every = f"all ({sum(g['shards'] for g in counts.values())})"
    rows = [{"estimator": name, every: percent(wide["mape"][name].get(WIDE_SET)),
             **{f"dim {d} ({counts[d]['shards']})": percent(groups[WIDE_SET][d]["mape"]) for d in dims if d in counts}}
            for name, groups in wide["error_by_dim"].items() if WIDE_SET in groups]
    return join("## The wide pool: the dims of real models",
                paragraph(f"MAPE on shards of the wide pool's unseen tables (dims {', '.join(dims)}), in all and by "
                          "the dim of each shard's widest table (shards in parentheses)."), table(rows))


def page(results: Results, figures: Figures) -> str | None:
    """The cost_model page's text, or None without its metrics."""
    c = results.cost_model
    if c is None:
        return None
    shown = figures.inline
    targets = [{"test set": k, "neural MAPE": percent(c["neural_mape"].get(k)), "target": f"{t:.0%}",
                "met": "met" if c["targets_met"].get(k) else "**not met**"} for k, t in c["mape_targets"].items()]
    return join(heading(TITLE),
                paragraph(f"Shards: {', '.join(f'{k} {n}' for k, n in c['shards'].items())}; best epoch "
                          f"{c['best_epoch']}; 10,000 shards predicted in {c['predict_10k_shards_seconds']:.3f} s."),
                shown("cost_model", "training", "training and validation loss"),
                "## Every estimator on held-out shards", comparison_table(c),
                shown("cost_model", "predicted_vs_measured", "predicted against measured cost per test shard"),
                table(targets), shown("cost_model", "error_by_size", "error by shard size"),
                "## Against a re-measurement", floor_line(c),
                "## The hybrid", hybrid_label(results.profile), architecture_table(c), active_table(c),
                "## How much profiling is enough",
                shown("cost_model", "learning_curve", "error against training shards"),
                wide_table(c))

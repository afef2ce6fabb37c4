"""The pre-registered primary endpoints in words and tables: the summary's sentences and short
table, and the evaluate page's full tables, registration record and headroom bounds."""

from autoshard.pipeline.report.format import interval, item, number, percent, ratio
from autoshard.studies.endpoints import MOSTLY_IDENTICAL, entries
from autoshard.studies.evaluate import Amendment, Evaluation, Headroom, PrimaryEndpoint, Registration

WORDS = {"better": "better than", "worse": "worse than", "equivalent": "equivalent to",
         "inconclusive": "inconclusive against"}


def endpoints(evaluate: Evaluation) -> dict[str, PrimaryEndpoint]:
    """The endpoints of `primary`, without its registration record (`registered`, `amendments`)."""
    return entries(evaluate["primary"])


def registration(evaluate: Evaluation) -> Registration | None:
    return evaluate["primary"].get("registered")


def amendments(evaluate: Evaluation) -> list[Amendment]:
    return evaluate["primary"].get("amendments") or []


def protocols(evaluate: Evaluation) -> list[str]:
    """The protocols the endpoints are declared on, in their order."""
    return list(dict.fromkeys(e["protocol"] for e in endpoints(evaluate).values()))


def mostly_identical(e: PrimaryEndpoint) -> bool:
    """The verdict rests mostly on identical plans, not on measurement."""
    return number(e["identical_share"]) and e["identical_share"] > MOSTLY_IDENTICAL


def spread(e: PrimaryEndpoint) -> str:
    """The trained chains' medians, lowest to highest ("0.978-1.020")."""
    medians = e["replicate_medians"]
    return f"{min(medians):.3f}-{max(medians):.3f}" if medians else "n/a"


def chains(count: int) -> str:
    return "one trained chain" if count == 1 else f"{count} trained chains"


def verdict_cell(e: PrimaryEndpoint) -> str:
    word = f"**{e['verdict']}**"
    return f"{word}, mostly on identical plans" if mostly_identical(e) else word


def bottom_line(evaluate: Evaluation) -> str:
    """The answer in one sentence: how many endpoints, over how many chains, and how they came out."""
    decided = list(endpoints(evaluate).values())
    counts = {word: sum(e["verdict"] == word for e in decided) for word in ("better", "worse", "equivalent",
                                                                            "inconclusive")}
    chained = sorted({e["replicates"] for e in decided})
    over = chains(chained[0]) if len(chained) == 1 else f"{chained[0]} to {chained[-1]} trained chains"
    better = [f"{e['method']} over {e['reference']} ({e['protocol']})" for e in decided if e["verdict"] == "better"]
    head = (f"**Better than its reference: {', '.join(better)}.**" if better else
            "**No learned method is better than its reference on any pre-registered endpoint.**")
    return (f"{head} Of {len(decided)} endpoints over {over}: {counts['better']} better, {counts['worse']} worse, "
            f"{counts['equivalent']} equivalent (within the margin), {counts['inconclusive']} inconclusive.")


def p_cell(p: float | None) -> str:
    """A Holm-adjusted p-value as the table shows it: the metrics file keeps 6 decimals, so 0 there
    is below 1e-6, not nought."""
    return "n/a" if p is None else "< 1e-6" if p == 0 else f"{p:.3g}"


def sentences(evaluate: Evaluation) -> list[str]:
    """One sentence per protocol: over how many trained chains and tasks, each endpoint's verdict in
    words with its median ratio and interval."""
    out = []
    for protocol in protocols(evaluate):
        group = [e for e in endpoints(evaluate).values() if e["protocol"] == protocol]
        counts = sorted({e["replicates"] for e in group})
        claims = [f"{e['method']} is {WORDS.get(e['verdict'], e['verdict'])} {e['reference']} "
                  f"({'median ratio ' if i == 0 else ''}{interval(e['median_ratio'], e['ci_low'], e['ci_high'], 2)})"
                  for i, e in enumerate(group)]
        listed = claims[0] if len(claims) == 1 else ", ".join(claims[:-1]) + " and " + claims[-1]
        who = chains(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]} trained chains"
        out.append(f"Across {who} and {max(e['tasks'] for e in group)} {protocol} tasks, {listed}.")
    return out


def short_rows(evaluate: Evaluation) -> list[dict]:
    """The summary's primary table: seven columns (the rest on the evaluate page)."""
    return [{"method / reference": f"{e['method']} / {e['reference']}", "protocol": e["protocol"],
             "verdict": verdict_cell(e),
             "median ratio [interval]": interval(e["median_ratio"], e["ci_low"], e["ci_high"]),
             "chains' medians": f"{spread(e)} ({e['replicates']})",
             "p (Holm)": p_cell(e["p_holm"]),
             "identical plans": percent(e["identical_share"], 0)} for e in endpoints(evaluate).values()]


def decision_rows(evaluate: Evaluation) -> list[dict]:
    """The evaluate page's first primary table: each endpoint's decision and what it rests on."""
    return [{"method / reference": f"{e['method']} / {e['reference']}", "protocol": e["protocol"], "cost": e["cost"],
             "verdict": verdict_cell(e), "median ratio [interval]": interval(e["median_ratio"], e["ci_low"],
                                                                             e["ci_high"]),
             "p (Holm)": p_cell(e["p_holm"]), "sesoi": f"{e['sesoi']:g}",
             "tasks": str(e["tasks"]), "failed": str(e["failed"])} for e in endpoints(evaluate).values()]


def measurement_rows(evaluate: Evaluation) -> list[dict]:
    """The evaluate page's second primary table: how each interval was found and what it is made of."""
    return [{"method / reference": f"{e['method']} / {e['reference']}", "protocol": e["protocol"],
             "interval": e["interval"], "resamples": str(e["resamples"]),
             "MC error of the ends": "n/a" if e["mc_error"] is None else f"{e['mc_error']:.4f}",
             "chains' medians": ", ".join(ratio(m) for m in e["replicate_medians"]),
             "identical plans": percent(e["identical_share"], 0), "pass": str(e.get("pass"))}
            for e in endpoints(evaluate).values()]


def notes(evaluate: Evaluation) -> list[str]:
    """The endpoints' notes (identity that decides, chains on both sides of a margin), one item each."""
    return [item(f"{e['method']} / {e['reference']} on {e['protocol']}: {e['note']}.")
            for e in endpoints(evaluate).values() if e.get("note")]


def record(evaluate: Evaluation) -> list[str]:
    """The registration and every amendment since, one list item each (printed under the table)."""
    registered, changes = registration(evaluate), amendments(evaluate)
    if registered is None:
        return ["**No registration on record (`primary.registered` in params.yaml): these endpoints were not "
                "pre-registered.**"]
    head = (f"Registered at commit {registered['commit']} on {registered['date']}; "
            + (f"{len(changes)} amendment{'s' if len(changes) != 1 else ''} since:" if changes
               else "no amendment since."))
    return [head, "", *(item(f"{a['date']} ({a['commit']}; results {'seen' if a['results_seen'] else 'not seen'}): "
                             f"{a['change']}. Why: {a['why']}.") for a in changes)]


def bound_line(protocol: str, h: Headroom) -> str:
    """One protocol's headroom as bounds: at least `lower` available under the cost model, at most
    `upper` (or why there is no upper bound), and whether "better" was out of reach."""
    upper = (f"at most {percent(h['upper'])} ({h['upper_why']})" if number(h["upper"])
             else f"no upper bound ({h['upper_why']})")
    reach = "" if h["better_reachable"] else "; the upper bound lies below the margin, so **better** was out of reach"
    return f"{protocol}: at least {percent(h['lower'])} available over cost_greedy under the cost model, {upper}{reach}"

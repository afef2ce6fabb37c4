"""The measurements' quality: in brief for the summary, in full for the evaluate page; in bold
wherever the run is noisier than its targets allow."""

from autoshard.measure.analysis import Profile
from autoshard.pipeline.report.format import number, paragraph, percent
from autoshard.studies.evaluate import Evaluation, ReferenceChoice


def brief(evaluate: Evaluation, profile: Profile | None) -> list[str]:
    """Two lines: the evaluate pass's noise against its targets and the profile's against its CV
    target, each linking to its page."""
    noise = evaluate["noise"]
    state = "within its targets" if noise["met"] else "**noisier than its targets**"
    lines = [paragraph(f"Evaluate pass {state}: shard CV across rounds {percent(noise['median_cv'])} (target "
                       f"{noise['targets']['median_cv']:.0%}); a plan measured again in another pass moved "
                       f"{percent(noise['plan_repeat_change'])} (target {noise['targets']['plan_repeat_change']:.0%}; "
                       "never divided into these ratios). [Details](evaluate.md#measurement-quality).")]
    if profile is not None:
        lines += ["", profile_line(profile) + " [Details](profile.md)."]
    return lines


def profile_line(profile: Profile) -> str:
    """The profile's noise (what the cost model learnt from) against its CV target, bold when above."""
    noise, target = profile["noise"], profile["cv_target"]
    text = (f"profile (the cost model's data): median CV of a shard across interleaved rounds "
            f"{percent(noise.get('median_cv'))} (target {target:.0%}); drift between rounds "
            f"{percent(noise.get('round_drift'))} (median over chunks); {percent(noise.get('remeasured_share'))} of "
            "chunks measured again because the machine drifted.")
    cv = noise.get("median_cv")
    noisy = not number(cv) or cv > target
    return paragraph(f"**Profile noise above its target:** {text}" if noisy else f"Profile noise: {text}")


def selection_line(reference: dict[str, ReferenceChoice]) -> str:
    """How the best heuristic was chosen and how much choosing it on the pass's own measurements
    would have flattered it."""
    parts = [f"{protocol} {entry['oracle_over_chosen_median']:+.1%} ({entry['tasks_differing']} of "
             f"{entry['tasks']} tasks differ)" for protocol, entry in reference.items()
             if number(entry["oracle_over_chosen_median"])]
    if not parts:
        return ""
    chooser = next(iter(reference.values()))["chosen_by"]
    return (f"The best heuristic of a task is chosen on `{chooser}` (the cost model's prediction) and scored on "
            "this pass; the lowest of its measurements instead would have lowered the reference by (median of "
            f"lowest / chosen - 1, compute only): {', '.join(parts)}.")


def full(evaluate: Evaluation) -> str:
    """The evaluate pass's measurement quality in full: CV, repeat pass, drift, re-measured share,
    the measured all-to-alls and the reference's selection."""
    noise = evaluate["noise"]
    facts = (f"Median CV of a shard across interleaved rounds {percent(noise['median_cv'], 2)} (target "
             f"{noise['targets']['median_cv']:.0%}); a plan measured again in a separate pass moved "
             f"{percent(noise['plan_repeat_change'], 2)} (median, target {noise['targets']['plan_repeat_change']:.0%}; "
             f"{percent(noise['plan_repeat_change_calibrated'], 2)} once each pass's calibration-shard time is "
             "divided out, i.e. without the machine's overall change of speed between the passes); drift between "
             f"rounds {percent(noise['round_drift'], 2)} (median over tasks); {percent(noise['remeasured_share'], 2)} "
             "of tasks measured again because the machine drifted.")
    comm = noise.get("comm_plans")
    if comm:
        facts += (f" Measured all-to-alls ({comm} plans): median CV of a device's all-to-all time across rounds "
                  f"{percent(noise.get('comm_round_cv'), 2)}.")
    head = ("Within the targets." if noise["met"] else
            "**This run is noisier than its targets: a difference smaller than the noise below is not a finding, "
            "and the run should be repeated on a quieter machine.**")
    return paragraph(head, facts, selection_line(evaluate["reference"]))

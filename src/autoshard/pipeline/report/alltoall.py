"""The all-to-all in words: where each protocol's came from (the evaluate page) and how well the
comm model fitted on measured all-to-alls predicts held-out placements (the profile page)."""

from autoshard.measure.analysis import Profile
from autoshard.measure.commmodel import CommMetrics
from autoshard.pipeline.report.format import percent
from autoshard.studies.evaluate import Evaluation

COMM_SOURCES = {"measured": "the all-to-all measured across one process per device",
                "measured-oversubscribed": "the all-to-all measured across more processes than cores: "
                                           "oversubscribed, mostly scheduling",
                "measured-model": "the comm model at a device count it was fitted on",
                "oversubscribed-model": "the comm model at a device count it was fitted on, from oversubscribed "
                                        "timings (more processes than cores)",
                "extrapolated-model": "the comm model extrapolated to another device count",
                "analytic": "TorchRec's analytic all-to-all estimate"}


def units(device: str | None) -> str:
    """What one process per device needs of its own: a GPU on CUDA, else a core."""
    return "GPUs" if (device or "cpu").startswith("cuda") else "cores"


def crowded(world: int | str, limit: int, device: str | None) -> str:
    """How an oversubscribed all-to-all was measured, in words."""
    return f"measured across {world} processes on {limit} {units(device)}: oversubscribed, mostly scheduling"


def oversubscribed_counts(comm: CommMetrics) -> list[int]:
    """The measured device counts above the honest limit (none in metrics that predate it)."""
    limit = comm.get("honest_limit")
    return [] if limit is None else [w for w in comm["device_counts"] if w > limit]


def comm_sources(evaluate: Evaluation, profile: Profile | None = None) -> str:
    """Where each protocol's all-to-all came from (`comm_source`), in words; with the profile's
    comm metrics, an oversubscribed measurement names its processes and cores."""
    comm = (profile or {}).get("comm")
    over = oversubscribed_counts(comm) if comm else []
    words = dict(COMM_SOURCES)
    if comm and over:
        words["measured-oversubscribed"] = "the all-to-all " + crowded(" or ".join(map(str, over)),
                                                                     comm["honest_limit"], profile["device"])
    by_source: dict[str, list[str]] = {}
    for protocol, source in evaluate.get("comm_source", {}).items():
        by_source.setdefault(source, []).append(protocol)
    return "; ".join(f"{words.get(source, source)} ({', '.join(protocols)})"
                     for source, protocols in by_source.items()) or "the all-to-all (source not recorded)"


def comm_model_lines(profile: Profile) -> list[str]:
    """The comm model (`profile.json` `comm`): which device counts were measured honestly (one
    process per core or GPU) and why, the held-out MAPE target's verdict on them with the
    measurement floor beside it, each oversubscribed count labelled so, and the pooled figures."""
    comm = profile["comm"]
    by_world, target = comm["mape_heldout_by_world"], comm["mape_target"]
    met = "met" if comm["mape_target_met"] else "**not met**"
    counts = ", ".join(map(str, comm["device_counts"]))
    lines = [f"{comm['placements']} random placements per device count ({counts}), their forward and backward "
             f"all-to-all measured with one torchrun process per device; {comm['heldout_share']:.0%} held out."]
    limit, honest, unit = comm["honest_limit"], comm["honest_device_counts"], units(profile["device"])
    lines += ["", f"Honest device counts: {', '.join(map(str, honest)) or 'none'}. This machine lets the "
                  f"stage use {limit} {unit}, so a launch of at most {limit} processes runs one per "
                  f"{unit[:-1]}; above that the ranks wait for a {unit[:-1]} and the times mostly measure "
                  "scheduling (oversubscribed)."]
    if comm["mape_heldout_honest"] is None:
        why = comm.get("mape_target_note") or "the honest counts' MAPE is not a finite number"
        lines += ["", f"Held-out MAPE target ({target:.0%}) {met}: {why}."]
    else:
        floor, noise_free = comm.get("mape_floor_honest"), comm.get("mape_noise_free_honest")
        floor_text = "" if floor is None or noise_free is None else (
            f"; one round of a held-out placement against the median of its other rounds scores {percent(floor)}, "
            f"so a noise-free model would score about {percent(noise_free)} against the "
            f"median of {comm['rounds']} rounds (rounds independently and normally noisy), and none can be shown "
            "better")
        lines += ["", f"Held-out MAPE over the honest counts {percent(comm['mape_heldout_honest'])} "
                      f"(target {target:.0%}): {met}{floor_text}."]
    for world in oversubscribed_counts(comm):
        lines += ["", f"Oversubscribed, {world} devices: held-out MAPE {percent(by_world.get(str(world)))} "
                      f"({crowded(world, limit, profile['device'])}; not judged against the target)."]
    lines += ["", f"Pooled over all counts {percent(comm['mape_heldout'])}; the fit across counts alone (what "
                  f"extrapolation to unmeasured counts uses) {percent(comm['mape_heldout_across'])}."]
    return lines

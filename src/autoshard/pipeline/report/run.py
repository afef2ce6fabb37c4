"""reports/run.md: the wall time each stage recorded against the study's budget, where the study
ran (CPU, GPU, library versions), and the rendered notebooks."""

import os
import platform

from autoshard.core.schema import StageTime, read_checked
from autoshard.pipeline.report.format import Figures, heading, join, paragraph, table
from autoshard.pipeline.report.results import Results

TITLE = "The run: wall time and environment"


def stage_times(results: Results) -> str:
    """The wall time each notebook stage recorded against its share of `budget_minutes`
    (`budget_shares`), and their sum against the whole."""
    rows = []
    for stage, _ in results.stages:
        path = results.reports / "metrics" / f"{stage}.json"
        if path.exists():
            rows.append((stage, read_checked(path, StageTime)["seconds"]))
    total = sum(seconds for _, seconds in rows)
    budget, held = results.budget_minutes, results.budget_shares

    def row(stage: str, seconds: float, share: float | None) -> dict:
        out = {"stage": stage, "wall time (s)": f"{seconds:.0f}"}
        if budget is not None and held:
            out["its share (s)"] = "-" if share is None else f"{share * budget * 60:.0f}"
            out["within"] = "-" if share is None else "yes" if seconds <= share * budget * 60 else "**no**"
        return out

    shown = table([*(row(s, t, (held or {}).get(s)) for s, t in rows), row("**all notebook stages**", total, 1.0)]
                  if rows else [])
    if budget is None or not rows:
        return shown
    within = total <= budget * 60
    left = (f" The whole `make repro` also spends DVC's own time and the kernels' start-up, which this sum leaves out: "
            f"it meets the budget only if they fit in the {budget - total / 60:.1f} min left." if within else "")
    verdict = "within" if within else "**over**"
    return join(shown, paragraph(f"All notebook stages together: {total / 60:.1f} min, {verdict} "
                                 f"the study's budget of {budget:g} min (`budget_minutes`: `make repro` from a fresh "
                                 f"clone on 2 idle cores).{left}"))


def measured_on(results: Results) -> dict[str, str]:
    """The machine the profile measured on, as it recorded it (`measure.harness`): CPU model, the
    flags FBGEMM can use, the ISA it chose and the path its row-wise Adagrad backward took, and
    FBGEMM's harness forward and backward in a fresh process (default heap, and the heap kept):
    what tells a fast machine of this kind from a slow one (issue 49); and the measuring effort
    decided from them (`pipeline.effort`) with the precision it reached; and what one legacy-SSE
    instruction after 256-bit AVX costs there, which decides that backward's speed."""
    profile = results.profile or {}
    machine, calibration = profile.get("machine") or {}, profile.get("calibration") or {}
    out = {}
    if machine:
        flags = [name for name, present in sorted(machine.get("cpu_flags", {}).items()) if present]
        out |= {"cpu model": str(machine.get("cpu_model", "?")), "cpu flags FBGEMM can use": ", ".join(flags) or "none",
                "FBGEMM ISA": str(machine.get("fbgemm_isa", "?")),
                "row-wise Adagrad backward path": str(machine.get("adagrad_backward_path", "?"))}
    effort = profile.get("effort")
    if effort:
        out["measuring effort"] = (f"level {effort['level']}: every measurement's rounds divided by "
                                   f"{2 ** effort['level']:g} (at least {effort['least']}, at most {effort['most']:g} "
                                   f"times as written), from the harness backward {effort['speed_ms']:.1f} ms against "
                                   f"the {effort['reference_ms']:.1f} ms of the machine the rounds were sized for; "
                                   f"precision reached: median CV {profile.get('median_cv', float('nan')):.1%} "
                                   f"across passes")
    for heap, facts in calibration.items():
        out[f"harness, {heap} heap (ms)"] = (f"forward {facts['forward_ms']:.1f}, backward (row-wise Adagrad) "
                                             f"{facts['backward_rowwise_adagrad_ms']:.1f}, backward (SGD) "
                                             f"{facts['backward_sgd_ms']:.1f}; "
                                             f"{facts['adagrad_ns_per_touched_row']:.0f} ns per touched row")
    penalty = (calibration.get("default") or {}).get("sse_after_avx_ns")
    if penalty is not None:
        out["legacy SSE after 256-bit AVX (ns)"] = (
            f"{penalty:.0f}: paid about three times per touched row by FBGEMM's row-wise Adagrad kernel (a "
            f"machine that charges it runs that backward several times slower; training there pays it too)")
    return out


def environment() -> dict[str, str]:
    """Where the report was written: CPU, cores, GPU, library versions, torch threads."""
    import torch

    versions = {}
    for module in ("torch", "fbgemm_gpu", "torchrec", "pandas", "dvc", "papermill"):
        try:
            versions[module] = __import__(module).__version__
        except ImportError:
            versions[module] = "absent"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return {"cpu": platform.processor() or platform.machine(), "cores": str(os.cpu_count()), "gpu": gpu,
            "python": platform.python_version(), "torch threads": str(torch.get_num_threads()), **versions}


def page(results: Results, figures: Figures) -> str:
    """The run page's text (always written)."""
    notebooks = [(stage, stem) for stage, stem in results.stages
                 if (results.reports / "html" / f"{stem}.html").exists()]
    return join(heading(TITLE), "## Wall time per stage",
                paragraph("As each notebook recorded it in the run that produced these outputs; a stage that resumed "
                          "from its checkpoints shows only the resumed part."), stage_times(results),
                "## Environment", table([{"": k, "value": v}
                                         for k, v in (environment() | measured_on(results)).items()]),
                "## Notebooks", "\n".join(f"- `{stage}`: [{stem}.html](html/{stem}.html) (code hidden; with code: "
                                          f"[notebooks/{stem}.ipynb](notebooks/{stem}.ipynb))"
                                          for stage, stem in notebooks) or "(no notebook rendered)")

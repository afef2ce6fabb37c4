"""The report: typed metrics in, pages out. The summary answers on its first screen (the verdicts in
words, the forest plot, a short table with the registration's record under it); each stage page
shows its figures beside what they support; HTML, plot files and pages are written whole."""

import ast
import copy
import json
import re
import shutil
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest
import yaml
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from autoshard.core.errors import ConfigError
from autoshard.core.metrics import write_metrics
from autoshard.core.schema import check
from autoshard.pipeline.report.build import PAGES, build, main, notebook_stages
from autoshard.pipeline.report.summary import MAX_LINES
from autoshard.studies.endpoints import RECORD_KEYS
from autoshard.studies.evaluate import Evaluation

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "autoshard" / "pipeline" / "report"


def endpoint(method: str, reference: str, protocol: str, verdict: str, median: float, lo: float, hi: float,
             identical: float = 0.1, medians: tuple[float, ...] = (0.978, 0.99, 1.0, 1.004, 1.02), tasks: int = 40,
             p: float | None = 0.001) -> dict:
    """One `primary.<endpoint>` as issue 48's evaluate.json holds it."""
    return {"method": method, "reference": reference, "protocol": protocol, "cost": "max_device_ms",
            "verdict": verdict, "median_ratio": median, "ci_low": lo, "ci_high": hi,
            "interval": "two-level bootstrap, BCa", "mc_error": 0.0012, "resamples": 10000, "p_holm": p,
            "p_claims": {"better": 1.0, "worse": 1.0, "equivalent": p}, "sesoi": 0.05, "alpha": 0.05,
            "tasks": tasks, "failed": 0, "replicates": len(medians), "replicate_medians": list(medians),
            "identical_share": identical, "note": "", "per_task": {"t0": median}, "pass": "evaluate-0123456789"}


def pair(median: float, lo: float, hi: float, identical: float = 0.0) -> dict:
    return {"tasks": 40, "median_ratio": median, "ci_low": lo, "ci_high": hi, "p_value": 0.01,
            "identical_share": identical, "mde": 0.03}


def method(ratio: float, lo: float, hi: float, wins: float) -> dict:
    return {"plans": 40, "ratio_median": ratio, "ratio_lo": lo, "ratio_hi": hi, "win_rate": wins,
            "mean_ms": 10 * ratio, "predicted_ratio_median": ratio * 0.9, "seconds_median": 0.01}


def headroom(lower: float, upper: float | None, why: str, reachable: bool = True) -> dict:
    return {"tasks": 40, "tasks_without_greedy": 0, "greedy_gap": lower, "greedy_gap_max": 0.07,
            "greedy_gap_above_share": 1.0, "bound": 0.96, "how": "best of local search from 9 starts", "starts": 9,
            "search_seconds": 7.5, "captured": {"rl_greedy": -1.2, "cost_greedy": 0.0}, "captured_tasks": 40,
            "lpt_gap": 0.016, "how_lpt": "MILP lower bound", "lpt_gap_optimal_share": 0.0, "measured_gap": -0.009,
            "measured_cost": "max_device_ms", "measured_tasks": 40, "measured_of": {"cost_greedy": 40},
            "measured_at_best_share": 0.4, "lower": lower, "upper": upper, "upper_why": why,
            "better_reachable": reachable, "noise_floor": 0.058, "noise_key": "noise.noise_sd_max_device.autoshard"}


NOISE = {"median_cv": 0.01, "round_drift": 0.02, "remeasured_share": 0.1, "plan_repeat_change": 0.005,
         "plan_repeat_change_calibrated": 0.004, "noise_sd": {"autoshard": 0.02},
         "targets": {"median_cv": 0.03, "plan_repeat_change": 0.01}, "met": True}
AMENDMENT = {"date": "2026-12-06", "commit": "f451a7d",
             "change": "the headroom gate removed: every endpoint is decided",
             "why": "the gate was added after results were seen", "results_seen": True, "family": None}
BLOCK = {"autoshard": {"rl_greedy__vs__cost_greedy": pair(0.99, 0.98, 1.01),
                       "rl_greedy__vs__torchrec": pair(0.95, 0.90, 0.97),
                       "cost_greedy__vs__torchrec": pair(0.96, 0.91, 0.99)}}
EVALUATE = {
    "seconds": 12.0, "objective": {"autoshard": "max_device", "tight": "max_device"},
    "primary": {
        "rl_greedy__vs__cost_greedy__autoshard": endpoint("rl_greedy", "cost_greedy", "autoshard", "equivalent",
                                                          0.993, 0.981, 1.004),
        "rl_greedy__vs__torchrec__autoshard": endpoint("rl_greedy", "torchrec", "autoshard", "better",
                                                       0.952, 0.931, 0.975, medians=(0.94, 0.95, 0.96, 0.95, 0.97)),
        "rl_greedy__vs__cost_greedy__tight": endpoint("rl_greedy", "cost_greedy", "tight", "inconclusive",
                                                      0.982, 0.933, 1.030, identical=0.62, tasks=20, p=0.2),
        "registered": {"commit": "286cb2b", "date": "2026-12-01", "family": "07c2b2605b94"},
        "amendments": [AMENDMENT]},
    "headroom": {"autoshard": headroom(0.042, None, "no proof of optimality: the MILP proved no task optimal"),
                 "tight": headroom(0.021, 0.031, "the MILP's dual bound", reachable=False)},
    "families": {"sesoi": 0.05, "seconds": 3.0, "families": []},
    "noise": NOISE, "reference": {},
    "paired": BLOCK, "paired_max_device": BLOCK, "paired_synchronized": {},
    "answer": [], "replicates": {},
    "results": {"autoshard": {"size_greedy": method(1.0, 1.0, 1.1, 0.0), "rl_greedy": method(0.8312, 0.75, 0.9, 0.75)}},
    "targets": [{"protocol": "autoshard", "method": "rl_greedy", "statistic": "measured median ratio",
                 "value": 0.8312, "target": "<= 0.9", "met": True}],
    "failed": {"autoshard": {"rl_greedy": 0, "torchrec": 2}},
}
STAGES = ("synthesize", "profile", "cost_model", "train_rl", "evaluate", "transfer", "ablation", "columns")


def fake_reports(tmp_path: Path, evaluate: dict = EVALUATE, committed: bool = True) -> tuple[Path, Path, Path]:
    """A reports/ tree: one notebook per stage, the committed metrics of every stage but evaluate (which
    the issue-48 fixture replaces), and an empty PNG for every figure the committed run saved."""
    reports, data = tmp_path / "reports", tmp_path / "data"
    dvc_file = tmp_path / "dvc.yaml"
    dvc_file.write_text("stages:\n" + "".join(f"  {s}:\n    cmd: x\n    deps: [notebooks/0{i}_{s}.ipynb]\n"
                                              for i, s in enumerate(STAGES, 1)))
    nb = new_notebook(cells=[new_markdown_cell("# Title"), new_code_cell("print('secret code')", outputs=[
        new_output("stream", name="stdout", text="visible output\n")])])
    (reports / "notebooks").mkdir(parents=True)
    for i, stage in enumerate(STAGES, 1):
        nbformat.write(nb, reports / "notebooks" / f"0{i}_{stage}.ipynb")
        if committed and stage != "evaluate":
            (reports / "metrics").mkdir(exist_ok=True)
            shutil.copy(ROOT / "reports" / "metrics" / f"{stage}.json", reports / "metrics" / f"{stage}.json")
        for png in (ROOT / "reports" / "figures" / stage).glob("*.png"):
            (reports / "figures" / stage).mkdir(parents=True, exist_ok=True)
            (reports / "figures" / stage / png.name).write_bytes(b"\x89PNG")
    write_metrics(reports / "metrics" / "evaluate.json", evaluate)
    (data / "evaluate").mkdir(parents=True)
    pd.DataFrame({"method": ["a", "b", "a", "b"], "tables": [10, 10, 20, 20], "seconds": [1, 2, 3, 4]}).to_csv(
        data / "evaluate" / "speed.csv", index=False)
    pd.DataFrame({"protocol": ["p", "p"], "method": ["a", "b"], "ratio": [1.0, 0.9]}).to_csv(
        data / "evaluate" / "plans.csv", index=False)
    return reports, data, dvc_file


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    reports, data, dvc_file = fake_reports(tmp_path_factory.mktemp("report"))
    build(reports, data, dvc_file, ROOT / "params.yaml")
    return reports


def test_the_fixture_holds_issue_48s_evaluate_contract():
    check(copy.deepcopy(EVALUATE), Evaluation, "evaluate.json")


def test_the_summary_answers_on_its_first_screen(built):
    lines = (built / "README.md").read_text().splitlines()
    assert len(lines) <= MAX_LINES
    first = "\n".join(lines[:15])
    assert "![every task's ratio per primary endpoint (forest plot)](figures/evaluate/primary.png)" in first
    sentences = re.findall(r"Across [^.]*(?:\.\d+[^.]*)*\.(?=\s|$)", " ".join(lines[:15]))
    assert [s.split(" tasks,")[0] for s in sentences] == ["Across 5 trained chains and 40 autoshard",
                                                          "Across 5 trained chains and 20 tight"], "one per protocol"
    said = " ".join(lines[2:15])
    assert "rl_greedy is equivalent to cost_greedy (median ratio 0.99 [0.98, 1.00])" in said
    assert "rl_greedy is better than torchrec (0.95 [0.93, 0.97])" in said
    assert "rl_greedy is inconclusive against cost_greedy (median ratio 0.98 [0.93, 1.03])" in said
    assert said.index("forest plot") < said.index("| method / reference |"), "the plot, then the table"
    assert said.startswith("**Better than its reference: rl_greedy over torchrec ("), "the bottom line first"
    counts = re.search(r"Of (\d+) endpoints over 5 trained chains: (\d+) better, (\d+) worse, (\d+) equivalent "
                       r"\(within the margin\), (\d+) inconclusive\.", said)
    entries = [e for k, e in EVALUATE["primary"].items() if k not in RECORD_KEYS]
    assert counts and [int(c) for c in counts.groups()] == [len(entries), *(
        sum(e["verdict"] == w for e in entries) for w in ("better", "worse", "equivalent", "inconclusive"))]


def test_the_primary_table_has_at_most_seven_columns_and_each_verdict_its_spread(built):
    text = (built / "README.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| method / reference"))
    assert header.count("|") - 1 <= 7
    rows = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| rl_greedy / ")}
    tight = next(line for line in text.splitlines() if line.startswith("| rl_greedy / cost_greedy | tight"))
    assert "**inconclusive**, mostly on identical plans" in tight and "62%" in tight
    autoshard = next(line for line in text.splitlines() if line.startswith("| rl_greedy / cost_greedy | autoshard"))
    assert "identical" not in autoshard.split("|")[3] and "0.978-1.020 (5)" in autoshard
    assert "0.940-0.970 (5)" in next(line for line in text.splitlines() if "/ torchrec | autoshard" in line)
    assert rows, "the endpoints are rows"


def test_the_registration_and_amendments_stand_under_the_primary_table(built):
    text = (built / "README.md").read_text()
    table_end = text.index("| rl_greedy / cost_greedy | tight")
    record = text.index("Registered at commit 286cb2b on 2026-12-01; 1 amendment since:")
    assert table_end < record < text.index("## Measurement quality")
    assert "- 2026-12-06 (f451a7d; results seen): the headroom gate removed" in text


def test_the_headroom_is_given_as_bounds_beside_the_verdicts(built):
    text = (built / "README.md").read_text()
    assert ("autoshard: at least 4.2% available over cost_greedy under the cost model, no upper bound (no proof of "
            "optimality") in text
    tight = next(line for line in text.splitlines() if line.startswith("- tight:"))
    assert "at most 3.1% (the MILP's dual bound)" in tight and "out of reach" in text.split("- tight:")[1][:400]
    assert "out of reach" not in text.split("- autoshard:")[1].split("- tight:")[0]
    assert "exceeds" not in text and "no headroom" not in text, "the gate is gone"


def test_the_summary_links_one_page_per_stage_and_the_measurement_quality_in_brief(built):
    text = (built / "README.md").read_text()
    for _, file, *_ in PAGES:
        assert f"]({file})" in text and (built / file).exists(), file
    assert text.index("## Measurement quality") < text.index("## The stages, one page each")
    assert "Evaluate pass within its targets" in text and "(html/05_evaluate.html)" in text
    assert max(len(line) for line in text.splitlines()) <= 160


def test_every_figure_is_inline_on_its_stage_page_beside_what_it_supports(built):
    for stage, file, *_ in PAGES:
        text = (built / file).read_text()
        assert "## More figures" not in text and "## Figures" not in text, f"{file}: a figure listed, not placed"
        for png in (built / "figures" / stage).glob("*.png") if stage != "run" else []:
            assert f"(figures/{stage}/{png.name})" in text, f"{file} does not show {png.name}"
    lines = (built / "evaluate.md").read_text().splitlines()
    forest = next(i for i, line in enumerate(lines) if "figures/evaluate/primary.png" in line)
    assert lines[forest + 2].startswith("| method / reference |"), "the forest plot stands above the primary table"


def test_a_figure_no_page_knows_is_added_to_its_stage_page(tmp_path):
    reports, data, dvc_file = fake_reports(tmp_path)
    (reports / "figures" / "ablation" / "new_curve.png").write_bytes(b"\x89PNG")
    build(reports, data, dvc_file)
    assert "## More figures\n\n![new curve](figures/ablation/new_curve.png)" in (reports / "ablation.md").read_text()


def test_exploratory_comparisons_are_method_by_reference_tables(built):
    text = (built / "evaluate.md").read_text()
    section = text.split("## Exploratory comparisons")[1].split("\n## ")[0]
    assert not re.search(r"^- ", section, re.M), "tables, not bullets"
    header = next(line for line in section.splitlines() if line.startswith("| method |"))
    assert header.split(" | ")[1:3] == ["cost_greedy", "torchrec"]
    row = next(line for line in section.splitlines() if line.startswith("| rl_greedy |"))
    assert "0.990 [0.980, 1.010] |" in row and "0.950 [0.900, 0.970] ↓" in row
    for word in ("better", "worse", "equivalent"):
        assert word not in section, "exploratory: no verdict words"


def test_the_evaluate_page_names_each_interval_method_and_its_mc_error(built):
    text = (built / "evaluate.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| rl_greedy / torchrec | autoshard | two-level"))
    assert "two-level bootstrap, BCa | 10000 | 0.0012 | 0.940, 0.950, 0.960, 0.950, 0.970" in row
    assert "95% BCa" not in text, "no header claims BCa for all"


def test_a_noisy_run_says_so_in_bold_on_the_summary(tmp_path):
    noisy = EVALUATE | {"noise": NOISE | {"median_cv": 0.05, "met": False}}
    reports, data, dvc_file = fake_reports(tmp_path, noisy)
    build(reports, data, dvc_file)
    assert "Evaluate pass **noisier than its targets**: shard CV across rounds 5.0% (target 3%)" in (
        reports / "README.md").read_text()
    assert "**This run is noisier than its targets" in (reports / "evaluate.md").read_text()


def test_build_writes_html_plots_and_pages(tmp_path):
    reports, data, dvc_file = fake_reports(tmp_path, committed=False)
    (reports / "transfer.md").write_text("stale")
    build(reports, data, dvc_file)
    html = (reports / "html" / "05_evaluate.html").read_text()
    assert "visible output" in html and "secret code" not in html
    assert pd.read_csv(reports / "plots" / "sharding_time.csv").columns.tolist() == ["tables", "a", "b"]
    assert pd.read_csv(reports / "plots" / "ratios.csv").set_index("method")["p"].to_dict() == {"a": 1.0, "b": 0.9}
    assert not (reports / "transfer.md").exists(), "a page whose metrics are gone is removed"
    assert "](transfer.md)" not in (reports / "README.md").read_text()
    assert re.search(r"\| evaluate \| 12 \|", (reports / "run.md").read_text()), "the stage's wall time"


def test_the_report_reads_evaluate_json_typed_and_names_a_missing_key(tmp_path, capsys):
    broken = copy.deepcopy(EVALUATE)
    del broken["primary"]["rl_greedy__vs__cost_greedy__tight"]["replicate_medians"]
    reports, data, dvc_file = fake_reports(tmp_path, broken)
    assert main(["--reports", str(reports), "--data", str(data), "--dvc-file", str(dvc_file)]) == 2
    assert "evaluate.json" in capsys.readouterr().err
    assert not (reports / "README.md").exists() and not (reports / "html").exists(), "nothing written"


def test_missing_notebook_fails_cleanly(tmp_path, capsys):
    reports, data, dvc_file = fake_reports(tmp_path)
    (reports / "notebooks" / "05_evaluate.ipynb").unlink()
    with pytest.raises(ConfigError, match="05_evaluate.ipynb is missing"):
        build(reports, data, dvc_file)
    assert main(["--reports", str(reports), "--data", str(data), "--dvc-file", str(dvc_file)]) == 2
    assert "report: error: reports/notebooks: 05_evaluate.ipynb is missing" in capsys.readouterr().err


def test_stage_times_are_set_against_the_budget(built):
    text = (built / "run.md").read_text()
    assert "**all notebook stages**" in text and "the study's budget of" in text and "fbgemm_gpu" in text
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    share = params["budget_shares"]["evaluate"] * params["budget_minutes"] * 60
    assert f"| evaluate | 12 | {share:.0f} | yes |" in text, "each stage against its share of the budget"


def test_notebook_stages_follow_dvc_yaml():
    stages = notebook_stages(ROOT / "dvc.yaml")
    assert stages[0] == ("synthesize", "01_synthesize") and ("evaluate", "05_evaluate") in stages


def test_no_report_function_takes_a_bare_or_untyped_dict():
    """Every parameter of every function in the report package is annotated, none as a bare `dict` (a mapping
    of typed parts, `dict[str, PairedComparison]`, says what it holds)."""
    for file in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for arg in [a for a in node.args.args + node.args.kwonlyargs if a.arg not in ("self", "cls")]:
                    assert arg.annotation is not None, f"{file.name}:{node.name}({arg.arg}) untyped"
                    text = ast.unparse(arg.annotation)
                    bare = re.search(r"(^|[|\s])dict($|[|\s])|dict\[str, Any\]|\bAny\b", text)
                    assert not bare, f"{file.name}:{node.name}({arg.arg}: {text})"


def test_every_committed_metrics_file_is_strict_json():
    files = sorted((ROOT / "reports" / "metrics").glob("*.json"))
    assert files
    for path in files:
        json.loads(path.read_text(), parse_constant=lambda token, name=path.name: pytest.fail(f"{name}: {token}"))
    assert np.isfinite(1.0)


def test_the_environment_names_the_machine_the_profile_measured_and_its_harness_figures(built):
    """Issue 49: the CPU model, FBGEMM's ISA and Adagrad path, and the harness forward and backward
    per heap, read from the profile's metrics, so that a reader can tell a fast VM from a slow one."""
    text = (built / "run.md").read_text()
    profile = json.loads((ROOT / "reports" / "metrics" / "profile.json").read_text())
    assert f"| cpu model | {profile['machine']['cpu_model']} |" in text
    assert f"| FBGEMM ISA | {profile['machine']['fbgemm_isa']} |" in text
    assert f"| row-wise Adagrad backward path | {profile['machine']['adagrad_backward_path']} |" in text
    for heap, facts in profile["calibration"].items():
        assert (f"| harness, {heap} heap (ms) | forward {facts['forward_ms']:.1f}, backward (row-wise Adagrad) "
                f"{facts['backward_rowwise_adagrad_ms']:.1f},") in text
    penalty = profile["calibration"]["default"].get("sse_after_avx_ns")
    if penalty is None:  # a profile from before the probe
        assert "| legacy SSE after 256-bit AVX (ns) |" not in text
    else:
        assert f"| legacy SSE after 256-bit AVX (ns) | {penalty:.0f}: paid about three times" in text


def test_the_environment_gives_the_sse_penalty_where_the_profile_measured_it():
    from types import SimpleNamespace

    from autoshard.pipeline.report.run import measured_on

    figures = {"forward_ms": 8.6, "backward_rowwise_adagrad_ms": 149.8, "backward_sgd_ms": 28.6,
               "adagrad_ns_per_touched_row": 389.4}
    rows = measured_on(SimpleNamespace(profile={"calibration": {"default": figures | {"sse_after_avx_ns": 104.6}}}))
    assert rows["legacy SSE after 256-bit AVX (ns)"].startswith("105: paid about three times per touched row")
    assert "legacy SSE after 256-bit AVX (ns)" not in measured_on(
        SimpleNamespace(profile={"calibration": {"default": figures | {"sse_after_avx_ns": None}}}))

"""The report generator: metrics in, tables out; HTML, plot files and README written whole."""

import json
import re
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from autoshard.core.errors import ConfigError
from autoshard.core.metrics import read_metrics, write_metrics
from autoshard.core.schema import EvaluateMetrics, check
from autoshard.pipeline.report import (
    build,
    device_error_line,
    families_table,
    headline,
    headroom_table,
    main,
    notebook_stages,
    primary_table,
    quality,
    readme,
    stage_times,
    targets,
)

ROOT = Path(__file__).resolve().parents[2]


def method(ratio, lo, hi, wins, plans=4, gap=None):
    return {"plans": plans, "ratio_median": ratio, "ratio_lo": lo, "ratio_hi": hi, "win_rate": wins,
            "mean_ms": 10 * ratio, "predicted_ratio_median": ratio * 0.9, "seconds_median": 0.01,
            "predicted_gap_median": gap}


NOISE = {"median_cv": 0.05, "round_drift": 0.02, "remeasured_share": 0.1, "plan_repeat_change": 0.03,
         "noise_sd": {"autoshard": 0.02}, "targets": {"median_cv": 0.03, "plan_repeat_change": 0.01}, "met": False,
         "plan_repeat_change_calibrated": 0.02}


EVALUATE = {
    "results": {"autoshard": {"size_greedy": method(1.0, 1.0, 1.1, 0.0),
                              "rl_greedy": method(0.8312, 0.75, 0.9, 0.75)},
                "small": {"rl_greedy": method(0.99, 0.9, 1.1, 0.5, gap=0.0123),
                          "exact": method(1.0, 0.9, 1.1, 0.5, gap=0.0)}},
    "targets": [{"protocol": "autoshard", "method": "rl_greedy", "statistic": "measured median ratio",
                 "value": 0.8312, "target": "<= 0.9", "met": True},
                {"protocol": "small", "method": "rl_greedy", "statistic": "predicted gap", "value": 0.0123,
                 "target": "<= 0.01", "met": False}],
    "objective": {"autoshard": "synchronized_stages", "small": "max_device"},
    "paired_max_device": {}, "paired": {}, "paired_synchronized": {}, "answer": [], "replicates": {}, "failed": {},
    "reference": {},
    "noise": NOISE | {"median_cv": 0.01, "plan_repeat_change": 0.005, "met": True},
    "primary": {"rl_greedy__vs__cost_greedy__autoshard": {
        "method": "rl_greedy", "reference": "cost_greedy", "protocol": "autoshard", "cost": "max_device_ms",
        "verdict": "equivalent", "median_ratio": 0.9931, "ci_low": 0.981, "ci_high": 1.004, "p_holm": 0.0012,
        "p_claims": {"better": 1.0, "worse": 1.0, "equivalent": 0.0012},
        "sesoi": 0.05, "alpha": 0.05, "tasks": 40, "failed": 0, "interval": "BCa", "pass": "evaluate-0123456789",
        "identical_share": 0.25,
        "per_task": {"t0": 0.99}}},
    "headroom": {},
    "families": {"noise_floor": 0.05, "noise_key": "headroom.dreamshard.noise_floor", "seconds": 3.0, "families": []},
    "seconds": 12.0,
}


def test_headline_table_comes_from_the_metrics():
    text = headline(EVALUATE)
    assert "**autoshard** (4 tasks; bottleneck: synchronized_stages)" in text
    assert "**small** (4 tasks; bottleneck: max_device)" in text, "each protocol under its own objective"
    row = next(line for line in text.splitlines() if line.startswith("| rl_greedy") and "0.831" in line)
    assert "0.831 [0.750, 0.900]" in row and "75%" in row
    assert "1.23%" in text, "the small tasks show the gap to the optimum"
    table = targets(EVALUATE)
    measured, predicted = table.split("Predicted (cost model):")
    assert "Measured:" in measured and "0.831" in measured and "0.012" not in measured
    verdicts = [line.rstrip(" |").rsplit("|", 1)[-1].strip() for part in (measured, predicted)
                for line in part.splitlines() if line.startswith("| ") and "protocol" not in line]
    assert verdicts == ["met", "**not met**"], "measured and predicted targets stand in separate tables"


def test_the_headline_refuses_one_objective_for_all():
    with pytest.raises(ConfigError, match="objective"):
        headline(EVALUATE | {"objective": "max_device"})




def test_a_noisy_run_says_so_in_bold_at_the_top(tmp_path):
    noisy = quality(EVALUATE | {"noise": NOISE})
    assert noisy[0].startswith("**Measurement quality: this run is noisier than its targets")
    assert "5.00%" in noisy[0] and "target 3%" in noisy[0] and "all-to-alls" not in noisy[0]
    measured = quality(EVALUATE | {"noise": NOISE | {"comm_round_cv": 0.21, "comm_plans": 40}})
    assert ("Measured all-to-alls (40 plans): median CV of a device's all-to-all time across rounds 21.00%"
            in measured[0])
    assert "chosen on" not in measured[0], "no reference recorded, no sentence on how it was chosen"
    reference = {"autoshard": {"chosen_by": "predicted_ms", "oracle_over_chosen_median": -0.034,
                               "tasks_differing": 12, "tasks": 40},
                 "dreamshard": {"chosen_by": "predicted_ms", "oracle_over_chosen_median": None,
                                "tasks_differing": 0, "tasks": 0}}
    flattered = quality(EVALUATE | {"noise": NOISE, "reference": reference})[0]
    assert "chosen on `predicted_ms`" in flattered and "autoshard -3.4% (12 of 40 tasks differ)" in flattered
    assert "dreamshard" not in flattered, "a protocol without a figure is left out"
    quiet = quality(EVALUATE | {"noise": NOISE | {"median_cv": 0.01, "plan_repeat_change": 0.005, "met": True}})
    assert quiet[0].startswith("Measurement quality: within the targets") and "**" not in quiet[0]
    assert quality({k: v for k, v in EVALUATE.items() if k != "noise"})[0].startswith(
        "**The evaluate stage recorded no measurement quality")
    answer = ["autoshard, rl_greedy: x."]
    reports, data, dvc_file = fake_reports(tmp_path, EVALUATE | {"noise": NOISE, "answer": answer})
    build(reports, data, dvc_file)
    text = (reports / "README.md").read_text()
    first = text.split("## Exploratory comparisons")[0]
    assert "| rl_greedy / cost_greedy | autoshard  | **equivalent** | 0.993 [0.981, 1.004]" in first, first
    assert "Measurement quality **noisier than its targets**" in first and "[Details](#measurement-quality)" in first
    assert "## Measurement quality" in text and "**Measurement quality: this run is noisier" in text


def test_notebook_stages_follow_dvc_yaml():
    stages = notebook_stages(ROOT / "dvc.yaml")
    assert stages[0] == ("synthesize", "01_synthesize")
    assert ("evaluate", "05_evaluate") in stages


def fake_reports(tmp_path: Path, evaluate: dict = EVALUATE) -> tuple[Path, Path, Path]:
    reports, data = tmp_path / "reports", tmp_path / "data"
    dvc_file = tmp_path / "dvc.yaml"
    dvc_file.write_text("stages:\n  evaluate:\n    cmd: x\n    deps: [notebooks/05_evaluate.ipynb, data/pool]\n"
                        "  other:\n    cmd: y\n    deps: [data/pool]\n")
    nb = new_notebook(cells=[new_markdown_cell("# Title"), new_code_cell("print('secret code')", outputs=[
        new_output("stream", name="stdout", text="visible output\n")])])
    (reports / "notebooks").mkdir(parents=True)
    nbformat.write(nb, reports / "notebooks" / "05_evaluate.ipynb")
    write_metrics(reports / "metrics" / "evaluate.json", evaluate)
    (reports / "figures" / "evaluate").mkdir(parents=True)
    (reports / "figures" / "evaluate" / "ratios.png").write_bytes(b"\x89PNG")
    (data / "evaluate").mkdir(parents=True)
    pd.DataFrame({"method": ["a", "b", "a", "b"], "tables": [10, 10, 20, 20], "seconds": [1, 2, 3, 4]}).to_csv(
        data / "evaluate" / "speed.csv", index=False)
    pd.DataFrame({"protocol": ["p", "p"], "method": ["a", "b"], "ratio": [1.0, 0.9]}).to_csv(
        data / "evaluate" / "plans.csv", index=False)
    return reports, data, dvc_file


def test_build_writes_html_plots_and_readme(tmp_path):
    reports, data, dvc_file = fake_reports(tmp_path)
    build(reports, data, dvc_file)
    html = (reports / "html" / "05_evaluate.html").read_text()
    assert "visible output" in html and "secret code" not in html
    assert pd.read_csv(reports / "plots" / "sharding_time.csv").columns.tolist() == ["tables", "a", "b"]
    assert pd.read_csv(reports / "plots" / "ratios.csv").set_index("method")["p"].to_dict() == {"a": 1.0, "b": 0.9}
    text = (reports / "README.md").read_text()
    assert "0.831 [0.750, 0.900]" in text
    assert "(html/05_evaluate.html)" in text and "figures/evaluate/ratios.png" in text
    assert re.search(r"\| evaluate\s*\|\s*12\s*\|", text), "the stage's wall time"
    assert "fbgemm_gpu" in text


def test_missing_notebook_fails_cleanly(tmp_path, capsys):
    reports, data, dvc_file = fake_reports(tmp_path)
    (reports / "notebooks" / "05_evaluate.ipynb").unlink()
    with pytest.raises(ConfigError, match="05_evaluate.ipynb is missing"):
        build(reports, data, dvc_file)
    assert main(["--reports", str(reports), "--data", str(data), "--dvc-file", str(dvc_file)]) == 2
    assert "report: error: reports/notebooks: 05_evaluate.ipynb is missing" in capsys.readouterr().err
    assert not (reports / "README.md").exists() and not (reports / "html").exists()


def test_transfer_and_ablation_tables_come_from_the_metrics(transfer_metrics, ablation_metrics):
    from autoshard.pipeline.report import ablation_table, transfer_table

    text = transfer_table(transfer_metrics)
    row = next(line for line in text.splitlines() if line.startswith("| tables = 320"))
    for method in ("rl_greedy", "cost_greedy"):
        point = transfer_metrics["axes"]["tables"][method]["320"]
        assert f"{point['ratio_median']:.3f} [{point['ratio_lo']:.3f}, {point['ratio_hi']:.3f}]" in row
    lines = ablation_table(ablation_metrics).splitlines()
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["full method", "MLP state (no LSTM)"]
    no_lstm = ablation_metrics["variants"][1]
    assert f"{no_lstm['vs_full']:+.3f}" in lines[3] and f"[{no_lstm['min']:.3f}, {no_lstm['max']:.3f}]" in lines[3]


def test_readme_reads_transfer_and_ablation_through_their_schema(tmp_path, transfer_metrics, ablation_metrics):
    reports, data, dvc_file = fake_reports(tmp_path)
    write_metrics(reports / "metrics" / "transfer.json", transfer_metrics)
    write_metrics(reports / "metrics" / "ablation.json", ablation_metrics)
    text = readme(reports, notebook_stages(dvc_file))
    assert "| tables = 320" in text and "MLP state (no LSTM)" in text and "seeds [0, 1, 2]" in text
    broken = {k: v for k, v in ablation_metrics.items() if k != "iterations"}
    write_metrics(reports / "metrics" / "ablation.json", broken)
    with pytest.raises(ConfigError, match=r"ablation\.json: key 'iterations' is missing"):
        readme(reports, notebook_stages(dvc_file))


def test_stage_times_need_every_stage_seconds(tmp_path):
    reports, data, dvc_file = fake_reports(tmp_path)
    write_metrics(reports / "metrics" / "evaluate.json", EVALUATE | {"seconds": "12 s"})
    with pytest.raises(ConfigError, match=r"evaluate\.json: key 'seconds' holds '12 s'"):
        build(reports, data, dvc_file)


def test_metrics_are_strict_json(tmp_path):
    """A value that is not a finite number is written as null: NaN is not JSON."""
    write_metrics(tmp_path / "m.json", {"median": float("nan"), "inf": np.inf, "ok": np.float32(0.5)})
    assert json.loads((tmp_path / "m.json").read_text()) == {"median": None, "inf": None, "ok": 0.5}


def test_every_committed_metrics_file_is_strict_json():
    files = sorted((ROOT / "reports" / "metrics").glob("*.json"))
    assert files
    for path in files:
        json.loads(path.read_text(), parse_constant=lambda token, name=path.name: pytest.fail(f"{name}: {token}"))


def test_failed_placements_are_listed_per_protocol():
    from autoshard.pipeline.report import failed_table

    text = failed_table({"failed": {"tight": {"cost_greedy": 0, "torchrec": 3}, "dreamshard": {"cost_greedy": 0}}})
    assert "torchrec: 3" in text and "cost_greedy" not in text.split("tight")[1].split("\n")[0]
    assert "none: every method placed every task" in text


def test_columns_section_reads_the_stage_metrics():
    from autoshard.pipeline.report import columns_table

    entry = {"tasks": 10, "twin": "lpt_measured", "median_ratio": 0.97, "ci_low": 0.95, "ci_high": 0.99,
             "p_value": 0.01, "identical_share": 0.6, "direction": "below 1", "split_share": 0.4,
             "split_tables_median": 0.0, "bound_share_median": 0.55}
    text = columns_table({"protocols": {"autoshard": {"column_lpt": entry},
                                        "tight": {"column_lpt": entry | {"median_ratio": None, "ci_low": None,
                                                                         "ci_high": None, "direction": "no tasks"}}}})
    autoshard, tight = text.split("| autoshard")[1].split("\n")[0], text.split("| tight")[1].split("\n")[0]
    assert "column_lpt / lpt_measured" in autoshard and "0.970 [0.950, 0.990]" in autoshard
    assert "below 1" in autoshard and "40%" in autoshard and "0.55" in autoshard
    assert "n/a" in tight and "no tasks" in tight
    for word in ("met", "better", "worse", "equivalent"):
        assert word not in text, "exploratory: no verdict words"


def test_the_profile_noise_opens_the_report_too():
    from autoshard.pipeline.report import quality

    evaluate = {"noise": {"median_cv": 0.02, "plan_repeat_change": 0.005, "round_drift": 0.01,
                          "remeasured_share": 0.0, "met": True,
                          "targets": {"median_cv": 0.03, "plan_repeat_change": 0.01}}}
    profile = {"cv_target": 0.03, "noise": {"median_cv": 0.05, "round_drift": 0.04, "round_drift_max": 0.2,
                                            "remeasured_share": 0.25}}
    lines = quality(evaluate, profile)
    assert lines[0].startswith("Measurement quality: within the targets")
    assert lines[-1].startswith("**Profile noise above its target:**") and "5.0%" in lines[-1]
    profile["noise"]["median_cv"] = 0.02
    assert quality(evaluate, profile)[-1].startswith("Profile noise:")


def test_the_regime_table_says_where_each_interval_lies_without_verdict_words():
    from autoshard.pipeline.report import regime_table

    def pair(median, low, high, mde=0.01):
        return {"tasks": 20, "median_ratio": median, "ci_low": low, "ci_high": high, "p_value": 0.01,
                "identical_share": 0.0, "mde": mde}

    evaluate = {"paired": {"dreamshard": {"rl_greedy__vs__cost_greedy": pair(0.95, 0.93, 0.97)},
                           "tight": {"rl_greedy__vs__cost_greedy": pair(1.05, 1.02, 1.08)}},
                "paired_synchronized": {"dreamshard": {"rl_greedy__vs__cost_greedy": pair(0.995, 0.99, 0.999,
                                                                                           mde=0.02)}}}
    evaluate["paired_max_device"] = evaluate["paired"]
    text = regime_table(evaluate, references=("cost_greedy",))
    lines = {line.split("|")[1].strip(): line for line in text.splitlines()[2:]}
    assert "below 1" in lines["compute only"] and "above 1" in lines["tight memory"]
    assert "below 1" in lines["synchronized stages with communication"], "exploratory: the interval, no MDE rule"
    assert not any(word in text for word in ("beats", "ties", "loses")), "no verdict words outside the primary table"


def test_the_compute_only_row_reads_paired_max_device_for_every_protocol():
    from autoshard.pipeline.report import regime_table

    def pair(median, low, high):
        return {"tasks": 20, "median_ratio": median, "ci_low": low, "ci_high": high, "p_value": 0.01,
                "identical_share": 0.0, "mde": 0.01}

    evaluate = {"objective": {"autoshard": "max_device", "dreamshard": "synchronized_stages"},
                "paired": {"autoshard": {"rl_greedy__vs__cost_greedy": pair(0.95, 0.93, 0.97)},
                           "dreamshard": {"rl_greedy__vs__cost_greedy": pair(1.05, 1.02, 1.08)}},
                "paired_synchronized": {"dreamshard": {"rl_greedy__vs__cost_greedy": pair(1.05, 1.02, 1.08)}},
                "paired_max_device": {"autoshard": {"rl_greedy__vs__cost_greedy": pair(0.95, 0.93, 0.97)},
                                      "dreamshard": {"rl_greedy__vs__cost_greedy": pair(0.912, 0.9, 0.93)}}}
    rows = regime_table(evaluate, references=("cost_greedy",)).splitlines()[2:]
    compute = {line.split("|")[2].strip(): line for line in rows if line.split("|")[1].strip() == "compute only"}
    assert "0.912 [0.900, 0.930] below 1" in compute["dreamshard"] and "n/a" not in compute["dreamshard"]
    assert "0.950 [0.930, 0.970] below 1" in compute["autoshard"]
    synced = next(line for line in rows if line.split("|")[1].strip().startswith("synchronized"))
    assert "1.050 [1.020, 1.080] above 1" in synced, "the synchronized row still reads paired_synchronized"
    broken = evaluate | {"paired_max_device": {"dreamshard": {"rl_greedy__vs__cost_greedy": {"tasks": 20}}}}
    with pytest.raises(ConfigError, match=r"evaluate\.json: key 'paired_max_device\.dreamshard\..*' is missing"):
        regime_table(broken, references=("cost_greedy",))


def test_the_synchronized_policy_is_set_against_the_sync_baselines_where_it_ran():
    from autoshard.pipeline.report import sync_policy_table

    pair = {"tasks": 20, "median_ratio": 0.9, "ci_low": 0.85, "ci_high": 0.95, "p_value": 0.01,
            "identical_share": 0.0, "mde": 0.01}
    assert "not evaluated" in sync_policy_table({"paired_synchronized": {"autoshard": {}}})
    text = sync_policy_table({"paired_synchronized": {"autoshard": {"rl_greedy__vs__cost_greedy": pair},
                                                      "dreamshard": {"rl_sync_greedy__vs__sync_milp": pair}}})
    rows = text.splitlines()[2:]
    assert len(rows) == 1 and "dreamshard" in rows[0] and "below 1" in rows[0]
    assert "sync_milp" in text.splitlines()[0]


def test_stage_times_are_set_against_the_budget(tmp_path):
    reports, _, dvc_file = fake_reports(tmp_path)
    stages = notebook_stages(dvc_file)
    total = sum(read_metrics(reports / "metrics" / f"{s}.json")["seconds"] for s, _ in stages
                if (reports / "metrics" / f"{s}.json").exists())
    within = stage_times(reports / "metrics", stages, total / 60 + 1)
    assert total > 0 and "within the study's budget of" in within and "if they fit in the 1.0 min left" in within
    assert "**over** the study's budget" in stage_times(reports / "metrics", stages, total / 60 / 2)
    assert "budget" not in stage_times(reports / "metrics", stages)


def test_a_bad_budget_is_refused_naming_the_field(tmp_path):
    reports, data, dvc_file = fake_reports(tmp_path)
    (tmp_path / "p.yaml").write_text("budget_minutes: 0\n")
    with pytest.raises(ConfigError, match=r"^budget_minutes: 0"):
        build(reports, data, dvc_file, tmp_path / "p.yaml")


def test_the_answer_names_the_objective_each_protocol_compares():
    from autoshard.pipeline.report import answer

    text = answer({"answer": ["dreamshard, rl_greedy: ties with cost_greedy"],
                   "objective": {"autoshard": "max_device", "dreamshard": "synchronized_stages"}})
    assert text.splitlines()[0] == ("Each protocol's lines compare its headline objective (autoshard: max_device; "
                                    "dreamshard: synchronized_stages).")
    assert text.endswith("- dreamshard, rl_greedy: ties with cost_greedy")


def test_the_cost_model_section_sets_the_hybrid_against_a_re_measurement():
    from autoshard.pipeline.report import floor_line

    floor = {"shards": 40, "pass_to_pass_mape": 0.055, "pass_to_pass_mape_rescaled": 0.05,
             "mape_vs_main": {"hybrid": 0.07, "feature-only": 0.072},
             "mape_vs_mean": {"hybrid": 0.05, "feature-only": None}}
    line = floor_line({"measurement_floor": floor})
    assert "40 seen-table test shards" in line
    assert "a re-measurement (the second pass as the prediction) 5.5% (5.0% once" in line
    assert "hybrid 7.0% (5.0% against the mean" in line and "feature-only 7.2% (n/a against" in line
    assert "a noise-free model would score about 3.5%" in line
    assert "no measurement floor" in floor_line({}), "a run with `remeasure` off has none"
    assert "no floor" in floor_line({"measurement_floor": floor | {"shards": 0}})


def test_the_active_selection_line_says_whether_choosing_beat_chance():
    from autoshard.pipeline.report import active_line

    arms = {"base": {"seen": 0.068, "unseen": 0.127}, "active": {"seen": 0.066, "unseen": 0.121},
            "uniform": {"seen": 0.069, "unseen": 0.131}}
    paired = {"active - uniform | unseen": {"difference": -0.0105, "ci_low": -0.018, "ci_high": -0.0034,
                                            "p_value": 0.014, "shards": 188},
              "active - base | seen": {"difference": -0.002, "ci_low": -0.009, "ci_high": 0.004,
                                       "p_value": 0.5, "shards": 89},
              "active - base | unseen": {"difference": 0.02, "ci_low": 0.01, "ci_high": 0.03,
                                         "p_value": 0.01, "shards": 188}}
    line = active_line({"active": {"rounds": 3, "shards_per_round": 50, "ensemble": 5, "seeds": 3, "candidates": 3000,
                                   "shards_measured": 290, "mape": arms,
                                   "mape_sd": {k: {"seen": 0.001, "unseen": 0.002} for k in arms},
                                   "paired": paired}})
    assert "290 more train-table shards" in line and "3 rounds of 50 per arm" in line
    assert "base 6.8% ± 0.1% | 12.7% ± 0.2%" in line
    assert "active - uniform | unseen -1.1 points [-1.8, -0.3], p 0.014 (188 shards): lower error" in line
    assert "active - base | seen -0.2 points [-0.9, +0.4], p 0.500 (89 shards): no difference shown" in line
    assert "active - base | unseen +2.0 points" in line and line.count("higher error") == 1
    assert "measured no shards" in active_line({})
    wide = {k: {"seen": 0.03, "unseen": 0.03} for k in arms}
    line = active_line({"active": {"rounds": 3, "shards_per_round": 50, "ensemble": 5, "seeds": 3, "candidates": 9,
                                   "shards_measured": 290, "mape": arms, "mape_sd": wide, "paired": paired}})
    assert line.count("within the fits' spread") == 2 and "lower error" not in line


def test_the_regime_text_says_where_each_protocols_all_to_all_came_from():
    from autoshard.pipeline.report import comm_sources

    text = comm_sources({"comm_source": {"autoshard": "extrapolated-model", "dreamshard": "measured",
                                         "small": "extrapolated-model"}})
    assert text == ("the comm model extrapolated to another device count (autoshard, small); "
                    "the all-to-all measured across one process per device (dreamshard)")
    assert comm_sources({}) == "the all-to-all (source not recorded)"
    assert comm_sources({"comm_source": {"tight": "oversubscribed-model"}}) == (
        "the comm model at a device count it was fitted on, from oversubscribed timings (more processes than "
        "cores) (tight)")


COMM = {"placements": 40, "device_counts": [2, 4], "batch_size": 2048, "heldout_share": 0.25,
        "mape_heldout": 0.107, "mape_heldout_by_world": {"2": 0.085, "4": 0.118}, "mape_train": 0.093,
        "mape_heldout_across": 0.116, "median_ms_by_world": {"2": 10.8, "4": 11.7}, "mape_target": 0.1,
        "mape_target_met": True, "honest_limit": 2, "honest_device_counts": [2], "mape_heldout_honest": 0.085,
        "mape_target_note": None}


def test_the_comm_model_is_judged_on_the_honest_counts_and_the_oversubscribed_one_says_so():
    from autoshard.pipeline.report import comm_model_lines

    text = "\n".join(comm_model_lines({"device": "cpu", "comm": COMM}))
    assert "Honest device counts: 2. This machine lets the stage use 2 cores" in text
    assert "Held-out MAPE over the honest counts 8.5% (target 10%): met." in text
    assert ("Oversubscribed, 4 devices: held-out MAPE 11.8% (measured across 4 processes on 2 cores: "
            "oversubscribed, mostly scheduling") in text
    assert "Pooled over all counts 10.7%" in text and "11.6%" in text
    none = COMM | {"honest_limit": 1, "honest_device_counts": [], "mape_heldout_honest": None,
                   "mape_target_met": False, "mape_target_note": "every one is oversubscribed"}
    text = "\n".join(comm_model_lines({"device": "cpu", "comm": none}))
    assert "Honest device counts: none." in text and "**not met**: every one is oversubscribed" in text
    assert "Oversubscribed, 2 devices" in text and "Oversubscribed, 4 devices" in text
    gpus = "\n".join(comm_model_lines({"device": "cuda", "comm": COMM | {"honest_device_counts": [2]}}))
    assert "use 2 GPUs" in gpus and "on 2 GPUs" in gpus



def test_the_comm_verdict_shows_the_measurement_floor_where_recorded():
    from autoshard.pipeline.report import comm_model_lines

    floored = "\n".join(comm_model_lines({"device": "cpu", "comm": COMM | {"mape_floor_honest": 0.041,
                                                                         "mape_floor": 0.052, "rounds": 3,
                                                                         "mape_noise_free_honest": 0.022}}))
    assert ("Held-out MAPE over the honest counts 8.5% (target 10%): met; one round of a held-out placement "
            "against the median of its other rounds scores 4.1%, so a noise-free model would score about 2.2% "
            "against the median of 3 rounds") in floored
    plain = comm_model_lines({"device": "cpu", "comm": COMM})
    assert comm_model_lines({"device": "cpu", "comm": COMM | {"mape_floor_honest": None}}) == plain
    assert "noise-free" not in "\n".join(plain) and "(target 10%): met." in "\n".join(plain)


def test_a_noise_free_comm_model_scores_below_the_one_round_floor():
    from autoshard.measure.commmodel import median_variance, noise_free_comm_mape

    assert median_variance(1) == pytest.approx(1, abs=0.01) and median_variance(2) == pytest.approx(0.5, abs=0.01)
    assert median_variance(3) == pytest.approx(0.449, abs=0.01)  # the median of 3 normals
    g = np.random.default_rng(1)  # check the conversion by simulation: rows of 3 noisy rounds around a truth
    rounds = 1 + 0.1 * g.standard_normal((100_000, 3))
    floor = np.mean(np.abs(rounds[:, 0] - np.median(rounds[:, 1:], axis=1)) / np.median(rounds[:, 1:], axis=1))
    truth_error = np.mean(np.abs(np.median(rounds, axis=1) - 1))
    assert noise_free_comm_mape(floor, 3) == pytest.approx(truth_error, rel=0.05)

def test_an_oversubscribed_measurement_names_its_processes_and_cores():
    from autoshard.pipeline.report import comm_sources

    evaluate = {"comm_source": {"dreamshard": "measured-oversubscribed", "tight": "measured"}}
    assert comm_sources(evaluate, {"device": "cpu", "comm": COMM}) == (
        "the all-to-all measured across 4 processes on 2 cores: oversubscribed, mostly scheduling (dreamshard); "
        "the all-to-all measured across one process per device (tight)")
    assert "more processes than cores: oversubscribed, mostly scheduling (dreamshard)" in comm_sources(evaluate)


def test_the_device_error_line_names_both_models_and_the_target():
    errors = {"cost_model_device_error_median": {"autoshard": 0.084, "dreamshard": 0.137},
              "hybrid_device_error_median": {"autoshard": 0.025, "dreamshard": 0.029}, "device_error_target": 0.03}
    line = device_error_line(errors)
    assert "feature-only: autoshard 8.4%, dreamshard 13.7% — target not met" in line
    assert "hybrid: autoshard 2.5%, dreamshard 2.9% — target met" in line and "at most 3%" in line
    older = device_error_line({"cost_model_device_error_median": {"autoshard": 0.084}})
    assert "hybrid" not in older and "Target" not in older and "target met" not in older
    assert device_error_line({}).startswith("This run's evaluate stage recorded no device-level error")
    unknown = device_error_line(errors | {"hybrid_device_error_median": {"autoshard": 0.01, "dreamshard": None}})
    assert "hybrid: autoshard 1.0%, dreamshard n/a — target not met" in unknown, "a missing figure meets nothing"


def test_the_hybrid_is_labelled_as_profiling_every_table():
    from autoshard.pipeline.report import hybrid_label

    text = hybrid_label({"shards_by_kind": {"single": 856, "heuristic": 30}, "seconds": 318.4})
    assert "every table is profiled alone first (here 856 single-table measurements" in text and "5.3 min" in text
    assert "not generalisation to tables never measured" in text
    assert "(here" not in hybrid_label(None), "a run without a profile says what the hybrid needs, not a count"


def test_a_baseline_that_placed_as_another_on_most_tasks_is_shown_once():
    from autoshard.pipeline.report import shown_once

    block = {"dreamshard": {"sync_milp__vs__sync_local_search": {"identical_share": 0.7},
                            "sync_local_search__vs__sync_greedy": {"identical_share": 0.1}}}
    kept, notes = shown_once(("sync_greedy", "sync_local_search", "sync_milp"), block, ("dreamshard",))
    assert kept == ("sync_greedy", "sync_local_search")
    assert notes == ["`sync_milp` placed exactly as `sync_local_search` on most tasks (dreamshard 70% of them): "
                     "shown once, as `sync_local_search`."]
    assert shown_once(("sync_greedy", "sync_milp"), {"dreamshard": {}}, ("dreamshard",))[0] == ("sync_greedy",
                                                                                                  "sync_milp")


def test_the_hybrids_form_is_shown_against_the_same_information_at_equal_data():
    from autoshard.pipeline.report import architecture_line

    hybrid = {"equal_data_hybrid_mape_seen": 0.041, "equal_data_hybrid_mape_unseen": 0.068,
              "informed_mape_seen": 0.052, "informed_mape_unseen": float("nan"),
              "feature_only_mape_seen": 0.09, "feature_only_mape_unseen": 0.136}
    text = architecture_line({"hybrid": hybrid})
    assert "the hybrid 4.1% / 6.8%" in text and "as an input 5.2% / n/a" in text
    assert "without them, 9.0% / 13.6%" in text
    assert architecture_line({"hybrid": {"mape_seen": 0.04}}) == "", "a run without the comparison says nothing"


def test_the_headroom_stands_beside_each_endpoint_against_greedy():
    room = {"tasks": 40, "tasks_without_greedy": 0, "greedy_gap": 0.012, "greedy_gap_max": 0.05,
            "greedy_gap_above_share": 0.6, "bound": 0.988, "how": "best of local search from 9 starts and every "
            "method's plan", "starts": 9, "search_seconds": 20.0, "captured": {"rl_greedy": -0.5, "cost_greedy": 0.0},
            "captured_tasks": 30, "lpt_gap": 0.002, "how_lpt": "MILP lower bound", "lpt_gap_optimal_share": 0.25,
            "measured_gap": 0.01, "measured_cost": "max_device_ms", "measured_tasks": 40,
            "measured_of": {"cost_greedy_local_search": 40}, "measured_at_best_share": 0.1, "noise_floor": 0.07,
            "noise_key": "noise.noise_sd_max_device.autoshard", "exceeds_noise": False}
    gated = EVALUATE["primary"]["rl_greedy__vs__cost_greedy__autoshard"] | {"verdict": "no headroom", "p_holm": None}
    evaluate = EVALUATE | {"headroom": {"autoshard": room}, "primary": {"a": gated}}
    check(evaluate, EvaluateMetrics, "evaluate.json")
    table = primary_table(evaluate)
    assert "**no headroom**" in table and "1.20% / 14.0%" in table, "the gap against twice the noise floor"
    text = headroom_table(evaluate)
    assert "1.20% (5.00%)" in text and "cost_greedy_local_search 40" in text and "**no**" in text
    assert re.search(r"\| rl_greedy +\| -0\.50 +\|", text), "captured: worse than cost_greedy"
    assert headroom_table(EVALUATE) == "(no protocol evaluated)"


def family(name: str, gap: float, speeds: str = "equal", blind: float | None = None) -> dict:
    return {"family": name, "per_device": 2, "devices": 8, "memory": "ample", "speeds": speeds, "tasks": 12,
            "greedy_gap": gap, "greedy_gap_p90": 2 * gap, "greedy_gap_max": 3 * gap,
            "blind_gap": gap if blind is None else blind, "exceeds_noise": gap > 2 * 0.05}


def test_the_candidate_regimes_say_which_exceed_twice_the_noise_floor():
    searched = EVALUATE["families"] | {"families": [family("2 per device", 0.02),
                                                    family("mixed", 0.03, "generations", blind=0.4)]}
    check(EVALUATE | {"families": searched}, EvaluateMetrics, "evaluate.json")
    text = families_table(EVALUATE | {"families": searched})
    assert "10.0% (twice `headroom.dreamshard.noise_floor`)" in text and "**none exceeds it**" in text
    assert re.search(r"\| mixed +\| +12 \| 3\.00% \(6\.00%, 9\.00%\) +\| 40\.00% +\| no ", text)
    assert re.search(r"\| 2 per device +\| +12 \| 2\.00% \(4\.00%, 6\.00%\) +\| – ", text), "no blind gap: equal speeds"
    kept = families_table(EVALUATE | {"families": searched | {"families": [family("few", 0.2)]}})
    assert "kept as candidates for a measured protocol: few." in kept and "| yes" in kept
    assert families_table(EVALUATE).startswith("(no candidate regimes searched")


def test_the_wide_pool_table_reads_the_error_by_widest_dim():
    from autoshard.pipeline.report import WIDE_SET, wide_table

    by_dim = {WIDE_SET: {"4": {"mape": 0.1, "shards": 3}, "1024": {"mape": 0.7, "shards": 2}}}
    wide = {"dims": [4, 256, 1024], "shards": {}, "best_epoch": 1,
            "mape": {"fitted": {WIDE_SET: 0.34}, "pool's": {WIDE_SET: 0.9}},
            "error_by_dim": {"fitted": by_dim, "pool's": {WIDE_SET: {"4": {"mape": 0.2, "shards": 3},
                                                                   "1024": {"mape": 1.5, "shards": 2}}}}}
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in wide_table({"wide": wide}).splitlines()]
    assert cells[0] == ["estimator", "all (5)", "dim 4 (3)", "dim 1024 (2)"], "no column for a dim without shards"
    assert cells[2] == ["fitted", "34.0%", "10.0%", "70.0%"] and cells[3] == ["pool's", "90.0%", "20.0%", "150.0%"]
    assert wide_table({}) is None and wide_table({"wide": wide | {"error_by_dim": {}}}) is None

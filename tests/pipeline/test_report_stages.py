"""The stage pages' parts: each table and sentence built from its stage's typed result says what the
metrics hold (a wrong key, cell or word breaks these), exploratory ones without verdict words."""

import json
from pathlib import Path

from autoshard.pipeline.report import ablation, alltoall, columns, cost_model, evaluate, exploratory, transfer
from autoshard.pipeline.report.format import Figures, table

ROOT = Path(__file__).resolve().parents[2]
COMM = {"placements": 40, "device_counts": [2, 4], "batch_size": 2048, "heldout_share": 0.25,
        "mape_heldout": 0.107, "mape_heldout_by_world": {"2": 0.085, "4": 0.118}, "mape_train": 0.093,
        "mape_heldout_across": 0.116, "median_ms_by_world": {"2": 10.8, "4": 11.7}, "mape_target": 0.1,
        "mape_target_met": True, "honest_limit": 2, "honest_device_counts": [2], "mape_heldout_honest": 0.085,
        "mape_target_note": None}


def committed(stage: str) -> dict:
    return json.loads((ROOT / "reports" / "metrics" / f"{stage}.json").read_text())


def test_a_table_has_no_padding_and_escapes_a_bar():
    assert table([{"a": "x|y", "b": "1"}, {"a": "z"}]) == "| a | b |\n|---|---|\n| x\\|y | 1 |\n| z |  |"
    assert table([], "(none here)") == "(none here)"


def test_the_comm_model_is_judged_on_the_honest_counts_and_the_oversubscribed_one_says_so():
    text = "\n".join(alltoall.comm_model_lines({"device": "cpu", "comm": COMM}))
    assert "Honest device counts: 2. This machine lets the stage use 2 cores" in text
    assert "Held-out MAPE over the honest counts 8.5% (target 10%): met." in text
    assert ("Oversubscribed, 4 devices: held-out MAPE 11.8% (measured across 4 processes on 2 cores: "
            "oversubscribed, mostly scheduling") in text
    floored = "\n".join(alltoall.comm_model_lines({"device": "cuda", "comm": COMM | {
        "mape_floor_honest": 0.041, "rounds": 3, "mape_noise_free_honest": 0.022}}))
    assert "scores 4.1%, so a noise-free model would score about 2.2% against the median of 3 rounds" in floored
    assert "use 2 GPUs" in floored


def test_each_protocols_all_to_all_source_is_named():
    evaluate_ = {"comm_source": {"dreamshard": "measured-oversubscribed", "tight": "measured"}}
    assert alltoall.comm_sources(evaluate_, {"device": "cpu", "comm": COMM}) == (
        "the all-to-all measured across 4 processes on 2 cores: oversubscribed, mostly scheduling (dreamshard); "
        "the all-to-all measured across one process per device (tight)")
    assert alltoall.comm_sources({}) == "the all-to-all (source not recorded)"


def test_the_device_error_line_names_both_models_and_the_target():
    errors = {"cost_model_device_error_median": {"autoshard": 0.084, "dreamshard": 0.137},
              "hybrid_device_error_median": {"autoshard": 0.025, "dreamshard": 0.029}, "device_error_target": 0.03}
    line = " ".join(evaluate.device_error_line(errors).split())
    assert "feature-only: autoshard 8.4%, dreamshard 13.7% - target not met" in line
    assert "hybrid: autoshard 2.5%, dreamshard 2.9% - target met" in line and "at most 3%" in line
    assert evaluate.device_error_line({}).startswith("This run's evaluate stage recorded no device-level error")


def test_a_baseline_that_placed_as_another_on_most_tasks_is_shown_once():
    entries = {"sync_milp__vs__sync_local_search": {"identical_share": 0.7},
               "sync_local_search__vs__sync_greedy": {"identical_share": 0.1}}
    kept, notes = exploratory.shown_once(("sync_greedy", "sync_local_search", "sync_milp"), entries)
    assert kept == ["sync_greedy", "sync_local_search"]
    assert notes == ["`sync_milp` placed exactly as `sync_local_search` on 70% of the tasks: shown once, as "
                     "`sync_local_search`."]


def test_the_failed_placements_name_the_methods_that_failed():
    text = exploratory.failed_table({"failed": {"tight": {"cost_greedy": 0, "torchrec": 3}, "dreamshard": {"x": 0}}})
    assert "| tight | torchrec: 3 |" in text and "| dreamshard | none: every method placed every task |" in text


def test_the_cost_model_page_sets_every_estimator_against_each_test_set():
    c = committed("cost_model")
    text = cost_model.comparison_table(c)
    header = text.splitlines()[0]
    assert header.startswith("| estimator | seen tables, multi-table shards |")
    score = c["comparison"]["TorchRec analytic | seen tables, multi-table shards"]
    assert f"| TorchRec analytic | {score['mape']:.1%} (R2 {score['r2']:.2f}" in text


def test_the_floor_line_sets_the_models_against_a_re_measurement():
    floor = {"shards": 40, "pass_to_pass_mape": 0.055, "pass_to_pass_mape_rescaled": 0.05,
             "mape_vs_main": {"hybrid": 0.07}, "mape_vs_mean": {"hybrid": 0.05}}
    line = " ".join(cost_model.floor_line({"measurement_floor": floor}).split())
    assert "a re-measurement (the second pass as the prediction) 5.5% (5.0% once" in line
    assert "hybrid 7.0% (5.0% against the mean" in line and "about 3.5%" in line
    assert "no measurement floor" in cost_model.floor_line({})


def test_the_active_selection_says_whether_choosing_beat_chance_without_a_verdict():
    arms = {"active": {"seen": 0.066, "unseen": 0.121}, "uniform": {"seen": 0.069, "unseen": 0.131}}
    active = {"rounds": 3, "shards_per_round": 50, "ensemble": 5, "seeds": 3, "candidates": 3000,
              "shards_measured": 290, "mape": arms, "mape_sd": {k: {"seen": 0.001, "unseen": 0.002} for k in arms},
              "paired": {"active - uniform | unseen": {"difference": -0.0105, "ci_low": -0.018, "ci_high": -0.0034,
                                                       "p_value": 0.014, "shards": 188}}}
    text = cost_model.active_table({"active": active})
    assert "| active - uniform | unseen | -1.1 [-1.8, -0.3] | 0.014 | 188 | lower error |" in text
    wide = active | {"mape_sd": {k: {"seen": 0.03, "unseen": 0.03} for k in arms}}
    assert "within the fits' spread" in cost_model.active_table({"active": wide})


def test_the_transfer_page_is_point_by_method_per_axis(transfer_metrics):
    text = transfer.axis_table(transfer_metrics, "tables")
    row = next(line for line in text.splitlines() if line.startswith("| tables = 320"))
    for name in ("rl_greedy", "cost_greedy"):
        p = transfer_metrics["axes"]["tables"][name]["320"]
        assert f"{p['ratio_median']:.3f} [{p['ratio_lo']:.3f}, {p['ratio_hi']:.3f}]" in row


def test_the_ablation_table_shows_each_variant_against_the_full_method(ablation_metrics):
    lines = ablation.ablation_table(ablation_metrics).splitlines()
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["full method", "MLP state (no LSTM)"]
    no_lstm = ablation_metrics["variants"][1]
    assert f"{no_lstm['vs_full']:+.3f}" in lines[3] and f"[{no_lstm['min']:.3f}, {no_lstm['max']:.3f}]" in lines[3]


def test_the_columns_page_is_method_by_twin_per_protocol():
    c = committed("columns")
    protocol = next(iter(c["protocols"]))
    method, entry = next(iter(c["protocols"][protocol].items()))
    row = next(line for line in columns.protocol_table(c, protocol).splitlines() if line.startswith(f"| {method} |"))
    assert f"| {entry['twin']} | {entry['tasks']} | {entry['median_ratio']:.3f} [" in row
    for word in ("better", "worse", "equivalent"):
        assert word not in columns.protocol_table(c, protocol), "exploratory: no verdict words"


def test_a_figure_is_placed_once_and_only_where_the_stage_saved_it(tmp_path):
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "fusion_gap.png").write_bytes(b"\x89PNG")
    figures = Figures(tmp_path)
    assert figures.inline("profile", "missing", "x") == ""
    assert figures.unplaced("profile") == ["fusion_gap"]
    assert figures.inline("profile", "fusion_gap", "gap") == "![gap](figures/profile/fusion_gap.png)"
    assert figures.unplaced("profile") == []


def test_every_methods_results_and_the_targets_come_from_the_metrics():
    results = {"autoshard": {"size_greedy": {"plans": 4, "ratio_median": 1.0, "ratio_lo": 1.0, "ratio_hi": 1.1,
                                             "win_rate": 0.0, "mean_ms": 10.0, "predicted_ratio_median": 0.9,
                                             "seconds_median": 0.01},
                             "rl_greedy": {"plans": 4, "ratio_median": 0.8312, "ratio_lo": 0.75, "ratio_hi": 0.9,
                                           "win_rate": 0.75, "mean_ms": 8.3, "predicted_ratio_median": 0.8,
                                           "seconds_median": 0.02}}}
    text = exploratory.results_table({"results": results, "objective": {"autoshard": "synchronized_stages"}})
    assert "**autoshard** (4 tasks; bottleneck: synchronized_stages)" in text
    assert "| rl_greedy | 4 | 0.831 [0.750, 0.900] | 75% | 8.30 | 0.800 | 0.0200 |" in text
    targets = [{"protocol": "autoshard", "method": "rl_greedy", "statistic": "measured median ratio", "value": 0.8312,
                "target": "<= 0.9", "met": True},
               {"protocol": "small", "method": "rl_greedy", "statistic": "predicted gap", "value": 0.0123,
                "target": "<= 0.01", "met": False}]
    measured, predicted = exploratory.targets_table({"targets": targets}).split("Predicted (cost model):")
    assert "| autoshard | rl_greedy | measured median ratio | 0.831 | <= 0.9 | met |" in measured
    assert "0.012" not in measured and "| **not met** |" in predicted

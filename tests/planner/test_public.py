"""The public-shapes benchmark: its models as published, and its page records a run that did
not finish as a result, not a gap."""

import argparse

from autoshard.planner import public


def test_the_criteo_models_have_their_published_shapes():
    kaggle, terabyte = public.model("criteo_kaggle", 0), public.model("criteo_terabyte", 0)
    assert len(kaggle) == len(terabyte) == 26
    assert kaggle["rows"].max() == 10131227 and set(kaggle["dim"]) == {16}
    assert terabyte["rows"].max() == 40_000_000 and set(terabyte["dim"]) == {128}
    assert terabyte["pooling_factor"].max() == 100
    assert len(public.model("production_240", 0)) == 240


def test_the_page_scores_against_the_defaults_and_keeps_what_did_not_finish():
    scored = {"finished": True, "command_seconds": 0.5, "peak_gib": 0.1, "split": {"replicated": 2, "rows": 1,
                                                                                     "columns": 0},
              "score": {"finished": True, "perf_max_ms": 9.0}}
    cell = {"model": "m", "tables": 3, "ranks": 8, "ours": scored,
            "torchrec_defaults": {"finished": True, "seconds": 4.0, "perf_max_ms": 10.0},
            "torchrec_our_accounting": {"finished": False, "why": "not finished in 90 s"}}
    args = argparse.Namespace(ranks=[8], bound_s=90.0, hbm=80 * 2**30, batch_per_rank=2048)
    text = public.page([cell], args)
    rows = [line for line in text.splitlines() if line.startswith("| m |")]
    assert rows[0].split(" | ")[4:6] == ["9", "0.900"]
    assert rows[1].split(" | ")[4:6] == ["10", "1.000"]
    assert "not finished in 90 s" in rows[2] and rows[2].split(" | ")[5] == "-"
    assert public.estimate(cell["torchrec_our_accounting"]) is None and public.estimate(scored) == 9.0


def test_a_plan_whose_scoring_did_not_finish_is_labelled_planned_with_its_own_times():
    unscored = {"finished": True, "command_seconds": 8.5, "placing_seconds": 2.0, "peak_gib": 0.3,
                "split": {"replicated": 5, "rows": 2, "columns": 2}, "score": {"finished": False,
                                                                             "why": "not finished in 120 s"}}
    cell = {"model": "m", "tables": 3, "ranks": 8, "ours": unscored,
            "torchrec_defaults": {"finished": True, "seconds": 9.3, "planning_seconds": 3.0, "perf_max_ms": 10.0},
            "torchrec_our_accounting": {"finished": False, "why": "not finished in 120 s"}}
    args = argparse.Namespace(ranks=[8], bound_s=120.0, hbm=80 * 2**30, batch_per_rank=2048)
    rows = [line.split(" | ") for line in public.page([cell], args).splitlines() if line.startswith("| m |")]
    assert rows[0][4] == "- (planned; TorchRec's scoring of the plan: not finished in 120 s)"
    assert rows[0][6:8] == ["8.5", "2.00"]   # our command's wall time and its placement
    assert rows[1][6:8] == ["9.3", "3.00"]   # TorchRec's scoring process and its plan call
    assert rows[2][4] == "- (not finished in 120 s)" and rows[2][6:8] == ["-", "-"]


def test_the_synthetic_keeps_ten_thousand_tables_and_shrinks_their_rows():
    big = public.model("synthetic_10000", 0)
    assert len(big) == 10_000 and big["rows"].min() >= 100
    assert (big["rows"] * big["dim"] * 4).sum() < 0.6 * 8 * 80 * 2**30, "its weights fit 8 ranks of 80 GiB"


def test_a_run_past_its_bound_or_failing_is_a_result_with_its_reason():
    import sys

    assert public._bounded([sys.executable, "-c", "import time; time.sleep(5)"], 0.5) == "not finished in 0.5 s"
    said = public._bounded([sys.executable, "-c", "import sys; print('no room', file=sys.stderr); sys.exit(2)"], 30)
    assert said == "no room"
    out, seconds, _ = public._bounded([sys.executable, "-c", "print(7)"], 30)
    assert out.strip() == "7" and seconds > 0

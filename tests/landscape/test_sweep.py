"""The GPU landscape (`landscape.sweep`): its script runs end to end on a CPU at toy size with
only numpy and torch, writes at most 8 files whose rows parse and whose figures are finite, stops
cleanly when its budget runs out, and draws its tables like the study's wide pool."""

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from autoshard.landscape import sweep as landscape
from autoshard.landscape.sweep import SMOKE, LandscapeConfig, plan, run

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("pandas", "yaml", "tqdm", "scipy", "sklearn", "torchrec", "fbgemm_gpu", "matplotlib", "pyarrow")


def numbers(value) -> list:
    """Every number (and None) in a summary section, however deep."""
    if isinstance(value, dict):
        return [x for v in value.values() for x in numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in numbers(v)]
    return [value] if value is None or isinstance(value, int | float) else []


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, float]:
    """`scripts/gpu_landscape.sh DIR --smoke` where importing pandas, PyYAML, tqdm (and the
    package's other libraries that are not numpy or torch) fails; its folder, process, seconds."""
    blocked = tmp_path_factory.mktemp("blocked")
    for name in BLOCKED:
        (blocked / f"{name}.py").write_text(f"raise ImportError('{name} is not installed here')\n")
    out = tmp_path_factory.mktemp("landscape") / "out"
    env = os.environ | {"PYTHONPATH": str(blocked), "PYTHON": sys.executable}
    t0 = time.perf_counter()
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_landscape.sh"), str(out), "--smoke"],
                          capture_output=True, text=True, env=env, timeout=120)
    return out, done, time.perf_counter() - t0


def test_the_script_runs_at_toy_size_with_numpy_and_torch_only(smoke):
    out, done, seconds = smoke
    assert done.returncode == 0, done.stdout + done.stderr
    assert seconds < 60
    files = sorted(p.name for p in out.iterdir())
    assert files == ["log.txt", "rows.jsonl", "run.json", "summary.json", "tables.json"] and len(files) <= 8
    assert "torch / torch_fused: median" in (out / "log.txt").read_text()


def test_every_item_is_measured_by_both_backends_and_the_rows_name_their_tables(smoke):
    out = smoke[0]
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    items = plan(LandscapeConfig(**SMOKE))
    assert len(rows) == 2 * len(items)
    assert {r["backend"] for r in rows} == {"torch_fused", "torch"}
    for i, item in enumerate(items):
        pair = [r for r in rows if r["item"] == i]
        assert sorted(r["backend"] for r in pair) == ["torch", "torch_fused"]
        assert all(r["tables"] == list(item.tables) and r["kind"] == item.kind for r in pair)
        assert all(r["status"] == "ok" and r["forward_ms"] > 0 and r["backward_ms"] > 0 for r in pair)
    tables = json.loads((out / "tables.json").read_text())["tables"]
    assert [t["table"] for t in tables] == list(range(SMOKE["tables"]))
    assert all(len(t["trace"]) == 64 and t["dim"] in (16, 32, 64, 128, 256) for t in tables)


def test_the_summary_holds_every_sanity_figure_and_each_is_finite(smoke):
    summary = json.loads((smoke[0] / "summary.json").read_text())
    assert summary["run"] | {"rows": None} == {"stopped": None, "skipped": 0, "measured": summary["run"]["planned"],
                                               "errors": 0, "planned": summary["run"]["planned"],
                                               "elapsed_s": summary["run"]["elapsed_s"], "rows": None}
    assert summary["device"]["type"] == "cpu" and summary["device"]["torch"]
    figures = {k: summary[k] for k in ("repeatability", "bandwidth", "fusion", "batch_scaling", "torch_over_fused")}
    for backend in ("torch_fused", "torch"):
        assert summary["repeatability"][backend]["n"] >= 3
        assert set(summary["fusion"][backend]) == {"2", "4", "8"}
        assert summary["batch_scaling"][backend]["batches"] == [128, 256, 512]
    values = numbers(figures) + [summary["copy_gbps"]]
    assert values and all(v is not None and math.isfinite(v) for v in values), figures


def test_an_exhausted_budget_stops_before_the_next_shard_and_leaves_valid_rows(tmp_path):
    out = tmp_path / "out"

    def clock() -> float:  # the budget runs out once four rows are written
        rows = out / "rows.jsonl"
        written = len(rows.read_text().splitlines()) if rows.exists() else 0
        return time.monotonic() + (1e6 if written >= 4 else 0.0)

    summary = run(LandscapeConfig(**SMOKE), out, clock)
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and {r["item"] for r in rows} == {0, 1}
    assert summary["run"]["stopped"] == "budget" and summary["run"]["measured"] == 2
    assert json.loads((out / "summary.json").read_text())["run"]["stopped"] == "budget"
    assert summary["fusion"] == {"torch_fused": {}, "torch": {}} and summary["batch_scaling"]["torch"] is None


def test_a_shard_predicted_to_overrun_the_budget_is_skipped():
    now = [0.0]
    budget = landscape.Budget(10.0, lambda: now[0])
    assert budget.fits(1e9)                  # nothing measured yet: no prediction
    budget.taken += [(1000.0, 2.0), (100.0, 1.0)]  # 2 s for 1,000 lookups, 1 s for 100
    now[0] = 5.0
    assert budget.predicted(2000.0) == 4.0 and budget.fits(2000.0)      # done at 9 s
    assert budget.predicted(300.0) == 3.0                                # the most per lookup of those alike
    assert not budget.fits(3000.0)                                       # 6 s more: past 10 s
    assert budget.predicted(40_000.0) == 80.0                            # none alike: the largest, scaled
    now[0] = 10.0
    assert budget.exhausted()


def test_the_plan_measures_singles_nested_prefixes_batches_random_shards_and_spread_repeats():
    cfg = LandscapeConfig()
    items = plan(cfg)
    kinds = [i.kind for i in items]
    assert kinds[0] == kinds[-1] == "repeat" and kinds.count("repeat") == cfg.repeats
    assert sorted(i.tables[0] for i in items if i.kind == "single") == list(range(cfg.tables))
    for o in range(cfg.orders):
        prefixes = [i.tables for i in items if i.kind == "prefix" and i.order == o]
        assert [len(p) for p in prefixes] == list(cfg.prefixes)
        assert all(p == prefixes[-1][:len(p)] for p in prefixes)
    reference = [i for i in items if i.kind in ("batch", "repeat")]
    assert {i.tables for i in reference} == {items[0].tables} and len(items[0].tables) == cfg.reference_tables
    assert [i.batch_size for i in reference if i.kind == "batch"] == list(cfg.batches)
    shards = [i.tables for i in items if i.kind == "random_shard"]
    assert len(shards) == cfg.random_shards and all(2 <= len(s) <= cfg.random_tables for s in shards)
    assert all(len(set(s)) == len(s) and max(s) < cfg.tables for s in shards)
    assert plan(cfg) == items and plan(replace(cfg, seed=1)) != items


def test_the_sample_is_drawn_by_the_wide_pools_generator_with_the_issues_dims():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    wide = params["pool"] | {k: v for k, v in params["wide"].items() if k in params["pool"]}
    assert {k: v for k, v in landscape.SAMPLE_POOL.items() if k != "dims"} == \
        {k: wide[k] for k in landscape.SAMPLE_POOL if k != "dims"}
    assert landscape.TABLE_MIB_MAX == params["wide"]["table_mib_max"]


@pytest.mark.parametrize("args, message", [
    (["--batches", "1024"], "--batches: 1024 (above --bags 512)"),
    (["--tables", "1"], "--tables: 1 (expected at least 2)"),
    (["--device", "tpu"], "--device: 'tpu' (expected cuda or cpu)"),
    (["--warmup", "-1"], "--warmup: -1 (expected at least 0)"),
    (["--prefixes", "2,x"], None),
])
def test_bad_settings_are_one_line_and_status_2(tmp_path, capsys, args, message):
    if message is None:  # what argparse refuses: its own usage and error, status 2
        with pytest.raises(SystemExit, match="2"):
            landscape.main(["--smoke", "--out", str(tmp_path / "out"), *args])
        assert "--prefixes: invalid" in capsys.readouterr().err
    else:
        assert landscape.main(["--smoke", "--out", str(tmp_path / "out"), *args]) == 2
        assert capsys.readouterr().err == f"autoshard.landscape.sweep: error: {message}\n"
    assert not (tmp_path / "out").exists()


def test_a_folder_holding_another_runs_rows_is_refused(tmp_path, capsys):
    (tmp_path / "rows.jsonl").write_text("")
    assert landscape.main(["--smoke", "--out", str(tmp_path)]) == 2
    assert "holds rows.jsonl of another run" in capsys.readouterr().err


def test_it_measures_the_study_s_own_tables_from_a_write_jobs_file(smoke_params, tmp_path):
    """`--jobs`: the sample is tables of an `autoshard measure --write-jobs` file, their traces
    regenerated and checked as the portable worker does; a batch above the file's traces is refused."""
    from autoshard.cli.main import main as autoshard

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(smoke_params))
    jobs = tmp_path / "jobs.json"
    assert autoshard(["measure", "--write-jobs", str(jobs), "--params", str(params), "--passes", "main",
                      "--backend", "torch_fused", "--device", "cpu"]) == 0
    listed = {t["table"]: t for t in json.loads(jobs.read_text())["traces"]["tables"]}
    bags = smoke_params["pool"]["batch_size"]
    options = ["--smoke", "--jobs", str(jobs), "--bags", str(bags), "--batches", f"{bags // 2},{bags}", "--tables", "6"]
    assert landscape.main(["--out", str(tmp_path / "out"), *options]) == 0
    tables = json.loads((tmp_path / "out" / "tables.json").read_text())
    assert tables["generator"] == {"jobs": str(jobs)} and len(tables["tables"]) == 6
    for entry in tables["tables"]:
        assert entry["trace"] == listed[entry["table"]]["trace"], "the pool's own trace, regenerated"
    rows = [json.loads(line) for line in (tmp_path / "out" / "rows.jsonl").read_text().splitlines()]
    assert {r["backend"] for r in rows} == {"torch_fused", "torch"} and all(r["status"] == "ok" for r in rows)
    assert landscape.main(["--out", str(tmp_path / "more"), "--smoke", "--jobs", str(jobs),
                           "--bags", str(bags * 2), "--batches", str(bags)]) == 2

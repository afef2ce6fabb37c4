"""The `autoshard` command: plan, score and compare on a user's tables, the TorchRec export and
its round trip through `DistributedModelParallel`, and every kind of bad input refused cleanly."""

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from study_configs import study

from autoshard.cli.main import main
from autoshard.cli.user_tables import BINS, parse_memory, read_tables
from autoshard.costmodel.model import CostModel, CostModelConfig, save_model
from autoshard.data.features import feature_matrix
from autoshard.data.tasks import Task


@pytest.fixture(scope="module")
def files(user_models) -> dict[str, Path]:
    return user_models


def plan(files, out, *extra, method="rl_greedy") -> int:
    return main(["plan", "--tables", str(files["tables"]), "--devices", "2", "--memory-per-device", "1GiB",
                 "--method", method, "--policy", str(files["policy"]), "--cost-model", str(files["model"]),
                 "--out", str(out), *extra])


@pytest.mark.parametrize("method", ["rl_greedy", "rl_best_of_n", "rl_local_search", "cost_greedy",
                                    "cost_greedy_local_search", "size_lookup_greedy", "torchrec"])
def test_plan_writes_a_complete_plan(files, tmp_path, capsys, method):
    out = tmp_path / "plan.json"
    assert plan(files, out, method=method) == 0
    doc = json.loads(out.read_text())
    names = pd.read_csv(files["tables"])["name"].tolist()
    assert doc["method"] == method and set(doc["assignment"]) == set(names)
    assert {d["device"] for d in doc["per_device"]} == {0, 1}
    assert sum(d["tables"] for d in doc["per_device"]) == len(names)
    assert all(d["memory_bytes"] <= doc["memory_per_device_bytes"] for d in doc["per_device"])
    assert doc["predicted_bottleneck_ms"] == pytest.approx(max(d["predicted_ms"] for d in doc["per_device"]))
    assert doc["model_files"]["cost_model"]["sha256"] and doc["sharding_seconds"] > 0
    assert ("policy" in doc["model_files"]) == method.startswith("rl_")
    assert "predicted bottleneck" in capsys.readouterr().out


def test_tables_outside_the_cost_models_range_are_named_in_one_line(files, tmp_path, capsys):
    """The cost model was fitted on dims 8-32: a 512-wide table and a billion-row one get one
    warning line (stderr and the plan's `warnings`); the plan is still made. Inside, no line."""
    out = tmp_path / "plan.json"
    assert plan(files, out, method="cost_greedy") == 0
    assert "outside the range" not in capsys.readouterr().err and "warnings" not in json.loads(out.read_text())
    wide = files["tables"].read_text() + "wide,1000,512,1\nhuge,1000000000,8,1\n"
    tables = tmp_path / "wide.csv"
    tables.write_text(wide)
    assert main(["plan", "--tables", str(tables), "--devices", "2", "--memory-per-device", "400GiB",
                 "--method", "cost_greedy", "--cost-model", str(files["model"]), "--out", str(out)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "outside the range" in line]
    assert len(err) == 1
    assert "2 of 10 tables" in err[0] and "dim 8-32 (1 outside, e.g. wide: 512)" in err[0]
    assert "rows 40-100000 (1 outside, e.g. huge: 1e+09)" in err[0] and "pooling_factor" not in err[0]
    assert json.loads(out.read_text())["warnings"] == [err[0].removeprefix("autoshard: ")]


def test_plan_options_and_json_output(files, tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert plan(files, out, "--best-of", "4", "--json", method="rl_best_of_n") == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["options"] == {"best_of": 4, "seed": 0, "batch_size": 2048}
    assert printed == json.loads(out.read_text())


def test_size_lookup_greedy_matches_the_evaluate_stage(tmp_path, smoke_params, monkeypatch):
    """On the study's own pool, the command's heuristic is the evaluate stage's heuristic."""
    from autoshard.data.pool import build_pool, save_pool
    from autoshard.placement.heuristics import heuristic_plan

    monkeypatch.chdir(tmp_path)  # no study outputs here: the heuristic needs no model
    pool = build_pool(smoke_params["dataset"], smoke_params["pool"], smoke_params["seed"], progress=False)
    save_pool(pool, tmp_path / "pool")
    out = tmp_path / "plan.json"
    assert main(["plan", "--tables", str(tmp_path / "pool"), "--devices", "3", "--memory-per-device", "64MiB",
                 "--method", "size_lookup_greedy", "--out", str(out), "--cost-model", str(tmp_path / "none.pt")]) == 2
    assert main(["plan", "--tables", str(tmp_path / "pool"), "--devices", "3", "--memory-per-device", "64MiB",
                 "--method", "size_lookup_greedy", "--out", str(out)]) == 0
    task = Task("x", "user", "test", tuple(range(pool.num_tables)), 3, 64 * 2**20, 1.0)
    expected = heuristic_plan("size_lookup_greedy", pool.features, task, 0)
    assignment = json.loads(out.read_text())["assignment"]
    assert [assignment[f"table_{t}"] for t in range(pool.num_tables)] == expected.tolist()


@pytest.mark.parametrize("backend", ["analytic", "fbgemm"])
def test_score_measures_a_plan_and_a_torchrec_plan(files, tmp_path, capsys, backend):
    out, exported = tmp_path / "plan.json", tmp_path / "plan.torchrec.json"
    assert plan(files, out, "--torchrec", str(exported), "--torchrec-device", "cpu", method="cost_greedy") == 0
    capsys.readouterr()
    results = []
    for path in (out, exported):
        assert main(["score", "--tables", str(files["tables"]), "--plan", str(path), "--backend", backend,
                     "--batch-size", "256", "--runs", "2", "--json"]) == 0
        results.append(json.loads(capsys.readouterr().out))
    for r in results:
        per_device = pd.DataFrame(r["per_device"])
        assert r["measured_bottleneck_ms"] == pytest.approx(per_device["total_ms"].max())
        busy = per_device["tables"] > 0
        assert per_device["tables"].sum() == 8 and (per_device.loc[busy, "total_ms"] > 0).all()
        assert (per_device.loc[~busy, "total_ms"] == 0).all()
    assert [d["tables"] for d in results[0]["per_device"]] == [d["tables"] for d in results[1]["per_device"]]


def test_score_reads_and_fills_a_measurement_store(files, tmp_path, capsys, monkeypatch):
    """With --store, a plan scored twice is measured once; the plain score gives the same
    analytic figures; other settings (batch size) measure again."""
    from autoshard.measure.analytic import AnalyticBackend

    out = tmp_path / "plan.json"
    assert plan(files, out, method="cost_greedy") == 0
    calls = []
    original = AnalyticBackend.measure
    monkeypatch.setattr(AnalyticBackend, "measure", lambda self, t, b: calls.append(b) or original(self, t, b))

    def score(*extra) -> dict:
        capsys.readouterr()
        assert main(["score", "--tables", str(files["tables"]), "--plan", str(out), "--backend", "analytic",
                     "--runs", "2", "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    stored = score("--batch-size", "256", "--store", str(tmp_path / "store"))
    first = len(calls)
    assert first > 0 and list((tmp_path / "store").glob("*/batch-*.json"))
    assert score("--batch-size", "256", "--store", str(tmp_path / "store")) == stored
    assert len(calls) == first, "the second score reads the store"
    plain = score("--batch-size", "256")
    assert plain["measured_bottleneck_ms"] == pytest.approx(stored["measured_bottleneck_ms"])
    before = len(calls)
    score("--batch-size", "128", "--store", str(tmp_path / "store"))
    assert len(calls) > before and len(list((tmp_path / "store").iterdir())) == 2


def test_compare_runs_every_method(files, capsys):
    from autoshard.cli.service import METHODS

    assert main(["compare", "--tables", str(files["tables"]), "--devices", "2", "--memory-per-device", "1GiB",
                 "--policy", str(files["policy"]), "--cost-model", str(files["model"]), "--best-of", "3",
                 "--measure", "--backend", "analytic", "--batch-size", "256", "--json"]) == 0
    rows = pd.DataFrame(json.loads(capsys.readouterr().out))
    assert set(METHODS) <= set(rows["method"])
    ok = rows[rows["status"] == "ok"]
    assert len(ok) >= len(METHODS) and (ok["measured_ms"] > 0).all() and (ok["predicted_ms"] > 0).all()


def test_exported_plan_runs_in_torchrec_with_two_processes(files, tmp_path):
    from autoshard.cli.torchrec.check import check

    out, exported = tmp_path / "plan.json", tmp_path / "plan.torchrec.json"
    assert plan(files, out, "--torchrec", str(exported), "--torchrec-device", "cpu", method="size_lookup_greedy") == 0
    result = check(files["tables"], exported, processes=2)
    assignment = json.loads(out.read_text())["assignment"]
    assert result["world_size"] == 2
    for r in result["ranks"]:
        assert r["max_abs_error"] < 1e-4
        assert r["tables"] == sorted(n for n, d in assignment.items() if d == r["rank"])


def test_torchrec_check_runs_one_process_per_rank_of_a_cpu_plan(files, tmp_path, capsys):
    from autoshard.cli.torchrec import check as torchrec_check

    out, exported = tmp_path / "plan.json", tmp_path / "plan.torchrec.json"
    assert plan(files, out, "--torchrec", str(exported), "--torchrec-device", "cpu", method="size_greedy") == 0
    assert torchrec_check.plan_ranks(exported, None) == 2
    for argv, pattern in (([str(exported), "--processes", "3"], r"--processes: 3 \(the plan has 2 ranks"),
                          ([str(out)], "not a TorchRec plan written by"),
                          ([str(tmp_path / "none.json")], "none.json: no such file")):
        assert torchrec_check.main([str(files["tables"]), *argv]) == 2
        assert re.search(pattern, capsys.readouterr().err)
    assert plan(files, out, "--torchrec", str(exported), method="size_greedy") == 0  # CUDA ranks
    assert torchrec_check.main([str(files["tables"]), str(exported)]) == 2
    assert "write it with `--torchrec-device cpu`" in capsys.readouterr().err


def test_help_needs_no_torch_and_lists_every_method():
    import subprocess
    import sys

    from autoshard.cli import main as cli
    from autoshard.cli import service as planning

    assert cli.METHODS == planning.METHODS
    code = "import sys; from autoshard.cli.main import parser; parser(); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_memory_sizes():
    assert parse_memory("16GiB") == 16 * 2**30
    assert parse_memory("16 GB") == 16 * 10**9
    assert parse_memory("1.5e10") == 15_000_000_000
    assert parse_memory("512 MiB") == 512 * 2**20


def write(tmp_path, text, name="tables.csv", mode="w"):
    path = tmp_path / name
    if mode == "wb":
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


HEADER = "name,rows,dim,pooling_factor\n"
BAD_TABLES = {
    "missing column": (HEADER.replace(",pooling_factor", "") + "a,10,16\n", r"missing column 'pooling_factor'"),
    "extra column": ("name,rows,dim,pooling_factor,owner\na,10,16,1,me\n", r"unknown column 'owner'"),
    "not a number": (HEADER + "a,10,16,1\nb,many,16,1\n", r"row 2 \(b\), field rows: 'many' \(not a number\)"),
    "negative": (HEADER + "a,10,16,-1\n", r"row 1 \(a\), field pooling_factor: '-1'"),
    "zero rows": (HEADER + "a,0,16,1\n", r"row 1 \(a\), field rows: '0' \(must be at least 1\)"),
    "header only": (HEADER, r"no tables"),
    "dim": (HEADER + "a,10,18,1\n", r"row 1 \(a\), field dim: 18 \(not a multiple of 4"),
    "duplicate": (HEADER + "a,10,16,1\nb,10,16,1\na,20,16,1\n", r"row 3, field name: 'a' \(a duplicate"),
    "empty file": ("", r"the file is empty"),
    "truncated": (HEADER + 'a,10,16,1\n"b,10,16\n', r"row 2|not a valid CSV"),
    "partial bins": ("name,rows,dim,pooling_factor,reuse_bin_0\na,10,16,1,1\n", r"missing column 'reuse_bin_1'"),
}


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
def test_bad_table_files_are_refused(files, tmp_path, capsys, case):
    text, pattern = BAD_TABLES[case]
    tables = write(tmp_path, text)
    out = tmp_path / "plan.json"
    assert main(["plan", "--tables", str(tables), "--devices", "2", "--memory-per-device", "1GiB",
                 "--method", "size_greedy", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(tables) in err
    import re

    assert re.search(pattern, err), err
    assert not out.exists() and not list(tmp_path.glob(".plan.json*"))


def test_binary_and_yaml_inputs(files, tmp_path, capsys):
    out = tmp_path / "plan.json"
    binary = write(tmp_path, bytes(range(256)) * 4, "tables.csv", "wb")
    assert main(["plan", "--tables", str(binary), "--devices", "2", "--memory-per-device", "1GiB",
                 "--method", "size_greedy", "--out", str(out)]) == 2
    assert "not a text file" in capsys.readouterr().err and not out.exists()
    rows = pd.read_csv(files["tables"]).to_dict("records")
    yaml_file = tmp_path / "tables.yaml"
    import yaml

    yaml_file.write_text(yaml.safe_dump({"tables": rows}))
    assert main(["plan", "--tables", str(yaml_file), "--devices", "2", "--memory-per-device", "1GiB",
                 "--method", "size_greedy", "--out", str(out)]) == 0
    truncated = write(tmp_path, "tables:\n  - {name: a, rows: 10\n", "bad.yaml")
    assert main(["plan", "--tables", str(truncated), "--devices", "2", "--memory-per-device", "1GiB",
                 "--method", "size_greedy", "--out", str(tmp_path / "p2.json")]) == 2
    assert "not valid YAML" in capsys.readouterr().err and not (tmp_path / "p2.json").exists()


def test_reuse_bins_given_or_computed(tmp_path):
    computed = read_tables(write(tmp_path, HEADER + "a,1000,16,4\n"))
    bins = computed.features[[f"reuse_{i}" for i in range(len(BINS))]].to_numpy()
    assert bins.sum() == pytest.approx(1.0) and bins[0, 0] > 0
    given = [0.5, 0.5] + [0.0] * (len(BINS) - 2)
    text = "name,rows,dim,pooling_factor," + ",".join(BINS) + "\na,1000,16,4," + ",".join(map(str, given)) + "\n"
    assert read_tables(write(tmp_path, text, "b.csv")).features[[f"reuse_{i}" for i in range(len(BINS))]
                                                                 ].to_numpy()[0].tolist() == given
    again = read_tables(write(tmp_path, HEADER + "a,1000,16,4\n", "c.csv"))
    assert np.array_equal(again.traces.indices, computed.traces.indices), "traces are seeded by the table name"


@pytest.mark.parametrize("args, pattern", [
    (["--memory-per-device", "lots"], r"--memory-per-device: 'lots'"),
    (["--devices", "0"], r"--devices: 0 \(must be at least 1\)"),
    (["--method", "magic"], r"--method: 'magic'"),
    (["--memory-per-device", "40KB"], r"row 1 \(user_id\): .* do not fit one device's memory"),
    (["--memory-per-device", "12MB"], r"more than the 2 devices hold together"),
])
def test_bad_task_arguments_are_refused(files, tmp_path, capsys, args, pattern):
    import re

    out = tmp_path / "plan.json"
    base = {"--devices": "2", "--memory-per-device": "1GiB", "--method": "size_greedy"}
    base |= dict(zip(args[::2], args[1::2], strict=True))
    argv = ["plan", "--tables", str(files["tables"]), "--out", str(out)] + [x for kv in base.items() for x in kv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(pattern, err), err
    assert not out.exists()


def test_a_policy_file_that_is_not_ours_is_refused(files, tmp_path, capsys):
    fake = tmp_path / "policy.pt"
    fake.write_bytes(b"not a checkpoint")
    out = tmp_path / "plan.json"
    assert main(["plan", "--tables", str(files["tables"]), "--devices", "2", "--memory-per-device", "1GiB",
                 "--policy", str(fake), "--cost-model", str(files["model"]), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(fake) in err and "not a policy checkpoint file" in err and not out.exists()


def test_missing_model_files_name_the_stage_that_makes_them(files, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AUTOSHARD_MODELS", str(tmp_path))  # no models here
    assert main(["plan", "--tables", str(files["tables"]), "--devices", "2", "--memory-per-device", "1GiB",
                 "--method", "rl_greedy", "--out", str(tmp_path / "plan.json")]) == 2
    assert "run `dvc repro train_rl`" in capsys.readouterr().err


def first_run(files, folder: Path, cache: Path, *extra: str) -> dict:
    out = folder / f"plan{len(list(folder.glob('plan*.json')))}.json"
    assert main(["plan", "--tables", str(files["tables"]), "--devices", "2", "--memory-per-device", "1GiB",
                 "--cache", str(cache), "--out", str(out), "--batch-size", "64", "--runs", "1", *extra]) == 0
    return json.loads(out.read_text())


def test_a_fresh_clone_plans_on_costs_measured_here_and_reuses_them(files, tmp_path, capsys, monkeypatch):
    """No trained models: every table is measured alone (FBGEMM on this CPU), cached, and LPT
    places on those costs; the plan says so; a second run measures nothing and plans alike."""
    monkeypatch.setenv("AUTOSHARD_MODELS", str(tmp_path))
    cache = tmp_path / "cache"
    doc = first_run(files, tmp_path, cache)
    assert "no trained models" in capsys.readouterr().err
    tables = read_tables(files["tables"])
    assert doc["method"] == "lpt_measured" and doc["costs"]["kind"] == "measured"
    assert doc["costs"]["backend"] == "fbgemm" and doc["costs"]["machine"]["cpu"]
    assert doc["costs"]["tables_measured_now"] == len(tables.names) and doc["costs"]["tables_from_cache"] == 0
    assert len(list((cache / "singles").glob("*.json"))) == len(tables.names), "one cached cost per table"
    again = first_run(files, tmp_path, cache)
    assert again["costs"]["tables_measured_now"] == 0 and again["costs"]["tables_from_cache"] == len(tables.names)
    assert again["assignment"] == doc["assignment"], "the same costs, the same plan"
    exact = first_run(files, tmp_path, cache, "--method", "milp")
    assert exact["costs"]["tables_measured_now"] == 0 and set(exact["assignment"]) == set(tables.names)
    out = tmp_path / "scored.json"
    assert main(["score", "--tables", str(files["tables"]), "--plan", str(tmp_path / "plan0.json"),
                 "--backend", "analytic", "--json"]) == 0, "the plan file reads back"
    assert not out.exists()


def test_the_single_cost_cache_is_keyed_by_what_the_measurement_depends_on(files, tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOSHARD_MODELS", str(tmp_path))
    cache = tmp_path / "cache"
    first_run(files, tmp_path, cache)
    before = set((cache / "singles").glob("*.json"))
    other = first_run(files, tmp_path, cache, "--batch-size", "32")
    assert other["costs"]["tables_measured_now"] == len(read_tables(files["tables"]).names), \
        "another batch size is another measurement"
    damaged = sorted(set((cache / "singles").glob("*.json")) - before)[0]
    damaged.write_text("{not json")
    again = first_run(files, tmp_path, cache, "--batch-size", "32")
    assert again["costs"]["tables_measured_now"] == 1, "a damaged entry is measured again, not trusted"


def test_a_plan_for_other_tables_is_refused(files, tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert plan(files, out, method="size_greedy") == 0
    other = write(tmp_path, HEADER + "a,10,16,1\n", "other.csv")
    assert main(["score", "--tables", str(other), "--plan", str(out), "--backend", "analytic"]) == 2
    assert "is not in" in capsys.readouterr().err


def test_plan_runs_without_torch_when_the_numpy_planner_matches(files, tmp_path):
    """With `planner.npz` exported from the model files next to them, `plan` (rl greedy,
    cost-greedy, a heuristic) never imports torch and writes the plan torch would; a stale
    export is ignored and sampling or local search still use torch."""
    import shutil
    import subprocess
    import sys

    from autoshard.rl import numpy_planner

    root = tmp_path / "models"
    root.mkdir()
    models = {k: shutil.copy(files[k], root / files[k].name) for k in ("model", "policy")}
    docs = {}
    for method in ("rl_greedy", "cost_greedy", "size_greedy"):
        out = tmp_path / f"{method}.torch.json"
        assert plan({**files, **models}, out, method=method) == 0
        docs[method, "torch"] = json.loads(out.read_text())
    numpy_planner.export(models["model"], models["policy"], root / numpy_planner.FILE_NAME)
    for method in ("rl_greedy", "cost_greedy", "size_greedy"):
        out = tmp_path / f"{method}.numpy.json"
        code = ("import sys; from autoshard.cli.main import main; "
                f"rc = main(['plan', '--tables', {str(files['tables'])!r}, '--devices', '2', "
                f"'--memory-per-device', '1GiB', '--method', {method!r}, '--policy', {str(models['policy'])!r}, "
                f"'--cost-model', {str(models['model'])!r}, '--out', {str(out)!r}]); "
                "print('torch' in sys.modules); sys.exit(rc)")
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip().splitlines()[-1] == "False"
        doc, before = json.loads(out.read_text()), docs[method, "torch"]
        assert (doc["engine"], before["engine"]) == ("numpy", "torch")
        assert doc["assignment"] == before["assignment"] and doc["model_files"] == before["model_files"]
        assert doc["predicted_bottleneck_ms"] == pytest.approx(before["predicted_bottleneck_ms"], rel=1e-5)
    out = tmp_path / "sampled.json"
    assert plan({**files, **models}, out, "--best-of", "2", method="rl_best_of_n") == 0
    assert json.loads(out.read_text())["engine"] == "torch"
    save_model(CostModel.fitted_to(study(CostModelConfig, hidden=4, encoding=4, head_hidden=4),
                                   feature_matrix(read_tables(files["tables"]).features)), models["model"])
    assert plan({**files, **models}, out, method="cost_greedy") == 0  # the export is stale now
    assert json.loads(out.read_text())["engine"] == "torch"


def test_plan_bench_times_the_command(files, tmp_path, smoke_params, monkeypatch, capsys):
    """The benchmark runs the real command on tiled pool tables and reports time and memory."""
    import shutil

    from autoshard.cli import bench as plan_bench
    from autoshard.data.pool import build_pool, save_pool
    from autoshard.rl import numpy_planner

    monkeypatch.chdir(tmp_path)
    save_pool(build_pool(smoke_params["dataset"], smoke_params["pool"], 0, progress=False), tmp_path / "data/pool")
    rl = tmp_path / "data/rl"
    rl.mkdir()
    shutil.copy(files["model"], rl / "cost_model.pt")
    shutil.copy(files["policy"], rl / "policy.pt")
    numpy_planner.export(rl / "cost_model.pt", rl / "policy.pt", rl / numpy_planner.FILE_NAME)
    assert plan_bench.main(["--sizes", "30x4", "--repeats", "2"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (row["tables"], row["devices"], row["engine"]) == (30, 4, "numpy")
    assert len(row["command_seconds_all"]) == 2 and row["command_seconds_median"] > row["placing_seconds_last"] > 0
    assert 0 < row["peak_memory_gib"] < 4


def column_plan(files, out, *extra) -> int:
    return plan(files, out, "--sharding", "column", "--split", "history=2", *extra, method="cost_greedy")


def test_a_column_wise_plan_lists_each_split_tables_columns(files, tmp_path):
    from autoshard.cli.plan_files import read_columns as read

    out = tmp_path / "plan.json"
    assert column_plan(files, out, "--column-ways", "1,2,4") == 0
    doc = json.loads(out.read_text())
    assert doc["sharding"] == "column" and doc["options"]["split"] == {"history": 2}
    assert [(c["start"], c["width"]) for c in doc["columns"]["history"]] == [(0, 16), (16, 16)]
    names = pd.read_csv(files["tables"])["name"].tolist()
    assert set(doc["assignment"]) | set(doc["columns"]) == set(names)
    shards, placement, devices = read(out, read_tables(files["tables"]))
    assert devices == 2 and len(shards) == len(placement) == len(doc["assignment"]) + sum(
        len(c) for c in doc["columns"].values())
    assert sum(d["shards"] for d in doc["per_device"]) == len(shards)


def test_a_column_wise_plan_runs_in_torchrec_and_computes_what_the_unsharded_module_does(files, tmp_path):
    from autoshard.cli.torchrec.check import check

    out, exported = tmp_path / "plan.json", tmp_path / "plan.torchrec.json"
    assert column_plan(files, out, "--torchrec", str(exported), "--torchrec-device", "cpu") == 0
    params = json.loads(exported.read_text())["modules"][""]
    assert params["history"]["sharding_type"] == "column_wise"
    assert [s["sizes"] for s in params["history"]["shards"]] == [[80000, 16], [80000, 16]]
    result = check(files["tables"], exported, processes=2)
    assert result["world_size"] == 2
    for r in result["ranks"]:
        assert r["max_abs_error"] < 1e-4


@pytest.mark.parametrize("extra,pattern", [
    (["--split", "query_terms=8"], r"table query_terms: dim 16 cannot be split into 8 column shards of a multiple "
                                   r"of 4 columns \(2 each\)"),
    (["--split", "history=3"], r"table history: dim 32 cannot be split into 3 column shards"),
    (["--split", "nope=2"], r"--split: 'nope=2' \(no table 'nope'"),
    (["--column-ways", "1,x"], r"--column-ways: '1,x'"),
])
def test_column_wise_bad_input_is_refused_in_one_line(files, tmp_path, capsys, extra, pattern):
    out = tmp_path / "plan.json"
    assert plan(files, out, "--sharding", "column", *extra, method="cost_greedy") == 2
    err = capsys.readouterr().err
    assert re.search(pattern, err) and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_column_options_need_column_sharding(files, tmp_path, capsys):
    assert plan(files, tmp_path / "p.json", "--split", "history=2", method="size_greedy") == 2
    assert "--split: --sharding table does not use it" in capsys.readouterr().err
    assert plan(files, tmp_path / "p.json", "--sharding", "column", method="rl_greedy") == 2
    assert "only cost_greedy" in capsys.readouterr().err


def test_score_measures_each_column_shard_at_its_width(files, tmp_path, capsys):
    out, exported = tmp_path / "plan.json", tmp_path / "plan.torchrec.json"
    assert column_plan(files, out, "--torchrec", str(exported), "--torchrec-device", "cpu") == 0
    capsys.readouterr()
    results = []
    for path in (out, exported):
        assert main(["score", "--tables", str(files["tables"]), "--plan", str(path), "--backend", "analytic",
                     "--batch-size", "256", "--json"]) == 0
        results.append(json.loads(capsys.readouterr().out))
    widths = pd.read_csv(files["tables"])["dim"].sum()
    doc = json.loads(out.read_text())
    shards = len(doc["assignment"]) + sum(len(c) for c in doc["columns"].values())
    assert shards >= 9  # history in two, at least
    for r in results:
        per_device = pd.DataFrame(r["per_device"])
        assert per_device["columns"].sum() == widths and per_device["tables"].sum() == shards
    assert results[0]["per_device"] == results[1]["per_device"]


def test_a_negative_zero_pooling_factor_is_zero(tmp_path):
    """"-0" passes the range check; as -0.0 it made numpy's trace sampler fail (`scale < 0`)."""
    tables = read_tables(write(tmp_path, HEADER + "a,1000,16,-0\nb,500,16,-0.0\n"))
    assert not np.signbit(tables.features["pooling_factor"]).any()
    assert len(tables.traces.indices) == 0  # empty bags, and no crash


def test_a_column_wise_plan_counts_each_shards_training_memory(files, tmp_path):
    from autoshard.cli.plan_files import read_columns as read
    from autoshard.cli.user_tables import read_tables
    from autoshard.data.footprint import shard_footprint

    out = tmp_path / "plan.json"
    assert column_plan(files, out, "--batch-size", "1024") == 0
    tables = read_tables(files["tables"])
    shards, placement, _ = read(out, tables)
    f = tables.features
    held = np.zeros(2, dtype=np.int64)
    for s, d in zip(shards, placement, strict=True):
        held[d] += shard_footprint(int(f["rows"][s.table]), s.width, 4, 1024, float(f["pooling_factor"][s.table]),
                                   False)
    assert [d["memory_bytes"] for d in json.loads(out.read_text())["per_device"]] == held.tolist()

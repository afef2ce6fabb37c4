"""The portable measurement worker and `autoshard measure`: a job file in, rows out; the pool
rebuilt from its seed gives the rows of the pool folder; bad job files are one line, status 2."""

import json
import re

import pytest

from autoshard.cli.main import main
from autoshard.core.compute import LocalEngine
from autoshard.data.pool import build_pool, save_pool
from autoshard.measure.worker import JOBS_FORMAT, ROWS_FORMAT, measure_job, parse_job, split

BACKEND = {"backend": "analytic", "device": "cpu", "optimizer": "EXACT_SGD", "batch_size": 64, "threads": 1,
           "warmup": 0, "runs": 1, "memory_limit_gib": 1.0}
SHARDS = [[0, 3, 5], [1], [2, 4, 6, 7], [8, 9]]


@pytest.fixture(scope="module")
def source(smoke_params, tmp_path_factory) -> dict:
    """A 12-table pool's parameters and seed, and the same pool saved as a folder."""
    params = {"dataset": smoke_params["dataset"], "pool": smoke_params["pool"] | {"num_tables": 12}, "seed": 0}
    folder = tmp_path_factory.mktemp("worker") / "pool"
    save_pool(build_pool(params["dataset"], params["pool"], 0, progress=False), folder)
    return {"params": params, "folder": {"folder": str(folder)}}


def job_doc(pool: dict, changes: dict | None = None) -> dict:
    return {"format": JOBS_FORMAT, "pool": pool, "backend": BACKEND, "shards": SHARDS} | (changes or {})


def test_measure_writes_a_row_per_shard_and_a_rebuilt_pool_gives_the_folder_rows(source, tmp_path, capsys):
    jobs, out = tmp_path / "jobs.json", tmp_path / "rows.json"
    jobs.write_text(json.dumps(job_doc(source["params"])))
    assert main(["measure", "--jobs", str(jobs), "--out", str(out)]) == 0
    assert "measured 4 of 4 shards with analytic on cpu" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["format"] == ROWS_FORMAT and [r["tables"] for r in doc["rows"]] == SHARDS
    row = doc["rows"][0]
    assert row["forward_ms"] > 0 and row["backward_ms"] > 0 and row["backend"] == "analytic"
    assert {"forward_iqr_ms", "backward_iqr_ms", "device", "status"} <= set(row) and row["versions"]["torch"]
    assert measure_job(parse_job(job_doc(source["folder"]))) == doc["rows"]


def test_split_jobs_on_an_engine_give_the_whole_jobs_rows(source):
    job = parse_job(job_doc(source["folder"]))
    parts = split(job, 3)
    assert len(parts) == 2 and sum(len(p.shards) for p in parts) == len(SHARDS)
    rows = [r for part in LocalEngine(1).map(measure_job, parts) for r in part]
    assert rows == measure_job(job)


@pytest.mark.parametrize("change, message", [
    ({"format": "other/1"}, r"job\.format: 'other/1' \(expected autoshard-measure-jobs/1\)"),
    ({"shards": [[0, 12]]}, r"job\.shards\[0\]: table 12 is not in the pool of 12 tables"),
    ({"shards": [[0], []]}, r"job\.shards\[1\]: \[\] \(expected a non-empty list of table ids\)"),
    ({"shards": [["a"]]}, r"job\.shards\[0\]: .*expected a non-empty list of table ids"),
    ({"backend": BACKEND | {"runs": 0}}, r"backend\.runs: 0 \(must be at least 1\)"),
    ({"backend": BACKEND | {"backend": "magic"}}, r"backend\.backend: 'magic' \(expected one of"),
    ({"backend": BACKEND | {"batch_size": 10**6}}, r"profile\.batch_size: 1000000 \(the traces hold"),
    ({"pool": {"folder": "/nonexistent/pool"}}, r"/nonexistent/pool: no pool here"),
    ({"extra": 1}, r"job\.extra: 1 \(unknown parameter\)"),
])
def test_bad_job_files_are_one_line_naming_the_file_and_field(source, tmp_path, capsys, change, message):
    jobs, out = tmp_path / "jobs.json", tmp_path / "rows.json"
    jobs.write_text(json.dumps(job_doc(source["folder"], change)))
    assert main(["measure", "--jobs", str(jobs), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"autoshard measure: error: {jobs}: ")
    assert re.search(message, err), err
    assert not out.exists()


def test_measure_refuses_a_job_file_that_is_not_json_and_an_output_that_is_its_input(tmp_path, capsys):
    jobs = tmp_path / "jobs.json"
    jobs.write_text("{not json")
    assert main(["measure", "--jobs", str(jobs), "--out", str(tmp_path / "rows.json")]) == 2
    assert "not JSON" in capsys.readouterr().err
    assert main(["measure", "--jobs", str(jobs), "--out", str(jobs)]) == 2
    assert "an input of this command" in capsys.readouterr().err


PLAN_SHARDS = [[0, 3, 5], [1, 2, 4, 6, 7], [8, 9, 10, 11]]


def plan_file(path, shards) -> None:
    """A hand-made table-wise plan of the 12-table pool (tables named as `read_tables` names them)."""
    assignment = {f"table_{t}": d for d, shard in enumerate(shards) for t in shard}
    path.write_text(json.dumps({
        "format": "autoshard-plan/1", "method": "by_hand", "options": {}, "tables_file": "pool", "devices": len(shards),
        "memory_per_device_bytes": 2**30, "assignment": assignment, "per_device": [{}] * len(shards),
        "predicted_bottleneck_ms": None, "predicted": "none", "sharding_seconds": 0.0, "model_files": {},
        "engine": "none"}))


def measured_rows(source, tmp_path, shards) -> tuple:
    """`autoshard measure` of `shards` on the pool folder: the rows file and its document."""
    jobs, out = tmp_path / "jobs.json", tmp_path / "rows.json"
    jobs.write_text(json.dumps(job_doc(source["folder"], {"shards": shards})))
    assert main(["measure", "--jobs", str(jobs), "--out", str(out)]) == 0
    return out, json.loads(out.read_text())


def store_import(rows, store, *extra) -> int:
    return main(["store", "import", str(rows), "--store", str(store), *extra])


def score_space(source, plan, store, space, *extra) -> int:
    return main(["score", "--tables", source["folder"]["folder"], "--plan", str(plan), "--backend", "analytic",
                 "--batch-size", "64", "--store", str(store), "--space", space, "--json", *extra])


@pytest.fixture
def no_measuring(monkeypatch):
    """Any measurement in this process from now on fails the test (requested after measuring the rows)."""
    from autoshard.measure import batches
    from autoshard.measure.analytic import AnalyticBackend

    def refuse(*_):
        raise AssertionError("measured here")

    monkeypatch.setattr(batches, "measure_batch_job", refuse)
    monkeypatch.setattr(AnalyticBackend, "measure", refuse)


def test_rows_carry_their_space_and_score_reads_the_imported_rows_without_measuring(source, tmp_path, capsys,
                                                                                   request):
    from autoshard.data.pool import load_pool
    from autoshard.measure.backends import BackendConfig
    from autoshard.measure.store import space

    rows, doc = measured_rows(source, tmp_path, PLAN_SHARDS)
    cfg = parse_job(job_doc(source["folder"])).backend
    assert isinstance(cfg, BackendConfig) and doc["space"] == space(cfg, load_pool(source["folder"]["folder"]))
    store = tmp_path / "store"
    capsys.readouterr()
    assert store_import(rows, store) == 0
    out = capsys.readouterr().out
    assert f"imported 3 shards into space {doc['space']} of {store}" in out and f"--space {doc['space']}" in out
    batch = list((store / doc["space"]).glob("batch-*.json"))
    assert len(batch) == 1 and "rows.json" in json.loads(batch[0].read_text())["label"]
    assert json.loads((store / doc["space"] / "space.json").read_text()) == doc["settings"]
    assert store_import(rows, store) == 0 and "already imported" in capsys.readouterr().out
    assert list((store / doc["space"]).glob("batch-*.json")) == batch, "re-importing is a no-op"
    plan = tmp_path / "plan.json"
    plan_file(plan, PLAN_SHARDS)
    request.getfixturevalue("no_measuring")
    assert score_space(source, plan, store, doc["space"]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert [d["forward_ms"] for d in scored["per_device"]] == [r["forward_ms"] for r in doc["rows"]]
    assert scored["space"] == doc["space"] and sorted(p.name for p in store.iterdir()) == [doc["space"]]


def other_machine(doc: dict) -> dict:
    """The rows document as a GPU node would have written it: its machine, so its own key."""
    from autoshard.measure.store import settings_key

    host = doc["settings"]["machine"] | {"gpu": "NVIDIA H200", "cpu": "Other CPU"}
    settings = doc["settings"] | {"machine": host}
    return doc | {"settings": settings, "space": settings_key(settings),
                  "rows": [r | {"versions": host} for r in doc["rows"]]}


def test_rows_of_another_machine_are_filed_under_their_own_key(source, tmp_path, capsys):
    _, doc = measured_rows(source, tmp_path, PLAN_SHARDS)
    foreign = other_machine(doc)
    assert foreign["space"] != doc["space"]
    rows, store = tmp_path / "gpu-rows.json", tmp_path / "store"
    rows.write_text(json.dumps(foreign))
    assert store_import(rows, store, "--pass", "repeat-1") == 0 and store_import(rows, store) == 0
    assert "NVIDIA H200" in capsys.readouterr().out
    from autoshard.core.digest import key

    assert sorted(p.name for p in store.iterdir()) == sorted([foreign["space"], key(foreign["space"], "repeat-1")])
    assert json.loads((store / foreign["space"] / "space.json").read_text())["machine"]["gpu"] == "NVIDIA H200"


@pytest.mark.parametrize("change, message", [
    (lambda d: d | {"format": "autoshard-measure-rows/1"}, r"rows\.format: autoshard-measure-rows/1 \(carries no "
                                                           r"space key"),
    (lambda d: d | {"space": "0" * 16}, r"rows\.space: '0{16}' \(not the key of rows\.settings"),
    (lambda d: d | {"rows": [d["rows"][0] | {"forward_ms": -1.0}]}, r"rows\.rows\[0\]\.forward_ms: -1\.0"),
    (lambda d: d | {"rows": [d["rows"][0] | {"forward_ms": None}]}, r"rows\.rows\[0\]\.forward_ms: None"),
    (lambda d: d | {"rows": [d["rows"][0], d["rows"][0]]}, r"rows\.rows\[1\]\.tables: \[0, 3, 5\] \(this shard is "
                                                           r"listed twice"),
    (lambda d: d | {"rows": [d["rows"][0] | {"versions": {"cpu": "x"}}]}, r"rows\.rows\[0\]\.versions: not the "
                                                                          r"machine of rows\.settings"),
    (lambda d: d | {"rows": []}, r"rows\.rows: \[\] \(expected a non-empty list\)"),
    (lambda d: d | {"settings": d["settings"] | {"code": "abc"}}, r"rows\.settings\.code: 'abc' \(expected a SHA-256"),
    (lambda d: {k: v for k, v in d.items() if k != "settings"}, r"rows\.settings: missing"),
])
def test_bad_rows_files_are_one_line_and_leave_the_store_alone(source, tmp_path, capsys, change, message):
    _, doc = measured_rows(source, tmp_path, PLAN_SHARDS[:1])
    rows, store = tmp_path / "bad.json", tmp_path / "store"
    rows.write_text(json.dumps(change(doc)))
    capsys.readouterr()
    assert store_import(rows, store) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"autoshard store: error: {rows}: "), err
    assert re.search(message, err), err
    assert not store.exists()


def test_a_foreign_space_missing_shards_is_an_error_and_nothing_is_measured(source, tmp_path, capsys, request):
    rows, doc = measured_rows(source, tmp_path, PLAN_SHARDS[:1])
    store, plan = tmp_path / "store", tmp_path / "plan.json"
    assert store_import(rows, store) == 0
    request.getfixturevalue("no_measuring")
    plan_file(plan, PLAN_SHARDS)
    files = sorted(store.rglob("*"))
    capsys.readouterr()
    assert score_space(source, plan, store, doc["space"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"measurement space {doc['space']}: 2 shards of the plan {plan} are missing" in err
    assert sorted(store.rglob("*")) == files
    for space, message in ((doc["space"][:8], "expected a space key"), ("f" * 16, "no such space")):
        assert score_space(source, plan, store, space) == 2
        assert f"--space: '{space}' ({message}" in capsys.readouterr().err
    assert main(["score", "--tables", source["folder"]["folder"], "--plan", str(plan), "--space", doc["space"]]) == 2
    assert "--space: only with --store" in capsys.readouterr().err
    assert score_space(source, plan, store, doc["space"], "--batch-size", "32") == 2
    assert "measured at batch size 64, not 32" in capsys.readouterr().err


# `autoshard measure --write-jobs`: the profile stage's shard list as worker job files, one per pass.


@pytest.fixture(scope="module")
def profile_plan(smoke_params) -> dict:
    """The smoke study's profile shards by pass tag, as the stage plans them (the notebook's
    `plan_jobs` call, its repeat rounds and its remeasure pass), and its pool and config."""
    from autoshard.data.tasks import make_tasks
    from autoshard.measure.collect import ProfileConfig, pass_tag, plan_jobs, remeasure_jobs
    from autoshard.placement.heuristics import every_plan

    p = smoke_params
    pool = build_pool(p["dataset"], p["pool"], p["seed"], progress=False)
    tasks, train, test = make_tasks(pool.features, p["tasks"], p["seed"])
    cfg = ProfileConfig.from_params(p["profile"] | {"backend": "analytic", "device": "cpu"})
    jobs = plan_jobs(pool, tasks, train, cfg, p["seed"], test,
                     placements=lambda task: every_plan(pool.features, task, p["seed"]))
    by_pass = {pass_tag(r): [list(j.tables) for j in jobs if j.round == r] for r in range(cfg.repeat_rounds + 1)}
    by_pass["remeasure"] = [list(j.tables) for j in remeasure_jobs(jobs, train)]
    return {"pool": pool, "cfg": cfg, "shards": by_pass}


@pytest.fixture
def params_file(smoke_params, tmp_path):
    """The smoke parameters as a file, a function that writes changed ones."""
    import yaml

    def write(changes: dict | None = None):
        from autoshard.core.params import merge

        path = tmp_path / "params.yaml"
        path.write_text(yaml.safe_dump(merge(smoke_params, changes or {})))
        return path
    return write


def write_jobs(folder, params, *extra) -> int:
    folder.mkdir(exist_ok=True)
    return main(["measure", "--write-jobs", str(folder / "jobs.json"), "--params", str(params), *extra])


def test_write_jobs_lists_the_profiles_shards_one_file_per_pass_and_the_same_bytes_again(
        profile_plan, params_file, tmp_path, capsys):
    params = params_file()
    assert write_jobs(tmp_path / "a", params, "--device", "cuda") == 0
    out = capsys.readouterr().out.splitlines()
    files = {"": "jobs.json", "repeat-1": "jobs.repeat-1.json", "repeat-2": "jobs.repeat-2.json",
             "remeasure": "jobs.remeasure.json"}
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(files.values()) and len(out) == len(files)
    for (tag, name), line in zip(files.items(), out, strict=True):
        doc = json.loads((tmp_path / "a" / name).read_text())
        assert doc["shards"] == profile_plan["shards"][tag], tag
        assert doc["backend"]["device"] == "cuda" and set(doc["pool"]) == {"dataset", "pool", "seed"}
        assert f"{len(doc['shards'])} shards" in line and line.endswith(f"--pass {tag}" if tag else "data/measurements")
    assert write_jobs(tmp_path / "b", params, "--device", "cuda") == 0
    for name in files.values():
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert write_jobs(tmp_path / "c", params, "--passes", "main,remeasure") == 0
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["jobs.json", "jobs.remeasure.json"]


@pytest.mark.parametrize("changes, extra, message", [
    ({"profile": {"collect": {"random_shards": -1}}}, [], r"profile\.collect\.random_shards: -1"),
    ({"profile": {"device": "tpu"}}, [], r"profile\.device: 'tpu' \(expected one of auto, cpu, cuda\)"),
    ({"pool": {"num_tables": 0}}, [], r"pool\.num_tables: 0"),
    ({}, ["--passes", "main,repeat-9"], r"--passes: 'repeat-9' \(the profile's passes here: main, repeat-1"),
])
def test_write_jobs_with_bad_params_is_one_line_and_writes_nothing(params_file, tmp_path, capsys, changes, extra,
                                                                   message):
    params = params_file(changes)
    before = params.read_bytes()
    assert write_jobs(tmp_path / "out", params, *extra) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"autoshard measure: error: {params}: "), err
    assert re.search(message, err), err
    assert list((tmp_path / "out").iterdir()) == [] and params.read_bytes() == before


def test_written_jobs_measured_elsewhere_and_imported_hold_every_shard_of_each_pass(
        profile_plan, params_file, tmp_path, request):
    from dataclasses import replace

    from autoshard.measure.backends import make_backend
    from autoshard.measure.collect import Job, collect
    from autoshard.measure.store import shard_key, store_for

    folder, store, pool, cfg = tmp_path / "jobs", tmp_path / "store", profile_plan["pool"], profile_plan["cfg"]
    assert write_jobs(folder, params_file(), "--backend", "analytic", "--device", "cpu") == 0
    spaces = set()
    for tag, shards in profile_plan["shards"].items():
        name = f".{tag}" if tag else ""
        rows = folder / f"rows{name}.json"
        assert main(["measure", "--jobs", str(folder / f"jobs{name}.json"), "--out", str(rows)]) == 0
        spaces.add(json.loads(rows.read_text())["space"])
        assert store_import(rows, store, *(["--pass", tag] if tag else [])) == 0
        held = store_for(store, cfg.backend, pool, space_override=min(spaces)).tagged(tag).read()
        assert set(held) == {shard_key(s) for s in shards}, tag
    assert len(spaces) == 1, "every pass measured under the same settings"
    request.getfixturevalue("no_measuring")  # the stage reads the imported space and measures nothing
    main_pass = [Job("single", tuple(s)) for s in profile_plan["shards"][""]]
    table = collect(pool, main_pass, make_backend(pool, cfg.backend), replace(cfg, measurements_space=spaces.pop()),
                    store, progress=False)
    assert len(table) == len(main_pass) and table["forward_ms"].notna().all()

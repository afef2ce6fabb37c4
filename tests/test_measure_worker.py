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

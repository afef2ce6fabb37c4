"""The portable worker (`measure.portable`): runs where only numpy and torch are installed,
regenerates the pool's traces bit for bit from the job, and its rows import under the space
key the full worker gives; a bad job is one line, status 2, nothing written."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from autoshard.cli.main import main
from autoshard.core.errors import ConfigError
from autoshard.core.seeding import rng
from autoshard.measure import portable
from autoshard.measure.store import space
from autoshard.measure.worker import parse_job

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("pandas", "yaml", "tqdm", "scipy", "sklearn", "torchrec", "matplotlib", "pyarrow")


@pytest.fixture(scope="module")
def job(smoke_params, tmp_path_factory) -> dict:
    """The smoke profile's main-pass jobs file as `--write-jobs` writes it for the torch backend
    on CPU, cut to three shards and the quickest timing."""
    folder = tmp_path_factory.mktemp("portable")
    params = folder / "params.yaml"
    params.write_text(yaml.safe_dump(smoke_params))
    assert main(["measure", "--write-jobs", str(folder / "jobs.json"), "--params", str(params), "--passes", "main",
                 "--backend", "torch", "--device", "cpu"]) == 0
    doc = json.loads((folder / "jobs.json").read_text())
    doc["shards"] = doc["shards"][:3]
    doc["backend"] |= {"batch_size": 32, "warmup": 0, "runs": 1}
    return doc


@pytest.fixture(scope="module")
def blocked(tmp_path_factory) -> Path:
    """A folder that, first on the path, makes importing pandas, yaml, tqdm (and the other
    libraries of the package that are not numpy or torch) fail."""
    folder = tmp_path_factory.mktemp("blocked")
    for name in BLOCKED:
        (folder / name).mkdir()
        (folder / name / "__init__.py").write_text(f"raise ImportError('{name} is not installed here')\n")
    return folder


def run_portable(blocked: Path, jobs: Path, out: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": f"{blocked}{os.pathsep}{ROOT / 'src'}"}
    return subprocess.run([sys.executable, "-m", "autoshard.measure.portable", "--jobs", str(jobs), "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=jobs.parent, timeout=120)


def test_the_worker_runs_without_pandas_yaml_or_tqdm_and_its_rows_import_under_the_full_workers_key(
        job, blocked, smoke_params, pool, tmp_path):
    jobs, out, store = tmp_path / "jobs.json", tmp_path / "rows.json", tmp_path / "store"
    jobs.write_text(json.dumps(job))
    done = run_portable(blocked, jobs, out)
    assert done.returncode == 0, done.stderr
    assert "measured 3 of 3 shards with torch on cpu" in done.stdout
    doc = json.loads(out.read_text())
    assert [r["tables"] for r in doc["rows"]] == job["shards"]
    assert all(r["forward_ms"] > 0 and r["backward_ms"] > 0 for r in doc["rows"])
    full = parse_job(job).backend  # what the full worker would run: same settings, this machine, this pool
    assert doc["space"] == space(replace(full, backend="torch"), pool)
    assert main(["store", "import", str(out), "--store", str(store)]) == 0
    assert (store / doc["space"] / "space.json").is_file() and len(list((store / doc["space"]).glob("batch-*"))) == 1


def test_regenerated_traces_are_the_pools(job, pool):
    regenerated = portable.regenerate(portable.parse_job(job).traces)
    used = sorted({t for s in job["shards"] for t in s})
    assert set(used) <= set(regenerated.tables)
    t, b = pool.traces, pool.traces.batch_size
    for i, table in enumerate(regenerated.tables):
        r = regenerated.traces
        assert np.array_equal(r.table(i), t.table(table)), table
        own = r.offsets[i * b:(i + 1) * b + 1] - r.offsets[i * b]
        assert np.array_equal(own, t.offsets[table * b:(table + 1) * b + 1] - t.offsets[table * b]), table
    assert list(regenerated.features["rows"]) == pool.features["rows"].iloc[list(regenerated.tables)].tolist()


def first_table(doc: dict, **changes) -> dict:
    """`doc` with its first trace table's fields changed."""
    tables = [dict(s) for s in doc["traces"]["tables"]]
    tables[0] |= changes
    return doc | {"traces": doc["traces"] | {"tables": tables}}


def broken_trace(doc: dict) -> dict:
    return first_table(doc, trace="0" * 64)


@pytest.mark.parametrize("change, message", [
    (lambda d: {k: v for k, v in d.items() if k != "traces"}, r"job\.traces: missing"),
    (lambda d: d | {"backend": d["backend"] | {"backend": "analytic"}},
     r"job\.backend\.backend: 'analytic' \(the portable worker measures with fbgemm or torch_fused or torch\)"),
    (lambda d: d | {"shards": [[0, 10**6]]}, r"job\.shards\[0\]: table 1000000 \(not in job\.traces\.tables\)"),
    (lambda d: d | {"traces": d["traces"] | {"seed": -1}}, r"job\.traces\.seed: -1"),
    (broken_trace, r"job\.traces\.tables\[0\]\.trace: table \d+'s trace regenerated here differs"),
    (lambda d: first_table(d, ambiguous=[[0, 10**9]]),
     r"job\.traces\.tables\[0\]\.ambiguous\[0\]: \[0, 1000000000\] \(expected \[position, index\]"),
    (lambda d: first_table(d, ambiguous=[[3, 0], [3, 1]]), r"job\.traces\.tables\[0\]\.ambiguous: .* listed twice"),
    (lambda d: first_table(d, ambiguous=[[10**9, 0]]),
     r"job\.traces\.tables\[0\]\.ambiguous: position 1000000000 \(table \d+'s trace has \d+ lookups\)"),
    (lambda d: [1, 2], r"job: \[1, 2\]"),
])
def test_a_bad_job_is_one_line_status_2_and_nothing_written(job, tmp_path, capsys, change, message):
    import re

    jobs, out = tmp_path / "jobs.json", tmp_path / "rows.json"
    jobs.write_text(json.dumps(change(job)))
    assert portable.main(["--jobs", str(jobs), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"autoshard.measure.portable: error: {jobs}: "), err
    assert re.search(message, err), err
    assert not out.exists()


def test_the_replayed_draws_are_the_pools(job, pool):
    """`portable.replay` and `zipf_points` restate `data.synth.bag_trace`'s draws (to find the
    ambiguous ones): their floors, scattered, are the pool's trace."""
    from autoshard.data.synth import scatter

    source = portable.parse_job(job).traces
    b = pool.traces.batch_size
    for s in source.tables:
        lengths, points, g = portable.replay(source.seed, s.table, s.rows, s.pooling_factor, s.alpha,
                                             source.batch_size, source.dispersion)
        ranks = np.clip(np.floor(points).astype(np.int64) - 1, 0, s.rows - 1)
        assert np.array_equal(lengths, pool.traces.lengths[s.table])
        assert np.array_equal(scatter(g, ranks, s.rows), pool.traces.table(s.table)), s.table
        assert np.array_equal(pool.traces.offsets[s.table * b:(s.table + 1) * b + 1] - pool.traces.offsets[s.table * b],
                              np.concatenate([[0], np.cumsum(lengths)]))


def test_a_draw_one_ulp_across_an_integer_on_another_cpu_still_regenerates_exactly(job, monkeypatch):
    """The writer's CPU computes draw 0 of a table as exactly the integer n, the worker's one ulp
    below it (vectorised powers differ so from CPU to CPU), so the worker's floor is one rank
    lower. Without the writer's `ambiguous` list the worker refuses the job; with it, the trace
    comes out bit for bit the pool's, its digest checked as strictly as before."""
    from autoshard.data import synth

    source = portable.parse_job(job).traces
    spec = max(source.tables, key=lambda s: s.rows)
    exact = portable.zipf_points
    first = portable.replay(source.seed, spec.table, spec.rows, spec.pooling_factor, spec.alpha,
                            source.batch_size, source.dispersion)[1][0]
    n = float(min(max(np.floor(first) + 1, 3), spec.rows))  # an integer near draw 0, two ranks from the first

    def on_a_cpu(value: float) -> None:
        """Draw 0 computed as `value` by both the pool's generator and the writer's search."""
        def points(u, rows, alpha):
            x = exact(u, rows, alpha)
            x[:1] = value
            return x

        monkeypatch.setattr(portable, "zipf_points", points)
        monkeypatch.setattr(synth, "zipf_ranks", lambda g, size, rows, alpha: np.clip(
            np.floor(portable.zipf_points(g.random(size), rows, alpha)).astype(np.int64) - 1, 0, rows - 1))

    def trace_of(s):
        return synth.bag_trace(rng(source.seed, "pool", "trace", s.table), s.rows, s.pooling_factor, s.alpha,
                               source.batch_size, source.dispersion)

    on_a_cpu(n)  # the job writer's machine
    lengths, indices = trace_of(spec)
    ambiguous = portable.ambiguous_draws(source.seed, spec.table, spec.rows, spec.pooling_factor, spec.alpha,
                                         source.batch_size, source.dispersion, indices)
    assert [0, int(indices[0])] in ambiguous and len(ambiguous) < 5
    written = replace(spec, trace=portable.trace_digest(lengths, indices))

    on_a_cpu(np.nextafter(n, 0.0))  # the worker's: one ulp below n
    assert trace_of(spec)[1][0] != indices[0], "the neighbouring rank: another row"
    with pytest.raises(ConfigError, match=r"trace regenerated here differs"):
        portable.regenerate(replace(source, tables=(written,)))
    again = portable.regenerate(replace(source, tables=(replace(written, ambiguous=tuple(map(tuple, ambiguous))),)))
    assert np.array_equal(again.traces.table(0), indices) and np.array_equal(again.traces.lengths[0], lengths)


def test_a_job_without_ambiguous_draws_is_read_as_having_none(job):
    """A job written before the field (or with nothing to list) overrides nothing."""
    tables = [{k: v for k, v in t.items() if k != "ambiguous"} for t in job["traces"]["tables"]]
    older = portable.parse_job(job | {"traces": job["traces"] | {"tables": tables}})
    assert all(s.ambiguous == () for s in older.traces.tables)
    assert portable.parse_job(first_table(job, ambiguous=[])).traces.tables[0].ambiguous == ()
    assert portable.parse_job(first_table(job, ambiguous=[[4, 1]])).traces.tables[0].ambiguous == ((4, 1),)


def test_write_jobs_lists_each_tables_ambiguous_draws_with_the_pools_index(smoke_params, pool, tmp_path,
                                                                            monkeypatch):
    """With a wide tolerance many draws are 'ambiguous': the job lists each as [position, the pool's
    index there], which the worker sets before its digest check."""
    monkeypatch.setattr(portable, "AMBIGUOUS", 1e-3)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(smoke_params))
    assert main(["measure", "--write-jobs", str(tmp_path / "jobs.json"), "--params", str(params), "--passes", "main",
                 "--backend", "torch_fused", "--device", "cpu"]) == 0
    doc = json.loads((tmp_path / "jobs.json").read_text())
    assert doc["backend"]["backend"] == "torch_fused"
    listed = 0
    for entry in doc["traces"]["tables"]:
        trace = pool.traces.table(entry["table"])
        assert all(trace[p] == index for p, index in entry["ambiguous"])
        listed += len(entry["ambiguous"])
    assert listed > 0
    assert portable.regenerate(portable.parse_job(doc).traces).tables  # and the worker still regenerates exactly

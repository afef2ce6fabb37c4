"""The profile stage's command: killed mid-way it resumes with nothing lost and nothing measured
twice; bad parameters are one line, status 2."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from autoshard.data.pool import build_pool, save_pool
from autoshard.data.tasks import make_tasks, save_tasks
from autoshard.measure.collect import ProfileConfig, load_profile, plan_jobs

from helpers import batch_files, every


@pytest.mark.slow
def test_killed_stage_resumes(tmp_path, smoke_params):
    """Kill the real fbgemm collection mid-way; rerun; nothing lost, nothing measured twice."""
    pool = build_pool(smoke_params["dataset"], smoke_params["pool"], seed=0, progress=False)
    tasks, train, test = make_tasks(pool.features, smoke_params["tasks"], seed=0)
    save_pool(pool, tmp_path / "pool")
    save_tasks(tmp_path / "tasks.json", tasks, train, test, seed=0)
    # The pool's tables alone are six chunks of eight already: the extra kinds cut to one chunk's worth,
    # the smoke timing kept (the kill lands after two chunks whatever a chunk takes).
    collect = smoke_params["profile"]["collect"] | {"random_shards": 3, "test_random_shards": 2, "heuristic_tasks": 1,
                                                    "test_heuristic_tasks": 1, "repeat_shards": 2, "repeat_rounds": 1}
    params = smoke_params | {"profile": smoke_params["profile"] | {"collect": collect}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    cmd = [sys.executable, "-m", "autoshard.pipeline.profile_run", "--params", str(tmp_path / "params.yaml"),
           "--pool", str(tmp_path / "pool"), "--tasks", str(tmp_path / "tasks.json"),
           "--out", str(tmp_path / "out"), "--store", str(tmp_path / "store")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(batch_files(tmp_path / "store")) < 2:
        assert proc.poll() is None, "the collection finished before it could be interrupted"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {k: v for path in batch_files(tmp_path / "store")
              for k, v in json.loads(path.read_text())["records"].items()}
    assert not (tmp_path / "out").exists()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    final = load_profile(tmp_path / "out")
    cfg = ProfileConfig.from_params(params["profile"])
    planned = plan_jobs(pool, tasks, train, cfg, 0, test_tables=test, placements=every(pool))
    assert final["shard_id"].tolist() == list(range(len(planned)))
    first = final[final["round"] == 0].set_index(final.loc[final["round"] == 0, "tables"].map(
        lambda t: ",".join(map(str, sorted(t)))))
    kept = [k for k in before if k in first.index]
    assert kept, "the chunks measured before the kill hold first-round shards"
    for k in kept:
        assert first.loc[k, "forward_ms"] == before[k]["forward_ms"], "measured before the kill, kept as measured"
    assert batch_files(tmp_path / "store"), "the store is kept for the other stages"


def test_cli_reports_bad_params(tmp_path, smoke_params, capsys):
    from autoshard.pipeline.profile_run import main

    (tmp_path / "p.yaml").write_text(yaml.safe_dump(smoke_params | {
        "profile": smoke_params["profile"] | {"backend": "tpu"}}))
    code = main(["--params", str(tmp_path / "p.yaml"), "--pool", str(tmp_path / "nopool"),
                 "--tasks", str(tmp_path / "none.json")])
    assert code == 2
    assert "profile.backend: 'tpu'" in capsys.readouterr().err

"""A stage killed outright (`kill -9` of its process group) resumes when run again: the rerun
completes, reads every measurement the killed run filed (nothing measured twice in a pass), ends
with the design an uninterrupted run has, and leaves no temporary or half-written file.

One project copy on smoke parameters runs the chain synthesize -> evaluate through the stage
command (`autoshard-notebook STAGE`, as dvc.yaml runs it); profile, train_rl and evaluate are each
killed once their first measurement or checkpoint is on disk, then run again."""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import torch

from autoshard.core.atomic import WRITER
from autoshard.core.digest import key
from autoshard.core.params import merge
from autoshard.core.paths import Paths
from autoshard.data.pool import load_pool
from autoshard.data.tasks import load_tasks
from autoshard.measure.collect import ProfileConfig, load_profile
from autoshard.measure.store import BATCH_GLOB
from autoshard.placement.profile_shards import profile_jobs

from helpers import copy_project, sh, tool_env

pytestmark = pytest.mark.slow

PATHS = Paths()
DEADLINE_S = 300  # for a stage to write its first file, or to finish
# Smaller than smoke where resuming does not depend on the size (fewer profile shards, no second
# profile pass), with still several chunks, so that the kill lands mid-way.
SMALLER = {"profile": {"collect": {"random_shards": 6, "test_random_shards": 4, "repeat_rounds": 1,
                                   "remeasure": False}}}


@pytest.fixture(scope="module")
def resume_params(smoke_params) -> dict:
    return merge(smoke_params, SMALLER)


@pytest.fixture(scope="module")
def project(tmp_path_factory, resume_params) -> Path:
    """A project copy on `resume_params` with the pool and tasks made (synthesize)."""
    dest = copy_project(tmp_path_factory.mktemp("resume"), resume_params)
    done = sh(["autoshard-notebook", "synthesize"], dest)
    assert done.returncode == 0, done.stderr
    return dest


def batch_files(root: Path) -> dict[Path, str]:
    """Every batch file of the measurement store under `root`, with its text."""
    return {p: p.read_text() for p in sorted((root / PATHS.measurements).glob(f"*/{BATCH_GLOB}"))}


def records(files: dict[Path, str]) -> dict[tuple[str, str], dict]:
    """The records of `files` by (space, shard key)."""
    return {(p.parent.name, k): r for p, text in files.items() for k, r in json.loads(text)["records"].items()}


def kill_when(root: Path, stage: str, written) -> None:
    """Start `stage` and kill its process group (and its notebook's kernel, its own session) with
    SIGKILL as soon as `written()` is true; the kernel must not outlive the stage."""
    log = (root / f"{stage}.log").open("w")
    proc = subprocess.Popen(["autoshard-notebook", stage], cwd=root, env=tool_env(root), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + DEADLINE_S
    while not written():
        assert proc.poll() is None, f"{stage} ended before it could be killed: {(root / f'{stage}.log').read_text()}"
        assert time.monotonic() < deadline, f"{stage}: nothing written in {DEADLINE_S} s"
        time.sleep(0.05)
    kernels = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    log.close()
    _, alive = psutil.wait_procs(kernels, timeout=30)  # a kernel's parent poller ends it within a second
    assert not alive, f"{stage}: the notebook's kernel outlived the killed stage"


def rerun(root: Path, stage: str) -> None:
    done = sh(["autoshard-notebook", stage], root, timeout=DEADLINE_S)
    assert done.returncode == 0, done.stderr[-3000:]


def no_leftovers(root: Path) -> None:
    """No temporary of an atomic write, nor a running notebook, anywhere in the project's outputs."""
    left = [p for folder in (root / PATHS.data, root / PATHS.reports) for p in folder.rglob(".*")
            if WRITER.search(p.name) or p.name.endswith((".running.ipynb", ".old"))]
    assert not left, left


def measured_once_per_pass(files: dict[Path, str]) -> None:
    """No shard is in two batch files of one space: nothing of a pass was measured twice."""
    seen: dict[tuple[str, str], Path] = {}
    for path, text in files.items():
        for shard in json.loads(text)["records"]:
            assert (path.parent.name, shard) not in seen, f"{shard} measured twice in {path.parent.name}"
            seen[path.parent.name, shard] = path


def test_profile_resumes(project, resume_params):
    before = batch_files(project)
    kill_when(project, "profile", lambda: len(batch_files(project)) > len(before))
    killed = batch_files(project)
    assert not (project / PATHS.profile / "shards.parquet").exists(), "killed before it saved its data set"
    rerun(project, "profile")
    after = batch_files(project)
    assert all(after.get(p) == text for p, text in killed.items()), "batches filed before the kill kept as filed"
    measured_once_per_pass(after)
    table = load_profile(project / PATHS.profile)
    cfg = ProfileConfig.from_params(resume_params["profile"] | {"device": "cpu"})
    pool = load_pool(project / PATHS.pool)
    tasks, train, test = load_tasks(project / PATHS.tasks)
    planned = profile_jobs(pool, tasks, train, test, cfg, resume_params["seed"])
    assert [(r.kind, tuple(r.tables), r.round) for r in table.itertuples()] == [
        (j.kind, j.tables, j.round) for j in planned], "the design of an uninterrupted run"
    first_round = {",".join(map(str, sorted(r.tables))): r for r in table.itertuples() if r.round == 0}
    reused = {shard: r for (_, shard), r in records(killed).items() if shard in first_round}
    assert reused, "the batches filed before the kill hold first-round shards (the first chunks)"
    for shard, r in reused.items():
        assert first_round[shard].forward_ms == r["forward_ms"], "measured before the kill, read as measured"
    assert not (project / PATHS.work("profile")).exists(), "the profile's work folder is dropped once saved"
    no_leftovers(project)


def tensors(payload, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a saved payload, by its path in it."""
    if isinstance(payload, torch.Tensor):
        return {prefix: payload}
    items = payload.items() if isinstance(payload, dict) else enumerate(payload) if isinstance(
        payload, list | tuple) else ()
    return {k: v for name, value in items for k, v in tensors(value, f"{prefix}/{name}").items()}


def saved(root: Path) -> dict[str, dict[str, torch.Tensor]]:
    """The tensors of every model and policy file train_rl wrote."""
    return {str(p.relative_to(root)): tensors(torch.load(p, weights_only=True))
            for p in sorted((root / PATHS.rl).rglob("*.pt"))}


def test_train_rl_resumes(project):
    rerun(project, "cost_model")
    work = project / PATHS.work("train_rl")
    kill_when(project, "train_rl", lambda: any(work.glob("*/policy.pt")))
    store = batch_files(project)
    rerun(project, "train_rl")
    assert all(batch_files(project).get(p) == text for p, text in store.items()), "measurements kept as filed"
    measured_once_per_pass(batch_files(project))
    resumed = saved(project)
    assert {"data/rl/policy.pt", "data/rl/cost_model.pt"} <= set(resumed)
    no_leftovers(project)
    # An uninterrupted run (reading the measurements the first filed, a refresh round's plans): the same files.
    shutil.rmtree(work)
    shutil.rmtree(project / PATHS.rl)
    rerun(project, "train_rl")
    again = saved(project)
    assert again.keys() == resumed.keys()
    for name, state in resumed.items():
        assert state.keys() == again[name].keys(), name
        for k, v in state.items():
            assert torch.equal(v, again[name][k]), f"{name}: {k} differs from the uninterrupted run's"


def test_evaluate_resumes(project):
    before = batch_files(project)
    kill_when(project, "evaluate", lambda: len(batch_files(project)) > len(before))
    killed = {p: t for p, t in batch_files(project).items() if p not in before}
    rerun(project, "evaluate")
    after = batch_files(project)
    assert all(after.get(p) == text for p, text in killed.items()), "the batches filed before the kill are kept"
    measured_once_per_pass(after)
    devices = pd.read_csv(project / PATHS.results("evaluate") / "devices.csv")
    spaces = {p.parent for p in after}
    passes = {key(base.name, name): name for base in spaces for name in devices["pass"].unique()}
    for path, text in killed.items():
        assert path.parent.name in passes, "the rerun's pass is the killed run's: the same tasks and plans"
        rows = devices[devices["pass"] == passes[path.parent.name]].drop_duplicates("shard").set_index("shard")
        filed = json.loads(text)["records"]
        shown = [k for k in filed if k in rows.index]  # a batch holds every plan's shards, the frame those it reports
        assert shown, "the killed run's batch holds shards of the reported plans"
        for k in shown:
            assert rows.loc[k, "forward_compute_ms"] == pytest.approx(filed[k]["forward_ms"], rel=1e-12), k
    no_leftovers(project)

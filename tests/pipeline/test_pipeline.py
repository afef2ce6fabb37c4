"""End to end: a copy of the repository runs `dvc repro` on smoke parameters, then a second
`dvc repro` with nothing changed reruns nothing, and a changed ablation parameter reruns only
the ablation and the report."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def sh(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def clone(tmp_path_factory, smoke_params) -> Path:
    """The repository as git sees it (tracked and untracked-but-not-ignored files), committed."""
    dest = tmp_path_factory.mktemp("clone")
    files = sh(["git", "ls-files", "-co", "--exclude-standard", "-z"], ROOT).stdout.split("\0")
    for rel in filter(None, files):
        if (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    (dest / "params.yaml").write_text(yaml.safe_dump(smoke_params))
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy"]):
        assert sh(cmd, dest).returncode == 0
    return dest


def test_dvc_repro_then_nothing_to_do(clone):
    first = sh(["dvc", "repro"], clone)
    assert first.returncode == 0, first.stderr + first.stdout
    assert "Running stage 'synthesize'" in first.stdout
    for rel in ("data/pool/tables.parquet", "data/tasks.json", "dvc.lock",
                "reports/metrics/synthesize.json", "reports/notebooks/01_synthesize.ipynb",
                "reports/metrics/evaluate.json", "data/evaluate/plans.csv", "reports/metrics/transfer.json",
                "reports/metrics/ablation.json", "reports/README.md", "reports/html/07_ablation.html"):
        assert (clone / rel).is_file(), rel
    lock = (clone / "dvc.lock").read_text()
    second = sh(["dvc", "repro"], clone)
    assert second.returncode == 0, second.stderr
    assert "Running stage" not in second.stdout
    assert (clone / "dvc.lock").read_text() == lock
    status = sh(["dvc", "status", "dvc.yaml"], clone)  # data.dvc is declared, not fetched
    assert "up to date" in status.stdout, status.stdout


def test_an_ablation_parameter_reruns_only_ablation_and_report(clone):
    if not (clone / "dvc.lock").exists():
        assert sh(["dvc", "repro"], clone).returncode == 0
    params = yaml.safe_load((clone / "params.yaml").read_text())
    params["ablation"]["iterations"] += 1
    (clone / "params.yaml").write_text(yaml.safe_dump(params))
    again = sh(["dvc", "repro"], clone)
    assert again.returncode == 0, again.stderr + again.stdout
    ran = sorted(line.split("'")[1] for line in again.stdout.splitlines() if line.startswith("Running stage"))
    assert ran == ["ablation", "report"]

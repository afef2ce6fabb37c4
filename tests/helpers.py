"""Plain helpers that several test files share (fixtures live in conftest.py)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml

from autoshard.data.features import FEATURE_COLUMNS
from autoshard.data.tasks import Task
from autoshard.measure.analytic import AnalyticBackend
from autoshard.placement.heuristics import every_plan

# studies/test_transfer.py, studies/test_ablation.py

MODEL_TABLES = """name,rows,dim,pooling_factor
user_id,50000,32,1
item_id,20000,32,3.5
category,300,16,2
query_terms,100000,16,12
history,80000,32,25
country,250,8,1
device,40,8,1
ads,30000,16,6
"""
PROFILE = {"backend": "fbgemm", "device": "cpu", "optimizer": "EXACT_SGD", "batch_size": 64, "threads": 1,
           "memory_limit_gib": 1.0}
TIMING = {"timing": {"warmup": 0, "runs": 1, "rounds": 1, "drift_limit": 0.5, "retries": 0}}


def pool_features(n=60, seed=0):
    g = np.random.default_rng(seed)
    out = pd.DataFrame(g.random((n, len(FEATURE_COLUMNS))), columns=FEATURE_COLUMNS)
    out["size_bytes"] = g.integers(1000, 100000, n)
    return out


# rl/test_env.py, rl/test_ppo.py, rl/test_infer.py, rl/test_refresh.py

def tasks_of(pool, n: int, tables: int, devices: int, memory: int | None = None, seed: int = 0) -> list[Task]:
    g = np.random.default_rng(seed)
    sizes = pool.features["size_bytes"].to_numpy()
    out = []
    for k in range(n):
        ids = tuple(sorted(g.choice(pool.num_tables, tables, replace=False).tolist()))
        cap = memory or int(2 * sizes[list(ids)].sum() / devices + sizes.max())
        out.append(Task(f"t/{k}", "test", "train", ids, devices, cap, 0.0))
    return out


# costmodel/test_dataset.py, costmodel/test_train.py

def _profile_table(pool, shards, backend_name="analytic"):
    backend = AnalyticBackend(pool)
    rows = []
    for i, shard in enumerate(shards):
        cost = backend.measure(shard, 256)
        rows.append({"shard_id": i, "tables": list(shard), "kind": "random", "status": "ok",
                     "backend": backend_name, "forward_ms": cost.forward_ms,
                     "backward_ms": cost.backward_ms, "total_ms": cost.total_ms})
    return pd.DataFrame(rows)


# measure/test_collect.py, pipeline/test_profile.py

def every(pool, seed=0):
    """The study's heuristic plans, as the profile stage passes them."""
    return lambda task: every_plan(pool.features, task, seed)


def batch_files(root):
    return sorted(root.glob("*/batch-*.json"))


# placement/test_columns.py, studies/test_columns.py

class LinearModel:
    """A cost model whose device cost is the sum of dim x pooling factor over its shards
    (what the planner sees of a real one: `encode`, `cost_ms`, `predict_ms`)."""

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        dim, pf = FEATURE_COLUMNS.index("dim"), FEATURE_COLUMNS.index("pooling_factor")
        return (x[:, dim] * x[:, pf] / 100).reshape(-1, 1)

    def cost_ms(self, pooled: torch.Tensor) -> torch.Tensor:
        return pooled[..., 0]

    def predict_ms(self, features, shards) -> np.ndarray:
        enc = self.encode(torch.as_tensor(np.asarray(features), dtype=torch.float32))
        return np.array([float(enc[list(s)].sum()) for s in shards])


# cli/test_sharding.py, cli/test_constraints.py: a scaled-down production-shaped model (two modules,
# sequence features of 1,500 lookups, a table too large for one device of 600 MB while training)
PRODUCTION_TABLES = """name,rows,dim,pooling_factor,module,pooling
user_id,2000000,128,1,sparse,pooled
item_id,200000,64,3.5,sparse,pooled
category,300,4,2,sparse,pooled
query,100000,8,12,sparse,pooled
ads,30000,8,6,sparse,pooled
clicks,300000,128,1516.5,seq,sequence
views,250000,128,900,seq,sequence
"""


# pipeline/conftest.py, pipeline/test_notebooks.py, pipeline/test_resume.py

REPO = Path(__file__).resolve().parents[1]


def tool_env(project: Path | None = None) -> dict:
    """The environment with this interpreter's scripts (dvc, autoshard-notebook) first on the PATH;
    in a `project` copy, its own package first on the import path, so that what runs there (and the
    measuring code's digest, which keys the measurement store) is the copy's, whatever is edited here."""
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    if project is not None and (Path(project) / "src" / "autoshard").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(project) / "src"), os.environ.get("PYTHONPATH")]))
    return env


def sh(cmd: list[str], cwd: Path, timeout: float = 1800) -> subprocess.CompletedProcess:
    """`cmd` run in `cwd` with `tool_env(cwd)`, its output captured."""
    return subprocess.run(cmd, cwd=cwd, env=tool_env(cwd), capture_output=True, text=True, timeout=timeout)


def copy_project(dest: Path, params: dict) -> Path:
    """The repository as git sees it (tracked and untracked-but-not-ignored files) copied to
    `dest` and committed there, with `params` as its params.yaml."""
    files = sh(["git", "ls-files", "-co", "--exclude-standard", "-z"], REPO).stdout.split("\0")
    for rel in filter(None, files):
        if (REPO / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, dest / rel)
    (dest / "params.yaml").write_text(yaml.safe_dump(params))
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy"]):
        assert sh(cmd, dest).returncode == 0
    return dest


# Two mixed clusters as `autoshard plan --topology` reads them: two GPU generations, and a device half
# taken by another job (tests/cli/test_topology.py, test_topology_search.py)
TWO_GENERATIONS = """hosts:
  - {devices: 2, speed: 1.0, memory: 2GiB}
  - {devices: 2, speed: 0.4, memory: 1GiB}
"""
HALF_TAKEN = """hosts:
  - devices:
      - {speed: 1.0, memory: 2GiB}
      - {speed: 1.0, memory: 2GiB}
      - {speed: 0.5, memory: 1GiB}
      - {speed: 1.0, memory: 2GiB}
"""

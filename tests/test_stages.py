"""dvc.yaml against the code: every stage depends on each `autoshard` module its notebook uses,
directly or through other modules, so editing one reruns every stage it can change."""

import ast
import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "autoshard"
STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def top_module(dotted: str) -> str | None:
    """`src/autoshard/<name>.py` or the sub-package folder `src/autoshard/<name>`, if it exists."""
    head = dotted.split(".")[0]
    if (PACKAGE / f"{head}.py").is_file():
        return f"src/autoshard/{head}.py"
    if (PACKAGE / head).is_dir():
        return f"src/autoshard/{head}"
    return None


def imported(source: str) -> set[str]:
    """Dotted names below `autoshard` that `source` imports (`from autoshard import x` gives x)."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "autoshard":
            rest = node.module.split(".")[1:]
            out |= {".".join(rest)} if rest else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".", 1)[1] for a in node.names if a.name.startswith("autoshard.")}
        elif isinstance(node, ast.ImportFrom) and node.level:  # relative import inside a sub-package
            out |= {f"costs.{node.module}"} if node.module else {f"costs.{a.name}" for a in node.names}
    return out


def closure(source: str) -> set[str]:
    """Paths (dvc.yaml style) of every package module reachable from `source`'s imports."""
    todo, seen = [m for m in imported(source) if top_module(m)], set()
    while todo:
        path = top_module(todo.pop())
        if path is None or path in seen:
            continue
        seen.add(path)
        files = [ROOT / path] if path.endswith(".py") else sorted((ROOT / path).rglob("*.py"))
        todo += [m for f in files for m in imported(f.read_text())]
    return seen


@pytest.mark.parametrize("stage", [s for s, spec in STAGES.items() if spec["cmd"].startswith("autoshard-notebook")])
def test_stage_depends_on_every_module_its_notebook_uses(stage):
    deps = STAGES[stage]["deps"]
    notebook = next(d for d in deps if d.startswith("notebooks/"))
    cells = json.loads((ROOT / notebook).read_text())["cells"]
    source = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    missing = sorted(closure(source) - set(deps))
    assert not missing, f"stage {stage} does not depend on {missing}"


def test_report_depends_on_its_modules_and_every_notebook_stage():
    deps = set(STAGES["report"]["deps"])
    assert closure((PACKAGE / "report.py").read_text()) | {"src/autoshard/report.py"} <= deps
    for stage, spec in STAGES.items():
        for out in spec.get("metrics", []):
            assert next(iter(out)) in deps, f"report does not read {stage}'s metrics"


def test_only_the_ablation_stage_reads_ablation_parameters():
    readers = [s for s, spec in STAGES.items()
               if any(str(p).split(".")[0] == "ablation" for p in spec.get("params", []))]
    assert readers == ["ablation"]

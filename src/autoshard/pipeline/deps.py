"""Which code each stage runs: the package files its notebook's imports reach, found by following
the imports (the same walk that keys the caches). dvc.yaml lists exactly these (a test compares
them), so editing a module reruns every stage it can change and no other.

`python -m autoshard.pipeline.deps` checks dvc.yaml; `--write` rewrites its code dependencies.

Layers, in data-flow order; a module imports only from its own layer or layers before it
(`cli` sits beside `studies`: neither imports the other):
core < data < measure < costmodel < placement < rl < methods < studies | cli < planner < landscape < pipeline.
"""

import argparse
import ast
import json
import re
import sys
from pathlib import Path

import yaml

from autoshard.core.digest import PACKAGE_DIR, source_files

LAYERS = ("core", "data", "measure", "costmodel", "placement", "rl", "methods", "studies", "cli", "planner",
          "landscape", "pipeline")  # landscape: the GPU landscape, a tool beside the study that no stage runs
RANK = {**{layer: i for i, layer in enumerate(LAYERS)}, "cli": LAYERS.index("studies")}


def imported_modules(source: str) -> set[str]:
    """Dotted names below `autoshard` that `source` imports (`from autoshard.rl import env` gives rl.env)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "autoshard":
            rest = node.module.split(".")[1:]
            base = ".".join(rest)
            for alias in node.names:
                sub = f"{base}.{alias.name}" if base else alias.name
                out.add(sub if _module_file(sub) else base)
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".", 1)[1] for a in node.names if a.name.startswith("autoshard.")}
    return {m for m in out if m}


def _module_file(dotted: str) -> Path | None:
    path = PACKAGE_DIR.joinpath(*dotted.split("."))
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return None


def module_closure(source: str) -> set[str]:
    """Every package module reachable from `source`'s imports (dotted names below `autoshard`):
    the same import closure that keys the caches (`core.digest.source_files`)."""
    files = source_files(f"autoshard.{m}" for m in imported_modules(source))
    return {".".join(f.relative_to(PACKAGE_DIR).with_suffix("").parts) for f in files if f.name != "__init__.py"}


def notebook_source(path: Path) -> str:
    cells = json.loads(Path(path).read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def code_deps(source: str) -> list[str]:
    """dvc.yaml dependencies for code that `source` runs: every package file its imports reach
    (function-level imports included), in layer order, so an edit reruns only the stages that can
    run the edited code."""
    modules = module_closure(source)
    ordered = sorted(modules, key=lambda m: (RANK[m.split(".")[0]], m))
    return [f"src/autoshard/{m.replace('.', '/')}.py" for m in ordered]


def layer_violations() -> list[str]:
    """`module -> import` pairs that import from a later layer (or across studies and cli)."""
    bad = []
    for file in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = file.relative_to(PACKAGE_DIR).with_suffix("").parts
        if len(parts) < 2:
            continue
        layer = parts[0]
        for name in imported_modules(file.read_text()):
            target = name.split(".")[0]
            crosses = {layer, target} == {"studies", "cli"}
            if RANK.get(target, -1) > RANK[layer] or crosses:
                bad.append(f"{'.'.join(parts)} -> {name}")
    return bad


def runtime_imports(source: str) -> set[str]:
    """`imported_modules` without the imports under `if TYPE_CHECKING:` (types, never run)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            node.body = [ast.Pass()]
    return imported_modules(ast.unparse(tree))


def folder_cycles() -> dict[str, list[list[str]]]:
    """Per folder of the package, the import circles among its modules (function-level imports
    included, so none can be hidden in a function), each as its modules sorted; none is the rule."""
    graph: dict[str, dict[str, set[str]]] = {}
    for file in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = file.relative_to(PACKAGE_DIR).with_suffix("").parts
        if len(parts) != 2 or parts[1] == "__init__":
            continue
        targets = {m.split(".")[1] for m in runtime_imports(file.read_text())
                   if m.split(".")[0] == parts[0] and "." in m}
        graph.setdefault(parts[0], {})[parts[1]] = targets - {parts[1]}
    return {folder: found for folder, edges in graph.items() if (found := _circles(edges))}


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def stage_code_deps(stage: str, spec: dict, root: Path) -> list[str]:
    """The code a stage of dvc.yaml runs: the files its notebook's imports reach, or for a
    `python -m` stage its module and the files that module's imports reach."""
    notebooks = [d for d in spec.get("deps", []) if str(d).startswith("notebooks/")]
    if notebooks:
        return code_deps(notebook_source(root / notebooks[0]))
    module = spec["cmd"].split("-m ", 1)[1].split()[0]
    stem = "src/" + module.replace(".", "/")
    file = f"{stem}.py" if (root / f"{stem}.py").is_file() else f"{stem}/__main__.py"  # `-m package` runs __main__
    return [file, *code_deps((root / file).read_text())]


def rewrite(text: str, root: Path) -> str:
    """dvc.yaml's text with every stage's `src/autoshard` dependencies replaced by the rule's."""
    stages = yaml.safe_load(text)["stages"]
    lines = text.splitlines(keepends=True)
    out, stage, in_deps = [], None, False
    for line in lines:
        header = re.match(r"^  (\w+):\s*$", line)
        if header:
            stage, in_deps = header.group(1), False
        if stage in stages and re.match(r"^    deps:\s*$", line):
            out.append(line)
            out += [f"      - {d}\n" for d in stage_code_deps(stage, stages[stage], root)]
            in_deps = True
            continue
        if in_deps and re.match(r"^      - src/autoshard", line):
            continue
        if in_deps and not line.startswith("      - "):
            in_deps = False
        out.append(line)
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autoshard.pipeline.deps", description=__doc__.split("\n")[0])
    parser.add_argument("--dvc-file", type=Path, default=Path("dvc.yaml"))
    parser.add_argument("--write", action="store_true", help="rewrite the code dependencies in place")
    args = parser.parse_args(argv)
    text = args.dvc_file.read_text()
    wanted = rewrite(text, args.dvc_file.resolve().parent)
    if wanted == text:
        print(f"{args.dvc_file}: code dependencies follow the import rule")
        return 0
    if args.write:
        args.dvc_file.write_text(wanted)
        print(f"{args.dvc_file}: code dependencies rewritten")
        return 0
    print(f"{args.dvc_file}: code dependencies differ from the import rule (run with --write)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())

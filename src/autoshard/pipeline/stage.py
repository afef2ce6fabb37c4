"""Run one DVC stage's notebook through papermill with exactly the parameters the stage declares.

`autoshard-notebook synthesize` reads the stage `synthesize` from dvc.yaml, takes its notebook
(the dependency ending in .ipynb) and its `params` list, and executes the notebook with the
python3 kernel (papermill's `-k python3`), injecting those sections of params.yaml and
nothing else, so DVC's view of what a stage depends on is exactly what the notebook sees.
The executed notebook lands in reports/notebooks/ only if every cell succeeded; a failure
prints the notebook's error on one line and exits non-zero.
"""

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from autoshard.core.errors import ConfigError
from autoshard.core.figures import save_figure
from autoshard.core.metrics import write_metrics
from autoshard.core.params import load_params
from autoshard.core.paths import Paths
from autoshard.data.pool import Pool, load_pool
from autoshard.data.tasks import Task, load_tasks

KERNEL = "python3"


class StageFailed(RuntimeError):
    """A cell of the stage's notebook raised; `kept` is the executed notebook, for debugging."""

    def __init__(self, stage: str, ename: str, evalue: str, kept: Path):
        super().__init__(f"error in stage {stage!r}: {ename}: {evalue} "
                         f"(executed notebook kept at {kept})")
        self.ename = ename


def stage_spec(stage: str, dvc_file: Path) -> tuple[Path, list[str]]:
    """The notebook and the parameter names of `stage` in `dvc_file`."""
    spec = yaml.safe_load(dvc_file.read_text())["stages"].get(stage)
    if spec is None:
        raise ConfigError(f"{dvc_file}: no stage named {stage!r}")
    notebooks = [d for d in spec.get("deps", []) if str(d).endswith(".ipynb")]
    if len(notebooks) != 1:
        raise ConfigError(f"{dvc_file}: stage {stage!r} must depend on exactly one notebook")
    names: list[str] = []
    for entry in spec.get("params", []):
        # An entry is a name in params.yaml, or {file: [names]} for another file (not ours).
        names += [entry] if isinstance(entry, str) else list(entry.get("params.yaml", []))
    return Path(notebooks[0]), names


def select(params: dict[str, Any], names: list[str], source: str) -> dict[str, Any]:
    """The named (possibly dotted) parameters, as notebook parameters keyed by top-level name."""
    out: dict[str, Any] = {}
    for name in names:
        head, *rest = name.split(".")
        node: Any = params
        for part in name.split("."):
            if not isinstance(node, dict) or part not in node:
                raise ConfigError(f"{source}: parameter {name!r} is missing")
            node = node[part]
        if not rest:
            out[head] = node
        else:
            target = out.setdefault(head, {})
            for part in rest[:-1]:
                target = target.setdefault(part, {})
            target[rest[-1]] = node
    return out


def run(stage: str, params_file: Path, dvc_file: Path, output_dir: Path,
        extra: dict[str, Any]) -> Path:
    """Execute the stage's notebook; return the path of the executed copy."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    notebook, names = stage_spec(stage, dvc_file)
    parameters = select(load_params(params_file), names, str(params_file)) | extra
    output_dir.mkdir(parents=True, exist_ok=True)
    out = output_dir / notebook.name
    tmp = output_dir / f".{notebook.stem}.running.ipynb"
    try:
        # The notebook's own progress bars (tqdm, on stderr) stream to this terminal.
        papermill.execute_notebook(str(notebook), str(tmp), parameters=parameters, kernel_name=KERNEL,
                                   cwd=os.getcwd(), progress_bar=False, stderr_file=sys.stderr)
    except PapermillExecutionError as exc:
        kept = Path(tempfile.gettempdir()) / f"failed-{notebook.name}"
        os.replace(tmp, kept)
        raise StageFailed(stage, exc.ename, exc.evalue, kept) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    os.replace(tmp, out)
    return out


def _parse_extra(pairs: list[str]) -> dict[str, Any]:
    extra = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set: {pair!r} (expected KEY=VALUE)")
        extra[key] = yaml.safe_load(value)
    return extra


def enter_repo() -> Path:
    """Change to the repository root (the folder holding dvc.yaml), wherever Jupyter started."""
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "dvc.yaml").is_file():
            os.chdir(folder)
            return folder
    raise ConfigError(f"{here}: not inside the study's repository (no dvc.yaml above it)")


def fill(stage: str, params_file: str | Path = "params.yaml", dvc_file: str | Path = "dvc.yaml",
         **given: Any) -> Any:
    """The notebook's parameters: those papermill injected, the rest read from params.yaml.

    Lets a notebook opened by hand in JupyterLab run with the study's current parameters: the
    ones it is not given are read as `stage` lists them in dvc.yaml (a dotted name there, such as
    `profile.batch_size`, gives only that key), exactly what the stage runner would inject.
    """
    missing = [name for name, value in given.items() if value is None]
    if missing:
        listed = select(load_params(params_file), stage_spec(stage, Path(dvc_file))[1], str(params_file))
        given |= {name: listed[name] for name in missing if name in listed}
        unlisted = [name for name in missing if name not in listed]
        if unlisted:
            raise ConfigError(f"{dvc_file}: stage {stage} does not list the parameter {unlisted[0]!r}")
    return SimpleNamespace(**given)


@dataclass
class Stage:
    """What a stage notebook works with: its parameters, its paths, the pool and tasks (read
    on first use), its figures folder and a timer started when the stage opened."""

    name: str
    params: SimpleNamespace
    paths: Paths
    work: Path | None
    started: float = field(default_factory=time.perf_counter)

    @cached_property
    def pool(self) -> Pool:
        return load_pool(self.paths.pool)

    @cached_property
    def tasks(self) -> tuple[list[Task], Any, Any]:
        """(every task, train-pool table ids, test-pool table ids)."""
        return load_tasks(self.paths.tasks)

    @property
    def figures(self) -> Path:
        return self.paths.figures(self.name)

    def save(self, fig: Any, file: str) -> None:
        """Save a figure under the stage's figures folder (the notebook shows it inline too)."""
        save_figure(fig, self.figures / file)

    def seconds(self) -> float:
        """Wall time since the stage opened."""
        return time.perf_counter() - self.started

    def write_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Write reports/metrics/<stage>.json (strict JSON) and return the metrics for display."""
        write_metrics(self.paths.metrics(self.name), metrics)
        return metrics


def open_stage(name: str, data_dir: str | Path = "data", reports_dir: str | Path = "reports",
               work_dir: str | Path | None = None, **given: Any) -> Stage:
    """Open stage `name` from its notebook: move to the repository root and fill the parameters
    papermill did not inject from params.yaml (see `fill`)."""
    enter_repo()
    return Stage(name, fill(name, **given), Paths(Path(data_dir), Path(reports_dir)),
                 None if work_dir is None else Path(work_dir))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="autoshard-notebook", description=__doc__.split("\n")[0])
    parser.add_argument("stage", help="stage name in dvc.yaml")
    parser.add_argument("--params-file", type=Path, default=Path("params.yaml"))
    parser.add_argument("--dvc-file", type=Path, default=Path("dvc.yaml"))
    parser.add_argument("--output-dir", type=Path, default=Path("reports/notebooks"))
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                        help="extra notebook parameter (YAML value), e.g. data_dir=/tmp/x")
    args = parser.parse_args(argv)
    try:
        out = run(args.stage, args.params_file, args.dvc_file, args.output_dir,
                  _parse_extra(args.extra))
    except ConfigError as exc:
        print(f"autoshard-notebook: error: {exc}", file=sys.stderr)
        return 2
    except StageFailed as exc:
        print(f"autoshard-notebook: {exc}", file=sys.stderr)
        return 2 if exc.ename == "ConfigError" else 1
    print(f"autoshard-notebook: {args.stage}: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

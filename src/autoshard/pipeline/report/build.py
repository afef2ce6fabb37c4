"""The report stage: every executed notebook as self-contained HTML, the key curves as DVC plot
files, one Markdown page per stage in `reports/` and the summary `reports/README.md`, all generated
from the stages' typed metrics (never typed by hand).

Run as `python -m autoshard.pipeline.report` (what `dvc.yaml` does).
"""

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import yaml

from autoshard.core.atomic import atomic_dir, atomic_file
from autoshard.core.errors import ConfigError
from autoshard.core.params import Fields, load_params
from autoshard.pipeline.budget import shares
from autoshard.pipeline.report import (
    ablation,
    columns,
    cost_model,
    evaluate,
    profile,
    run,
    summary,
    synthesize,
    train_rl,
    transfer,
)
from autoshard.pipeline.report.format import Figures, join
from autoshard.pipeline.report.results import Results, read_results

Writer = Callable[[Results, Figures], str | None]

# (stage, page file, title, what it holds, writer), in pipeline order; `run` is the run's own page.
PAGES: tuple[tuple[str, str, str, str, Writer], ...] = (
    ("synthesize", "synthesize.md", "Synthesize", "the table pool, the tasks, reuse against the published statistics",
     synthesize.page),
    ("profile", "profile.md", "Profile", "shards measured, repeatability, the fusion gap, backends, the comm model",
     profile.page),
    ("cost_model", "cost_model.md", "Cost model", "every estimator on held-out shards, the hybrid, the wide pool",
     cost_model.page),
    ("train_rl", "train_rl.md", "Train RL", "the policy and the fair sharder on the validation tasks (predicted)",
     train_rl.page),
    ("evaluate", "evaluate.md", "Evaluate", "the primary endpoints in full, headroom, measurement quality, every "
     "comparison as method x reference", evaluate.page),
    ("transfer", "transfer.md", "Transfer", "the policy on other task shapes, not fine-tuned", transfer.page),
    ("ablation", "ablation.md", "Ablation", "each part of the method retrained without it", ablation.page),
    ("columns", "columns.md", "Columns", "column-wise sharding against table-wise, like with like", columns.page),
    ("run", "run.md", "The run", "wall time per stage against the budget, the environment, the notebooks", run.page),
)


def notebook_stages(dvc_file: str | Path) -> list[tuple[str, str]]:
    """(stage, notebook stem) of every notebook stage in `dvc.yaml`, in pipeline order."""
    stages = yaml.safe_load(Path(dvc_file).read_text())["stages"]
    out = []
    for name, spec in stages.items():
        notebooks = [d for d in spec.get("deps", []) if str(d).startswith("notebooks/")]
        if notebooks:
            out.append((name, Path(notebooks[0]).stem))
    return out


def render_html(notebook: Path, out: Path) -> None:
    """The executed notebook as one HTML file with its figures embedded and code hidden."""
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab", exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nbformat.read(notebook, as_version=4))
    out.write_text(body, encoding="utf-8")


def plot_files(data_dir: Path, plots: Path) -> None:
    """Wide CSVs of the key curves for `dvc plots show`: sharding time against the number of
    tables, and each method's median measured ratio per protocol."""
    speed = pd.read_csv(data_dir / "evaluate" / "speed.csv")
    speed.pivot(index="tables", columns="method", values="seconds").reset_index().to_csv(
        plots / "sharding_time.csv", index=False)
    ratios = pd.read_csv(data_dir / "evaluate" / "plans.csv")
    ratios.groupby(["protocol", "method"], sort=False)["ratio"].median().unstack("protocol").reset_index().to_csv(
        plots / "ratios.csv", index=False)


def pages(results: Results) -> dict[str, str]:
    """Page file -> text: every stage page with metrics, then the summary (README.md) linking them.
    A figure no page placed is added under its stage's page rather than lost."""
    figures = Figures(results.reports / "figures")
    out: dict[str, str] = {}
    written = []
    for stage, file, title, what, writer in PAGES:
        text = writer(results, figures)
        if text is None:
            continue
        extra = [figures.inline(stage, name, name.replace("_", " ")) for name in figures.unplaced(stage)]
        out[file] = join(text, "## More figures" if extra else "", "\n\n".join(extra))
        written.append((file, title, what))
    out["README.md"] = summary.page(results, figures, written)
    return out


def write_pages(results: Results) -> None:
    """Every page written whole; a stage page whose metrics are gone is removed, not left stale."""
    texts = pages(results)
    for _, file, *_ in PAGES:
        if file not in texts:
            (results.reports / file).unlink(missing_ok=True)
    for file, text in texts.items():
        with atomic_file(results.reports / file) as tmp:
            tmp.write_text(text, encoding="utf-8")


def build(reports: str | Path, data_dir: str | Path, dvc_file: str | Path,
          params_file: str | Path | None = None) -> None:
    """Render the HTML, the plot files and the pages under `reports` (each written whole);
    `params_file` gives the study's time budget (`budget_minutes`) and each stage's share of it
    (`budget_shares`)."""
    reports = Path(reports)
    params = load_params(params_file) if params_file is not None else None
    budget = Fields("", params).number("budget_minutes", lo=0, lo_open=True) if params is not None else None
    stage_shares = shares(params) if params is not None and "budget_shares" in params else None
    stages = notebook_stages(dvc_file)
    missing = [stem for _, stem in stages if not (reports / "notebooks" / f"{stem}.ipynb").exists()]
    if missing:
        raise ConfigError(f"reports/notebooks: {missing[0]}.ipynb is missing (run its stage first)")
    results = read_results(reports, tuple(stages), budget, stage_shares)  # checked before anything is written
    with atomic_dir(reports / "html") as html:
        for _, stem in stages:
            render_html(reports / "notebooks" / f"{stem}.ipynb", html / f"{stem}.html")
    with atomic_dir(reports / "plots") as plots:
        plot_files(Path(data_dir), plots)
    write_pages(results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autoshard.pipeline.report", description=__doc__.split("\n")[0])
    parser.add_argument("--reports", type=Path, default=Path("reports"))
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--dvc-file", type=Path, default=Path("dvc.yaml"))
    parser.add_argument("--params", type=Path, default=Path("params.yaml"),
                        help="for `budget_minutes` and `budget_shares`")
    args = parser.parse_args(argv)
    try:
        build(args.reports, args.data, args.dvc_file, args.params)
    except ConfigError as exc:
        print(f"report: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"written": [str(args.reports / file) for file in ("README.md", "html", "plots")]}))
    return 0

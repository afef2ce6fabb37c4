"""dvc.yaml against the code: every stage depends on exactly the package files its code's imports
reach, so editing a module reruns every stage it can change and no other; imports flow one way."""

from pathlib import Path

import yaml

from autoshard.pipeline import deps

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "autoshard"
STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def test_code_dependencies_follow_the_import_rule():
    """Every stage lists exactly the files its code's imports reach: none missing, none superfluous."""
    for stage, spec in STAGES.items():
        listed = [d for d in spec["deps"] if str(d).startswith("src/")]
        assert listed == deps.stage_code_deps(stage, spec, ROOT), stage


def test_the_check_fails_on_a_missing_and_on_a_superfluous_dependency(tmp_path):
    text = (ROOT / "dvc.yaml").read_text()
    assert deps.rewrite(text, ROOT) == text
    missing = text.replace("      - src/autoshard/measure/timing.py\n", "", 1)
    extra = text.replace("      - src/autoshard/data/tasks.py\n",
                         "      - src/autoshard/data/tasks.py\n      - src/autoshard/placement/milp.py\n", 1)
    for broken in (missing, extra):
        assert broken != text and deps.rewrite(broken, ROOT) == text


def test_imports_flow_one_way():
    """core <- data <- measure <- costmodel <- placement <- rl <- methods <- studies | cli <- pipeline."""
    assert deps.layer_violations() == []


def test_no_folder_holds_an_import_circle():
    """Within each folder too imports run one way, function-level ones included (issue 47: the
    command's two circles were held apart by seven imports inside functions)."""
    assert deps.folder_cycles() == {}


def test_the_circle_check_finds_a_circle_hidden_in_a_function():
    assert deps._circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert deps._circles({"a": {"b"}, "b": set()}) == []
    hidden = "def f():\n    from autoshard.cli.main import main\n"
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from autoshard.cli.main import main\n"
    assert deps.runtime_imports(hidden) == {"cli.main"} and deps.runtime_imports(typed) == set()


def test_every_module_lives_in_a_layer():
    flat = [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    assert flat == []
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(deps.LAYERS)
    assert all(not p.read_text().strip() for p in PACKAGE.glob("*/__init__.py"))


def test_report_depends_on_every_notebook_stage():
    report = set(STAGES["report"]["deps"])
    for stage, spec in STAGES.items():
        for out in spec.get("metrics", []):
            assert next(iter(out)) in report, f"report does not read {stage}'s metrics"


def test_only_the_ablation_stage_reads_ablation_parameters():
    readers = [s for s, spec in STAGES.items()
               if any(str(p).split(".")[0] == "ablation" for p in spec.get("params", []))]
    assert readers == ["ablation"]


def test_an_edit_reruns_only_the_stages_that_import_it():
    """The profile never imports the MILP, so editing it reruns the stages that plan with
    it (evaluate and after) and not the profile, the cost model or the policy's training."""
    users = {s for s, spec in STAGES.items() if "src/autoshard/placement/milp.py" in spec["deps"]}
    assert {"profile", "cost_model", "train_rl"}.isdisjoint(users)
    assert "evaluate" in users

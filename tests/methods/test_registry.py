"""The method catalogue: every method built by one entry, left out (with the reason) when what it
needs is missing, and its id spelt as a literal nowhere else in the package."""

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from autoshard.core.errors import ConfigError
from autoshard.data.tasks import Task
from autoshard.methods.artifacts import Artifacts, Settings
from autoshard.methods.registry import COLUMNS, METHODS, REGISTRY, build, check, ids, needs, not_run
from autoshard.placement.surrogate import MilpConfig

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "autoshard"


def bare(n: int = 4) -> Artifacts:
    """Tables and nothing trained or measured: what a fresh clone has."""
    features = pd.DataFrame({"dim": [8] * n, "size_bytes": [10] * n, "pooling_factor": [1.0] * n, "rows": [100] * n})
    return Artifacts(pool_features=features, features=np.zeros((n, 21)))


def test_without_trained_files_only_the_methods_that_need_none_are_built():
    built = build(METHODS, bare(), Settings(seed=0, batch_size=64, milp=MilpConfig(10, 1.0)))
    assert set(built.planners) == {*ids(kind="heuristic"), "torchrec"}
    assert set(built.planners) | set(built.left_out) == set(METHODS)
    assert built.left_out["lpt_measured"] == "needs single_costs"
    assert built.left_out["rl_greedy"] == "needs cost_model, policy"


def test_measured_single_costs_are_enough_for_lpt_and_the_milp_and_the_milp_needs_its_limits():
    artifacts = Artifacts(**{**bare().__dict__, "single_costs": np.array([3.0, 1.0, 2.0, 2.0])})
    task = Task("t", "user", "test", (0, 1, 2, 3), 2, 100, 1.0)
    built = build(("lpt_measured", "milp"), artifacts, Settings(seed=0, batch_size=64, milp=MilpConfig(100, 5.0)))
    assert {m: sorted(np.bincount(p(task), weights=[3, 1, 2, 2])) for m, p in built.planners.items()} == \
        {"lpt_measured": [4.0, 4.0], "milp": [4.0, 4.0]}
    assert built.solves["milp"]["t"].status == "optimal"
    unlimited = build(("milp",), artifacts, Settings(seed=0, batch_size=64))
    assert "milp" in unlimited.left_out and not unlimited.planners


def test_needs_name_artifact_fields_and_cover_every_alternative():
    assert needs(("rl_greedy",)) == {"cost_model", "policy", "numpy"}
    assert needs(ids(kind="heuristic")) == set()
    for method in REGISTRY.values():
        assert all(set(group) <= set(Artifacts.__dataclass_fields__) for group in method.needs), method.id


def test_an_unknown_id_is_refused_naming_the_option():
    with pytest.raises(ConfigError, match=r"--method: 'nope' \(expected one of random, naive"):
        check("nope")


def test_tags_pick_the_studies_lists():
    assert ids("replicate") == ("cost_greedy", "cost_greedy_local_search", "rl_greedy", "rl_fair_greedy",
                                "rl_local_search")
    assert set(ids("command")) <= set(METHODS) and "exact" not in ids("command")
    assert ids("solver") == ("milp", "sync_milp")
    assert not_run("exact", Task("a", "autoshard", "test", (0,), 1, 1, 0.0)) == "small tasks only"


def test_method_ids_are_spelt_only_in_the_registry_and_the_modules_that_implement_them():
    """A caller asks the registry (`ids`, its role names) instead of spelling an id: an id typed
    elsewhere is a list that can drift from the catalogue."""
    # the heuristics' own table of sort keys, and their rules on a topology of unlike devices; the
    # column study's pairing of each column-wise method (a registry entry of kind `column`) with its
    # table-wise twin
    implementing = {"placement/heuristics.py", "cli/topology_plan.py", "cli/topology_search.py", "studies/columns.py"}
    spelt: dict[str, set[str]] = {}
    for file in PACKAGE.rglob("*.py"):
        rel = str(file.relative_to(PACKAGE))
        if rel == "methods/registry.py" or rel in implementing:
            continue
        text = file.read_text()
        for method in (*METHODS, *COLUMNS):
            if re.search(rf"([\"']){method}\1", text):
                spelt.setdefault(method, set()).add(rel)
    allowed = {"torchrec": {"measure/analytic.py", "placement/torchrec.py", "pipeline/report/run.py",  # the package
                            "planner/production.py", "cli/torchrec/method.py",  # their loggers
                            "cli/service.py"},  # the one method that counts memory its own way
               "random": {"measure/collect.py"},  # a kind of profiled shard
               "milp": {"studies/evaluate.py", "studies/stats.py"}}  # a params section, a metrics section
    assert {m: files - allowed.get(m, set()) for m, files in spelt.items() if files - allowed.get(m, set())} == {}


def test_the_readmes_example_method_builds_and_places(pool):
    """The README's "Adding a method" block, run as written: one function and one entry."""
    import torch
    from study_configs import study

    from autoshard.costmodel.model import CostModel, CostModelConfig
    from autoshard.data.features import feature_matrix
    from autoshard.methods import registry

    readme = (PACKAGE.parents[1] / "docs" / "methods.md").read_text()  # the README links it
    block = readme.split("# Adding a method", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    namespace = {**vars(registry), "np": np}
    exec(compile(block.replace("# in METHODS_LIST:\n", "entry = "), "README.md", "exec"), namespace)
    torch.manual_seed(0)
    features = feature_matrix(pool.features)
    artifacts = Artifacts(pool_features=pool.features, features=features,
                          cost_model=CostModel.fitted_to(study(CostModelConfig), features))
    entry = namespace["entry"]
    assert entry.missing(bare()) == ("cost_model",) and entry.missing(artifacts) is None
    task = Task("t", "user", "test", tuple(range(12)), 3, int(pool.features["size_bytes"].sum()), 1.0)
    planner = entry.build(artifacts, Settings(seed=0, batch_size=64), None)
    assert sorted(set(planner(task).tolist())) == [0, 1, 2]

"""The presets in configs/ (paper.yaml, quick.yaml), merged over params.yaml: every key a preset
sets is one params.yaml has (a preset cannot add a key the pipeline ignores), and every stage
parses the merged parameters dvc.yaml gives it as its notebook does."""

from collections.abc import Mapping
from pathlib import Path

import pytest

from autoshard.core.compute import ComputeConfig
from autoshard.core.params import Fields, load_params, merge
from autoshard.costmodel.train import CostStageConfig
from autoshard.data.pool import DatasetConfig
from autoshard.data.synth import PoolConfig
from autoshard.data.tasks import TaskConfig
from autoshard.measure.collect import ProfileConfig
from autoshard.methods.registry import METHODS
from autoshard.pipeline.stage import select, stage_spec
from autoshard.rl.ppo import RLStageConfig
from autoshard.studies.ablation import AblationConfig
from autoshard.studies.columns import ColumnsConfig
from autoshard.studies.endpoints import PrimaryConfig
from autoshard.studies.evaluate import PROTOCOLS, EvaluateConfig
from autoshard.studies.transfer import TransferConfig

ROOT = Path(__file__).resolve().parents[2]
PARAMS = load_params(ROOT / "params.yaml")
DVC_STAGES = load_params(ROOT / "dvc.yaml")["stages"]
PRESETS = ["paper", "quick"]

# What each stage's notebook (the report: its module) builds from its parameters `p`.
PARSE = {
    "synthesize": lambda p: (DatasetConfig.from_params(p["dataset"]), PoolConfig.from_params(p["pool"]),
                             TaskConfig.from_params(p["tasks"])),
    "profile": lambda p: (ProfileConfig.from_params(p["profile"]), ComputeConfig.from_params(p["compute"])),
    "cost_model": lambda p: (CostStageConfig.from_params(p["cost_model"]), ProfileConfig.from_params(p["profile"])),
    "train_rl": lambda p: (RLStageConfig.from_params(p["rl"]), ComputeConfig.from_params(p["compute"])),
    "evaluate": lambda p: (EvaluateConfig.from_params(p["evaluate"], p["profile"], p["rl"]),
                           TaskConfig.from_params(p["tasks"]), ComputeConfig.from_params(p["compute"]),
                           PrimaryConfig.from_params(p["primary"], METHODS, PROTOCOLS,
                                                     p["evaluate"]["timing"]["drift_limit"])),
    "transfer": lambda p: (TransferConfig.from_params(p["transfer"], p["evaluate"], p["profile"]),
                           ComputeConfig.from_params(p["compute"])),
    "ablation": lambda p: (AblationConfig.from_params(p["ablation"], p["rl"], p["profile"], p["evaluate"]),
                           ComputeConfig.from_params(p["compute"])),
    "columns": lambda p: (ColumnsConfig.from_params(p["columns"]), TaskConfig.from_params(p["tasks"]),
                          EvaluateConfig.from_params(p["evaluate"], p["profile"], p["rl"])),
    "report": lambda p: Fields("", p).number("budget_minutes", lo=0, lo_open=True),
}


def unknown_keys(preset: Mapping, params: Mapping, prefix: str = "") -> list[str]:
    """Dotted names `preset` sets that `params` lacks (descending where both hold a mapping: a
    value may replace a mapping, as a single `evaluate.objective` does)."""
    out = []
    for key, value in preset.items():
        if key not in params:
            out.append(f"{prefix}{key}")
        elif isinstance(value, Mapping) and isinstance(params[key], Mapping):
            out += unknown_keys(value, params[key], f"{prefix}{key}.")
    return out


def stage_params(merged: dict, stage: str, source: str) -> dict:
    """The parameters dvc.yaml lists for `stage`, as the stage runner selects them."""
    names = DVC_STAGES[stage]["params"] if stage == "report" else stage_spec(stage, ROOT / "dvc.yaml")[1]
    p = select(merged, names, source)
    if "profile" in p:  # the device is resolved when the stage runs (this machine may have no GPU)
        p["profile"] = p["profile"] | {"device": "cpu"}
    return p


def test_every_stage_has_a_parser():
    assert sorted(PARSE) == sorted(DVC_STAGES)


@pytest.mark.parametrize("preset", PRESETS)
def test_a_preset_sets_only_keys_of_params_yaml(preset):
    assert unknown_keys(load_params(ROOT / "configs" / f"{preset}.yaml"), PARAMS) == []


def test_an_unknown_key_is_found():
    assert unknown_keys({"rl": {"iterations": 1, "iteratoins": 2}, "objective": 1}, PARAMS) == [
        "rl.iteratoins", "objective"]


@pytest.mark.parametrize("stage", list(DVC_STAGES))
@pytest.mark.parametrize("preset", PRESETS)
def test_every_stage_parses_a_presets_parameters(preset, stage):
    source = f"configs/{preset}.yaml"
    PARSE[stage](stage_params(merge(PARAMS, load_params(ROOT / source)), stage, source))

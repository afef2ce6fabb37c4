"""The study's configs as its readers make them from params.yaml: `study(CostModelConfig,
hidden=16)` is the study's cost model with a smaller encoder, for a test that needs a config."""

import dataclasses
from pathlib import Path
from typing import Any, TypeVar

from autoshard.core.params import load_params

ROOT = Path(__file__).resolve().parents[1]
PARAMS = load_params(ROOT / "params.yaml")
C = TypeVar("C")


def stage_params(params: dict, stage: str) -> dict:
    """The parameters dvc.yaml gives `stage` (what its reader is handed), device `cpu`."""
    from autoshard.pipeline.stage import select, stage_spec

    chosen = select(params, stage_spec(stage, ROOT / "dvc.yaml")[1], "params.yaml")
    return chosen | {"profile": chosen["profile"] | {"device": "cpu"}}


def top_configs(params: dict = PARAMS) -> dict[str, Any]:
    """Every section of `params` that is a mapping, as the study's reader of it makes it."""
    from autoshard.core.compute import ComputeConfig
    from autoshard.costmodel.train import CostStageConfig
    from autoshard.data.pool import DatasetConfig
    from autoshard.data.synth import PoolConfig
    from autoshard.data.tasks import TaskConfig
    from autoshard.data.wide import WideConfig
    from autoshard.measure.collect import ProfileConfig
    from autoshard.methods.registry import METHODS
    from autoshard.pipeline.budget import Shares
    from autoshard.pipeline.effort import EffortConfig
    from autoshard.rl.ppo import RLStageConfig
    from autoshard.studies.ablation import AblationConfig
    from autoshard.studies.columns import ColumnsConfig
    from autoshard.studies.endpoints import PrimaryConfig
    from autoshard.studies.evaluate import PROTOCOLS, EvaluateConfig
    from autoshard.studies.transfer import TransferConfig

    evaluate, transfer, ablation = (stage_params(params, s) for s in ("evaluate", "transfer", "ablation"))
    return {
        "compute": ComputeConfig.from_params(params["compute"]),
        "budget_shares": Shares.from_params(params["budget_shares"]),
        "effort": EffortConfig.from_params(params["effort"]),
        "dataset": DatasetConfig.from_params(params["dataset"]),
        "pool": PoolConfig.from_params(params["pool"]),
        "wide": WideConfig.from_params(params["wide"]),
        "tasks": TaskConfig.from_params(params["tasks"]),
        "profile": ProfileConfig.from_params(params["profile"] | {"device": "cpu"}),
        "cost_model": CostStageConfig.from_params(params["cost_model"]),
        "rl": RLStageConfig.from_params(params["rl"]),
        "evaluate": EvaluateConfig.from_params(evaluate["evaluate"], evaluate["profile"], evaluate["rl"]),
        "transfer": TransferConfig.from_params(transfer["transfer"], transfer["evaluate"], transfer["profile"]),
        "ablation": AblationConfig.from_params(ablation["ablation"], ablation["rl"], ablation["profile"],
                                               ablation["evaluate"]),
        "columns": ColumnsConfig.from_params(params["columns"]),
        "primary": PrimaryConfig.from_params(params["primary"], METHODS, PROTOCOLS,
                                             params["evaluate"]["timing"]["drift_limit"]),
    }


def _first_of_each_type(value: Any, out: dict[type, Any]) -> dict[type, Any]:
    if dataclasses.is_dataclass(value):
        out.setdefault(type(value), value)
        for f in dataclasses.fields(value):
            _first_of_each_type(getattr(value, f.name), out)
    elif isinstance(value, tuple):
        for item in value:
            _first_of_each_type(item, out)
    return out


STUDY: dict[type, Any] = {}


def study(cls: type[C], **changes: Any) -> C:
    """The study's config of type `cls` (the first the readers make: the profile's timing, the
    `rl` section's policy) with `changes`."""
    if not STUDY:
        for cfg in top_configs().values():
            _first_of_each_type(cfg, STUDY)
    return dataclasses.replace(STUDY[cls], **changes)

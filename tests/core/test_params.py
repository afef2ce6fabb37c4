"""params.yaml is the one source of defaults: every dataclass default that names a parameter
equals its value there (or the dataclass has no default)."""

import dataclasses
from pathlib import Path

import pytest

from autoshard.core.params import load_params
from autoshard.costmodel.model import CostModelConfig
from autoshard.measure.timing import TimingConfig
from autoshard.rl.policy import PolicyConfig
from autoshard.rl.ppo import RLConfig, RLStageConfig, SyncPolicyConfig

ROOT = Path(__file__).resolve().parents[2]
PARAMS = load_params(ROOT / "params.yaml")


@pytest.mark.parametrize("config, section", [
    (RLConfig, ("rl",)), (RLStageConfig, ("rl",)), (PolicyConfig, ("rl", "policy")), (CostModelConfig, ("cost_model",)),
    (TimingConfig, ("profile",)), (SyncPolicyConfig, ("rl", "sync_policy")),
], ids=lambda x: getattr(x, "__name__", ".".join(x) if isinstance(x, tuple) else x))
def test_dataclass_defaults_equal_params_yaml(config, section):
    values = PARAMS
    for key in section:
        values = values[key]
    compared = 0
    for f in dataclasses.fields(config):
        if f.name not in values or isinstance(values[f.name], dict):
            continue
        if f.default is not dataclasses.MISSING:
            assert f.default == values[f.name], f"{config.__name__}.{f.name}: {f.default!r} vs params.yaml"
            compared += 1
    assert compared > 0, "nothing compared: the test lost track of the parameters"


def test_the_command_builds_a_tables_features_as_the_study_built_the_pools():
    """A user's table gets its reuse histogram from a trace of the pool's batch and dispersion:
    the features the cost model and policy learnt from."""
    from autoshard.cli.user_tables import DEFAULT_BAG_DISPERSION, DEFAULT_TRACE_BATCH

    assert DEFAULT_TRACE_BATCH == PARAMS["pool"]["batch_size"]
    assert DEFAULT_BAG_DISPERSION == PARAMS["pool"]["bag_dispersion"]

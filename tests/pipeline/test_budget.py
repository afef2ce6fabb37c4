"""make repro's first lines: each stage's estimate on this machine against its share of the budget."""

import pytest

from autoshard.core.errors import ConfigError
from autoshard.pipeline import budget

SHARES = {"synthesize": 0.05, "profile": 0.2, "cost_model": 0.05, "train_rl": 0.2, "evaluate": 0.3,
          "transfer": 0.1, "ablation": 0.05, "columns": 0.05}


def test_shares_cover_every_stage_and_add_up_to_one():
    assert budget.shares({"budget_shares": SHARES}) == SHARES
    with pytest.raises(ConfigError, match="expected 1"):
        budget.shares({"budget_shares": SHARES | {"columns": 0.1}})
    with pytest.raises(ConfigError, match="budget_shares.columns: -0.05"):
        budget.shares({"budget_shares": SHARES | {"columns": -0.05, "evaluate": 0.4}})
    with pytest.raises(ConfigError, match="ablation"):
        budget.shares({"budget_shares": {k: v for k, v in SHARES.items() if k != "ablation"}})


def test_the_estimate_scales_the_committed_times_by_the_harness_speed():
    est = budget.estimate({"profile": 600.0, "evaluate": 1200.0}, 10.0, 25.0)
    assert est == {"profile": 1500.0, "evaluate": 3000.0}
    assert budget.estimate({"profile": 600.0}, None, 25.0) == {"profile": 600.0}, "no reference: unscaled"
    lines = budget.table(est, SHARES, 60.0)
    assert lines[2].split() == ["profile", "25.0", "min", "12.0", "min"]
    assert lines[-1].split()[:5] == ["all", "75.0", "min", "60.0", "min"] and "OVER" in lines[-1]
    assert "within" in budget.table({"profile": 60.0}, SHARES, 60.0)[-1]


def test_the_study_params_declare_their_shares():
    from pathlib import Path

    from autoshard.core.params import load_params

    params = load_params(Path(__file__).resolve().parents[2] / "params.yaml")
    assert sum(budget.shares(params).values()) == pytest.approx(1.0)

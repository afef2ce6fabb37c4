"""The candidate regimes: greedy's predicted gap to the best placement known per family, gated by
twice the lowest noise floor; every family's tasks seeded and placeable; the speed-blind greedy
no better than the best."""

import numpy as np
import pandas as pd
import pytest

from autoshard.core.errors import ConfigError
from autoshard.core.params import parse
from autoshard.core.schema import check
from autoshard.data.tasks import split_pool
from autoshard.placement.objective import Linear
from autoshard.studies import regimes
from autoshard.studies.evaluate import Families

CONFIG = {"tasks": 3, "devices": 2, "per_device": [3, 2], "tight_slack": 1.05,
          "generations": [1.0, 0.5], "shared": [1.0, 0.7]}


def config(**changes) -> regimes.FamiliesConfig:
    return parse(regimes.FamiliesConfig, "evaluate.families", CONFIG | changes)


def rows(greedy: float, best: float, blind: float | None = None, tasks: int = 4) -> pd.DataFrame:
    return pd.DataFrame([{"family": "f", "per_device": 2, "memory": "ample", "speeds": "equal", "task": f"f/{k}",
                          "greedy_ms": greedy, "blind_ms": blind or greedy, "best_ms": best, "seconds": 0.1}
                         for k in range(tasks)])


def test_a_family_is_a_candidate_only_where_its_gap_exceeds_the_smallest_effect_of_interest():
    kept = regimes.families(rows(11.0, 10.0), config(), 0.05)   # a 10% gap against a 5% sesoi
    assert kept["sesoi"] == 0.05
    (family,) = kept["families"]
    assert family["greedy_gap"] == pytest.approx(0.10) and family["exceeds_sesoi"]
    assert not regimes.families(rows(10.4, 10.0), config(), 0.05)["families"][0]["exceeds_sesoi"]  # 4% < 5%
    assert regimes.families(rows(10.4, 10.0), config(), 0.03)["families"][0]["exceeds_sesoi"]
    check(kept, Families, "families")


def test_every_family_is_searched_and_the_best_known_is_never_above_either_greedy(pool):
    cfg = config()
    _, test = split_pool(len(pool.features), 0.5, 0)
    weights = pool.features["dim"].to_numpy(float) * pool.features["pooling_factor"].to_numpy(float)
    table = regimes.family_rows(lambda ids: Linear.max_device(weights[ids]), pool.features, test, cfg, 0,
                                progress=False)
    assert len(table) == cfg.tasks * len(cfg.families()) == 24
    assert (table["best_ms"] <= table["greedy_ms"] * (1 + 1e-9)).all()
    assert (table["best_ms"] <= table["blind_ms"] * (1 + 1e-9)).all()
    equal = table[table["speeds"] == "equal"]
    assert (equal["blind_ms"] == equal["greedy_ms"]).all()  # told equal speeds, the two greedies agree
    again = regimes.family_rows(lambda ids: Linear.max_device(weights[ids]), pool.features, test, cfg, 0,
                                progress=False)
    pd.testing.assert_frame_equal(table.drop(columns="seconds"), again.drop(columns="seconds"))
    out = regimes.families(table, cfg, 0.05)
    assert [f["family"] for f in out["families"]] == [name for name, *_ in cfg.families()]


def test_a_tight_family_caps_memory_just_above_what_packing_reaches(pool):
    cfg = config()
    sizes = pool.features["size_bytes"].to_numpy(np.int64)
    _, test = split_pool(len(pool.features), 0.5, 0)
    tight = regimes.family_tasks(sizes, test, "t", 6, 2, "tight", cfg, 0)
    ample = regimes.family_tasks(sizes, test, "t", 6, 2, "ample", cfg, 0)
    assert [t.tables for t in tight] == [t.tables for t in ample]  # one family name: the same tables
    assert all(t.memory_bytes < a.memory_bytes for t, a in zip(tight, ample, strict=True))


def test_the_model_objective_is_the_cost_models_prediction(world):
    pool, features, model = world
    ids = np.array([0, 3, 5])
    objective = regimes.model_costs(model, features)(ids)
    predicted = model.predict_ms(features, [[0, 3, 5]])
    assert objective.cost(np.zeros(3, dtype=np.int64), 1) == pytest.approx(float(predicted[0]), rel=1e-4)


def test_speed_profiles_must_give_one_speed_per_device():
    with pytest.raises(ConfigError, match=r"evaluate\.families\.generations"):
        config(generations=[1.0, 0.5, 0.5])

"""The measurement floor: the pass-to-pass MAPE on test shards measured twice, and the models'
MAPE on exactly those shards against the main pass and the mean of the two passes."""

import json

import numpy as np
import pandas as pd
import pytest

from autoshard.core import schema
from autoshard.core.metrics import _plain
from autoshard.costmodel import accuracy as cost_eval
from autoshard.costmodel.floor import FLOOR_ROW, floor_table, measurement_floor, paired, pass_scale

# Three test shards; the second pass measured two of them (one listed unsorted) and one that is
# not a test shard.
TEST = pd.DataFrame({"tables": [(0, 1), (1, 2), (0, 2)], "num_tables": [2, 2, 2], "total_ms": [10.0, 20.0, 40.0]})
AGAIN = pd.DataFrame({"tables": [(1, 0), (1, 2), (3, 4)], "num_tables": [2, 2, 2], "total_ms": [11.0, 18.0, 5.0]})


def constant(ms: float):
    return lambda shards: np.full(len(shards), ms)


def test_the_floor_on_a_hand_made_frame():
    both = paired(TEST, AGAIN)
    assert both["tables"].tolist() == [(0, 1), (1, 2)] and both["remeasured_ms"].tolist() == [11.0, 18.0]
    floor = measurement_floor(TEST, AGAIN, {"twelve": constant(12.0)}, train=TEST)
    assert floor["shards"] == 2
    assert floor["pass_to_pass_mape"] == pytest.approx((1 / 10 + 2 / 20) / 2)
    scale = (11 * 10 + 18 * 20) / (11**2 + 18**2)  # least squares of main on the second pass
    assert pass_scale(TEST, AGAIN) == pytest.approx(scale)
    rescaled = (abs(scale * 11 - 10) / 10 + abs(scale * 18 - 20) / 20) / 2
    assert floor["pass_to_pass_mape_rescaled"] == pytest.approx(rescaled)
    assert floor["mape_vs_main"]["twelve"] == pytest.approx((2 / 10 + 8 / 20) / 2)
    assert floor["mape_vs_mean"]["twelve"] == pytest.approx((1.5 / 10.5 + 7 / 19) / 2)


def test_a_model_equal_to_the_remeasured_values_scores_the_floor_exactly():
    again = AGAIN.set_index(AGAIN["tables"].map(lambda t: tuple(sorted(t))))["total_ms"]
    oracle = {"re-measure": lambda shards: again.loc[list(shards["tables"])].to_numpy()}
    floor = measurement_floor(TEST, AGAIN, oracle, train=TEST)
    assert floor["mape_vs_main"]["re-measure"] == floor["pass_to_pass_mape"]
    table = floor_table(floor)
    ratio = table["vs main / rescaled re-measurement"]
    assert ratio[f"{FLOOR_ROW}, rescaled"] == 1.0
    assert ratio["re-measure"] == pytest.approx(floor["pass_to_pass_mape"] / floor["pass_to_pass_mape_rescaled"])


def test_no_shard_measured_twice_gives_nan_and_strict_json():
    floor = measurement_floor(TEST, AGAIN.iloc[2:], {"twelve": constant(12.0)})
    assert floor["shards"] == 0 and np.isnan(floor["pass_to_pass_mape"]) and np.isnan(floor["mape_vs_main"]["twelve"])
    assert np.isnan(measurement_floor(TEST, AGAIN, {})["pass_to_pass_mape_rescaled"]), "no train shards: no factor"
    plain = _plain(floor)
    json.dumps(plain, allow_nan=False)
    assert schema.check(plain, cost_eval.MeasurementFloor, "t.json")["mape_vs_mean"] == {"twelve": None}


def test_the_cost_model_metrics_carry_the_floor():
    from autoshard.costmodel import accuracy as cost_eval
    from autoshard.costmodel.dataset import SEEN_MULTI

    comparison = cost_eval.compare({"neural (total)": constant(12.0)}, {SEEN_MULTI: TEST})
    curve = pd.DataFrame({"fraction": [1.0], "train_shards": [3]})
    floor = measurement_floor(TEST, AGAIN, {"hybrid": constant(12.0)})
    metrics = cost_eval.cost_model_metrics({"train": TEST}, comparison, "neural (total)", {SEEN_MULTI: 0.05},
                                           0.02, curve, 1, 0.01, 1.0, floor=floor)
    plain = _plain(metrics)
    json.dumps(plain, allow_nan=False)
    checked = schema.check(plain, cost_eval.CostModelScores, "cost_model.json")
    assert checked["measurement_floor"]["shards"] == 2

"""The measurement floor: how far a second measurement of a shard lands from the first.

A model scored against one noisy pass cannot reach 0% MAPE. On the test shards measured in
both the profile's main pass and its independent `remeasure` pass, the remeasured cost used
as the prediction of the main one scores what an oracle that re-measures would score; the
models are scored on exactly those shards, against the main pass and against the mean of the
two passes (a less noisy target).
"""

import numpy as np
import pandas as pd

from autoshard.core.schema import MeasurementFloor
from autoshard.costmodel.evaluate import Estimator, mape

FLOOR_ROW = "re-measurement (pass-to-pass)"


def paired(test: pd.DataFrame, remeasured: pd.DataFrame) -> pd.DataFrame:
    """The rows of `test` (rows of `measured_shards`) measured in both passes, with the second
    pass's cost as `remeasured_ms`; `remeasured` is `measured_shards` of the second pass."""
    again = pd.Series(remeasured["total_ms"].to_numpy(),
                      index=remeasured["tables"].map(lambda t: tuple(sorted(int(x) for x in t))))
    keys = test["tables"].map(lambda t: tuple(sorted(int(x) for x in t)))
    both = keys.isin(again.index).to_numpy()
    return test[both].reset_index(drop=True).assign(remeasured_ms=again.loc[list(keys[both])].to_numpy())


def measurement_floor(test: pd.DataFrame, remeasured: pd.DataFrame,
                      estimators: dict[str, Estimator]) -> MeasurementFloor:
    """On the shards of `test` measured in both passes: the pass-to-pass MAPE (the remeasured
    cost as the prediction of the main one) and each estimator's MAPE against the main pass
    and against the mean of the two passes (NaN where no shard was measured twice)."""
    both = paired(test, remeasured)
    if both.empty:
        nan = float("nan")
        return {"shards": 0, "pass_to_pass_mape": nan, "mape_vs_main": dict.fromkeys(estimators, nan),
                "mape_vs_mean": dict.fromkeys(estimators, nan)}
    main, again = both["total_ms"].to_numpy(), both["remeasured_ms"].to_numpy()
    mean = (main + again) / 2
    predictions = {name: np.asarray(estimate(both), dtype=float) for name, estimate in estimators.items()}
    return {"shards": len(both), "pass_to_pass_mape": mape(again, main),
            "mape_vs_main": {k: mape(p, main) for k, p in predictions.items()},
            "mape_vs_mean": {k: mape(p, mean) for k, p in predictions.items()}}


def floor_table(floor: MeasurementFloor) -> pd.DataFrame:
    """`measurement_floor` as a table: one row per estimator (the re-measurement first), MAPE
    against the main pass and against the mean of the two passes, and its ratio to the floor."""
    rows = {FLOOR_ROW: {"MAPE vs main pass": floor["pass_to_pass_mape"], "MAPE vs mean of passes": float("nan")}}
    for name, value in floor["mape_vs_main"].items():
        rows[name] = {"MAPE vs main pass": value, "MAPE vs mean of passes": floor["mape_vs_mean"][name]}
    table = pd.DataFrame(rows).T
    table["vs main / floor"] = table["MAPE vs main pass"] / floor["pass_to_pass_mape"]
    return table.rename_axis(f"{floor['shards']} shards measured twice")

"""The measurement floor: how far a second measurement of a shard lands from the first.

A model scored against one noisy pass cannot reach 0% MAPE. On the test shards measured in
both the profile's main pass and its independent `remeasure` pass, the remeasured cost used
as the prediction of the main one scores what an oracle that re-measures would score; the
models are scored on exactly those shards, against the main pass and against the mean of the
two passes (a less noisy target).
"""

import numpy as np
import pandas as pd

from autoshard.costmodel.accuracy import Estimator, MeasurementFloor, mape

FLOOR_ROW = "re-measurement (pass-to-pass)"


def paired(test: pd.DataFrame, remeasured: pd.DataFrame) -> pd.DataFrame:
    """The rows of `test` (rows of `measured_shards`) measured in both passes, with the second
    pass's cost as `remeasured_ms`; `remeasured` is `measured_shards` of the second pass."""
    again = pd.Series(remeasured["total_ms"].to_numpy(),
                      index=remeasured["tables"].map(lambda t: tuple(sorted(int(x) for x in t))))
    keys = test["tables"].map(lambda t: tuple(sorted(int(x) for x in t)))
    both = keys.isin(again.index).to_numpy()
    return test[both].reset_index(drop=True).assign(remeasured_ms=again.loc[list(keys[both])].to_numpy())


def measurement_floor(test: pd.DataFrame, remeasured: pd.DataFrame, estimators: dict[str, Estimator],
                      train: pd.DataFrame | None = None) -> MeasurementFloor:
    """On the shards of `test` measured in both passes: the pass-to-pass MAPE (the remeasured
    cost as the prediction of the main one), the same with the second pass times the one
    least-squares factor that matches the main pass on the multi-table shards of `train` measured twice
    (the machine's overall change of speed between the passes divided out; NaN without
    `train`), and each estimator's MAPE against the main pass and against the mean of the two
    passes. NaN where no shard was measured twice."""
    nan = float("nan")
    both = paired(test, remeasured)
    if both.empty:
        return {"shards": 0, "pass_to_pass_mape": nan, "pass_to_pass_mape_rescaled": nan,
                "mape_vs_main": dict.fromkeys(estimators, nan), "mape_vs_mean": dict.fromkeys(estimators, nan)}
    main, again = both["total_ms"].to_numpy(), both["remeasured_ms"].to_numpy()
    mean = (main + again) / 2
    scale = pass_scale(train, remeasured) if train is not None else nan
    predictions = {name: np.asarray(estimate(both), dtype=float) for name, estimate in estimators.items()}
    return {"shards": len(both), "pass_to_pass_mape": mape(again, main),
            "pass_to_pass_mape_rescaled": mape(scale * again, main),
            "mape_vs_main": {k: mape(p, main) for k, p in predictions.items()},
            "mape_vs_mean": {k: mape(p, mean) for k, p in predictions.items()}}


def pass_scale(shards: pd.DataFrame, remeasured: pd.DataFrame) -> float:
    """The factor that best turns the second pass into the main one on the multi-table `shards`
    measured twice (least squares; NaN where there are none)."""
    both = paired(shards[shards["num_tables"] > 1], remeasured)
    again, main = both["remeasured_ms"].to_numpy(), both["total_ms"].to_numpy()
    return float(again @ main / (again @ again)) if len(both) else float("nan")


def floor_table(floor: MeasurementFloor) -> pd.DataFrame:
    """`measurement_floor` as a table: one row per estimator (the re-measurement first), MAPE
    against the main pass and against the mean of the two passes, and its ratio to the rescaled
    re-measurement's (the report's comparison)."""
    rows = {FLOOR_ROW: {"MAPE vs main pass": floor["pass_to_pass_mape"], "MAPE vs mean of passes": float("nan")},
            f"{FLOOR_ROW}, rescaled": {"MAPE vs main pass": floor["pass_to_pass_mape_rescaled"],
                                       "MAPE vs mean of passes": float("nan")}}
    for name, value in floor["mape_vs_main"].items():
        rows[name] = {"MAPE vs main pass": value, "MAPE vs mean of passes": floor["mape_vs_mean"][name]}
    table = pd.DataFrame(rows).T
    table["vs main / rescaled re-measurement"] = table["MAPE vs main pass"] / floor["pass_to_pass_mape_rescaled"]
    return table.rename_axis(f"{floor['shards']} shards measured twice")

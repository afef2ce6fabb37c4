"""The cost model's data set from the profile: bad tables refused, repeated shards averaged, the
last replicate's re-measured costs."""

import numpy as np
import pandas as pd
import pytest

from autoshard.core.errors import ConfigError
from autoshard.costmodel.dataset import measured_shards, single_costs

from helpers import _profile_table


def test_bad_profile_tables(pool):
    table = _profile_table(pool, [[0], [1, 2]])
    with pytest.raises(ConfigError, match="missing columns total_ms"):
        measured_shards(table.drop(columns="total_ms"), "analytic")
    with pytest.raises(ConfigError, match=r"no rows for backend 'fbgemm' \(it has: analytic\)"):
        measured_shards(table, "fbgemm")
    table.loc[1, "backward_ms"] = np.nan
    with pytest.raises(ConfigError, match=r"NaN backward_ms for the measured shard of tables \[1, 2\]"):
        measured_shards(table, "analytic")


def test_repeats_are_averaged(pool):
    table = _profile_table(pool, [[0, 1], [1, 0], [2]])
    table.loc[1, "total_ms"] = table.loc[0, "total_ms"] * 3
    shards = measured_shards(table, "analytic")
    assert len(shards) == 2 and shards["rounds"].tolist() == [2, 1]
    assert shards.loc[0, "total_ms"] == pytest.approx(table.loc[0, "total_ms"] * 2)
    assert single_costs(shards).index.tolist() == [2]


def test_the_last_replicate_fits_on_the_remeasured_costs():
    from autoshard.costmodel.dataset import with_costs

    split = pd.DataFrame({"tables": [(1, 2), (3,)], "forward_ms": [1.0, 2.0], "backward_ms": [1.0, 2.0],
                          "total_ms": [2.0, 4.0], "kind": ["random", "single"]})
    again = pd.DataFrame({"tables": [(3,), (1, 2), (5,)], "forward_ms": [2.5, 1.5, 9.0],
                          "backward_ms": [2.5, 1.5, 9.0], "total_ms": [5.0, 3.0, 18.0]})
    out = with_costs(split, again)
    assert out["total_ms"].tolist() == [3.0, 5.0] and out["kind"].tolist() == ["random", "single"]
    with pytest.raises(ConfigError, match=r"shard \[3\] was not measured again"):
        with_costs(split, again.iloc[1:])

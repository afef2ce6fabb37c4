"""The profile's statistics on a small table: the fusion gap, repeatability, the rounds needed."""

import numpy as np
import pandas as pd
import pytest

from autoshard.measure.analysis import fusion_gap, repeatability, rounds_needed


def test_stats_on_synthetic_table():
    table = pd.DataFrame({
        "shard_id": range(5), "kind": ["single", "single", "heuristic", "repeat", "repeat"],
        "round": [0, 0, 0, 1, 2], "tables": [[0], [1], [0, 1], [0, 1], [0, 1]],
        "num_tables": [1, 1, 2, 2, 2], "status": ["ok"] * 5,
        "total_ms": [1.0, 2.0, 2.4, 2.6, 2.5]})
    gap = fusion_gap(table)
    assert gap["sum_of_singles_ms"].tolist() == [3.0]
    assert gap["fused_over_sum"].tolist() == pytest.approx([0.8])
    rep = repeatability(table)
    assert rep["rounds"].tolist() == [3]
    assert rep["cv"].iloc[0] == pytest.approx(np.std([2.4, 2.6, 2.5], ddof=1) / 2.5)
    assert rounds_needed(0.02, 0.03) == 1 and rounds_needed(0.06, 0.03) == 4

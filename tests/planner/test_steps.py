"""The training-steps benchmark: our estimate of an export is the one our planner placed on, and a
one-model pass runs both plans under DistributedModelParallel on 2 gloo ranks."""

import json

import pytest

from autoshard.planner import steps


@pytest.mark.parametrize("tables", [8, 64])
def test_our_estimate_of_our_export_is_what_the_planner_placed_on(tmp_path, tables):
    model = steps.model_tables(0, tables)
    csv = tmp_path / "model.csv"
    model.to_csv(csv, index=False)
    export, doc = steps.our_plan(csv, tmp_path, 2, "4GiB", 1024)
    busiest = max(d["estimated_ms"] + d["comm_modelled_ms"] for d in doc["per_device"])
    assert steps.our_estimate(model, export, 2, 1024) == pytest.approx(busiest, rel=1e-9)
    assert len(model) == tables and model["rows"].between(1000, 200_000).all()


def test_one_model_both_plans_measured_in_one_pass(tmp_path):
    out = tmp_path / "steps.md"
    assert steps.main(["--models", "1", "--steps", "2", "--rounds", "2", "--batch-per-rank", "128",
                       "--out", str(out)]) == 0
    doc = json.loads(out.with_suffix(".json").read_text())
    (row,) = doc["models"]
    for plan in steps.PLANS:
        entry = row["plans"][plan]
        assert entry["steps"] == 4 and entry["iqr_ms"][0] <= entry["median_ms"] <= entry["iqr_ms"][1]
        assert entry["torchrec_estimate_ms"] > 0 and entry["our_estimate_ms"] > 0
        assert sum(entry["sharding_types"].values()) == row["tables"]
    assert set(doc["agreement"]) == {"torchrec_estimate_ms", "our_estimate_ms"}
    text = out.read_text()
    assert text.count("| 0 | 8 |") == 2 and "Kendall's tau" in text and doc["machine"]["cpu_model"] in text

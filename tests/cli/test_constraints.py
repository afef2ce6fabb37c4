"""`autoshard plan --constraints`: pinned tables on their devices, groups on one device, sharding
types restricted, by our placement (any sharding) and by TorchRec's planner (sharding types);
what cannot hold is refused in one line before anything is measured."""

import json

import pytest

from autoshard.cli.main import main
from autoshard.core.errors import ConfigError
from autoshard.placement.sharding import Layout, Piece, place
from autoshard.placement.topology import Topology

from helpers import PRODUCTION_TABLES

MODEL = PRODUCTION_TABLES
CONSTRAINTS = """sparse.category: {device: 3}
sparse.query: {group: text}
sparse.ads: {group: text}
sparse.item_id: {sharding_types: [table_row_wise]}
seq.views: {sharding_types: [row_wise]}
"""


@pytest.fixture
def files(tmp_path):
    (tmp_path / "model.csv").write_text(MODEL)
    (tmp_path / "c.yaml").write_text(CONSTRAINTS)
    return tmp_path


def plan(files, *extra, method="lpt_measured", sharding="auto") -> int:
    return main(["plan", "--tables", str(files / "model.csv"), "--devices", "4", "--devices-per-host", "2",
                 "--memory-per-device", "600MB", "--backend", "analytic", "--batch-size", "256",
                 "--method", method, "--sharding", sharding, "--out", str(files / "plan.json"), *extra])


def devices_of(doc: dict, name: str) -> set[int]:
    if name in doc["assignment"]:
        return {doc["assignment"][name]}
    held = doc["rows"].get(name, {}).get("shards") or doc["columns"].get(name, [])
    return {s["device"] for s in held}


def test_pins_groups_and_sharding_types_hold_in_our_placement(files):
    assert plan(files, "--constraints", str(files / "c.yaml")) == 0
    doc = json.loads((files / "plan.json").read_text())
    assert doc["assignment"]["sparse.category"] == 3
    assert doc["assignment"]["sparse.query"] == doc["assignment"]["sparse.ads"]
    assert doc["rows"]["sparse.item_id"]["kind"] == "table_row_wise"
    assert doc["rows"]["seq.views"]["kind"] == "row_wise"
    assert doc["options"]["constraints"] == str(files / "c.yaml")
    assert all(d["memory_bytes"] <= 600_000_000 for d in doc["per_device"])


def test_table_wise_plans_take_pins_and_groups_too(files):
    (files / "model.csv").write_text("name,rows,dim,pooling_factor\na,1000,16,8\nb,500,32,4\nc,20,8,4\nd,900,8,2\n")
    (files / "c.yaml").write_text("a: {device: 1}\nb: {group: g}\nc: {group: g}\n")
    argv = ["plan", "--tables", str(files / "model.csv"), "--devices", "2", "--memory-per-device", "1GiB",
            "--backend", "analytic", "--method", "lpt_measured", "--constraints", str(files / "c.yaml"),
            "--out", str(files / "plan.json")]
    assert main(argv) == 0
    doc = json.loads((files / "plan.json").read_text())
    assert doc["options"]["sharding"] == "table" and "rows" not in doc and "columns" not in doc
    assert doc["assignment"]["a"] == 1 and doc["assignment"]["b"] == doc["assignment"]["c"]


def test_torchrecs_planner_takes_the_sharding_types_and_refuses_pins(files, capsys):
    (files / "types.yaml").write_text("seq.views: {sharding_types: [row_wise]}\nsparse.ads: {sharding_types: "
                                      "[table_wise]}\n")
    assert plan(files, "--constraints", str(files / "types.yaml"), method="torchrec") == 0
    doc = json.loads((files / "plan.json").read_text())
    assert doc["rows"]["seq.views"]["kind"] == "row_wise" and "sparse.ads" in doc["assignment"]
    capsys.readouterr()
    (files / "plan.json").unlink()
    assert plan(files, "--constraints", str(files / "c.yaml"), method="torchrec") == 2
    assert "pins or groups tables, which TorchRec's planner cannot be told" in capsys.readouterr().err
    assert not (files / "plan.json").exists()


@pytest.mark.parametrize("text, pattern", [
    ("sparse.user_id: {device: 0}\n", r"table 'sparse.user_id', field device: 0 \(the table needs 1032133120 bytes"),
    ("seq.views: {device: 0}\nseq.clicks: {device: 0}\n", r"the tables pinned to device 0 need 605484480 bytes"),
    ("sparse.query: {group: g, device: 0}\nsparse.ads: {group: g, device: 1}\n", r"group 'g': .* devices \[0, 1\]"),
    ("seq.clicks: {group: g}\nseq.views: {group: g}\n", r"group 'g': its tables need \d+ bytes while training, more "
                                                         r"than one device's 600000000"),
    ("seq.clicks: {sharding_types: [table_row_wise]}\n", r"'table_row_wise' \(a sequence table's"),
    ("sparse.ads: {device: 0, sharding_types: [row_wise]}\n", r"a pinned or grouped table is whole"),
    ("sparse.ads: {device: 4}\n", r"table 'sparse.ads', field device: 4 \(a device from 0 to 3\)"),
    ("sparse.ads: {group: ''}\n", r"field group: '' \(a group's name\)"),
    ("sparse.ads: {sharding_types: []}\n", r"field sharding_types: \[\]"),
    ("sparse.ads: 3\n", r"table 'sparse.ads': 3 \(expected a mapping"),
])
def test_constraints_that_cannot_hold_are_refused_in_one_line(files, capsys, text, pattern):
    import re

    (files / "c.yaml").write_text(text)
    before = (files / "c.yaml").read_bytes()
    assert plan(files, "--constraints", str(files / "c.yaml")) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and re.search(pattern, err), err
    assert not (files / "plan.json").exists() and (files / "c.yaml").read_bytes() == before


def test_pinned_tables_go_first_and_where_they_are_pinned():
    whole = [[Layout("table_wise", (Piece(0, None, 0, None, c, 10),))] for c in (5.0, 4.0, 1.0)]
    placed = place(whole, Topology.uniform(2, 100, 2), ["a", "b", "c"], fixed=[None, 0, None])
    assert [p.devices for p in placed] == [(1,), (0,), (0,)]
    with pytest.raises(ConfigError, match=r"table b: pinned to device 0, which has 5 bytes left of the 10"):
        place(whole, Topology.uniform(2, 15, 2), ["a", "b", "c"], fixed=[0, 0, None])

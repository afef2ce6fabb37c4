"""`autoshard plan --topology FILE --method <heuristic>` (`cli.topology_plan`): the key heuristics
give a slow device work in proportion to its speed and place as on devices alike where the devices
are alike; naive and random keep each device's own memory; every plan reads back."""

import json

import numpy as np
import pandas as pd
import pytest

from autoshard.cli.main import main
from autoshard.cli.topology_plan import KEYED, METHODS
from autoshard.cli.user_tables import read_tables
from autoshard.placement import heuristics

TWO_GENERATIONS = "hosts:\n  - {devices: 4, speed: 1.0, memory: 2GiB}\n  - {devices: 4, speed: 0.5, memory: 2GiB}\n"
HALF_TAKEN = ("hosts:\n  - devices:\n" + "      - {speed: 1.0, memory: 2GiB}\n" * 3
              + "      - {speed: 0.5, memory: 2GiB}\n")


@pytest.fixture
def model(tmp_path):
    """60 pooled tables, many small ones, so that a greedy can balance any key finely."""
    g = np.random.default_rng(1)
    frame = pd.DataFrame({"name": [f"t{i}" for i in range(60)], "rows": g.integers(1000, 50000, 60),
                          "dim": g.choice([16, 32, 64], 60), "pooling_factor": g.integers(1, 40, 60)})
    path = tmp_path / "model.csv"
    frame.to_csv(path, index=False)
    return path


def plan(model, tmp_path, method, *extra, name="plan.json") -> dict:
    out = tmp_path / name
    assert main(["plan", "--tables", str(model), "--method", method, "--out", str(out), "--batch-size", "512",
                 *extra]) == 0
    return json.loads(out.read_text())


def cluster(tmp_path, text: str, name="cluster.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text", [TWO_GENERATIONS, HALF_TAKEN])
@pytest.mark.parametrize("method", KEYED)
def test_a_key_heuristic_gives_each_device_work_in_proportion_to_its_speed(model, tmp_path, method, text):
    doc = plan(model, tmp_path, method, "--topology", cluster(tmp_path, text))
    speeds = np.array(doc["topology"]["speeds"])
    key = np.array([d[f"{method}_key"] for d in doc["per_device"]])
    busy = np.array([d["busy_key"] for d in doc["per_device"]])
    assert busy == pytest.approx(key / speeds)
    blind = plan(model, tmp_path, method, "--devices", str(len(speeds)), "--memory-per-device", "2GiB",
                 name="blind.json")  # the same heuristic on devices it thinks alike
    blind_key = np.bincount([blind["assignment"][n] for n in blind["assignment"]], minlength=len(speeds),
                            weights=[key_of(model, method)[n] for n in blind["assignment"]])
    assert busy.max() < (blind_key / speeds).max(), "told the speeds, its slowest device finishes earlier"
    if method != "dim_greedy":  # dims come in three sizes: too coarse to balance finely
        assert busy.max() < 1.15 * busy.min(), busy


def features(model) -> pd.DataFrame:
    return read_tables(model, 4).features  # as the command reads them (fp32)


def key_of(model, method) -> dict[str, float]:
    names = pd.read_csv(model)["name"]
    return dict(zip(names, heuristics._keys(features(model))[method], strict=True))  # noqa: SLF001


@pytest.mark.parametrize("method", KEYED)
def test_on_devices_alike_a_key_heuristic_places_as_the_studys(model, tmp_path, method):
    # both take the largest key first onto the device with the least so far; they break ties between
    # devices of equal load apart (the study's by memory), which leaves the same loads on the devices
    doc = plan(model, tmp_path, method, "--topology",
               cluster(tmp_path, "hosts:\n  - {devices: 4, speed: 1, memory: 4GiB}\n"))
    frame = pd.read_csv(model)
    keys = key_of(model, method)
    study = heuristics.place(method, features(model), 4, 4 << 30)
    loads = np.bincount(study, weights=[keys[n] for n in frame["name"]], minlength=4)
    assert sorted(d[f"{method}_key"] for d in doc["per_device"]) == pytest.approx(sorted(loads))


def test_naive_is_round_robin_and_skips_a_device_without_room(model, tmp_path):
    roomy = plan(model, tmp_path, "naive", "--topology",
                 cluster(tmp_path, "hosts:\n  - {devices: 3, speed: 1, memory: 1GiB}\n  - {devices: 1, speed: 0.5, "
                                   "memory: 1GiB}\n"))
    names = pd.read_csv(model)["name"].tolist()
    assert [roomy["assignment"][n] for n in names] == [i % 4 for i in range(len(names))]
    tight = plan(model, tmp_path, "naive", "--topology",
                 cluster(tmp_path, "hosts:\n  - {devices: 3, speed: 1, memory: 1GiB}\n  - {devices: 1, speed: 1, "
                                   "memory: 1KiB}\n", name="tight.yaml"), name="tight.json")
    assert 3 not in tight["assignment"].values()
    assert tight["per_device"][3]["memory_bytes"] == 0


@pytest.mark.parametrize("method", METHODS)
def test_every_heuristic_keeps_each_devices_own_memory(model, tmp_path, method):
    frame = pd.read_csv(model)
    small = 48 * 1024**2  # below the largest tables' training footprint
    doc = plan(model, tmp_path, method, "--topology",
               cluster(tmp_path, f"hosts:\n  - {{devices: 3, speed: 1, memory: 1GiB}}\n"
                                 f"  - {{devices: 1, speed: 1, memory: {small}}}\n"), "--json")
    assert all(d["memory_bytes"] <= d["capacity_bytes"] for d in doc["per_device"])
    assert doc["per_device"][3]["capacity_bytes"] == small
    assert sorted(doc["assignment"]) == sorted(frame["name"])


def test_random_is_seeded(model, tmp_path):
    file = cluster(tmp_path, TWO_GENERATIONS)
    a = plan(model, tmp_path, "random", "--topology", file, "--seed", "3", name="a.json")
    b = plan(model, tmp_path, "random", "--topology", file, "--seed", "3", name="b.json")
    c = plan(model, tmp_path, "random", "--topology", file, "--seed", "4", name="c.json")
    assert a["assignment"] == b["assignment"] != c["assignment"]
    assert "costs" in a and a["costs"]["kind"] == "none"
    assert all("busy_key" not in d and "busy_ms" not in d for d in a["per_device"])


def test_a_key_heuristic_honours_a_pin(model, tmp_path):
    pins = tmp_path / "constraints.yaml"
    pins.write_text("t0: {device: 7}\nt1: {device: 7}\n")
    doc = plan(model, tmp_path, "lookup_greedy", "--topology", cluster(tmp_path, TWO_GENERATIONS), "--constraints",
               str(pins))
    assert doc["assignment"]["t0"] == doc["assignment"]["t1"] == 7


def test_a_rule_heuristic_refuses_constraints(model, tmp_path, capsys):
    pins = tmp_path / "constraints.yaml"
    pins.write_text("t0: {device: 7}\n")
    out = tmp_path / "p.json"
    assert main(["plan", "--tables", str(model), "--method", "naive", "--topology", cluster(tmp_path, TWO_GENERATIONS),
                 "--constraints", str(pins), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--constraints: --method naive" in err, err
    assert not out.exists()


def test_a_heuristic_plan_exports_to_torchrec_and_scores(model, tmp_path):
    file = cluster(tmp_path, TWO_GENERATIONS)
    doc = plan(model, tmp_path, "size_lookup_greedy", "--topology", file, "--torchrec", str(tmp_path / "tr.json"))
    exported = json.loads((tmp_path / "tr.json").read_text())
    ranks = {t: v["ranks"] for m in exported["modules"].values() for t, v in m.items()}
    assert {t: r[0] for t, r in ranks.items()} == doc["assignment"]
    assert main(["score", "--plan", str(tmp_path / "plan.json"), "--tables", str(model), "--backend",
                 "analytic"]) == 0

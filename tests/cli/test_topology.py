"""`autoshard plan --topology FILE`: two GPU generations, a device half taken by another job, and
hostile topology files (exit 2, one line naming the file and field, no output)."""

import json

import numpy as np
import pytest

from autoshard.cli.main import main
from autoshard.cli.topology_file import read_topology
from autoshard.core.errors import ConfigError

from helpers import HALF_TAKEN, TWO_GENERATIONS


@pytest.fixture
def model(tmp_path):
    """24 pooled tables of like cost, small enough that compute, not comm, decides."""
    g = np.random.default_rng(0)
    lines = ["name,rows,dim,pooling_factor"] + [f"t{i},{g.integers(2000, 20000)},{g.choice([16, 32, 64])},"
                                                f"{g.integers(2, 30)}" for i in range(24)]
    path = tmp_path / "model.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def plan(model, out, *devices, sharding="table") -> dict:
    assert main(["plan", "--tables", str(model), *devices, "--sharding", sharding, "--method", "lpt_measured",
                 "--backend", "analytic", "--bandwidths", "600,600", "--batch-size", "512", "--out", str(out),
                 "--cache", str(out.parent / "cache")]) == 0
    return json.loads(out.read_text())


def busy(doc: dict, speeds: np.ndarray) -> np.ndarray:
    """Each device's time under the real speeds: its costs over its speed, plus its comm."""
    d = doc["per_device"]
    return np.array([x["estimated_ms"] for x in d]) / speeds + np.array([x["comm_modelled_ms"] for x in d])


@pytest.mark.parametrize("cluster", [TWO_GENERATIONS, HALF_TAKEN])
@pytest.mark.parametrize("sharding", ["table", "auto"])
def test_told_the_speeds_it_beats_a_plan_that_thinks_the_devices_alike(model, tmp_path, cluster, sharding):
    file = tmp_path / "cluster.yaml"
    file.write_text(cluster)
    topology = read_topology(file)
    told = plan(model, tmp_path / "told.json", "--topology", str(file), sharding=sharding)
    if sharding == "table":  # `score` reads table- and column-wise plans
        assert main(["score", "--plan", str(tmp_path / "told.json"), "--tables", str(model), "--backend",
                     "analytic"]) == 0, "the plan file reads back, its topology set aside"
    alike = tmp_path / "alike.yaml"  # the same hosts, as TorchRec's Topology would see them: one speed, one memory
    alike.write_text("hosts:\n" + "".join(f"  - {{devices: {n}, speed: 1, memory: 1GiB}}\n" for n in topology.hosts))
    blind = plan(model, tmp_path / "blind.json", "--topology", str(alike), sharding=sharding)
    assert told["topology"] == topology.document() and "topology" not in blind
    assert all(x["memory_bytes"] <= x["capacity_bytes"] for x in told["per_device"])
    assert [x["busy_ms"] for x in told["per_device"]] == pytest.approx(busy(told, topology.speeds).tolist())
    told_peak, blind_peak = busy(told, topology.speeds).max(), busy(blind, topology.speeds).max()
    assert told_peak < 0.85 * blind_peak, (told_peak, blind_peak)
    slow = topology.speeds < 1
    placed = np.array([x["estimated_ms"] for x in told["per_device"]])
    assert placed[slow].max() < placed[~slow].min(), "the slow devices are given less work"


def test_a_uniform_topology_file_plans_as_the_flags_do(model, tmp_path):
    file = tmp_path / "cluster.yaml"
    file.write_text("hosts:\n  - {devices: 2, speed: 1, memory: 1GiB}\n  - {devices: 2, speed: 1, memory: 1GiB}\n")
    a = plan(model, tmp_path / "a.json", "--topology", str(file), sharding="auto")
    b = plan(model, tmp_path / "b.json", "--devices", "4", "--memory-per-device", "1GiB", "--devices-per-host", "2",
             sharding="auto")
    assert {k: a[k] for k in ("assignment", "rows", "columns")} == {k: b[k] for k in ("assignment", "rows", "columns")}


HOSTILE = [
    ("hosts: []\n", "field hosts: [] (expected a list of hosts)"),
    ("hosts:\n  - {devices: 2, speed: 0, memory: 1GiB}\n", "hosts[0], field speed: 0 (a relative speed above 0"),
    ("hosts:\n  - {devices: 2, speed: .nan, memory: 1GiB}\n", "hosts[0], field speed: nan"),
    ("hosts:\n  - {devices: 2, speed: 1, memory: lots}\n", "hosts[0], field memory: 'lots'"),
    ("hosts:\n  - {devices: 0, speed: 1, memory: 1GiB}\n", "hosts[0], field devices: 0"),
    ("hosts:\n  - {devices: true, speed: 1, memory: 1GiB}\n", "hosts[0], field devices: True"),
    ("hosts:\n  - {devices: 2, speed: 1}\n", "hosts[0], field memory is missing"),
    ("hosts:\n  - {devices: 2, speed: 1, memory: 1GiB, colour: red}\n", "hosts[0], field 'colour' is unknown"),
    ("hosts:\n  - devices: [{speed: 1, memory: 1GiB}, 7]\n", "hosts[0].devices[1]: 7 (expected a mapping"),
    ("hosts:\n  - {devices: [{speed: 1, memory: 1GiB}], speed: 1}\n", "gives its devices one by one and speed"),
    ("devices: 4\n", "expected one field, hosts"),
    ("hosts: [\n", "not valid YAML"),
]


@pytest.mark.parametrize(("text", "said"), HOSTILE)
def test_a_hostile_topology_file_is_refused_in_one_line(model, tmp_path, capsys, text, said):
    file = tmp_path / "cluster.yaml"
    file.write_text(text)
    out = tmp_path / "plan.json"
    with pytest.raises(ConfigError, match=None):
        read_topology(file)
    assert main(["plan", "--tables", str(model), "--topology", str(file), "--method", "lpt_measured",
                 "--backend", "analytic", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(file) in err and said in err, err
    assert not out.exists() and file.read_text() == text


@pytest.mark.parametrize(("extra", "said"), [
    (["--devices", "4"], "--devices: --topology"),
    (["--devices-per-host", "2"], "--devices-per-host: --topology"),
    (["--method", "rl_greedy"], "rl_greedy places on devices alike (the policy was trained on devices alike"),
    (["--method", "torchrec"], "torchrec places on devices alike (TorchRec's Topology has one memory and no speed"),
    (["--method", "rl_best_of_n"], "rl_best_of_n places on devices alike"),
    (["--method", "size_greedy", "--sharding", "row"], "--sharding: row with --method size_greedy, which places "
                                                       "every table whole"),
    (["--sharding", "column"], "--sharding: column places on devices alike"),
])
def test_topology_beside_what_it_replaces_or_a_method_that_cannot_use_it(model, tmp_path, capsys, extra, said):
    file = tmp_path / "cluster.yaml"
    file.write_text(TWO_GENERATIONS)
    out = tmp_path / "plan.json"
    base = ["plan", "--tables", str(model), "--topology", str(file), "--backend", "analytic", "--out", str(out)]
    assert main([*base, *(["--method", "lpt_measured"] if "--method" not in extra else []), *extra]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and said in err, err
    assert not out.exists()


def test_torchrec_export_needs_hosts_of_one_size(model, tmp_path, capsys):
    file = tmp_path / "cluster.yaml"
    file.write_text("hosts:\n  - {devices: 3, speed: 1, memory: 1GiB}\n  - {devices: 1, speed: 1, memory: 1GiB}\n")
    assert main(["plan", "--tables", str(model), "--topology", str(file), "--method", "lpt_measured", "--backend",
                 "analytic", "--out", str(tmp_path / "p.json"), "--torchrec", str(tmp_path / "t.json")]) == 2
    assert "TorchRec's topology has one number of devices per host" in capsys.readouterr().err


def test_without_topology_the_devices_are_required(model, tmp_path, capsys):
    assert main(["plan", "--tables", str(model), "--memory-per-device", "1GiB", "--out", str(tmp_path / "p")]) == 2
    assert "--devices: required (or --topology FILE)" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [[], ["--torchrec-device", "cpu"]])
def test_host_memory_a_plan_cannot_use_is_said_not_ignored(model, tmp_path, capsys, extra):
    file = tmp_path / "cluster.yaml"
    file.write_text("hosts:\n  - {devices: 2, speed: 1, memory: 1GiB, ddr: 64GiB}\n")
    out = tmp_path / "p.json"
    base = ["plan", "--tables", str(model), "--topology", str(file), "--method", "lpt_measured", "--backend",
            "analytic", "--out", str(out)]
    assert main([*base, *extra]) == 0
    err = capsys.readouterr().err
    said = f"{file}: field ddr: unused by this plan"
    if extra:  # a CPU plan keeps nothing in host memory
        assert said in err and said in json.loads(out.read_text())["warnings"][-1]
    else:  # --torchrec-device cuda (the default) may cache a table there: nothing to say
        assert said not in err and not any(said in w for w in json.loads(out.read_text()).get("warnings", []))

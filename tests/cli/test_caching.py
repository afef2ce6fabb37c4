"""`autoshard plan` with a table larger than every GPU's HBM, whole or split: kept in host memory
by TorchRec's UVM caching kernel, its HBM and DDR counted apart, exported with that kernel; and
the options that set it refused where nothing uses them."""

import json

import pytest

from autoshard.cli.main import main
from autoshard.placement import caching

MODEL = """name,rows,dim,pooling_factor
huge,5000000,128,2
a,20000,64,1
b,2000,32,3.5
"""  # huge: 2.58 GB of weights and state, more than a device of 1 GiB holds whole or in halves
BATCH = 512


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model.csv"
    path.write_text(MODEL)
    return path


def plan(model, tmp_path, *extra) -> int:
    return main(["plan", "--tables", str(model), "--devices", "2", "--memory-per-device", "1GiB", "--backend",
                 "analytic", "--method", "lpt_measured", "--sharding", "auto", "--batch-size", str(BATCH), "--out",
                 str(tmp_path / "plan.json"), *extra])


@pytest.mark.parametrize("load_factor", [None, "0.05"])
def test_a_table_no_device_holds_is_cached_in_host_memory(model, tmp_path, load_factor):
    exported = tmp_path / "plan.torchrec.json"
    factor = caching.LOAD_FACTOR if load_factor is None else float(load_factor)
    assert plan(model, tmp_path, "--torchrec", str(exported),
                *(["--cache-load-factor", load_factor] if load_factor else [])) == 0
    doc = json.loads((tmp_path / "plan.json").read_text())
    hbm, ddr = caching.memory(5_000_000, 128, 4, BATCH, 2.0, False, factor)
    assert doc["cached"] == {"huge": {"kernel": caching.KERNEL, "cache_load_factor": factor, "hbm_bytes": hbm,
                                      "ddr_bytes": ddr}}
    device = doc["assignment"]["huge"]
    held = doc["per_device"][device]
    assert held["ddr_bytes"] == ddr and hbm <= held["memory_bytes"] <= 2**30 < ddr
    assert sum(d["ddr_bytes"] for d in doc["per_device"]) == ddr, "the other tables hold no DDR"
    assert doc["costs"]["cached"]["slowdown"] == pytest.approx(caching.slowdown(factor))
    modules = json.loads(exported.read_text())["modules"][""]
    assert {name: p["compute_kernel"] for name, p in modules.items()} == {"huge": caching.KERNEL, "a": "fused",
                                                                          "b": "fused"}
    assert modules["huge"]["cache_params"] == {"load_factor": factor}, "the factor planned for, not TorchRec's default"
    assert "cache_params" not in modules["a"] and "cache_params" not in modules["b"]


def test_the_cache_load_factor_reaches_torchrec_as_its_generators_write_it(model, tmp_path):
    from autoshard.cli.user_tables import read_tables
    from autoshard.core.inputs import Cached, read_json, torchrec_blocks
    from autoshard.placement.torchrec import block_sharding_plan, load_sharding_plan, plan_to_json

    exported = tmp_path / "plan.torchrec.json"
    assert plan(model, tmp_path, "--torchrec", str(exported), "--cache-load-factor", "0.3") == 0
    written = json.loads(exported.read_text())
    blocks = torchrec_blocks(read_json(exported, "TorchRec plan"), exported)
    tables = read_tables(model)
    made = block_sharding_plan(tables.features, tables.names, blocks.blocks, blocks.kinds, 2, 2, "cuda",
                               Cached(frozenset({"huge"}), 0.3))
    assert written == json.loads(json.dumps(plan_to_json(made, 2, "cuda")))
    loaded = load_sharding_plan(exported).plan[""]
    assert loaded["huge"].compute_kernel == caching.KERNEL and loaded["huge"].cache_params.load_factor == 0.3
    assert loaded["a"].cache_params is None


@pytest.mark.parametrize(("change", "said"), [
    (lambda m: m["a"].update(cache_params={"load_factor": 0.2}), "table 'a', field cache_params: given for "
                                                                 "compute_kernel 'fused'"),
    (lambda m: m["huge"].update(cache_params={"load_factor": 0}), "table 'huge', field load_factor: 0 (above 0"),
    (lambda m: m["huge"].update(cache_params={"load_factor": "0.2"}), "table 'huge', field load_factor: '0.2'"),
    (lambda m: m["huge"].update(cache_params={"load_factor": 0.2, "algorithm": "lru"}),
     "table 'huge', field cache_params: field 'algorithm' is unknown"),
    (lambda m: m["huge"].update(cache_params=[0.2]), "table 'huge', field cache_params: [0.2] (expected an object)"),
])
def test_a_hostile_cache_params_is_refused_by_name(model, tmp_path, change, said):
    from autoshard.core.errors import ConfigError
    from autoshard.placement.torchrec import load_sharding_plan

    exported = tmp_path / "plan.torchrec.json"
    assert plan(model, tmp_path, "--torchrec", str(exported)) == 0
    doc = json.loads(exported.read_text())
    change(doc["modules"][""])
    exported.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as refused:
        load_sharding_plan(exported)
    assert str(refused.value).startswith(str(exported)) and said in str(refused.value), refused.value



def test_score_refuses_a_cached_table_it_cannot_measure(model, tmp_path, capsys):
    exported = tmp_path / "plan.torchrec.json"
    assert plan(model, tmp_path, "--torchrec", str(exported)) == 0
    capsys.readouterr()
    for written in (tmp_path / "plan.json", exported):
        assert main(["score", "--plan", str(written), "--tables", str(model), "--backend", "analytic"]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and str(written) in err and "table 'huge'" in err, err


def test_cached_costs_are_the_fused_estimate_times_torchrecs_slowdown(model, tmp_path):
    assert plan(model, tmp_path, "--devices-per-host", "1") == 0
    doc = json.loads((tmp_path / "plan.json").read_text())
    device = doc["assignment"]["huge"]
    alone = [d for d in doc["per_device"] if d["names"] == ["huge"]]
    assert alone, "huge alone on its device (it costs more than the rest together)"
    import numpy as np

    from autoshard.cli.sharding_plan import lookup_scaled

    fused = float(lookup_scaled(np.array([128]), np.array([2.0]), BATCH, "cuda")[0])
    assert doc["per_device"][device]["estimated_ms"] == pytest.approx(fused * caching.slowdown(0.2), rel=1e-9)


def test_too_little_host_memory_or_none_on_a_cpu_is_refused_by_name(model, tmp_path, capsys):
    assert plan(model, tmp_path, "--ddr-per-device", "1GiB") == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "table huge:" in err and "of DDR" in err, err
    assert plan(model, tmp_path, "--torchrec-device", "cpu") == 2
    err = capsys.readouterr().err
    assert "table huge:" in err and "DDR" not in err, err
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.parametrize(("extra", "said"), [
    (["--cache-load-factor", "0"], "--cache-load-factor: 0.0 (above 0, at most 1)"),
    (["--cache-load-factor", "nan"], "--cache-load-factor: nan"),
    (["--cache-load-factor", "1.5"], "--cache-load-factor: 1.5"),
    (["--ddr-per-device", "lots"], "--ddr-per-device"),
    (["--cache-load-factor", "0.2", "--torchrec-device", "cpu"], "--cache-load-factor: only a sharded plan"),
    (["--ddr-per-device", "64GiB", "--method", "size_greedy", "--sharding", "table"],
     "--ddr-per-device: only a sharded plan"),
])
def test_caching_options_out_of_range_or_unused_are_refused(model, tmp_path, capsys, extra, said):
    args = ["plan", "--tables", str(model), "--devices", "2", "--memory-per-device", "1GiB", "--backend", "analytic",
            "--sharding", "auto", "--out", str(tmp_path / "plan.json"), *extra]
    assert main(args if "--method" in extra else [*args, "--method", "lpt_measured"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and said in err, err
    assert not (tmp_path / "plan.json").exists()


def test_unsharded_plans_refuse_the_caching_options(model, tmp_path, capsys):
    assert main(["plan", "--tables", str(model), "--devices", "2", "--memory-per-device", "4GiB", "--method",
                 "size_greedy", "--cache-load-factor", "0.2", "--out", str(tmp_path / "plan.json")]) == 2
    assert "--cache-load-factor: only a sharded plan" in capsys.readouterr().err


def test_a_topology_file_gives_each_hosts_ddr(model, tmp_path, capsys):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("hosts:\n  - {devices: 1, speed: 1, memory: 1GiB, ddr: 1GiB}\n"
                       "  - devices: [{speed: 1, memory: 1GiB, ddr: 4GiB}]\n")
    out = tmp_path / "plan.json"
    assert main(["plan", "--tables", str(model), "--topology", str(cluster), "--backend", "analytic", "--method",
                 "lpt_measured", "--sharding", "table", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["assignment"]["huge"] == 1, "only device 1's DDR holds it"
    assert doc["topology"]["ddrs_bytes"] == [2**30, 4 * 2**30]
    cluster.write_text("hosts:\n  - {devices: 2, speed: 1, memory: 1GiB, ddr: plenty}\n")
    assert main(["plan", "--tables", str(model), "--topology", str(cluster), "--backend", "analytic", "--method",
                 "lpt_measured", "--out", str(out)]) == 2
    assert "hosts[0], field ddr: 'plenty'" in capsys.readouterr().err


def test_torchrecs_planner_is_offered_the_caching_kernel_too(model, tmp_path):
    # told only the fused kernel, TorchRec's planner found no plan for a table no device holds;
    # offered ours, it keeps it in host memory, counted as ours are
    exported = tmp_path / "plan.torchrec.json"
    assert main(["plan", "--tables", str(model), "--devices", "2", "--memory-per-device", "1GiB", "--method",
                 "torchrec", "--sharding", "auto", "--batch-size", str(BATCH), "--out", str(tmp_path / "plan.json"),
                 "--torchrec", str(exported), "--cache-load-factor", "0.1"]) == 0
    doc = json.loads((tmp_path / "plan.json").read_text())
    entry = doc["cached"]["huge"]
    assert entry["kernel"] == caching.KERNEL and entry["cache_load_factor"] == 0.1
    shards = doc["rows"]["huge"]["shards"] if "huge" in doc["rows"] else [{"rows": 5_000_000}]
    counted = [caching.memory(s["rows"], 128, 4, BATCH, 2.0, False, 0.1) for s in shards]
    assert entry["ddr_bytes"] == sum(d for _, d in counted) == sum(x.get("ddr_bytes", 0) for x in doc["per_device"])
    assert entry["hbm_bytes"] == sum(h for h, _ in counted)
    assert all(x["memory_bytes"] <= 1 << 30 for x in doc["per_device"])
    modules = json.loads(exported.read_text())["modules"][""]
    assert modules["huge"]["compute_kernel"] == caching.KERNEL and modules["a"]["compute_kernel"] == "fused"
    assert modules["huge"]["cache_params"] == {"load_factor": 0.1}


SHORT = """name,rows,dim,pooling_factor
hot0,700000,128,8
hot1,700000,128,8
hot2,700000,128,8
cold0,1300000,128,0.1
cold1,1300000,128,0.1
"""  # each table fits a device of 1 GiB, together they ask more HBM than two such devices have


def test_tables_that_fit_only_in_part_keep_the_coldest_for_each_byte_in_host_memory(tmp_path):
    model = tmp_path / "short.csv"
    model.write_text(SHORT)
    assert plan(model, tmp_path) == 0
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert set(doc["cached"]) == {"cold0"}, "the fewest tables, those whose caching adds least per byte it frees"
    assert all(d["memory_bytes"] <= 2**30 for d in doc["per_device"])
    assert sum(d["ddr_bytes"] for d in doc["per_device"]) == sum(c["ddr_bytes"] for c in doc["cached"].values())


def test_a_model_larger_than_the_devices_hbm_and_ddr_is_refused_in_one_line(tmp_path, capsys):
    model = tmp_path / "short.csv"
    model.write_text(SHORT)
    assert plan(model, tmp_path, "--ddr-per-device", "64MiB") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the 5 tables need at least" in err, err
    assert "bytes of HBM and host memory together" in err and "the 2 devices have" in err, err
    assert not (tmp_path / "plan.json").exists()


def test_a_table_too_large_for_any_devices_ddr_is_not_chosen_and_the_next_coldest_is(tmp_path):
    model = tmp_path / "short.csv"
    model.write_text(SHORT)
    assert plan(model, tmp_path, "--ddr-per-device", "600MiB") == 0  # a cold table's 670 MB of DDR fits no device
    cached = json.loads((tmp_path / "plan.json").read_text())["cached"]
    assert cached and set(cached) <= {"hot0", "hot1", "hot2"}, cached

"""`autoshard plan --topology FILE --method milp | cost_greedy_local_search`: the solver and the
search on two GPU generations and on a device half taken, never worse than the placement they
start from, each device within its own memory; and what they refuse."""

import itertools
import json

import numpy as np
import pytest

from autoshard.cli.main import main
from autoshard.cli.topology_file import read_topology

from helpers import HALF_TAKEN, TWO_GENERATIONS


def tables(tmp_path, n: int = 24, seed: int = 0):
    g = np.random.default_rng(seed)
    lines = ["name,rows,dim,pooling_factor"] + [f"t{i},{g.integers(2000, 20000)},{g.choice([16, 32, 64])},"
                                                f"{g.integers(2, 30)}" for i in range(n)]
    path = tmp_path / f"model{n}.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def plan(model, tmp_path, cluster: str, method: str, *extra, name: str = "plan.json") -> dict:
    file = tmp_path / "cluster.yaml"
    file.write_text(cluster)
    out = tmp_path / name
    assert main(["plan", "--tables", str(model), "--topology", str(file), "--sharding", "table", "--method", method,
                 "--batch-size", "512", "--bandwidths", "600,600", "--out", str(out), *extra]) == 0
    return json.loads(out.read_text())


def peak(doc: dict) -> float:
    return max(x["busy_ms"] for x in doc["per_device"])


@pytest.mark.parametrize("cluster", [TWO_GENERATIONS, HALF_TAKEN])
def test_the_milp_is_never_worse_than_lpt_it_starts_from_and_keeps_each_devices_memory(tmp_path, cluster):
    model = tables(tmp_path)
    lpt = plan(model, tmp_path, cluster, "lpt_measured", "--backend", "analytic", name="lpt.json")
    solved = plan(model, tmp_path, cluster, "milp", "--backend", "analytic")
    assert peak(solved) <= peak(lpt) * (1 + 1e-9)
    found = solved["costs"]["milp"]
    assert found["lower_bound_ms"] <= peak(solved) * (1 + 1e-9) and found["from"] == "lpt_measured's placement"
    assert found["status"] in ("optimal", "node_limit", "time_limit", "start")
    assert all(x["memory_bytes"] <= x["capacity_bytes"] for x in solved["per_device"])
    speeds = read_topology(tmp_path / "cluster.yaml").speeds
    busy = [x["estimated_ms"] / s + x["comm_modelled_ms"] for x, s in zip(solved["per_device"], speeds, strict=True)]
    assert [x["busy_ms"] for x in solved["per_device"]] == pytest.approx(busy), "the plan file's own objective"


def test_on_a_small_task_the_milp_finds_the_best_placement_there_is(tmp_path):
    from autoshard.cli.sharding_plan import estimated, parse_bandwidths
    from autoshard.cli.sharding_plan import plan as sharded
    from autoshard.cli.user_tables import read_tables

    model = tables(tmp_path, n=6, seed=1)
    solved = plan(model, tmp_path, TWO_GENERATIONS, "milp", "--backend", "analytic")
    assert solved["costs"]["milp"]["status"] == "optimal"
    topology, user = read_topology(tmp_path / "cluster.yaml"), read_tables(model, reuse=False)
    whole = [p.layout.pieces[0] for p in sharded(user, "table", topology, 512, (), estimated(user, 512, "cuda"),
                                                 parse_bandwidths("600,600")).placed]
    cost, comm, held = (np.array([getattr(q, f) for q in whole]) for f in ("cost", "comm", "memory"))
    best = np.inf
    for p in itertools.product(range(4), repeat=6):
        on = np.array(p)[:, None] == np.arange(4)
        if ((held[:, None] * on).sum(axis=0) <= topology.memories).all():
            busy = (cost[:, None] * on).sum(axis=0) / topology.speeds + (comm[:, None] * on).sum(axis=0)
            best = min(best, busy.max())
    assert peak(solved) == pytest.approx(best, rel=1e-3), "to HiGHS's gap of 0.1%"


def test_local_search_improves_cost_greedy_on_a_device_half_taken(user_models, tmp_path):
    greedy = plan(user_models["tables"], tmp_path, HALF_TAKEN, "cost_greedy", "--cost-model",
                  str(user_models["model"]), name="greedy.json")
    searched = plan(user_models["tables"], tmp_path, HALF_TAKEN, "cost_greedy_local_search", "--cost-model",
                    str(user_models["model"]))
    assert peak(searched) <= peak(greedy) * (1 + 1e-9)
    assert searched["costs"]["kind"] == "predicted" and searched["costs"]["search"]["from"] == \
        "cost_greedy's placement"
    assert all(x["memory_bytes"] <= x["capacity_bytes"] for x in searched["per_device"])


@pytest.mark.parametrize(("extra", "said"), [
    (["--method", "milp", "--sharding", "auto"], "--sharding: auto with --method milp, which places every table "
                                                 "whole (it moves whole tables"),
    (["--method", "milp", "--constraints", "PINS"], "pins or groups tables, which --method milp moves on a topology"),
    (["--method", "rl_local_search"], "rl_local_search places on devices alike (the policy was trained"),
])
def test_what_the_solver_and_search_refuse_on_a_topology(tmp_path, capsys, extra, said):
    model = tables(tmp_path)
    file = tmp_path / "cluster.yaml"
    file.write_text(TWO_GENERATIONS)
    pins = tmp_path / "pins.yaml"
    pins.write_text("t0: {device: 1}\n")
    out = tmp_path / "plan.json"
    extra = [str(pins) if e == "PINS" else e for e in extra]
    args = ["plan", "--tables", str(model), "--topology", str(file), "--backend", "analytic", "--out", str(out)]
    assert main([*args, *(["--sharding", "table"] if "--sharding" not in extra else []), *extra]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and said in err, err
    assert not out.exists()


def test_the_caching_kernel_is_left_to_the_placements_that_count_its_ddr(tmp_path, capsys):
    model = tables(tmp_path)
    file = tmp_path / "cluster.yaml"
    file.write_text(TWO_GENERATIONS)
    assert main(["plan", "--tables", str(model), "--topology", str(file), "--backend", "analytic", "--sharding",
                 "table", "--method", "milp", "--cache-load-factor", "0.2", "--out", str(tmp_path / "plan.json")]) == 2
    assert "--cache-load-factor: only a sharded plan" in capsys.readouterr().err

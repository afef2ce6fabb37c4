"""autoshard inside TorchRec's planner: the estimator, the partitioner and the plan loader on
meta-device modules, planned the way a TorchRec user plans (the README's example)."""

import json

import numpy as np
import pytest
import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import PlannerError
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from autoshard.cli.main import main
from autoshard.core.errors import ConfigError
from autoshard.planner.estimator import AutoShardEstimator
from autoshard.planner.loader import AutoShardPlanLoader
from autoshard.planner.partitioner import AutoShardPartitioner

TABLES = [("t_user", 4000, 16, 8.0), ("t_item", 20000, 32, 4.0), ("t_cat", 300, 16, 1.0), ("t_geo", 1000, 8, 2.0),
          ("t_ad", 8000, 16, 12.0), ("t_time", 50, 4, 1.0), ("t_page", 12000, 16, 6.0)]
BATCH = 256  # per rank
GIB = 2**30


def module() -> EmbeddingBagCollection:
    return EmbeddingBagCollection(device=torch.device("meta"), tables=[
        EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=r, feature_names=[n]) for n, r, d, _ in TABLES])


def constraints() -> dict:
    return {n: ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"], pooling_factors=[pf])
            for n, _, _, pf in TABLES}


def plan_with(partitioner, estimator=None, ranks: int = 2, ddr: int = GIB, loader=None):
    """The README's ten lines: TorchRec's planner with our estimator and partitioner."""
    topology = Topology(world_size=ranks, compute_device="cpu", ddr_cap=ddr)
    perf = estimator(topology) if estimator else EmbeddingPerfEstimator(topology, constraints=constraints())
    enumerator = EmbeddingEnumerator(topology=topology, batch_size=BATCH, constraints=constraints(),
                                     estimator=[perf, EmbeddingStorageEstimator(topology, constraints=constraints())])
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=BATCH, enumerator=enumerator,
                                       constraints=constraints(), partitioner=partitioner, plan_loader=loader,
                                       storage_reservation=FixedPercentageStorageReservation(0.0))
    return planner.plan(module(), [EmbeddingBagCollectionSharder()]).plan[""], perf


def loads(plan, costs: dict[str, float], ranks: int) -> np.ndarray:
    out = np.zeros(ranks)
    for name, p in plan.items():
        out[p.ranks[0]] += costs[name]
    return out


def estimates() -> dict[str, object]:
    """TorchRec's own estimate of each table's shard (table-wise, fused, on CPU): fixed numbers."""
    topology = Topology(world_size=2, compute_device="cpu", ddr_cap=GIB)
    enumerator = EmbeddingEnumerator(topology=topology, batch_size=BATCH, constraints=constraints(), estimator=[
        EmbeddingPerfEstimator(topology, constraints=constraints()),
        EmbeddingStorageEstimator(topology, constraints=constraints())])
    return {o.name: o.shards[0] for o in enumerator.enumerate(module(), [EmbeddingBagCollectionSharder()])}


def torchrec_costs() -> dict[str, float]:
    return {name: shard.perf.total for name, shard in estimates().items()}


def test_our_estimator_measures_every_shard_here_and_our_partitioner_places_them(tmp_path):
    made = []

    def estimator(topology):
        made.append(AutoShardEstimator(topology, cache=tmp_path, runs=1))
        return made[-1]

    partitioner = AutoShardPartitioner(method="lpt_measured")
    plan, _ = plan_with(partitioner, estimator)
    assert set(plan) == {n for n, *_ in TABLES} and all(p.sharding_type == "table_wise" for p in plan.values())
    assert {p.ranks[0] for p in plan.values()} == {0, 1}
    source = made[0].source
    assert source["kind"] == "measured" and source["backend"] == "fbgemm" and source["batch_size"] == BATCH
    assert len(list((tmp_path / "singles").glob("*.json"))) == len(TABLES), "each table measured alone, cached"
    assert partitioner.last["memory"] == "ddr" and partitioner.last["shards"] == len(TABLES)


def test_the_milp_partitioner_balances_at_least_as_well_as_torchrecs_greedy_on_the_same_estimates():
    costs = torchrec_costs()
    ours, _ = plan_with(AutoShardPartitioner(method="milp"), ranks=3)
    theirs, _ = plan_with(GreedyPerfPartitioner(), ranks=3)
    assert loads(ours, costs, 3).max() <= loads(theirs, costs, 3).max() * (1 + 1e-9)
    lpt, _ = plan_with(AutoShardPartitioner(method="lpt_measured"), ranks=3)
    assert loads(ours, costs, 3).max() <= loads(lpt, costs, 3).max() * (1 + 1e-9)


def test_storage_is_honoured_and_nothing_fitting_is_torchrecs_own_error():
    sizes = {name: shard.storage.ddr for name, shard in estimates().items()}  # TorchRec's storage estimate
    tight = int(max(max(sizes.values()), sum(sizes.values()) / 4) * 1.3)
    with pytest.raises(PlannerError):
        plan_with(AutoShardPartitioner(method="milp"), ranks=4, ddr=max(sizes.values()) - 1)
    plan, _ = plan_with(AutoShardPartitioner(method="lpt_measured"), ranks=4, ddr=tight)
    per_rank = np.zeros(4)
    for name, p in plan.items():
        per_rank[p.ranks[0]] += sizes[name]
    assert per_rank.max() <= tight


def test_the_cost_model_can_predict_the_shards_and_the_learned_sharder_place_them(user_models):
    made = []

    def estimator(topology):
        made.append(AutoShardEstimator(topology, costs="predicted", models=user_models["root"]))
        return made[-1]

    plan, _ = plan_with(AutoShardPartitioner(method="rl_greedy", models=user_models["root"]), estimator)
    assert set(plan) == {n for n, *_ in TABLES}
    assert made[0].source["kind"] == "predicted" and "cost_model" in made[0].source["model_files"]
    with pytest.raises(ConfigError, match="costs: 'guessed'"):
        AutoShardEstimator(Topology(world_size=2, compute_device="cpu"), costs="guessed")


@pytest.mark.parametrize("method", ["lpt_measured", "milp", "size_lookup_greedy"])
def test_the_partitioner_keeps_pinned_tables_and_groups_where_they_are_asked(method):
    plan, _ = plan_with(AutoShardPartitioner(method=method, pins={"t_item": 2, "t_time": 0},
                                             groups=[["t_user", "t_geo", "t_time"], ["t_ad", "t_page"]]), ranks=3)
    assert plan["t_item"].ranks == [2]
    assert plan["t_user"].ranks == plan["t_geo"].ranks == plan["t_time"].ranks == [0]
    assert plan["t_ad"].ranks == plan["t_page"].ranks
    assert set(plan) == {n for n, *_ in TABLES}


@pytest.mark.parametrize("pins, groups, pattern", [
    ({"t_nope": 0}, None, r"table 't_nope' is not among the proposed tables"),
    ({"t_item": 3}, None, r"pins: table 't_item': rank 3 \(ranks 0 to 2\)"),
    ({"t_item": 0, "t_ad": 1}, [["t_item", "t_ad"]], r"groups: \['t_item', 't_ad'\] pinned to ranks \[0, 1\]"),
    (None, [["t_item"], ["t_item", "t_ad"]], r"groups: table 't_item' is in two groups"),
])
def test_pins_and_groups_that_cannot_hold_are_refused(pins, groups, pattern):
    with pytest.raises(ConfigError, match=pattern):
        plan_with(AutoShardPartitioner(method="lpt_measured", pins=pins, groups=groups), ranks=3)


def test_an_unknown_method_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"method: 'nope' \(expected one of .*lpt_measured"):
        AutoShardPartitioner(method="nope")


def write_tables(tmp_path):
    path = tmp_path / "tables.csv"
    path.write_text("name,rows,dim,pooling_factor\n" + "".join(f"{n},{r},{d},{pf}\n" for n, r, d, pf in TABLES))
    return path


def test_the_plan_loader_hands_our_plan_file_to_torchrecs_planner(tmp_path):
    out = tmp_path / "plan.json"
    assert main(["plan", "--tables", str(write_tables(tmp_path)), "--devices", "2", "--memory-per-device", "1GiB",
                 "--method", "size_greedy", "--out", str(out)]) == 0
    assignment = json.loads(out.read_text())["assignment"]
    topology = Topology(world_size=2, compute_device="cpu", ddr_cap=GIB)
    loader = AutoShardPlanLoader(out, module(), [EmbeddingBagCollectionSharder()], topology, BATCH, constraints())
    plan, _ = plan_with(GreedyPerfPartitioner(), loader=loader)
    assert {n: p.ranks[0] for n, p in plan.items()} == assignment, "TorchRec returns the file's plan"
    with pytest.raises(ConfigError, match="a plan for 2 devices"):
        AutoShardPlanLoader(out, module(), [EmbeddingBagCollectionSharder()],
                            Topology(world_size=3, compute_device="cpu"), BATCH)


def test_the_plan_loader_gives_a_cached_table_the_caching_kernel_at_the_files_load_factor(tmp_path):
    from torchrec.distributed.types import CacheParams

    model = tmp_path / "huge.csv"
    model.write_text("name,rows,dim,pooling_factor\nhuge,5000000,128,2\na,20000,64,1\n")  # huge: 2.6 GB, HBM 1 GiB
    out, exported = tmp_path / "plan.json", tmp_path / "plan.torchrec.json"
    assert main(["plan", "--tables", str(model), "--devices", "2", "--memory-per-device", "1GiB", "--backend",
                 "analytic", "--method", "lpt_measured", "--sharding", "auto", "--batch-size", "512", "--out",
                 str(out), "--torchrec", str(exported), "--cache-load-factor", "0.3"]) == 0
    ebc = EmbeddingBagCollection(device=torch.device("meta"), tables=[
        EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=r, feature_names=[n])
        for n, r, d in (("huge", 5_000_000, 128), ("a", 20000, 64))])
    topology = Topology(world_size=2, compute_device="cuda", hbm_cap=GIB)

    def told(factor: float | None) -> dict:
        cache = {} if factor is None else {"cache_params": CacheParams(load_factor=factor)}
        return {n: ParameterConstraints(compute_kernels=["fused", "fused_uvm_caching"], pooling_factors=[pf], **cache)
                for n, pf in (("huge", 2.0), ("a", 1.0))}

    for path in (out, exported):  # our plan file (its `cached`) and the export (its kernel and cache_params)
        loaded = AutoShardPlanLoader(path, ebc, [EmbeddingBagCollectionSharder()], topology, 256, told(0.3)).load()
        kernels = {o.name: o.compute_kernel for o in loaded.values()}
        assert kernels == {"huge": "fused_uvm_caching", "a": "fused"}, path
        for factor, said in ((0.2, "TorchRec's option at 0.2"), (None, "TorchRec's option at 0.2")):
            with pytest.raises(ConfigError, match=f"table 'huge': cached at a load factor of 0.3, and {said}"):
                AutoShardPlanLoader(path, ebc, [EmbeddingBagCollectionSharder()], topology, 256, told(factor)).load()
        by_sharder = EmbeddingBagCollectionSharder(fused_params={"cache_load_factor": 0.3})
        loaded = AutoShardPlanLoader(path, ebc, [by_sharder], topology, 256, told(None)).load()
        assert {o.name: o.compute_kernel for o in loaded.values()}["huge"] == "fused_uvm_caching", "the sharder's"
        with pytest.raises(ConfigError, match="TorchRec's option at 0.2 .*fused_params"):
            AutoShardPlanLoader(path, ebc, [by_sharder], topology, 256, told(0.2)).load()  # constraints come first
    doc = json.loads(out.read_text())
    doc["cached"]["huge"]["cache_load_factor"] = 2
    out.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="field cached: table 'huge'.*a cache_load_factor above 0, at most 1"):
        AutoShardPlanLoader(out, ebc, [EmbeddingBagCollectionSharder()], topology, 256, told(0.3))


@pytest.mark.slow
def test_the_planned_module_runs_sharded_with_gloo_and_computes_what_the_unsharded_one_does(tmp_path):
    from autoshard.cli.torchrec.check import check
    from autoshard.placement.torchrec import plan_to_json

    topology = Topology(world_size=2, compute_device="cpu", ddr_cap=GIB)
    enumerator = EmbeddingEnumerator(topology=topology, batch_size=BATCH, constraints=constraints(), estimator=[
        AutoShardEstimator(topology, cache=tmp_path, runs=1), EmbeddingStorageEstimator(topology, constraints())])
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=BATCH, enumerator=enumerator,
                                       constraints=constraints(), partitioner=AutoShardPartitioner(method="milp"))
    sharding = planner.plan(module(), [EmbeddingBagCollectionSharder()])
    path = tmp_path / "plan.torchrec.json"
    path.write_text(json.dumps(plan_to_json(sharding, 2, "cpu")))
    result = check(write_tables(tmp_path), path)  # raises where the sharded output differs
    assert {r["rank"]: sorted(r["tables"]) for r in result["ranks"]} == {
        rank: sorted(n for n, p in sharding.plan[""].items() if p.ranks[0] == rank) for rank in range(2)}


def test_a_row_wise_plan_of_a_production_shaped_model_loads_into_torchrecs_planner(tmp_path):
    """Our `--sharding auto` plan of a small production-shaped model (modules, a sequence module,
    row-, table-row- and column-wise shards) is what TorchRec's planner accepts through the plan
    loader: every table on the ranks the plan gives, data-parallel ones on every rank, scored by
    TorchRec's estimators."""
    from autoshard.cli.main import main
    from autoshard.core.inputs import plan_blocks
    from autoshard.planner.production import production_tables, torchrec_plan

    tables = production_tables(0, tables=40)
    tables["rows"] = (tables["rows"] // 2000).clip(lower=10)  # a two-thousandth of the rows
    path, out, exported = tmp_path / "model.csv", tmp_path / "plan.json", tmp_path / "plan.torchrec.json"
    tables.to_csv(path, index=False)
    assert main(["plan", "--tables", str(path), "--devices", "8", "--devices-per-host", "4", "--memory-per-device",
                 "2GiB", "--sharding", "auto", "--method", "lpt_measured", "--backend", "analytic", "--batch-size",
                 "2048", "--cache", str(tmp_path / "cache"), "--out", str(out), "--torchrec", str(exported)]) == 0
    stats, _, plan = torchrec_plan(tables, 8, 4, 2 * 2**30, 256, loader_plan=exported)
    ours = plan_blocks(json.loads(exported.read_text()), exported)
    for module, params in plan.plan.items():
        for name, sharding in params.items():
            qualified = f"{module}.{name}" if module else name
            assert sharding.sharding_type == ours.kinds[qualified]
            assert list(sharding.ranks) == [b.device for b in ours.blocks[qualified]]
    assert stats["hbm_max_bytes"] > 0 and stats["perf_max_ms"] > 0
    assert {"data_parallel", "row_wise"} <= set(ours.kinds.values())  # replicas load too, on every rank


def test_our_partitioner_puts_row_shards_on_every_rank_and_table_row_shards_on_one_host():
    """TorchRec proposes row-wise (`uniform`) and table-row-wise (`host`) options too: each row
    shard lands on its rank, each table-row-wise table on the ranks of one host, in order."""
    kinds = {"t_user": "row_wise", "t_item": "table_row_wise", "t_ad": "table_row_wise"}
    wanted = {n: ParameterConstraints(sharding_types=[kinds.get(n, "table_wise")], compute_kernels=["fused"],
                                      pooling_factors=[pf]) for n, _, _, pf in TABLES}
    topology = Topology(world_size=4, local_world_size=2, compute_device="cuda", hbm_cap=GIB)  # CPU: no RW
    enumerator = EmbeddingEnumerator(topology=topology, batch_size=BATCH, constraints=wanted, estimator=[
        EmbeddingPerfEstimator(topology, constraints=wanted), EmbeddingStorageEstimator(topology, constraints=wanted)])
    partitioner = AutoShardPartitioner(method="lpt_measured")
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=BATCH, enumerator=enumerator, constraints=wanted,
                                       partitioner=partitioner,
                                       storage_reservation=FixedPercentageStorageReservation(0.0))
    plan = planner.plan(module(), [EmbeddingBagCollectionSharder()]).plan[""]
    assert plan["t_user"].sharding_type == "row_wise" and list(plan["t_user"].ranks) == [0, 1, 2, 3]
    hosts = [list(plan[n].ranks) for n in ("t_item", "t_ad")]
    assert all(r in ([0, 1], [2, 3]) for r in hosts) and hosts[0] != hosts[1], "two heavy tables, two hosts"
    assert partitioner.last["shards"] == len(TABLES) - 3


def test_the_production_benchmark_scores_any_plan_with_our_cost_model_as_the_command_does(user_models, tmp_path):
    """`predicted_load` of our own exported plan is the bottleneck the command predicted for it,
    so TorchRec's plan is predicted the same way; TorchRec's planner with its defaults plans the
    small production-shaped model too."""
    from autoshard.cli import service
    from autoshard.placement.torchrec import load_sharding_plan
    from autoshard.planner.production import model_and_topology, predicted_load, production_tables, torchrec_plan

    tables = production_tables(0, tables=24)
    tables["rows"] = (tables["rows"] // 2000).clip(lower=10)
    path, out, exported = tmp_path / "model.csv", tmp_path / "plan.json", tmp_path / "plan.torchrec.json"
    tables.to_csv(path, index=False)
    assert main(["plan", "--tables", str(path), "--devices", "4", "--devices-per-host", "2", "--memory-per-device",
                 "2GiB", "--sharding", "auto", "--method", "cost_greedy", "--cost-model", str(user_models["model"]),
                 "--batch-size", "1024", "--out", str(out), "--torchrec", str(exported)]) == 0
    models = service.load_models("cost_greedy", None, user_models["model"])
    _, _, user = model_and_topology(tables, 4, 2, 2 * GIB)
    ours = predicted_load(user, load_sharding_plan(exported), 4, models)
    assert ours == pytest.approx(json.loads(out.read_text())["predicted_bottleneck_ms"], rel=1e-6)
    stats, _, plan = torchrec_plan(tables, 4, 2, 2 * GIB, 256)
    assert np.isfinite(predicted_load(user, plan, 4, models)) and stats["perf_max_ms"] > 0


def test_the_partitioner_takes_our_topology_slow_ranks_get_less_work_and_small_ones_less_memory():
    """A two-generation cluster as `autoshard plan --topology` reads it: TorchRec's planner with our
    partitioner told the speeds, against the same partitioner told the ranks are alike."""
    from autoshard.placement.topology import Topology as Cluster
    from autoshard.planner.partitioner import torchrec_topology

    cluster = Cluster(np.array([1.0, 1.0, 0.4, 0.4]), np.full(4, GIB, dtype=np.int64), (2, 2))

    def planned(partitioner, on: Cluster):
        topology = torchrec_topology(on, "cpu")
        enumerator = EmbeddingEnumerator(topology=topology, batch_size=BATCH, constraints=constraints(), estimator=[
            EmbeddingPerfEstimator(topology, constraints=constraints()),
            EmbeddingStorageEstimator(topology, constraints=constraints())])
        planner = EmbeddingShardingPlanner(topology=topology, batch_size=BATCH, enumerator=enumerator,
                                           constraints=constraints(), partitioner=partitioner,
                                           storage_reservation=FixedPercentageStorageReservation(0.0))
        return planner.plan(module(), [EmbeddingBagCollectionSharder()]).plan[""]

    topology = torchrec_topology(cluster, "cpu")
    enumerator = EmbeddingEnumerator(topology=topology, batch_size=BATCH, constraints=constraints(), estimator=[
        EmbeddingPerfEstimator(topology, constraints=constraints()),
        EmbeddingStorageEstimator(topology, constraints=constraints())])
    options = enumerator.enumerate(module(), [EmbeddingBagCollectionSharder()])
    perf = {o.name: o.shards[0].perf for o in options}
    storage = {o.name: o.shards[0].storage.ddr for o in options}

    def busy(plan) -> np.ndarray:
        out = np.zeros(4)
        for name, p in plan.items():
            f, r = perf[name], p.ranks[0]
            compute = f.fwd_compute + f.bwd_compute + f.prefetch_compute
            out[r] += compute / cluster.speeds[r] + f.fwd_comms + f.bwd_comms
        return out

    told = AutoShardPartitioner(method="lpt_measured", topology=cluster)
    ours = planned(told, cluster)
    blind = planned(AutoShardPartitioner(method="lpt_measured"), cluster)
    assert set(ours) == {n for n, *_ in TABLES} and told.last["topology"] == cluster.document()
    times = [busy(p) for p in (ours, blind)]
    assert times[0].max() < times[1].max()
    assert told.last["bottleneck"] == pytest.approx(times[0].max(), rel=1e-6)
    small = min(storage.values()) * 2  # rank 3 shared with another job: room for the two smallest tables at most
    cramped = Cluster(np.ones(4), np.array([GIB, GIB, GIB, small], dtype=np.int64), (2, 2))
    held = planned(AutoShardPartitioner(method="lpt_measured", topology=cramped), cramped)
    assert sum(storage[n] for n, p in held.items() if p.ranks[0] == 3) <= small
    solver = AutoShardPartitioner(method="milp", topology=cluster)
    solved = planned(solver, cluster)
    assert busy(solved).max() <= times[0].max() * (1 + 1e-9), "the MILP starts from LPT's placement"
    assert solver.last["bottleneck"] == pytest.approx(busy(solved).max(), rel=1e-6)
    milp = solver.last["solver"]
    assert milp["lower_bound_ms"] <= solver.last["bottleneck"] * (1 + 1e-9) and milp["gap"] >= 0, milp
    assert milp["status"] in ("optimal", "node_limit", "time_limit", "start") and "solver" not in told.last
    with pytest.raises(ConfigError, match="'size_greedy' places on devices alike; with a topology, lpt_measured or "
                                          "milp"):
        AutoShardPartitioner(method="size_greedy", topology=cluster)
    with pytest.raises(ConfigError, match="hosts of \\[1, 3\\] devices"):
        torchrec_topology(Cluster(np.ones(4), np.full(4, GIB), (3, 1)))


def test_on_gpus_the_partitioner_counts_a_cached_tables_ddr_apart_from_its_hbm():
    """A table TorchRec's planner offers only with the UVM caching kernel: on our topology it goes
    to the rank whose host memory holds it, though the other has as much HBM and is as fast."""
    from torchrec.distributed.types import CacheParams

    from autoshard.placement.topology import Topology as Cluster
    from autoshard.planner.partitioner import torchrec_topology

    told = {n: ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused_uvm_caching" if n == "t_item"
                                                                                   else "fused"],
                                    pooling_factors=[pf], cache_params=CacheParams(load_factor=0.2))
            for n, _, _, pf in TABLES}
    ddr_item = 20000 * 32 * 4  # its weights, all in host memory (no optimizer attached to `module()`)
    for short in (0, 1):  # the rank a byte short of its host memory, in turn
        ddrs = np.full(2, 10 * GIB, dtype=np.int64)
        ddrs[short] = ddr_item - 1
        cluster = Cluster(np.ones(2), np.full(2, GIB, dtype=np.int64), (2,), ddrs)
        topology = torchrec_topology(cluster, "cuda")
        assert [d.storage.ddr for d in topology.devices] == ddrs.tolist()
        enumerator = EmbeddingEnumerator(topology=topology, batch_size=BATCH, constraints=told, estimator=[
            EmbeddingPerfEstimator(topology, constraints=told), EmbeddingStorageEstimator(topology, constraints=told)])
        planner = EmbeddingShardingPlanner(topology=topology, batch_size=BATCH, enumerator=enumerator,
                                           constraints=told, storage_reservation=FixedPercentageStorageReservation(0),
                                           partitioner=AutoShardPartitioner(method="lpt_measured", topology=cluster))
        plan = planner.plan(module(), [EmbeddingBagCollectionSharder()]).plan[""]
        assert plan["t_item"].compute_kernel == "fused_uvm_caching" and plan["t_item"].ranks == [1 - short]
    solver = AutoShardPartitioner(method="milp", topology=cluster)
    with pytest.raises(PlannerError, match="holds host memory"):  # the MILP counts no DDR: refused, not overfilled
        EmbeddingShardingPlanner(topology=topology, batch_size=BATCH, enumerator=enumerator, constraints=told,
                                 storage_reservation=FixedPercentageStorageReservation(0),
                                 partitioner=solver).plan(module(), [EmbeddingBagCollectionSharder()])

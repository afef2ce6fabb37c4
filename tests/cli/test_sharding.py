"""`autoshard plan --sharding row|auto` on a scaled-down production-shaped model: tables larger
than a device split by rows, sequence features, modules, the memory of training, and the
TorchRec export run for real under gloo."""

import json

import numpy as np
import pytest

from autoshard.cli.main import main
from autoshard.core.inputs import plan_blocks
from autoshard.data.footprint import io_bytes, shard_footprint
from autoshard.data.sizes import table_bytes

from helpers import PRODUCTION_TABLES

MODEL = PRODUCTION_TABLES
SMALL = """name,rows,dim,pooling_factor,module,pooling
user_id,20000,64,1,sparse,pooled
item_id,2000,32,3.5,sparse,pooled
category,300,4,2,sparse,pooled
query,1000,8,12,sparse,pooled
clicks,3000,16,150,seq,sequence
views,2500,16,90,seq,sequence
"""  # the same shape, a hundredth of the rows: user_id (5.2 MB while training) fits no device of 6 MB with another
BATCH = 256


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model.csv"
    path.write_text(MODEL)
    return path


def plan(model, out, *extra) -> int:
    return main(["plan", "--tables", str(model), "--devices", "4", "--memory-per-device", "600MB",
                 "--backend", "analytic", "--batch-size", str(BATCH), "--cache", str(out.parent / "cache"),
                 "--out", str(out), *extra])


def test_tables_too_large_for_a_device_are_split_by_rows_and_every_device_holds_its_share(model, tmp_path):
    out, exported = tmp_path / "plan.json", tmp_path / "plan.torchrec.json"
    assert main(["plan", "--tables", str(model), "--devices", "4", "--memory-per-device", "600MB", "--method",
                 "size_lookup_greedy", "--batch-size", str(BATCH), "--out", str(out)]) == 2  # whole, they do not fit
    assert plan(model, out, "--sharding", "auto", "--devices-per-host", "2", "--torchrec", str(exported),
                "--torchrec-device", "cpu") == 0
    doc = json.loads(out.read_text())
    assert "sparse.user_id" in doc["rows"]  # 1.03 GB while training: on no device whole
    assert all(doc["rows"][n]["kind"] == "row_wise" for n in ("seq.clicks", "seq.views") if n in doc["rows"])
    held_as_counted(doc, out, exported)


def held_as_counted(doc: dict, out, exported) -> None:
    """Each device's memory in the plan file is the training footprint of its pieces, within the cap,
    and the TorchRec export holds the same shards."""
    spec = {r.split(",")[4] + "." + r.split(",")[0]: r.split(",") for r in MODEL.strip().splitlines()[1:]}
    held = np.zeros(4, dtype=np.int64)
    plan_doc = plan_blocks({k: v for k, v in doc.items() if k != "costs"}, out)
    for name, blocks in plan_doc.blocks.items():
        _, rows, dim, pooling, _, kind = spec[name]
        ways = len(blocks) if plan_doc.kinds[name] in ("row_wise", "table_row_wise") else 1
        for b in blocks:
            if plan_doc.kinds[name] == "data_parallel":  # the whole table, buffers for a quarter of the batch
                held[b.device] += table_bytes(int(rows), int(dim), 4) + sum(io_bytes(BATCH // 4, float(pooling),
                                                                                     int(dim), kind == "sequence"))
                continue
            held[b.device] += shard_footprint(int(rows) if b.rows is None else b.rows,
                                              int(dim) if b.width is None else b.width, 4, BATCH, float(pooling),
                                              kind == "sequence", ways)
    assert [d["memory_bytes"] for d in doc["per_device"]] == held.tolist()
    assert held.max() <= 600_000_000
    back = plan_blocks(json.loads(exported.read_text()), exported)
    assert back.blocks == plan_doc.blocks and back.kinds == plan_doc.kinds


def test_torchrecs_own_planner_plans_the_model_with_the_same_accounting(model, tmp_path, capsys):
    """`--method torchrec --sharding auto`: TorchRec's planner on the same modules, sequence tables
    and training batch, its plan written and counted as ours are (memory, comm, export)."""
    out, exported = tmp_path / "plan.json", tmp_path / "plan.torchrec.json"
    assert plan(model, out, "--sharding", "auto", "--devices-per-host", "2", "--method", "torchrec",
                "--torchrec", str(exported)) == 0
    doc = json.loads(out.read_text())
    assert doc["method"] == "torchrec" and doc["costs"]["backend"] == "torchrec planner"
    assert doc["costs"]["batch_size"] == BATCH and "sparse.user_id" in doc["rows"]  # TorchRec too must split it
    assert all(d["estimated_ms"] > 0 and d["comm_modelled_ms"] > 0 for d in doc["per_device"])
    held_as_counted(doc, out, exported)
    capsys.readouterr()
    assert plan(model, tmp_path / "x.json", "--sharding", "auto", "--method", "torchrec", "--column-ways", "2") == 2
    assert "--column-ways: --method torchrec does not use it" in capsys.readouterr().err


def test_the_exported_row_wise_plan_runs_in_torchrec_and_computes_what_the_unsharded_model_does(model, tmp_path):
    from autoshard.cli.torchrec.check import check

    out, exported = tmp_path / "plan.json", tmp_path / "plan.torchrec.json"
    model.write_text(SMALL)
    assert plan(model, out, "--sharding", "auto", "--devices-per-host", "2", "--memory-per-device", "6MB",
                "--torchrec", str(exported), "--torchrec-device", "cpu") == 0
    kinds = {p["sharding_type"] for m in json.loads(exported.read_text())["modules"].values() for p in m.values()}
    assert "row_wise" in kinds and "sparse.user_id" in json.loads(out.read_text())["rows"]
    result = check(model, exported, processes=4)
    assert result["world_size"] == 4 and all(r["max_abs_error"] < 1e-4 for r in result["ranks"])
    doc = json.loads(out.read_text())
    placed = set(doc["rows"]) | set(doc["assignment"]) | set(doc["columns"])
    assert {t for r in result["ranks"] for t in r["tables"]} == placed


def test_row_sharding_on_predicted_costs_splits_what_does_not_fit(user_models, tmp_path):
    out = tmp_path / "plan.json"
    assert main(["plan", "--tables", str(user_models["tables"]), "--devices", "4", "--memory-per-device", "11MB",
                 "--sharding", "row", "--cost-model", str(user_models["model"]), "--torchrec-device", "cpu",
                 "--out", str(out)]) == 0  # on CPU ranks: no HBM, nothing to keep in host memory instead
    doc = json.loads(out.read_text())
    assert doc["method"] == "cost_greedy" and doc["costs"]["kind"] == "predicted"
    assert "history" in doc["rows"] and doc["predicted_bottleneck_ms"] == pytest.approx(
        max(d["predicted_ms"] for d in doc["per_device"]))
    assert main(["score", "--tables", str(user_models["tables"]), "--backend", "analytic", "--plan", str(out)]) == 2


def test_production_bounds_are_accepted_and_absurd_values_refused(tmp_path, capsys):
    tables = tmp_path / "t.csv"
    out = tmp_path / "p.json"
    tables.write_text("name,rows,dim,pooling_factor,module,pooling\nseq_a,80000000,128,1516.5,m,sequence\n"
                      "seq_a,1000,4,60000,n,pooled\nwide,10000,4096,1,n,pooled\n")
    argv = ["plan", "--tables", str(tables), "--devices", "96", "--memory-per-device", "138GiB", "--method",
            "size_lookup_greedy", "--batch-size", "1", "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    assert set(json.loads(out.read_text())["assignment"]) == {"m.seq_a", "n.seq_a", "n.wide"}
    for bad, pattern in (("1e6", r"field pooling_factor: '1e6' \(must be at most 65536\)"),
                         ("2", None)):
        if pattern is None:
            tables.write_text("name,rows,dim,pooling_factor\na,100,8192,2\n")
            pattern = r"field dim: '8192' \(must be at most 4096\)"
        else:
            tables.write_text(f"name,rows,dim,pooling_factor\na,100,16,{bad}\n")
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and __import__("re").search(pattern, err), err


def test_measured_pieces_are_timed_on_their_own_slice_of_the_trace_and_cached(tmp_path):
    """With a measuring backend, each distinct piece (whole table, row shard) is measured alone on
    its rows' slice of the table's trace, once: a second plan measures nothing."""
    tables = tmp_path / "t.csv"
    tables.write_text("name,rows,dim,pooling_factor\nbig,40000,16,4\nsmall,500,8,1\nmid,3000,8,2\n")
    out = tmp_path / "plan.json"
    argv = ["plan", "--tables", str(tables), "--devices", "2", "--memory-per-device", "2.5MB", "--sharding", "row",
            "--method", "lpt_measured", "--backend", "fbgemm", "--batch-size", "64", "--runs", "1",
            "--cache", str(tmp_path / "cache"), "--out", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert "big" in doc["rows"] and doc["costs"]["kind"] == "measured" and doc["costs"]["tables_measured_now"] >= 4
    assert all(d["measured_alone_ms"] > 0 for d in doc["per_device"])
    assert main(argv) == 0 and json.loads(out.read_text())["costs"]["tables_measured_now"] == 0


def test_on_the_analytic_backend_pieces_are_torchrecs_estimates_and_no_trace_is_drawn(model, tmp_path, monkeypatch):
    from autoshard.cli import user_tables

    monkeypatch.setattr(user_tables.UserTables, "traces", property(lambda self: pytest.fail("a trace was drawn")))
    out = tmp_path / "plan.json"
    assert plan(model, out, "--sharding", "auto", "--method", "lpt_measured") == 0
    doc = json.loads(out.read_text())
    assert doc["costs"]["kind"] == "estimated" and doc["costs"]["batch_size"] == BATCH
    assert all("estimated_ms" in d and "measured_alone_ms" not in d for d in doc["per_device"])


def test_each_piece_pays_for_its_output_exchange_reported_beside_its_cost(model, tmp_path, capsys):
    """Every device's modelled comm is the sum of its pieces' (`placement.traffic`) at the bandwidths
    given; a slower network moves no more across hosts; bad or unused bandwidths are refused."""
    from autoshard.placement.traffic import Links, gradient_bytes, piece_bytes

    spec = {r.split(",")[4] + "." + r.split(",")[0]: r.split(",") for r in MODEL.strip().splitlines()[1:]}
    crossing = {}
    for bandwidths in ("600,12.5", "600,0.5"):
        out = tmp_path / f"{bandwidths}.json"
        assert plan(model, out, "--sharding", "auto", "--devices-per-host", "2", "--bandwidths", bandwidths) == 0
        doc = json.loads(out.read_text())
        assert doc["costs"]["comm"]["bandwidths_gib_per_s"] == [float(v) for v in bandwidths.split(",")]
        links = Links.from_gib_per_s(*doc["costs"]["comm"]["bandwidths_gib_per_s"])
        blocks = plan_blocks({k: v for k, v in doc.items() if k != "costs"}, out)
        comm, cross = np.zeros(4), 0.0
        for name, held in blocks.blocks.items():
            _, rows, dim, pooling, _, kind = spec[name]
            for b in held:
                width = int(dim) if b.width is None else b.width
                moved = (gradient_bytes(int(rows), width, 4, 2) if blocks.kinds[name] == "data_parallel" else
                         piece_bytes(blocks.kinds[name], width, float(pooling) if kind == "sequence" else 1.0,
                                     kind == "sequence", BATCH, 4, 2))
                comm[b.device] += links.ms(*moved)
                cross += moved[1]
        assert [d["comm_modelled_ms"] for d in doc["per_device"]] == pytest.approx(comm.tolist())
        assert doc["costs"]["comm"]["bottleneck_ms"] == pytest.approx(comm.max()) and comm.max() > 0
        crossing[bandwidths] = cross
    assert crossing["600,0.5"] <= crossing["600,12.5"]
    capsys.readouterr()
    for bad, extra in (("0,12.5", ["--sharding", "auto"]), ("fast", ["--sharding", "row"]),
                       ("600,12.5", ["--sharding", "table"])):
        assert plan(model, tmp_path / "x.json", *extra, "--method", "lpt_measured", "--bandwidths", bad) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "--bandwidths" in err, err
    assert not (tmp_path / "x.json").exists()


def test_the_analytic_piece_costs_are_torchrecs_estimate_read_off_three_points_per_dim():
    """Thousands of pieces are estimated from three TorchRec calls per dim: the same numbers as
    TorchRec's evaluator called on every piece (to 1e-5), on both sides of one lookup per sample."""
    from autoshard.cli.sharding_plan import lookup_scaled
    from autoshard.measure.formulas import table_perf

    g = np.random.default_rng(0)
    dims = g.choice([4, 8, 16, 64, 96, 128, 1024], 60)
    lookups = np.concatenate([g.uniform(0.01, 1, 20), g.uniform(1, 3000, 40)])
    for device in ("cpu", "cuda"):
        got = lookup_scaled(dims, lookups, 8192, device)
        want = [(lambda p: p.fwd_compute + p.bwd_compute)(table_perf(int(d), float(x), 8192, 1, device))
                for d, x in zip(dims, lookups, strict=True)]
        assert got == pytest.approx(want, rel=1e-5)  # TorchRec rounds its byte counts up
    # a sequence table's output is every lookup's row: TorchRec's evaluator told it is not pooled
    from torchrec.distributed.planner.constants import DDR_MEM_BW, HBM_MEM_BW, HBM_TO_DDR_MEM_BW, kernel_bw_lookup
    from torchrec.distributed.planner.estimator.config import EmbeddingPerfEstimatorConfig
    from torchrec.distributed.planner.estimator.estimator import TableWiseEvaluator
    from torchrec.distributed.planner.estimator.types import ShardPerfContext
    from torchrec.distributed.planner.types import BasicCommsBandwidths

    def unpooled(dim: int, x: float) -> float:
        ctx = ShardPerfContext(
            sharding_type="table_wise", compute_kernel="fused", hash_size=1, emb_dim=dim, batch_sizes=[8192],
            num_poolings=[1.0], input_lengths=[x], world_size=1, local_world_size=1, intra_group_size=1,
            table_data_type_size=4, output_data_type_size=4, fwd_a2a_comm_data_type_size=4,
            bwd_a2a_comm_data_type_size=4, device_bw=kernel_bw_lookup("cuda", "fused", HBM_MEM_BW, DDR_MEM_BW,
                                                                      HBM_TO_DDR_MEM_BW),
            hbm_to_ddr_mem_bw=HBM_TO_DDR_MEM_BW, comms_bandwidths=BasicCommsBandwidths(), is_pooled=False)
        perf = TableWiseEvaluator().compute_perf(ctx, EmbeddingPerfEstimatorConfig())
        return perf.fwd_compute + perf.bwd_compute

    got = lookup_scaled(dims, lookups, 8192, "cuda", np.ones(len(dims), bool))
    assert got == pytest.approx([unpooled(int(d), float(x)) for d, x in zip(dims, lookups, strict=True)], rel=1e-5)


REPLICABLE = """name,rows,dim,pooling_factor,module,pooling
tiny_a,64,16,200,sparse,pooled
tiny_b,128,16,150,sparse,pooled
tiny_c,32,8,120,seq,sequence
huge,2000000,128,2,sparse,pooled
mid,50000,32,20,sparse,pooled
"""  # three tiny tables read 120-200 times a sample: serving a quarter of the batch each beats one device's load


def test_small_busy_tables_go_data_parallel_and_pay_for_their_gradient_all_reduce(tmp_path, capsys):
    """`--sharding auto` replicates a table where its all-reduce costs less than the balance it
    buys: each device holds the whole table and the buffers of its share of the batch, is charged
    the table's gradient all-reduce, and the plan and its TorchRec export say `data_parallel`
    (every rank, no shards, TorchRec's dense kernel). A sequence table and a table of 2M rows are
    not replicated, `--sharding row` offers no replica, and `score` refuses a replicated plan in
    one line."""
    from autoshard.cli.sharding_plan import Shape, footprint
    from autoshard.placement.traffic import Links, gradient_bytes

    model = tmp_path / "model.csv"
    model.write_text(REPLICABLE)
    out, exported = tmp_path / "plan.json", tmp_path / "plan.torchrec.json"
    assert plan(model, out, "--sharding", "auto", "--memory-per-device", "4GB", "--method", "lpt_measured",
                "--torchrec", str(exported), "--torchrec-device", "cpu") == 0
    doc = json.loads(out.read_text())
    assert set(doc["replicated"]) == {"sparse.tiny_a", "sparse.tiny_b"}  # a sequence table is never replicated
    links = Links.from_gib_per_s(*doc["costs"]["comm"]["bandwidths_gib_per_s"])
    spec = {r.split(",")[4] + "." + r.split(",")[0]: r.split(",") for r in REPLICABLE.strip().splitlines()[1:]}
    for d in doc["per_device"]:
        assert {f"{n} (replica)" for n in doc["replicated"]} <= set(d["names"])
        replicas = [spec[n] for n in doc["replicated"]]
        assert d["comm_modelled_ms"] >= sum(links.ms(*gradient_bytes(int(r[1]), int(r[2]), 4, 4)) for r in replicas)
        assert d["memory_bytes"] >= sum(footprint(Shape(0, 0, int(r[1]), 0, int(r[2]), 1, 4), 4, BATCH, float(r[3]),
                                                  r[5] == "sequence") for r in replicas)
    assert footprint(Shape(0, 0, 64, 0, 16, 1, 4), 4, BATCH, 200.0, False) == (
        table_bytes(64, 16, 4) + sum(io_bytes(BATCH // 4, 200.0, 16, False)))
    params = {n: p for m in json.loads(exported.read_text())["modules"].values() for n, p in m.items()}
    for name in ("tiny_a", "tiny_b"):
        assert (params[name]["sharding_type"], params[name]["ranks"], params[name]["shards"]) == (
            "data_parallel", [0, 1, 2, 3], [])
        assert params[name]["compute_kernel"] == "dense"
    ours, back = (plan_blocks({k: v for k, v in doc.items() if k != "costs"}, out),
                  plan_blocks(json.loads(exported.read_text()), exported))
    assert back.blocks == ours.blocks and back.kinds == ours.kinds
    assert ours.blocks["sparse.tiny_a"] == [(0, None, 0, None, d) for d in range(4)]
    assert plan(model, tmp_path / "row.json", "--sharding", "row", "--memory-per-device", "4GB",
                "--method", "lpt_measured") == 0
    assert "replicated" not in json.loads((tmp_path / "row.json").read_text())
    capsys.readouterr()
    assert main(["score", "--tables", str(model), "--plan", str(out), "--backend", "analytic"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "data-parallel replicas" in err, err


def test_a_replicated_plan_runs_in_torchrec_and_computes_what_the_unsharded_model_does(tmp_path):
    from autoshard.cli.torchrec.check import check

    model = tmp_path / "model.csv"
    model.write_text(REPLICABLE.replace("2000000", "20000").replace("seq,sequence", "sparse,pooled"))
    out, exported = tmp_path / "plan.json", tmp_path / "plan.torchrec.json"
    assert main(["plan", "--tables", str(model), "--devices", "2", "--memory-per-device", "4GB", "--backend",
                 "analytic", "--batch-size", str(BATCH), "--sharding", "auto", "--method", "lpt_measured",
                 "--torchrec", str(exported), "--torchrec-device", "cpu", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["replicated"]
    result = check(model, exported, processes=2)
    assert result["world_size"] == 2 and all(r["max_abs_error"] < 1e-4 for r in result["ranks"])


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_export_written_without_torch_is_the_file_torchrecs_generators_give(tmp_path, device):
    """`--torchrec` writes `placement.torchrec.plan_json`, from the blocks alone; TorchRec's own
    generators (`block_sharding_plan`, `plan_to_json`) give the same file for table-, column-, row-,
    table-row-wise and data-parallel tables, pooled and sequence modules, on CPU and GPU ranks."""
    from autoshard.cli.user_tables import read_tables
    from autoshard.placement.torchrec import block_sharding_plan, plan_json, plan_to_json

    kinds_seen = set()
    for text, memory, local in ((MODEL, "600MB", 2), (REPLICABLE, "4GB", 4), (SMALL, "6MB", 2)):
        model, out, exported = tmp_path / "model.csv", tmp_path / "plan.json", tmp_path / "plan.torchrec.json"
        model.write_text(text)
        assert plan(model, out, "--sharding", "auto", "--devices-per-host", str(local), "--memory-per-device", memory,
                    "--method", "lpt_measured", "--torchrec", str(exported), "--torchrec-device", device) == 0
        doc = json.loads(out.read_text())
        blocks = plan_blocks({k: v for k, v in doc.items() if k != "costs"}, out)
        tables = read_tables(model)
        written = json.loads(exported.read_text())
        assert written == plan_json(tables.features, tables.names, blocks.blocks, blocks.kinds, 4, local, device)
        made = block_sharding_plan(tables.features, tables.names, blocks.blocks, blocks.kinds, 4, local, device)
        assert written == json.loads(json.dumps(plan_to_json(made, 4, device)))
        kinds_seen |= set(blocks.kinds.values())
    assert kinds_seen >= {"table_wise", "column_wise", "row_wise", "table_row_wise", "data_parallel"}


def test_the_analytic_path_and_its_torchrec_export_import_neither_torch_nor_torchrec(model, tmp_path):
    """Issue 50: `plan --sharding auto --backend analytic --torchrec` is TorchRec's estimate as our
    formulas and the export written from the blocks, so the whole command never loads torch (most
    of its time at 2,000 tables, before), nor SciPy's solvers (imported by the MILP alone)."""
    import subprocess
    import sys

    code = ("import sys; from autoshard.cli.main import main; "
            f"rc = main(['plan', '--tables', {str(model)!r}, '--devices', '4', '--devices-per-host', '2', "
            "'--memory-per-device', '600MB', '--batch-size', '256', '--backend', 'analytic', '--sharding', 'auto', "
            f"'--method', 'lpt_measured', '--out', {str(tmp_path / 'p.json')!r}, "
            f"'--torchrec', {str(tmp_path / 't.json')!r}]); "
            "print(rc, sorted(m for m in ('torch', 'torchrec', 'fbgemm_gpu', 'scipy.optimize') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "0 []", done.stdout + done.stderr
    assert json.loads((tmp_path / "t.json").read_text())["modules"]

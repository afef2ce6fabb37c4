"""End to end on smoke parameters: a copy of the repository runs `dvc repro` once, each stage's
notebook, metrics, figures and data are checked from that one run, a second `dvc repro` with
nothing changed reruns nothing, and a changed ablation parameter would rerun only the ablation and
the report. One run serves every check (a run per check would double the suite's time)."""

import json
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest
import yaml

from autoshard.core import schema
from autoshard.costmodel.accuracy import CostModelScores
from autoshard.costmodel.dataset import measured_shards, single_costs
from autoshard.costmodel.hybrid import load_hybrid, with_single_costs
from autoshard.costmodel.model import load_model
from autoshard.data.calibration import Synthesis
from autoshard.data.features import feature_matrix
from autoshard.data.pool import load_pool
from autoshard.data.tasks import load_tasks
from autoshard.data.wide import load_wide
from autoshard.measure.analysis import Profile, repeatability, rounds_needed
from autoshard.measure.collect import load_profile
from autoshard.measure.commmodel import CommModel, mape
from autoshard.methods import registry
from autoshard.pipeline import effort as efforts
from autoshard.pipeline.stage import main, select, stage_spec
from autoshard.rl.infer import policy_plans
from autoshard.rl.ppo import load_policy
from autoshard.rl.validation import RLTraining
from autoshard.studies.ablation import Ablation
from autoshard.studies.columns import TWIN, Columns
from autoshard.studies.evaluate import Evaluation
from autoshard.studies.measured import MEASURED_SOURCES
from autoshard.studies.transfer import Transfer

from helpers import sh

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def run_synthesize(tmp_path, params):
    """The synthesize stage through the stage runner, its folders under `tmp_path`."""
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(params))
    return main(["synthesize", "--params-file", str(params_file), "--dvc-file", str(ROOT / "dvc.yaml"),
                 "--output-dir", str(tmp_path / "nb"),
                 "--set", f"data_dir={tmp_path / 'data'}",
                 "--set", f"reports_dir={tmp_path / 'reports'}"])


def executed_outputs(path):
    """Outputs of the executed notebook's code cells; none may be an error."""
    nb = nbformat.read(path, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    return nb, outputs


def test_stage_spec_reads_dvc_yaml():
    notebook, names = stage_spec("synthesize", ROOT / "dvc.yaml")
    assert notebook.name == "01_synthesize.ipynb"
    assert names == ["seed", "dataset", "pool", "tasks", "wide"]


def test_select_takes_only_the_named_params():
    params = {"seed": 1, "pool": {"a": 1, "b": {"c": 2}}, "other": 3}
    assert select(params, ["seed", "pool.b.c"], "p") == {"seed": 1, "pool": {"b": {"c": 2}}}


@pytest.fixture(scope="module")
def repro(clone) -> Path:
    """The clone after one `dvc repro`: every stage run, its outputs where dvc.yaml puts them."""
    first = sh(["dvc", "repro"], clone)
    assert first.returncode == 0, first.stderr + first.stdout
    assert "Running stage 'synthesize'" in first.stdout
    return clone


def notebook(run: Path, name: str) -> Path:
    return run / "reports" / "notebooks" / name


def test_synthesize_notebook(repro, smoke_params):
    tmp_path, params = repro, smoke_params
    pool = load_pool(tmp_path / "data" / "pool")
    assert pool.num_tables == params["pool"]["num_tables"]
    tasks, train, test = load_tasks(tmp_path / "data" / "tasks.json")
    assert len(train) + len(test) == pool.num_tables
    metrics = schema.read_checked(tmp_path / "reports" / "metrics" / "synthesize.json", Synthesis)
    assert metrics["tables"] == pool.num_tables
    assert metrics["lookups_per_bag"] == pytest.approx(params["pool"]["pooling_factor_mean"], rel=0.1)
    assert sum(metrics["tasks"].values()) == len(tasks)
    wide, wide_train, wide_test = load_wide(tmp_path / "data" / "wide")  # the wide pool: its own dims and split
    assert metrics["wide"]["tables"] == wide.num_tables == params["wide"]["tables"] == len(wide_train) + len(wide_test)
    assert metrics["wide"]["dims"] == sorted(params["wide"]["dims"])
    figures = sorted(p.name for p in (tmp_path / "reports" / "figures" / "synthesize").iterdir())
    assert figures == ["pool_distributions.png", "reuse_vs_published.png"]
    nb, outputs = executed_outputs(notebook(tmp_path, "01_synthesize.ipynb"))
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2, "figures must be inline"
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert json.dumps(params["pool"]["num_tables"]) in injected[0].source


def test_profile_notebook(repro, smoke_params):
    tmp_path = repro
    table = load_profile(tmp_path / "data" / "profile")
    assert (table["status"] == "ok").all() and table["shard_id"].is_unique
    assert set(table["kind"]) == {"single", "random", "heuristic", "test_random", "test_heuristic",
                                  "repeat"}
    assert (table["backend"] == "fbgemm").all() and (table["device"] == "cpu").all()
    metrics = schema.read_checked(tmp_path / "reports" / "metrics" / "profile.json", Profile)
    assert metrics["shards_measured"] == len(table)
    cv_target = smoke_params["profile"]["cv_target"]
    written = 1e-6  # metrics files keep 6 decimals
    assert metrics["median_cv"] == pytest.approx(float(repeatability(table)["cv"].median()), abs=written)
    assert metrics["cv_target"] == cv_target and metrics["cv_target_met"] == (metrics["median_cv"] <= cv_target)
    assert metrics["rounds_for_cv_target"] == rounds_needed(metrics["median_cv"], cv_target)
    assert metrics["harness_check"]["forward"]["fbgemm_harness_ms"] > 0
    effort = efforts.load(tmp_path / "data" / "profile" / "effort.json")  # what every later stage measures with
    assert metrics["effort"] == pytest.approx(effort.summary(), abs=written)
    speed = metrics["calibration"]["default"][efforts.SPEED]
    assert effort.speed_ms == pytest.approx(speed, abs=written)
    assert effort.level == efforts.decide({efforts.SPEED: speed}, efforts.EffortConfig.from_params(
        smoke_params["effort"])).level
    assert metrics["comm_measured_processes"] == 2
    assert metrics["comm"]["device_counts"] == [2]
    assert {"honest_device_counts", "mape_heldout_honest"} <= set(metrics["comm"]), "the target's counts recorded"
    comm = pd.read_parquet(tmp_path / "data" / "profile" / "comm.parquet")
    assert len(comm) == smoke_params["profile"]["comm"]["placements"] * 2 * 2 and (comm["ms"] > 0).all()
    comm_model = CommModel.load(tmp_path / "data" / "profile" / "comm_model.json")
    assert comm_model.source(2, 2) == "measured-model"
    mape_target = smoke_params["profile"]["comm"]["mape_target"]
    heldout = comm[comm["heldout"]]
    assert len(heldout) > 0 and metrics["comm"]["mape_heldout"] == pytest.approx(mape(comm_model, heldout), abs=written)
    assert metrics["comm"]["mape_target"] == mape_target
    assert metrics["comm"]["mape_target_met"] == (metrics["comm"]["mape_heldout_honest"] <= mape_target)
    wide = load_profile(tmp_path / "data" / "profile" / "wide")  # the wide pool's shards, measured alike
    assert (wide["status"] == "ok").all() and set(wide["kind"]) == {"single", "random", "test_random"}
    assert (wide["num_tables"] == 1).sum() == smoke_params["wide"]["tables"]
    _, outputs = executed_outputs(notebook(tmp_path, "02_profile.ipynb"))
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 7
    assert (tmp_path / "reports" / "figures" / "profile" / "fbgemm_vs_torch_fused.png").is_file()
    assert -1 <= metrics["torch_fused_fbgemm_kendall_tau"] <= 1 and metrics["torch_fused_over_fbgemm_median_ratio"] > 0
    assert not (tmp_path / "data" / "profile-work").exists(), "the profile chunks are dropped once saved"


def test_cost_model_notebook(repro, smoke_params):
    tmp_path = repro
    model = load_model(tmp_path / "data" / "cost_model" / "model.pt")
    pool = load_pool(tmp_path / "data" / "pool")
    assert (model.predict_ms(feature_matrix(pool.features), [[0, 1], [2]]) > 0).all()
    metrics = schema.read_checked(tmp_path / "reports" / "metrics" / "cost_model.json", CostModelScores)
    assert {"comparison", "neural_mape", "learning_curve", "noise_floor_cv"} <= set(metrics)
    assert len(metrics["learning_curve"]) == len(smoke_params["cost_model"]["learning_curve"])
    assert metrics["predict_10k_shards_seconds"] > 0
    hybrid = load_hybrid(tmp_path / "data" / "cost_model" / "hybrid.pt")
    single = single_costs(measured_shards(load_profile(tmp_path / "data" / "profile"), "fbgemm"))
    assert (hybrid.predict_ms(with_single_costs(feature_matrix(pool.features), single), [[0, 1], [2]]) > 0).all()
    assert 0 < metrics["hybrid"]["mape_unseen"] < 1 and 0 < metrics["hybrid"]["rescaled_sum_mape_seen"] < 1
    by_dim = metrics["error_by_dim"]  # the pool's dims are configs/smoke.yaml's: each a group, or mixed
    assert {g for groups in by_dim.values() for g in groups} <= {*map(str, smoke_params["pool"]["dims"]), "mixed"}
    assert "mixed" not in by_dim.get("unseen tables, single", {}), "a table alone has one dim"
    wide = metrics["wide"]  # the wide pool: a model fitted there, the pool's model, the sum of singles
    assert wide["dims"] == sorted(smoke_params["wide"]["dims"]) and set(wide["mape"]) == set(wide["error_by_dim"])
    assert len(wide["mape"]) == 3 and all(np.isfinite(m) and m >= 0 for s in wide["mape"].values() for m in s.values())
    singles = wide["error_by_dim"]["sum of single costs"]["unseen tables, single"]
    assert singles and set(singles) <= set(map(str, smoke_params["wide"]["dims"]))
    assert all(e["mape"] < 1e-9 for e in singles.values()), "the sum of single costs is exact on a table alone"
    _, outputs = executed_outputs(notebook(tmp_path, "03_cost_model.ipynb"))
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 4


def test_train_rl_notebook(repro, smoke_params):
    tmp_path = repro
    model = load_model(tmp_path / "data" / "cost_model" / "model.pt")
    policy = load_policy(tmp_path / "data" / "rl" / "policy.pt", model)
    pool = load_pool(tmp_path / "data" / "pool")
    sizes = pool.features["size_bytes"].to_numpy()
    tasks, _, _ = load_tasks(tmp_path / "data" / "tasks.json")
    task = next(t for t in tasks if t.split == "test")
    (placement,) = policy_plans(policy, model, feature_matrix(pool.features), [task])
    assert placement.shape == (len(task.tables),) and set(placement.tolist()) <= set(range(task.devices))
    used = np.bincount(placement, weights=sizes[list(task.tables)], minlength=task.devices)
    assert (used <= task.memory_bytes).all(), "the loaded policy places a held-out task within its memory cap"
    metrics = schema.read_checked(tmp_path / "reports" / "metrics" / "train_rl.json", RLTraining)
    assert "policy, greedy" in metrics["validation_ratio_to_best_heuristic"]
    assert [r["round"] for r in metrics["refresh"]] == [1], "smoke runs one refresh round"
    assert (tmp_path / "data" / "rl" / "cost_model.pt").exists()
    stages = load_model(tmp_path / "data" / "rl" / "stages_model.pt")  # the synchronized policy's simulator
    assert stages.cfg.heads == "stages" and load_policy(tmp_path / "data" / "rl" / "policy_sync.pt", stages)
    assert any(k.startswith("TorchRec / policy") for k in metrics["speed_seconds"])
    fair = metrics["fair"]  # the fair sharder: trained with and without shaping, its curves and its teacher's ratio
    assert set(fair["curves"]) == {"reproduction (rl_greedy)", "fair, per-step rewards", "fair, terminal reward"}
    assert fair["after_imitation_val_ratio"] is not None and fair["unshaped_val_ratio"] is not None
    assert fair["no_worse_than_greedy"] == (fair["val_ratio"] <= fair["cost_greedy_val_ratio"] + 1e-9)
    curve = fair["curves"]["fair, per-step rewards"]  # keep_best: the earliest of its best points
    best = min(ratio for _, ratio in curve)
    assert fair["kept_iteration"] == next(it for it, ratio in curve if ratio == best)
    assert load_policy(tmp_path / "data" / "rl" / "policy_fair.pt", load_model(tmp_path / "data" / "rl" /
                                                                               "cost_model.pt")).cfg.lookahead
    _, outputs = executed_outputs(notebook(tmp_path, "04_train_rl.ipynb"))
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 3, "training, the fair curves, an example"


def test_evaluate_notebook(repro, smoke_params):
    tmp_path = repro
    metrics = schema.read_checked(tmp_path / "reports" / "metrics" / "evaluate.json", Evaluation)
    assert set(metrics["results"]) == {"autoshard", "dreamshard", "tight", "small", "few"}
    assert "exact" in metrics["results"]["small"] and "exact" not in metrics["results"]["autoshard"]
    assert {"rl_greedy", "rl_best_of_n", "rl_local_search", "cost_greedy"} <= set(metrics["results"]["dreamshard"])
    assert {t["protocol"] for t in metrics["targets"]} == {"autoshard", "dreamshard", "tight", "small", "few"}
    assert set(metrics["failed"]) >= {"autoshard", "dreamshard", "tight"}
    plans = pd.read_csv(tmp_path / "data" / "evaluate" / "plans.csv")
    assert (plans["memory_share"] <= 1).all() and (plans["measured_ms"] > 0).all()
    small = plans[plans["protocol"] == "small"]
    optimum = small[small["method"] == "exact"].set_index("task")["predicted_ms"]
    assert (small["predicted_ms"] >= small["task"].map(optimum) * (1 - 1e-5)).all(), "nothing beats the optimum"
    figures = sorted(p.name for p in (tmp_path / "reports" / "figures" / "evaluate").iterdir())
    assert figures == ["device_breakdown.png", "paired.png", "predicted_vs_measured.png", "primary.png",
                       "ratios.png", "sharding_time.png"]
    _, outputs = executed_outputs(notebook(tmp_path, "05_evaluate.ipynb"))
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 6
    declared = smoke_params["primary"]["endpoints"]
    assert len(metrics["primary"]) == len(declared) + 2, "every declared endpoint decided, and the record"
    assert set(metrics["headroom"]) == {"autoshard", "dreamshard", "tight", "small", "few"}, "the headroom per protocol"
    few = smoke_params["evaluate"]["few"]["tasks"]
    assert metrics["headroom"]["few"]["tasks"] == few, "every task with few tables a device, greedy placed"
    assert metrics["headroom"]["small"]["how"] == "exhaustive search"
    assert metrics["headroom"]["autoshard"]["starts"] > 0
    for entry in metrics["headroom"].values():
        assert entry["lower"] == entry["greedy_gap"], "the best known bounds the gap from below"
        assert (entry["upper"] is not None) == (entry["how"] == "exhaustive search"), entry["upper_why"]
    assert metrics["headroom"]["small"]["upper"] == metrics["headroom"]["small"]["lower"]
    searched = metrics["families"]
    assert searched["sesoi"] == smoke_params["primary"]["sesoi"], "the candidate regimes are held to the sesoi"
    assert len(searched["families"]) == 4 * len(smoke_params["evaluate"]["families"]["per_device"])
    for family in searched["families"]:
        assert family["tasks"] == smoke_params["evaluate"]["families"]["tasks"]
        assert family["greedy_gap"] >= 0 and family["blind_gap"] >= 0, "the best known is never above either greedy"
        assert family["exceeds_sesoi"] == (family["greedy_gap"] > searched["sesoi"])
        if family["speeds"] == "equal":
            assert family["blind_gap"] == family["greedy_gap"], "equal speeds: the two greedies agree"
    replicas = pd.read_csv(tmp_path / "data" / "evaluate" / "replicates.csv")
    every = pd.concat([plans, replicas], ignore_index=True).pivot_table(index="task", columns="method",
                                                                        values="max_device_ms", aggfunc="first")
    chained = set(registry.ids("replicate"))
    endpoints_only = {k: v for k, v in metrics["primary"].items() if k not in ("registered", "amendments")}
    for entry in endpoints_only.values():
        assert entry["verdict"] in ("better", "worse", "equivalent", "inconclusive"), "every endpoint decided"
        assert (entry["verdict"] != "inconclusive") == (entry["p_holm"] is not None and entry["p_holm"] < 0.05)
        assert entry["tasks"] == len(entry["per_task"]) > 0 and entry["sesoi"] == smoke_params["primary"]["sesoi"]
        assert entry["replicates"] == smoke_params["replicates"] == len(entry["replicate_medians"])
        logs = np.log(list(entry["per_task"].values()))
        assert entry["median_ratio"] == pytest.approx(np.exp(np.median(logs)), rel=1e-6)
        assert entry["ci_low"] <= entry["median_ratio"] <= entry["ci_high"]
        tasks = list(entry["per_task"])
        for r, median in enumerate(entry["replicate_medians"]):  # recomputed from the measured plans
            arm, ref = (m if m not in chained or r == 0 else f"{m}@{r}" for m in (entry["method"], entry["reference"]))
            ratio = every.loc[tasks, arm] / every.loc[tasks, ref]
            assert median == pytest.approx(float(np.exp(np.median(np.log(ratio)))), rel=1e-6)
    assert metrics["primary"]["registered"]["commit"] and metrics["primary"]["amendments"], "the record travels"
    assert plans["pass"].nunique() == 1 and plans["pass"].iloc[0].startswith("evaluate-"), "one pass for the headline"
    assert {e["pass"] for e in endpoints_only.values()} == {plans["pass"].iloc[0]} == set(replicas["pass"])
    assert {"median_cv", "round_drift", "remeasured_share", "met"} <= set(metrics["noise"])
    pair = metrics["paired"]["dreamshard"]["rl_greedy__vs__cost_greedy"]
    assert set(pair) == {"tasks", "median_ratio", "ci_low", "ci_high", "p_value", "identical_share", "mde"}
    assert {"lpt_measured", "milp", "cost_greedy_local_search"} <= set(metrics["results"]["dreamshard"])
    assert metrics["answer"], "the plain answer is written"
    assert metrics["objective"] == {"autoshard": "max_device", "dreamshard": "synchronized_stages",
                                    "tight": "max_device", "small": "max_device", "few": "max_device"}
    synced = {"sync_greedy", "sync_local_search", "sync_milp"}
    assert synced <= set(metrics["results"]["dreamshard"]), "planned where they are scored"
    assert not synced & set(metrics["results"]["autoshard"]), "and nowhere else"
    assert "sync_greedy__vs__best_heuristic" in metrics["paired_synchronized"]["dreamshard"]
    assert "rl_sync_greedy" in metrics["results"]["dreamshard"], "the policy trained on the synchronized stages"
    assert "rl_sync_greedy" not in metrics["results"]["autoshard"]
    assert "rl_sync_greedy__vs__sync_greedy" in metrics["paired_synchronized"]["dreamshard"]
    assert metrics["paired_max_device"]["autoshard"] == metrics["paired"]["autoshard"], "its headline is max_device"
    assert "rl_greedy__vs__cost_greedy" in metrics["paired_max_device"]["dreamshard"], "compute only, every protocol"
    assert (plans["synchronized_ms"] >= plans["measured_ms"]).all()
    synchronized = plans["protocol"] == "dreamshard"  # ranked by the synchronized stages: its all-to-alls measured
    assert set(plans.loc[synchronized, "comm_source"]) <= set(MEASURED_SOURCES)  # oversubscribed on a 1-CPU box
    assert set(plans.loc[~synchronized, "comm_source"]) <= {"measured-model", "oversubscribed-model",
                                                           "extrapolated-model"}
    assert metrics["noise"]["comm_plans"] > 0 and metrics["noise"]["comm_round_cv"] is not None
    assert "rl_sync_local_search__vs__sync_local_search" in metrics["paired_synchronized"]["dreamshard"]


def test_transfer_notebook(repro, smoke_params):
    tmp_path = repro
    metrics = schema.read_checked(tmp_path / "reports" / "metrics" / "transfer.json", Transfer)
    assert set(metrics["axes"]) == {"tables", "devices", "unseen_ratio"}
    cfg = smoke_params["transfer"]
    assert set(metrics["axes"]["tables"]["rl_greedy"]) == {str(v) for v in cfg["tables"]}
    assert set(metrics["axes"]["devices"]["cost_greedy"]) == {str(v) for v in cfg["devices"]}
    plans = pd.read_csv(tmp_path / "data" / "transfer" / "plans.csv")
    assert (plans["measured_ms"] > 0).all() and (plans["memory_share"] <= 1).all()
    shapes = plans[plans["axis"] == "devices"].groupby("value")["task"].first()
    assert all(f"x{int(d)}/" in task for d, task in shapes.items()), "each devices point is its own shape"
    figures = sorted(p.name for p in (tmp_path / "reports" / "figures" / "transfer").iterdir())
    assert figures == ["devices.png", "tables.png", "unseen_ratio.png"]
    _, outputs = executed_outputs(notebook(tmp_path, "06_transfer.ipynb"))
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 3


def test_ablation_notebook(repro, smoke_params):
    tmp_path = repro
    metrics = schema.read_checked(tmp_path / "reports" / "metrics" / "ablation.json", Ablation)
    cfg = smoke_params["ablation"]
    assert [row["variant"] for row in metrics["variants"]] == [*cfg["variants"], "best_of_n", "local_search",
                                                                "cost_greedy"]
    assert all(row["variant"] == "full" or "p_holm" in row for row in metrics["variants"])
    assert all(len([k for k in row if k.startswith("seed ")]) == cfg["seeds"] for row in metrics["variants"])
    plans = pd.read_csv(tmp_path / "data" / "ablation" / "plans.csv")
    assert plans.groupby(["variant", "seed"])["task"].nunique().eq(cfg["test_tasks"]).all()
    refresh = pd.read_csv(tmp_path / "data" / "ablation" / "refresh.csv")
    assert sorted(refresh["seed"]) == [smoke_params["seed"], smoke_params["seed"] + 1]
    figures = sorted(p.name for p in (tmp_path / "reports" / "figures" / "ablation").iterdir())
    assert figures == ["ratios.png", "training.png"]
    _, outputs = executed_outputs(notebook(tmp_path, "07_ablation.ipynb"))
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2


def test_bad_parameter_fails_cleanly(tmp_path, params, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    params["pool"]["dims"] = [16, 18]
    assert run_synthesize(tmp_path, params) == 2
    err = capsys.readouterr().err
    assert "pool.dims[1]: 18 (not a multiple of 4" in err
    assert not (tmp_path / "data").exists()
    assert not (tmp_path / "nb" / "01_synthesize.ipynb").exists()
    assert not list((tmp_path / "nb").glob(".*.ipynb")), "no half-written notebook left behind"


def test_missing_params_file(tmp_path, capsys):
    code = main(["synthesize", "--params-file", str(tmp_path / "none.yaml"),
                 "--dvc-file", str(ROOT / "dvc.yaml")])
    assert code == 2
    assert "none.yaml: parameter file not found" in capsys.readouterr().err


def test_columns_notebook(repro, smoke_params):
    tmp_path = repro
    metrics = schema.read_checked(tmp_path / "reports" / "metrics" / "columns.json", Columns)
    assert {"autoshard", "dreamshard"} <= set(metrics["protocols"]) <= {"autoshard", "dreamshard", "tight"}
    plans = pd.read_csv(tmp_path / "data" / "columns" / "plans.csv")
    assert set(plans["method"]) <= set(TWIN) | set(TWIN.values()) and set(TWIN) <= set(plans["method"])
    assert plans["pass"].nunique() == 1, "every plan measured in one pass"
    per_protocol = plans.groupby("protocol")["task"].nunique()
    evaluate = smoke_params["evaluate"]
    available = {"autoshard": evaluate["autoshard_tasks_per_ratio"]
                 * len(smoke_params["tasks"]["autoshard"]["unseen_ratios"]),
                 "dreamshard": evaluate["dreamshard_tasks"], "tight": evaluate["tight_tasks"]}
    wanted = smoke_params["columns"]["tasks_per_protocol"]
    assert per_protocol.to_dict() == {p: min(wanted, n) for p, n in available.items()}
    pairs = pd.read_csv(tmp_path / "data" / "columns" / "pairs.csv")
    assert (pairs["twin"] == pairs["method"].map(TWIN)).all() and (pairs["ratio"] > 0).all()
    assert (pairs.loc[pairs["identical"], "ratio"] == 1.0).all(), "one plan, one measurement: ratio exactly 1"
    greedy = pairs[pairs["method"].isin(["column_greedy", "column_lpt"])]
    assert greedy.loc[~greedy["split"], "identical"].all(), "no split chosen: the twin's very plan"
    for protocol, by_method in metrics["protocols"].items():
        for method, entry in by_method.items():
            g = pairs[(pairs["protocol"] == protocol) & (pairs["method"] == method)]
            assert entry["tasks"] == len(g) and entry["split_share"] == pytest.approx(g["split"].mean(), abs=1e-6)
    assert sorted(p.name for p in (tmp_path / "reports" / "figures" / "columns").iterdir()) == ["paired.png"]
    _, outputs = executed_outputs(notebook(tmp_path, "08_columns.ipynb"))
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 1


def test_a_second_repro_runs_nothing(repro):
    lock = (repro / "dvc.lock").read_text()
    for rel in ("data/pool/tables.parquet", "data/tasks.json", "reports/metrics/synthesize.json",
                "reports/metrics/evaluate.json", "data/evaluate/plans.csv", "reports/metrics/transfer.json",
                "reports/metrics/ablation.json", "reports/README.md", "reports/html/07_ablation.html"):
        assert (repro / rel).is_file(), rel
    second = sh(["dvc", "repro"], repro)
    assert second.returncode == 0, second.stderr
    assert "Running stage" not in second.stdout
    assert (repro / "dvc.lock").read_text() == lock
    status = sh(["dvc", "status", "dvc.yaml"], repro)  # data.dvc is declared, not fetched
    assert "up to date" in status.stdout, status.stdout


def test_an_ablation_parameter_reruns_only_ablation_and_report(repro):
    """`dvc repro --dry` on a changed ablation parameter: the ablation is the one stage whose own
    inputs changed (the ablation's run itself is checked above), and the report is the one stage
    that reads its outputs, so a real repro reruns those two. The params are restored after."""
    kept = (repro / "params.yaml").read_text()
    params = yaml.safe_load(kept)
    params["ablation"]["iterations"] += 1
    (repro / "params.yaml").write_text(yaml.safe_dump(params))
    try:
        again = sh(["dvc", "repro", "--dry"], repro)
    finally:
        (repro / "params.yaml").write_text(kept)
    assert again.returncode == 0, again.stderr + again.stdout
    ran = sorted(line.split("'")[1] for line in again.stdout.splitlines() if line.startswith("Running stage"))
    assert ran == ["ablation"]
    stages = yaml.safe_load((repro / "dvc.yaml").read_text())["stages"]
    made = {str(next(iter(o)) if isinstance(o, dict) else o) for key in ("outs", "metrics")
            for o in stages["ablation"].get(key, [])}
    readers = sorted(name for name, stage in stages.items() if made & set(map(str, stage.get("deps", []))))
    assert readers == ["report"]

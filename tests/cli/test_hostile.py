"""The `autoshard` command under hostile input (issue 18): a checked-in corpus of each class of
failure, property-based fuzzing of tables, plans and arguments, and the cases that need models,
FIFOs, symlinks, signals or threads. The contract: exit status 2, exactly one line on stderr,
no traceback, no output file (nor a temporary one), every input byte-identical afterwards."""

import contextlib
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from study_configs import study

from autoshard.cli.main import main

CORPUS = Path(__file__).parents[1] / "corpus"
MANIFEST = yaml.safe_load((CORPUS / "cases.yaml").read_text())
TABLES = (CORPUS / "tables.csv").read_text()
FUZZ = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def run(argv: list[str]) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of the command run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # --help only
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every regular file under `folder` and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def refused(argv: list[str], folder: Path) -> str:
    """Run `argv`, assert the contract for everything in `folder`, and return the error line."""
    before = snapshot(folder)
    code, _, err = run(argv)
    assert code == 2, (argv, err)
    assert len(err.splitlines()) == 1 and err.endswith("\n"), err
    assert "Traceback" not in err
    assert snapshot(folder) == before, "an input changed, or an output or temporary file was left"
    return err.strip()


@pytest.fixture
def corpus(tmp_path, monkeypatch) -> Path:
    """A fresh copy of the corpus; no models anywhere the command looks."""
    folder = tmp_path / "corpus"
    shutil.copytree(CORPUS, folder)
    monkeypatch.setenv("AUTOSHARD_MODELS", str(folder))
    return folder


@pytest.mark.parametrize("case", MANIFEST["cases"], ids=lambda c: f"{c[0]}:{c[1][:70]}")
def test_corpus_case_is_refused_cleanly(corpus, case):
    _, command, pattern = case
    command = (command.replace("{plan}", MANIFEST["plan"]).replace("{score}", MANIFEST["score"])
               .replace("{sharded}", MANIFEST["sharded"]))
    err = refused(shlex.split(command.replace("{dir}", str(corpus))), corpus)
    import re

    assert re.search(pattern, err), err


def test_the_corpus_tables_and_plans_are_valid(corpus):
    """The corpus's base files pass, so each case fails for its own fault alone."""
    out = corpus / "out.json"
    assert run(shlex.split(MANIFEST["plan"].replace("{dir}", str(corpus))) + ["--out", str(out)])[0] == 0
    from autoshard.cli.plan_files import read_plan
    from autoshard.cli.user_tables import read_tables

    tables = read_tables(corpus / "tables.csv")
    for plan in ("plan.json", "torchrec.json", "out.json"):
        placement, devices = read_plan(corpus / plan, tables)
        assert devices == 2 and len(placement) == 3


# ---- destroyed or lost files: paths the corpus cannot hold, failures while writing, signals ----

def plan_argv(folder: Path, out: Path, *extra: str, method: str = "naive") -> list[str]:
    return ["plan", "--tables", str(folder / "tables.csv"), "--devices", "2", "--memory-per-device", "1GiB",
            "--method", method, "--out", str(out), *extra]


@pytest.mark.parametrize("kind", ["symlink", "fifo", "symlink to the tables"])
def test_an_output_that_is_a_symlink_or_a_fifo_is_refused(corpus, kind):
    out = corpus / "out.json"
    if kind == "fifo":
        os.mkfifo(out)
    else:
        out.symlink_to(corpus / ("tables.csv" if "tables" in kind else "plan.json"))
    err = refused(plan_argv(corpus, out), corpus)
    assert ("a symbolic link" in err) if kind != "fifo" else ("a device, FIFO or socket" in err)
    assert out.is_fifo() if kind == "fifo" else out.is_symlink()


def test_a_hard_link_to_an_input_is_refused(corpus):
    os.link(corpus / "tables.csv", corpus / "out.json")
    assert "an input of this command" in refused(plan_argv(corpus, corpus / "out.json"), corpus)


def test_a_plan_path_that_is_a_fifo_does_not_hang(corpus):
    fifo = corpus / "plan.fifo"
    os.mkfifo(fifo)
    signal.alarm(20)  # a hang fails the test instead of blocking the suite
    try:
        err = refused(["score", "--tables", str(corpus / "tables.csv"), "--plan", str(fifo)], corpus)
    finally:
        signal.alarm(0)
    assert "not a regular file" in err


def test_a_failed_rename_leaves_no_file(corpus, monkeypatch):
    def fail(src, dst):
        raise PermissionError(13, "Permission denied", dst)

    monkeypatch.setattr(os, "replace", fail)
    out, exported = corpus / "out.json", corpus / "out.torchrec.json"
    err = refused(plan_argv(corpus, out, "--torchrec", str(exported), "--torchrec-device", "cpu"), corpus)
    assert "out.json: cannot write (Permission denied)" in err


WRITE_SLOWLY = ("import os, sys, time\n"
                "def slow(fd):\n"
                "    print('writing', flush=True)\n"
                "    time.sleep(60)\n"
                "os.fsync = slow\n"
                "from autoshard.cli.main import main\n"
                "sys.exit(main(sys.argv[1:]))\n")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_writing_leaves_nothing_and_prints_one_line(corpus, signum):
    out = corpus / "out.json"
    before = snapshot(corpus)
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", WRITE_SLOWLY, *plan_argv(corpus, out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signum
    assert err.splitlines() == [f"autoshard plan: interrupted by {signal.Signals(signum).name}; no partial output left"]
    assert snapshot(corpus) == before


def test_a_table_file_that_is_a_symlink_loop_is_refused(corpus):
    (corpus / "loop.csv").symlink_to(corpus / "loop.csv")
    argv = plan_argv(corpus, corpus / "out.json")
    argv[argv.index("--tables") + 1] = str(corpus / "loop.csv")
    assert "loop.csv" in refused(argv, corpus)


def test_a_raw_pickle_or_a_planner_export_missing_a_field_is_one_line(corpus):
    import json as _json
    import pickle

    import numpy as np

    from autoshard.data.features import FEATURE_COLUMNS
    from autoshard.rl.numpy_planner import FILE_NAME, FORMAT

    with open(corpus / "raw.pkl", "wb") as fh:
        pickle.dump({"weights": [1.0]}, fh, protocol=4)
    argv = plan_argv(corpus, corpus / "out.json", "--cost-model", str(corpus / "raw.pkl"), method="cost_greedy")
    assert "raw.pkl: not a cost model file" in refused(argv, corpus)
    meta = {"format": FORMAT, "feature_columns": FEATURE_COLUMNS}  # the right tag; no `sources`
    np.savez(corpus / FILE_NAME, meta=np.array(_json.dumps(meta)))
    assert "not a NumPy planner file of this version" in refused(argv, corpus)


START = "from autoshard.cli.entry import run\nimport sys\nsys.argv[0] = 'autoshard'\nrun()\n"


@pytest.mark.parametrize("delay", [0.2, 0.5])  # while the modules load, well before the plan is written
def test_an_interrupt_during_start_up_is_one_line(corpus, delay):
    """Ctrl-C while the command's modules load: the line of any interrupted run, no traceback."""
    import time

    before = snapshot(corpus)
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", START, *plan_argv(corpus, corpus / "out.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    if proc.returncode == 0:
        pytest.skip("the command finished before the signal")
    assert proc.returncode == 130
    assert len(err.splitlines()) == 1 and "interrupted by SIGINT; no partial output left" in err, err
    assert snapshot(corpus) == before


# ---- fuzzing: generated tables, plans and arguments ----

HOSTILE = st.one_of(st.text(max_size=12), st.integers(-2**70, 2**70).map(str), st.floats().map(repr),
                    st.sampled_from(["", "1e18", "1e19", "-0", "1.5", "nan", "inf", "a.b", "a\nb", "a\x00b", "1_000",
                                     "0x10", " 8 ", "\u00e9", "True", "null", "{x: 1}", "[1]"]))
VALID_ROW = st.tuples(st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True), st.integers(1, 10**6).map(str),
                      st.sampled_from(["4", "8", "16", "64"]), st.sampled_from(["0", "1", "2.5", "40"]))


@st.composite
def table_files(draw) -> list[list[str]]:
    """A CSV table list: a header, then valid rows with a few fields (or whole rows) replaced by
    hostile values, fields added or dropped."""
    rows = [list(r) for r in draw(st.lists(VALID_ROW, min_size=1, max_size=5))]
    for _ in range(draw(st.integers(1, 3))):
        row = draw(st.sampled_from(rows))
        action = draw(st.sampled_from(["replace", "replace", "append", "drop"]))
        if action == "replace":
            row[draw(st.integers(0, len(row) - 1))] = draw(HOSTILE)
        elif action == "append":
            row.append(draw(HOSTILE))
        elif row:
            row.pop()
    return [["name", "rows", "dim", "pooling_factor"], *rows]


def is_name(text: str) -> bool:
    from autoshard.core.inputs import NAME

    return bool(NAME.fullmatch(text.strip()))


@FUZZ
@given(table_files())
def test_fuzzed_table_files_give_a_right_plan_or_one_clean_error(tmp_path, monkeypatch, lines):
    import csv
    import tempfile

    monkeypatch.setenv("AUTOSHARD_MODELS", str(tmp_path))
    with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
        folder = Path(folder)
        with open(folder / "tables.csv", "w", newline="") as fh:
            csv.writer(fh).writerows(lines)
        out = folder / "out.json"
        argv = plan_argv(folder, out, "--memory-per-device", "64MiB")
        before = snapshot(folder)
        code, _, err = run(argv)
        if code == 0:  # never a silent wrong plan: exactly these tables, within memory
            doc = json.loads(out.read_text())
            names = [r[0].strip() for r in lines[1:]]
            assert list(doc["assignment"]) == names and all(is_name(n) for n in names)
            assert all(len(r) == 4 for r in lines)
            assert all(d["memory_bytes"] <= 64 * 2**20 for d in doc["per_device"])
            assert sorted(snapshot(folder)) == sorted([*before, "out.json"])
        else:
            assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
            assert snapshot(folder) == before


HOSTILE_JSON = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                         st.text(max_size=8), st.lists(st.integers(0, 2), max_size=3),
                         st.dictionaries(st.text(max_size=3), st.integers(0, 2), max_size=2))


@st.composite
def plan_mutations(draw) -> tuple[str, list[str], object]:
    """(file, path of keys, new value or a marker to delete) for a corpus plan or TorchRec plan."""
    which = draw(st.sampled_from(["plan.json", "torchrec.json"]))
    doc = json.loads((CORPUS / which).read_text())
    path, node = [], doc
    while isinstance(node, (dict, list)) and node and (not path or draw(st.booleans())):
        key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else list(range(len(node)))))
        path.append(key)
        node = node[key]
    return which, path, draw(st.one_of(HOSTILE_JSON, st.just("<delete>")))


@FUZZ
@given(plan_mutations())
def test_fuzzed_plan_files_are_read_exactly_or_refused(tmp_path, mutation):
    from autoshard.cli.plan_files import read_plan
    from autoshard.cli.user_tables import read_tables
    from autoshard.core.errors import ConfigError

    which, path, value = mutation
    doc = json.loads((CORPUS / which).read_text())
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value == "<delete>":
        del node[path[-1]]
    else:
        node[path[-1]] = value
    plan = tmp_path / which
    plan.write_text(json.dumps(doc))
    tables = read_tables(CORPUS / "tables.csv")
    try:
        placement, devices = read_plan(plan, tables)
    except ConfigError as exc:
        assert "\n" not in str(exc) and str(plan) in str(exc)
        return
    # accepted: the file's devices, read independently, are exact ints, and are the placement
    if which == "plan.json":
        expected, world = doc["assignment"], doc["devices"]
    else:
        expected, world = {n: p["ranks"][0] for n, p in doc["modules"][""].items()}, doc["world_size"]
    assert type(world) is int and devices == world
    assert all(type(d) is int and 0 <= d < world for d in expected.values())
    assert placement.tolist() == [expected[n] for n in tables.names]


ARGUMENT = st.one_of(st.integers(-10**40, 10**40).map(str), HOSTILE)


@FUZZ
@given(st.sampled_from(["--devices", "--memory-per-device", "--seed", "--best-of", "--weight-bytes", "--method",
                        "--torchrec-device"]), ARGUMENT)
def test_fuzzed_arguments_give_a_plan_or_one_clean_error(tmp_path, monkeypatch, option, value):
    import tempfile

    monkeypatch.setenv("AUTOSHARD_MODELS", str(tmp_path))
    with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
        folder = Path(folder)
        (folder / "tables.csv").write_text(TABLES)
        before = snapshot(folder)
        code, _, err = run(plan_argv(folder, folder / "out.json", f"{option}={value}"))
        if code == 0:
            assert json.loads((folder / "out.json").read_text())["method"] in ("naive", value.strip())
        else:
            assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
            assert snapshot(folder) == before


# ---- model files, model discovery, reproducible refinement ----

@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """A folder with a tiny cost model and policy (a few training steps on the corpus tables)."""
    from autoshard.cli.user_tables import read_tables
    from autoshard.costmodel.model import CostModel, CostModelConfig, save_model
    from autoshard.data.features import feature_matrix
    from autoshard.data.tasks import Task
    from autoshard.rl.policy import PolicyConfig
    from autoshard.rl.ppo import RLConfig, train

    folder = tmp_path_factory.mktemp("models")
    x = feature_matrix(read_tables(CORPUS / "tables.csv").features)
    model = CostModel.fitted_to(study(CostModelConfig, hidden=16, encoding=8, head_hidden=8), x, scale=1.0)
    save_model(model, folder / "cost_model.pt")
    tasks = [Task(f"t{k}", "user", "train", (0, 1, 2), 2, 2**30, 0.0) for k in range(2)]
    cfg = study(RLConfig, policy=study(PolicyConfig, hidden=8, lstm_layers=1), iterations=1, tasks_per_batch=2)
    train(model, x, tasks, cfg, 0, folder / "policy.pt", progress=False)
    return folder


def damaged_model(models: Path, folder: Path, change) -> Path:
    """A copy of the cost model file whose state dict `change` has edited."""
    import torch

    payload = torch.load(models / "cost_model.pt", weights_only=True)
    change(payload["state_dict"])
    torch.save(payload, folder / "damaged.pt")
    return folder / "damaged.pt"


@pytest.mark.parametrize("change, message", [
    (lambda s: s["encoder.0.weight"].fill_(float("nan")), r"tensor encoder.0.weight holds NaN or infinite"),
    (lambda s: s.pop("head.2.bias"), r"tensor 'head.2.bias' is missing"),
    (lambda s: s.update({"encoder.0.weight": s["encoder.0.weight"][:, :3]}), r"tensor encoder.0.weight: shape"),
    (lambda s: s.update({"extra": s["mean"]}), r"tensor 'extra' is not expected"),
    (lambda s: (s["scale"].fill_(3e38), s["head.2.bias"].fill_(3e38)), r"predicts inf ms \(not a finite number"),
])
def test_a_damaged_cost_model_is_refused_naming_its_file(corpus, models, change, message):
    import re

    model = damaged_model(models, corpus, change)
    err = refused(plan_argv(corpus, corpus / "out.json", "--cost-model", str(model), method="cost_greedy"), corpus)
    assert "damaged.pt" in err and re.search(message, err), err


def test_a_policy_given_to_a_heuristic_is_checked(corpus, models):
    garbage = corpus / "policy.pt"
    garbage.write_bytes(b"PK\x03\x04 not a checkpoint")
    argv = plan_argv(corpus, corpus / "out.json", "--cost-model", str(models / "cost_model.pt"), "--policy",
                     str(garbage))
    assert "policy.pt: not a policy checkpoint file" in refused(argv, corpus)
    argv[argv.index(str(garbage))] = str(models / "policy.pt")
    assert run(argv)[0] == 0


def test_models_are_found_from_the_project_not_the_current_folder(corpus, models, monkeypatch, tmp_path):
    from autoshard.cli import service as planning

    root = Path(__file__).resolve().parents[2]
    monkeypatch.delenv("AUTOSHARD_MODELS")
    monkeypatch.chdir(tmp_path)
    assert planning.project_root() == root and planning.models_folder() == root / "data" / "rl"
    monkeypatch.setenv("AUTOSHARD_MODELS", str(models))
    assert run(plan_argv(corpus, corpus / "a.json", method="rl_greedy"))[0] == 0
    monkeypatch.setenv("AUTOSHARD_MODELS", str(tmp_path / "missing"))
    assert "$AUTOSHARD_MODELS: " in refused(plan_argv(corpus, corpus / "b.json", method="rl_greedy"), corpus)
    assert run(plan_argv(corpus, corpus / "b.json", "--models", str(models), method="rl_greedy"))[0] == 0
    assert json.loads((corpus / "b.json").read_text())["model_files"]["policy"]["path"] == str(models / "policy.pt")


def test_refine_gives_the_same_plan_whatever_the_thread_count(models, corpus):
    """The local search runs in float64 NumPy without BLAS: torch's thread count cannot change it."""
    import numpy as np
    import torch

    from autoshard.costmodel.model import CostModel, CostModelConfig
    from autoshard.data.tasks import Task
    from autoshard.placement.heuristics import place
    from autoshard.placement.search import model_search
    from autoshard.placement.shards import memory_ok, predicted_bottleneck

    g = np.random.default_rng(0)
    n, devices = 300, 8
    rows, dims = g.integers(100, 10**6, n), g.choice([8, 16, 64], n)
    x = np.column_stack([dims, rows, g.uniform(1, 50, n), rows * dims * 4, g.dirichlet(np.ones(17), n)])
    torch.manual_seed(0)
    model = CostModel.fitted_to(study(CostModelConfig, hidden=32, encoding=16, head_hidden=16), x)
    import pandas as pd

    sizes = x[:, 3]
    task = Task("t", "user", "test", tuple(range(n)), devices, int(sizes.max() + 1.5 * sizes.sum() / devices), 1.0)
    start = place("naive", pd.DataFrame({"size_bytes": sizes.astype(np.int64)}), devices, task.memory_bytes)
    before = torch.get_num_threads()
    plans = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            plans.append(model_search(model, x, task, start))
    finally:
        torch.set_num_threads(before)
    assert np.array_equal(plans[0], plans[1]) and memory_ok(task, plans[0], sizes)
    assert predicted_bottleneck(model, x, task, plans[0]) < predicted_bottleneck(model, x, task, start)
    assert np.array_equal(model_search(model, x, task, plans[0]), plans[0]), "a local optimum"
    docs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        out = corpus / f"refined{threads}.json"
        assert run(plan_argv(corpus, out, "--models", str(models), method="rl_local_search"))[0] == 0
        docs.append(json.loads(out.read_text())["assignment"])
    torch.set_num_threads(before)
    assert docs[0] == docs[1]


def test_refine_runs_without_torch_on_the_numpy_planner_and_agrees_with_torch(corpus, models, tmp_path):
    from autoshard.rl import numpy_planner

    folder = tmp_path / "with_planner"
    shutil.copytree(models, folder)
    torch_plan = corpus / "torch.json"
    assert run(plan_argv(corpus, torch_plan, "--models", str(models), method="rl_local_search"))[0] == 0
    numpy_planner.export(folder / "cost_model.pt", folder / "policy.pt", folder / numpy_planner.FILE_NAME)
    out = corpus / "numpy.json"
    code = ("import sys; from autoshard.cli.main import main; "
            f"rc = main({plan_argv(corpus, out, '--models', str(folder), method='rl_local_search')!r}); "
            "print('torch' in sys.modules); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0 and done.stdout.split()[-1] == "False", done.stderr
    docs = [json.loads(p.read_text()) for p in (torch_plan, out)]
    assert [d["engine"] for d in docs] == ["torch", "numpy"] and docs[0]["assignment"] == docs[1]["assignment"]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=30), st.from_regex(r"[+-]?[0-9]{0,25}(\.[0-9]{0,5})?([eE][+-]?[0-9]{1,25})?",
                                                     fullmatch=True)),
       st.sampled_from(["", "B", "GiB", "TB", "k"]))
def test_numbers_and_sizes_are_exact_ints_in_range_or_one_clean_error(text, unit):
    from autoshard.cli.user_tables import parse_memory
    from autoshard.core.errors import ConfigError
    from autoshard.core.inputs import MAX_MEMORY, MAX_ROWS, number

    for parse, hi in ((lambda: number(text, "rows", 1, MAX_ROWS, whole=True), MAX_ROWS),
                      (lambda: parse_memory(text + unit), MAX_MEMORY)):
        try:
            value = parse()
        except ConfigError as exc:
            assert "\n" not in str(exc)
            continue
        assert type(value) is int and 1 <= value <= hi


@pytest.mark.parametrize("argv, message", [
    (["{dir}/tables.csv", "{dir}/torchrec_missing_field.json"], r"table 'b': field 'ranks' is missing"),
    (["{dir}/tables.csv", "{dir}/torchrec_wrong_size.json"], r"table 'b', field sizes: \[999, 32\]"),
    (["{dir}/tables.csv", "{dir}/plan_duplicate_key.json"], r"duplicate key 'a'"),
    (["{dir}/tables.csv", "{dir}"], r"a folder, not a TorchRec plan"),
    (["{dir}/tables.csv"], r"the following arguments are required: plan"),
    (["{dir}/tables.csv", "{dir}/torchrec.json", "--processes", "3"], r"--processes: 3 \(the plan has 2 ranks"),
])
def test_torchrec_check_refuses_bad_plans_in_one_line(corpus, argv, message):
    import re

    from autoshard.cli.torchrec import check as torchrec_check

    before = snapshot(corpus)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert torchrec_check.main([a.replace("{dir}", str(corpus)) for a in argv]) == 2
    assert len(err.getvalue().splitlines()) == 1 and re.search(message, err.getvalue()), err.getvalue()
    assert snapshot(corpus) == before

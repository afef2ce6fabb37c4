"""Cost backends: shard inputs, the three backends, communication, and bad input."""

import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from autoshard.core.errors import ConfigError
from autoshard.data.pool import build_pool
from autoshard.measure.analytic import AnalyticBackend
from autoshard.measure.backends import make_backend, resolve_device
from autoshard.measure.base import ShardCost, shard_inputs
from autoshard.measure.collect import ProfileConfig
from autoshard.measure.comm import analytic_comm, device_stages, measure_comm
from autoshard.measure.crosscheck import BenchConfig, fbgemm_harness_check
from autoshard.measure.fbgemm import FbgemmBackend
from autoshard.measure.formulas import table_perf
from autoshard.measure.timing import one_round
from autoshard.measure.torch_bag import TorchBackend

FAST = one_round(warmup=1, runs=3)
LIMIT = 8 * 2**30  # bytes a shard may take


@pytest.fixture(scope="module")
def pool(smoke_params):
    return build_pool(smoke_params["dataset"], smoke_params["pool"], seed=0, progress=False)


def test_shard_inputs_layout(pool):
    indices, offsets = shard_inputs(pool.traces, [3, 1], batch_size=16)
    assert offsets.shape == (2 * 16 + 1,) and offsets[0] == 0 and offsets[-1] == indices.numel()
    t3 = pool.traces.table(3)[: pool.traces.lengths[3, :16].sum()]
    assert np.array_equal(indices[: len(t3)].numpy(), t3)
    assert np.array_equal(np.diff(offsets.numpy())[:16], pool.traces.lengths[3, :16])


@pytest.mark.parametrize(("tables", "batch", "message"), [
    ([], 16, r"shard: \[\] \(empty"),
    ([0, 999], 16, r"shard: table 999 is not in the pool of 48 tables"),
    ([0], 10_000, r"profile.batch_size: 10000 \(the traces hold 256 bags per table\)"),
])
def test_bad_shards(pool, tables, batch, message):
    cpu = torch.device("cpu")
    for backend in (AnalyticBackend(pool), FbgemmBackend(pool, cpu, "EXACT_ROWWISE_ADAGRAD", FAST, LIMIT, 1),
                    TorchBackend(pool, cpu, FAST, LIMIT, 1)):
        with pytest.raises(ConfigError, match=message):
            backend.measure(tables, batch)


def test_analytic_matches_torchrec_formula(pool):
    from torchrec.distributed.planner.constants import DDR_MEM_BW

    b, f = 256, pool.features.iloc[5]
    dim, pf = int(f["dim"]), float(f["pooling_factor"])
    penalty = 1.75  # dims below 64
    fwd = (b * pf * 8 + b * pf * max(dim, 32) * 4 + b * min(1, pf) * dim * 4) * penalty / DDR_MEM_BW
    cost = AnalyticBackend(pool).measure([5], b)
    assert cost.forward_ms == pytest.approx(fwd, rel=1e-6)
    assert cost.backward_ms == pytest.approx(2 * fwd, rel=1e-6)
    both = AnalyticBackend(pool).measure([5, 6], b)
    assert both.total_ms == pytest.approx(cost.total_ms + AnalyticBackend(pool).measure([6], b).total_ms)
    assert AnalyticBackend(pool).measure([5, 6], b) == both  # deterministic


@pytest.mark.parametrize("backend_cls", [FbgemmBackend, TorchBackend])
def test_measured_backends_on_cpu(pool, smoke_params, backend_cls):
    cfg = ProfileConfig.from_params(smoke_params["profile"] | {"device": "cpu"}).backend
    backend = make_backend(pool, replace(cfg, backend=backend_cls.name, timing=FAST))
    busiest = pool.features["lookups"].nlargest(8).index.tolist()
    quietest = int(pool.features["lookups"].idxmin())
    big, small = backend.measure(busiest, 256), backend.measure([quietest], 256)
    for cost in (big, small):
        assert all(math.isfinite(v) and v > 0 for v in (cost.forward_ms, cost.backward_ms))
        assert cost.forward_iqr_ms >= 0 and cost.backward_iqr_ms >= 0
    assert big.total_ms > small.total_ms


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["fbgemm", "torch"])
def test_cuda_backends(pool, smoke_params, name):
    values = smoke_params["profile"] | {"backend": name, "device": "cuda"}
    backend = make_backend(pool, ProfileConfig.from_params(values).backend)
    cost = backend.measure([0, 1, 2], 256)
    assert cost.forward_ms > 0 and cost.backward_ms > 0 and backend.device == "cuda"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_gpu(smoke_params):
    with pytest.raises(ConfigError, match=r"profile.device: 'cuda' \(no CUDA GPU"):
        resolve_device("cuda")
    with pytest.raises(ConfigError, match=r"profile.device: 'cuda'"):
        ProfileConfig.from_params(smoke_params["profile"] | {"device": "cuda"})
    assert resolve_device("auto") == "cpu"


@pytest.mark.parametrize(("key", "value", "message"), [
    ("backend", "tpu", r"profile.backend: 'tpu' \(expected one of fbgemm, torch_fused, torch, analytic\)"),
    ("optimizer", "ADAM", r"profile.optimizer: 'ADAM'"),
    ("runs", 0, r"profile.runs: 0"),
    ("device", "gpu", r"profile.device: 'gpu'"),
])
def test_bad_profile_params(smoke_params, key, value, message):
    with pytest.raises(ConfigError, match=message):
        ProfileConfig.from_params(smoke_params["profile"] | {key: value})


def test_two_process_all_to_all_on_cpu():
    measured = measure_comm([[16, 32], [16]], 64, "cpu", FAST)
    assert len(measured) == 2
    assert all(f > 0 and b > 0 for f, b in measured)


def test_analytic_comm_and_stages():
    comm = analytic_comm([[16, 32], [16]], [[2.0, 1.0], [3.0]], batch_size=64)
    expected = table_perf(16, 2.0, 32, 2).fwd_comms + table_perf(32, 1.0, 32, 2).fwd_comms
    assert comm[0][0] == pytest.approx(expected)
    stages = device_stages([ShardCost(1.0, 2.0), ShardCost(3.0, 1.0)], [(0.5, 0.5), (0.1, 0.2)])
    assert stages["total_ms"].tolist() == pytest.approx([4.0, 4.3])
    assert stages["total_ms"].max() == pytest.approx(4.3)


def test_one_process_cannot_measure_comm():
    with pytest.raises(ConfigError, match="comm.processes: 1"):
        measure_comm([[16]], 64, "cpu", FAST)


def test_fbgemm_harness_check_runs():
    table = fbgemm_harness_check(BenchConfig(2, 1000, 16, 4, 1.1, 128), FAST, "EXACT_ROWWISE_ADAGRAD")
    assert table["component"].tolist() == ["forward", "backward"]
    assert (table[["fbgemm_harness_ms", "ours_ms"]] > 0).all().all()


@pytest.mark.parametrize(("section", "value", "message"), [
    ("comm", {"processes": "two", "tasks": 1}, r"profile.comm.processes: 'two' \(expected an integer\)"),
    ("comm", {"processes": 2}, r"profile.comm.tasks: missing"),
    ("comm", {"processes": 2, "tasks": 1, "device_counts": [1], "placements": 4, "heldout_share": 0.25,
              "mape_target": 0.1}, r"profile.comm.device_counts"),
    ("comm", {"processes": 2, "tasks": 1, "device_counts": [2], "placements": 1, "heldout_share": 0.25,
              "mape_target": 0.1}, r"profile.comm.placements: 1"),
    ("crosscheck", {"torch_shards": -1, "bench": {}}, r"profile.crosscheck.torch_shards: -1"),
    ("crosscheck", {"torch_shards": 1, "bench": {"tables": 0}}, r"profile.crosscheck.bench.tables: 0"),
])
def test_bad_crosscheck_and_comm_params(smoke_params, section, value, message):
    with pytest.raises(ConfigError, match=message):
        ProfileConfig.from_params(smoke_params["profile"] | {section: value})


def test_a_backend_measures_on_its_own_thread_count_whatever_the_caller_set(pool):
    """The store files a shard under `profile.threads`: the backend pins that count itself, so a
    caller that forgot to set it (the column study once did) still measures as the key says."""
    seen = []

    class Watching(TorchBackend):
        def timed(self, *args):
            seen.append(torch.get_num_threads())
            return super().timed(*args)

    torch.set_num_threads(2)
    try:
        Watching(pool, torch.device("cpu"), FAST, LIMIT, 1).measure([0], 16)
        assert seen == [1] and torch.get_num_threads() == 2, "pinned inside, restored after"
    finally:
        torch.set_num_threads(1)


def test_more_ranks_than_gpus_are_refused_before_any_launch(monkeypatch):
    """Rank r takes GPU r: on one GPU rank 1 would die ("invalid device ordinal")."""
    from autoshard.measure import comm

    def never(*args, **kwargs):
        raise AssertionError("launched torchrun")

    monkeypatch.setattr(comm.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(comm.subprocess, "run", never)
    with pytest.raises(ConfigError, match=r"comm.processes: 2 \(an all-to-all on cuda runs one rank per GPU, "
                                          r"and this machine has 1"):
        measure_comm([[16], [16]], 64, "cuda", FAST)
    assert comm.can_measure(4, "cpu") and comm.can_measure(1, "cuda") and not comm.can_measure(2, "cuda")


def test_the_comm_check_estimates_what_the_gpus_cannot_run(monkeypatch, pool):
    from autoshard.data.tasks import Task
    from autoshard.measure import comm, crosscheck

    seen = []

    def stages(backend, features, plan, batch_size, measure, timing):
        seen.append(measure)
        return device_stages([ShardCost(1.0, 1.0)] * len(plan), [(0.1, 0.1)] * len(plan)).assign(
            comm="measured" if measure else "analytic")

    monkeypatch.setattr(crosscheck, "plan_stages", stages)
    task = Task("t0", "dreamshard", "train", (0, 1, 2, 3), 4, 2**30, 0.0)
    gpu = AnalyticBackend(pool, "cuda")
    for gpus, expected in ((1, [False]), (4, [False, True])):
        monkeypatch.setattr(comm.torch.cuda, "device_count", lambda n=gpus: n)
        seen.clear()
        table = crosscheck.comm_check(pool, [task], gpu, SimpleNamespace(batch_size=64, timing=FAST), 4, 1,
                                      placement_of=lambda t: np.arange(4))
        assert seen == expected and list(table["comm"].unique()) == ["measured" if e else "analytic" for e in expected]

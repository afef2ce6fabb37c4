"""FBGEMM where it is absent or on CUDA: every module imports without `fbgemm_gpu`, asking for
the `fbgemm` backend is one named error (the portable worker on CUDA measures with `torch`
instead, and says so), the harness check builds its TBE on the device it is given, and the
output gradient is drawn on the device."""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from autoshard.core.errors import ConfigError
from autoshard.measure import crosscheck, fbgemm, portable
from autoshard.measure.backends import make_backend
from autoshard.measure.base import ShardCost
from autoshard.measure.collect import ProfileConfig
from autoshard.measure.crosscheck import BenchConfig, fbgemm_harness_check, harness_check
from autoshard.measure.fbgemm import FbgemmMissing, output_grad
from autoshard.measure.timing import one_round

ROOT = Path(__file__).resolve().parents[2]
FAST = one_round(warmup=1, runs=2)

EVERY_MODULE = """
import importlib, pkgutil, sys
sys.modules["fbgemm_gpu"] = None  # as on a machine where it is not installed
import autoshard
names = [m.name for m in pkgutil.walk_packages(autoshard.__path__, "autoshard.")
         if not m.name.startswith("autoshard.planner")]  # TorchRec's plug-in: torchrec itself needs fbgemm_gpu
for name in names:
    importlib.import_module(name)
print(len(names))
"""


def test_every_module_imports_without_fbgemm_gpu():
    env = os.environ | {"PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", EVERY_MODULE], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) > 100


@pytest.fixture
def no_fbgemm(monkeypatch):
    """`fbgemm_gpu` and every module of it made unimportable for the test."""
    for name in [n for n in sys.modules if n == "fbgemm_gpu" or n.startswith("fbgemm_gpu.")] + ["fbgemm_gpu"]:
        monkeypatch.setitem(sys.modules, name, None)


def backend_config(smoke_params, **changes):
    return replace(ProfileConfig.from_params(smoke_params["profile"] | {"device": "cpu"}).backend, timing=FAST,
                   **changes)


def test_asking_for_fbgemm_where_it_is_absent_is_one_named_error(no_fbgemm, pool, smoke_params):
    with pytest.raises(ConfigError, match=r"profile.backend: 'fbgemm' needs fbgemm_gpu, which is not importable "
                                          r"here .*backend torch_fused or torch"):
        make_backend(pool, backend_config(smoke_params, backend="fbgemm"))
    with pytest.raises(FbgemmMissing, match=r"profile.crosscheck.bench \(timed by FBGEMM's own harness\) needs"):
        fbgemm_harness_check(BenchConfig(2, 1000, 16, 4, 1.1, 128), FAST, "EXACT_ROWWISE_ADAGRAD")
    torch_backend = make_backend(pool, backend_config(smoke_params, backend="torch"))
    assert torch_backend.measure([0, 1], 32).total_ms > 0, "the torch backend needs no FBGEMM"
    skipped = harness_check(BenchConfig(2, 1000, 16, 4, 1.1, 128), FAST, "EXACT_ROWWISE_ADAGRAD")
    assert skipped.empty and "ratio" in skipped, "the profile's harness check says it was skipped, and goes on"


def test_the_portable_worker_on_cuda_without_fbgemm_measures_with_torch_fused_and_names_it(no_fbgemm, pool,
                                                                                           smoke_params):
    cuda = backend_config(smoke_params, backend="fbgemm", device="cuda")
    backend = portable.worker_backend(pool, cuda)
    assert backend.name == "torch_fused" and backend.device == "cuda"
    assert portable.shard_rows(SimpleNamespace(name=backend.name, measure=lambda ids, b: ShardCost(1.0, 2.0)),
                               replace(cuda, device="cpu"), [[0]], [[0]])[0]["backend"] == "torch_fused"
    with pytest.raises(FbgemmMissing):  # on the CPU no other backend is taken silently
        portable.worker_backend(pool, backend_config(smoke_params, backend="fbgemm"))


class Recorder:
    """Stands for an FBGEMM module: every attribute is an enum-like namespace or a callable that
    records its arguments in `calls`."""

    def __init__(self, calls: dict):
        self.calls = calls

    def __getattr__(self, name):
        if name in ("EmbeddingLocation", "ComputeDevice", "SparseType", "EmbOptimType", "PoolingMode"):
            return Enumish(name)

        def call(*args, **kwargs):
            self.calls[name] = (args, kwargs)
            if name == "generate_requests":
                return [SimpleNamespace(unpack_2=lambda: (torch.zeros(1), torch.zeros(1)))]
            if name == "benchmark_requests":
                return 0.001
            return lambda *inputs: torch.zeros(1)
        return call


class Enumish:
    def __init__(self, name: str):
        self.name = name

    def __getitem__(self, member: str) -> str:
        return f"{self.name}.{member}"

    def __getattr__(self, member: str) -> str:
        return f"{self.name}.{member}"


@pytest.mark.parametrize(("device", "placement", "precision", "use_cpu"), [
    ("cpu", ("EmbeddingLocation.HOST", "ComputeDevice.CPU"), "SparseType.FP32", True),
    ("cuda", ("EmbeddingLocation.DEVICE", "ComputeDevice.CUDA"), "SparseType.FP16", False),
])
def test_the_harness_check_builds_its_tbe_on_the_device_it_is_given(monkeypatch, device, placement, precision,
                                                                     use_cpu):
    """The former check built a host-memory fp32 TBE whatever the device: it never checked CUDA."""
    calls: dict = {}
    monkeypatch.setattr(crosscheck, "fbgemm_module", lambda name, what: Recorder(calls))
    monkeypatch.setattr(crosscheck, "output_grad", lambda b, w, dev: calls.setdefault("grad", dev))
    monkeypatch.setattr(crosscheck, "time_steps",
                        lambda f, b, timing, dev: calls.setdefault("timed", (dev, timing.evict)) and ShardCost(1, 2))
    table = fbgemm_harness_check(BenchConfig(2, 1000, 16, 4, 1.1, 128), FAST, "EXACT_ROWWISE_ADAGRAD", device)
    (specs,), op = calls["SplitTableBatchedEmbeddingBagsCodegen"]
    assert specs == [(1000, 16, *placement)] * 2
    assert op["weights_precision"] == precision and op["device"] == torch.device(device)
    assert op["optimizer"] == "EmbOptimType.EXACT_ROWWISE_ADAGRAD"
    assert calls["generate_requests"][1]["use_cpu"] is use_cpu
    assert calls["grad"] == torch.device(device) and calls["timed"] == (torch.device(device), False)
    assert table["component"].tolist() == ["forward", "backward"]


def test_the_output_gradient_is_drawn_on_its_device_by_a_generator_there(monkeypatch):
    """At 65,536 bags a gradient drawn on the CPU and copied took most of a second per shard."""
    drawn = []
    real_randn = torch.randn

    class Generator:
        def __init__(self, device="cpu"):
            self.device = torch.device(device)

        def manual_seed(self, seed):
            self.seed = seed
            return self

    def randn(*shape, generator=None, device=None):
        drawn.append((shape, generator.device, generator.seed, torch.device(device) if device else None))
        return real_randn(*shape)

    monkeypatch.setattr(torch, "Generator", Generator)
    monkeypatch.setattr(torch, "randn", randn)
    fbgemm._output_grad.cache_clear()
    try:
        output_grad(64, 48, torch.device("cuda"))
        output_grad(64, 48, torch.device("cuda"))
        assert drawn == [((64, 48), torch.device("cuda"), 0, torch.device("cuda"))], "drawn there, once per shape"
    finally:
        fbgemm._output_grad.cache_clear()
        monkeypatch.undo()
    a, b = output_grad(8, 4, torch.device("cpu")), torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a, b), "on the CPU the same values as before"


def test_the_gpu_preset_measures_at_65536_bags_within_its_traces():
    from autoshard.core.params import load_params, merge

    paper = merge(load_params(ROOT / "params.yaml"), load_params(ROOT / "configs" / "paper.yaml"))
    assert paper["profile"]["device"] == "cuda"
    assert paper["profile"]["batch_size"] == 65536 <= paper["pool"]["batch_size"]
    assert paper["profile"]["crosscheck"]["bench"]["batch_size"] == 65536

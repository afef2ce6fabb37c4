"""Cross-checks of the measurements: fbgemm vs torch backends, ours vs FBGEMM's harness,
and measured vs analytic communication of a placement.

The harness check times one TBE configuration (T tables of E rows, dim D, L lookups per bag,
batch B, Zipf alpha) twice on the same requests: with FBGEMM's own benchmark code
(`fbgemm_gpu.tbe.bench.benchmark_requests` on `fbgemm_gpu.tbe.utils.requests.generate_requests`,
what its `split_table_batched_embeddings_benchmark.py device` command runs) and with ours.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from autoshard.core.params import bounded
from autoshard.data.pool import Pool
from autoshard.data.tasks import Task, shards
from autoshard.measure.backends import BackendConfig
from autoshard.measure.base import CostBackend
from autoshard.measure.comm import can_measure, plan_stages
from autoshard.measure.fbgemm import FbgemmMissing, fbgemm_module, output_grad, tbe_placement
from autoshard.measure.timing import TimingConfig, time_steps

HARNESS = "profile.crosscheck.bench (timed by FBGEMM's own harness)"


@dataclass(frozen=True)
class BenchConfig:
    """One TBE configuration for the harness check (the `profile.crosscheck.bench` section)."""

    tables: int
    rows: int
    dim: int
    pooling: int
    alpha: float = bounded(lo=0)
    batch_size: int


def compare_backends(a: CostBackend, b: CostBackend, shards: Sequence[Sequence[int]],
                     batch_size: int, progress: bool = True) -> pd.DataFrame:
    """The same shards measured by two backends, side by side, with their ratio b/a."""
    rows = []
    for shard in tqdm(shards, desc=f"{a.name} vs {b.name}", disable=not progress):
        ca, cb = a.measure(shard, batch_size), b.measure(shard, batch_size)
        rows.append({"tables": len(shard),
                     f"{a.name}_forward_ms": ca.forward_ms, f"{b.name}_forward_ms": cb.forward_ms,
                     f"{a.name}_backward_ms": ca.backward_ms, f"{b.name}_backward_ms": cb.backward_ms,
                     f"{a.name}_total_ms": ca.total_ms, f"{b.name}_total_ms": cb.total_ms})
    table = pd.DataFrame(rows)
    table["ratio"] = table[f"{b.name}_total_ms"] / table[f"{a.name}_total_ms"]
    return table


def fbgemm_harness_check(cfg: BenchConfig, timing: TimingConfig, optimizer: str,
                         device: str | torch.device = "cpu") -> pd.DataFrame:
    """Forward and backward ms of one TBE on `device`, timed by FBGEMM's harness and by ours: on
    the CPU in host memory with fp32 weights, on CUDA in device memory with fp16 weights (as the
    `fbgemm` backend runs it there, `fbgemm.tbe_placement`)."""
    device = torch.device(device)
    configs, common, training, bench, requests_module = (fbgemm_module(m, HARNESS) for m in (
        "split_embedding_configs", "split_table_batched_embeddings_ops_common",
        "split_table_batched_embeddings_ops_training", "tbe.bench", "tbe.utils.requests"))

    location, compute, precision = tbe_placement(device)
    op = training.SplitTableBatchedEmbeddingBagsCodegen(
        [(cfg.rows, cfg.dim, common.EmbeddingLocation[location], training.ComputeDevice[compute])] * cfg.tables,
        optimizer=getattr(configs.EmbOptimType, optimizer), weights_precision=configs.SparseType[precision],
        pooling_mode=common.PoolingMode.SUM, learning_rate=0.01, device=device)
    requests = requests_module.generate_requests(timing.runs, cfg.batch_size, cfg.tables, cfg.pooling, cfg.rows,
                                                 alpha=cfg.alpha, use_cpu=device.type != "cuda",
                                                 deterministic_output=True)
    grad = output_grad(cfg.batch_size, cfg.tables * cfg.dim, device)
    harness_fwd = bench.benchmark_requests(requests, lambda i, o, w: op(i, o), num_warmups=timing.warmup,
                                           check_median=True)
    harness_bwd = bench.benchmark_requests(requests, lambda i, o, w: op(i, o), num_warmups=timing.warmup,
                                           check_median=True, bwd_only=True, grad=grad)
    # The harness feeds request i to run i and leaves the cache warm: ours does the same here.
    inputs = [r.unpack_2() for r in requests]
    ours = time_steps(lambda run: op(*inputs[run % len(inputs)]), lambda out: out.backward(grad),
                      replace(timing, evict=False), device)
    return pd.DataFrame([
        {"component": "forward", "fbgemm_harness_ms": harness_fwd * 1e3, "ours_ms": ours.forward_ms},
        {"component": "backward", "fbgemm_harness_ms": harness_bwd * 1e3, "ours_ms": ours.backward_ms},
    ]).assign(ratio=lambda t: t["ours_ms"] / t["fbgemm_harness_ms"])


def harness_check(cfg: BenchConfig, timing: TimingConfig, optimizer: str,
                  device: str | torch.device = "cpu") -> pd.DataFrame:
    """`fbgemm_harness_check`, or no rows and a line saying why where `fbgemm_gpu` is absent (a
    GPU machine with torch alone still runs the profile, on `torch_fused`)."""
    try:
        return fbgemm_harness_check(cfg, timing, optimizer, device)
    except FbgemmMissing as exc:
        print(f"harness check skipped: {exc}")
        return pd.DataFrame(columns=["component", "fbgemm_harness_ms", "ours_ms", "ratio"])


def comm_check(pool: Pool, tasks: list[Task], backend: CostBackend, cfg: BackendConfig,
               processes: int, tasks_to_check: int, placement_of: Callable[[Task], np.ndarray]) -> pd.DataFrame:
    """Four-stage breakdown of `placement_of(task)` on the first DreamShard train tasks.

    Communication analytic for every task, and measured too (one process per device) when
    `processes` covers the task's devices and the machine can run them (`comm.can_measure`: on
    CUDA a GPU per device). Rows: one per task, comm kind (column `comm`) and device.
    """
    rows = []
    chosen = [t for t in tasks if t.protocol == "dreamshard" and t.split == "train"][:tasks_to_check]
    for task in chosen:
        plan = shards(placement_of(task), task.tables, task.devices)
        measurable = processes >= task.devices and can_measure(task.devices, backend.device)
        for measure in [False] + ([True] if measurable else []):
            stages = plan_stages(backend, pool.features, plan, cfg.batch_size, measure, cfg.timing)
            rows.append(stages.assign(task=task.name))
    return pd.concat(rows, ignore_index=True)

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
from autoshard.measure.comm import plan_stages
from autoshard.measure.fbgemm import output_grad
from autoshard.measure.timing import TimingConfig, time_steps


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


def fbgemm_harness_check(cfg: BenchConfig, timing: TimingConfig, optimizer: str) -> pd.DataFrame:
    """Forward and backward ms of one CPU TBE, timed by FBGEMM's harness and by ours."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )
    from fbgemm_gpu.tbe.bench import benchmark_requests
    from fbgemm_gpu.tbe.utils.requests import generate_requests

    op = SplitTableBatchedEmbeddingBagsCodegen(
        [(cfg.rows, cfg.dim, EmbeddingLocation.HOST, ComputeDevice.CPU)] * cfg.tables,
        optimizer=getattr(EmbOptimType, optimizer), weights_precision=SparseType.FP32,
        pooling_mode=PoolingMode.SUM, learning_rate=0.01, device=torch.device("cpu"))
    requests = generate_requests(timing.runs, cfg.batch_size, cfg.tables, cfg.pooling, cfg.rows,
                                 alpha=cfg.alpha, use_cpu=True, deterministic_output=True)
    grad = output_grad(cfg.batch_size, cfg.tables * cfg.dim, torch.device("cpu"))
    harness_fwd = benchmark_requests(requests, lambda i, o, w: op(i, o), num_warmups=timing.warmup,
                                     check_median=True)
    harness_bwd = benchmark_requests(requests, lambda i, o, w: op(i, o), num_warmups=timing.warmup,
                                     check_median=True, bwd_only=True, grad=grad)
    # The harness feeds request i to run i and leaves the cache warm: ours does the same here.
    inputs = [r.unpack_2() for r in requests]
    ours = time_steps(lambda run: op(*inputs[run % len(inputs)]), lambda out: out.backward(grad),
                      replace(timing, evict=False), torch.device("cpu"))
    return pd.DataFrame([
        {"component": "forward", "fbgemm_harness_ms": harness_fwd * 1e3, "ours_ms": ours.forward_ms},
        {"component": "backward", "fbgemm_harness_ms": harness_bwd * 1e3, "ours_ms": ours.backward_ms},
    ]).assign(ratio=lambda t: t["ours_ms"] / t["fbgemm_harness_ms"])


def comm_check(pool: Pool, tasks: list[Task], backend: CostBackend, cfg: BackendConfig,
               processes: int, tasks_to_check: int, placement_of: Callable[[Task], np.ndarray]) -> pd.DataFrame:
    """Four-stage breakdown of `placement_of(task)` on the first DreamShard train tasks.

    Communication analytic for every task, and measured too (one process per device) when
    `processes` covers the task's devices. Rows: one per task, comm kind and device.
    """
    rows = []
    chosen = [t for t in tasks if t.protocol == "dreamshard" and t.split == "train"][:tasks_to_check]
    for task in chosen:
        plan = shards(placement_of(task), task.tables, task.devices)
        for measure in [False] + ([True] if processes >= task.devices else []):
            stages = plan_stages(backend, pool.features, plan, cfg.batch_size, measure, cfg.timing)
            rows.append(stages.assign(task=task.name))
    return pd.concat(rows, ignore_index=True)

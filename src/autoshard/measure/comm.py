"""All-to-all communication of a placement: DreamShard's forward and backward comm stages.

Table-wise sharding with a data-parallel batch: device d computes the pooled embeddings of
its tables for the whole batch B, then the forward all-to-all sends each device its B/D rows
(B/D x width_d values to each peer); the backward all-to-all returns the gradients.

Measured: `measure_comm` starts D processes with `torchrun` (gloo on CPU, nccl on CUDA);
each runs `all_to_all_single` with the placement's split sizes and reports per-rank medians.
Analytic: TorchRec's table-wise comm estimate (output bytes / all-to-all bandwidth), used
when only one process is asked for.

Honest device counts: a launch of D processes measures the exchange only when each rank has a
core (gloo on CPU) or a GPU (nccl) of its own, D <= `honest_limit`; above it the ranks wait for
one another's core and the times mostly measure scheduling (oversubscribed). On CUDA more ranks
than GPUs cannot run at all (rank r takes GPU r, and NCCL refuses two ranks on one GPU): such a
launch is refused up front (`can_measure`), and the profile's callers estimate those counts
analytically instead, labelled so.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch

from autoshard.core.errors import ConfigError
from autoshard.measure.base import ShardCost
from autoshard.measure.formulas import table_perf
from autoshard.measure.timing import TimingConfig

STAGES = ["forward_compute_ms", "forward_comm_ms", "backward_comm_ms", "backward_compute_ms"]


def analytic_comm(dims_per_device: Sequence[Sequence[int]], pooling_per_device: Sequence[Sequence[float]],
                  batch_size: int, device: str = "cpu") -> list[tuple[float, float]]:
    """(forward, backward) all-to-all ms per device from TorchRec's table-wise estimate."""
    world = len(dims_per_device)
    per_rank = max(1, batch_size // world)
    out = []
    for dims, pfs in zip(dims_per_device, pooling_per_device, strict=True):
        perfs = [table_perf(int(d), round(float(p), 6), per_rank, world, device)
                 for d, p in zip(dims, pfs, strict=True)]
        out.append((sum(p.fwd_comms for p in perfs), sum(p.bwd_comms for p in perfs)))
    return out


CPU_QUOTA = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" microseconds, or "max <period>"


def cpu_quota() -> int | None:
    """Whole CPUs the container's cgroup v2 quota allows (at least 1), None without a quota."""
    try:
        quota, period = CPU_QUOTA.read_text().split()[:2]
        return None if quota == "max" else max(1, int(quota) // int(period))
    except (OSError, ValueError):
        return None


def honest_limit(device: str = "cpu") -> int:
    """The most processes one all-to-all launch runs one per core or GPU: on CUDA the GPU count,
    on CPU the CPUs this process may use (its affinity where the OS reports one, else the CPU
    count), capped by a container's CPU quota (`cpu_quota`). A launch of more ranks is
    oversubscribed. Hyper-threads are not seen: on such a machine the limit is an upper bound."""
    if device.startswith("cuda"):
        return torch.cuda.device_count()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cpu_quota()
    return cpus if quota is None else min(cpus, quota)


def can_measure(world: int, device: str = "cpu") -> bool:
    """Whether one all-to-all launch of `world` ranks can run here: on CPU always (more ranks than
    cores are oversubscribed, not refused), on CUDA only with a GPU per rank (`honest_limit`)."""
    return not device.startswith("cuda") or world <= honest_limit(device)


def measure_comm(dims_per_device: Sequence[Sequence[int]], batch_size: int, device: str, timing: TimingConfig,
                 timeout_s: float = 600) -> list[tuple[float, float]]:
    """(forward, backward) all-to-all ms per device, measured across D torchrun processes."""
    widths = [int(sum(d)) for d in dims_per_device]
    return measure_comm_many([widths], batch_size, device, timing, timeout_s)[0]


def measure_comm_many(placements: Sequence[Sequence[int]], batch_size: int, device: str, timing: TimingConfig,
                      timeout_s: float = 600) -> list[list[tuple[float, float]]]:
    """(forward, backward) all-to-all ms per device of many placements, given as the summed
    embedding width of every device, all with the same device count D: one torchrun launch of
    D processes measures them all (process start-up, ~2 s, is paid once). Each placement gets
    `timing.warmup` untimed and `timing.runs` timed forward and backward all-to-alls per rank;
    the per-rank medians are returned, in the order given. On CPU with more processes than
    cores the ranks are oversubscribed: their times include waiting for a core."""
    worlds = {len(w) for w in placements}
    if len(worlds) != 1:
        raise ConfigError(f"comm.placements: device counts {sorted(worlds)} (one launch measures one count)")
    world = worlds.pop()
    if world < 2:
        raise ConfigError(f"comm.processes: {world} (measuring all-to-all needs at least 2)")
    if batch_size < world:
        raise ConfigError(f"batch_size: {batch_size} (smaller than the {world} devices)")
    if not can_measure(world, device):
        raise ConfigError(f"comm.processes: {world} (an all-to-all on {device} runs one rank per GPU, and this "
                          f"machine has {honest_limit(device)}: NCCL refuses two ranks on one GPU)")
    with tempfile.TemporaryDirectory(prefix="autoshard-comm-") as tmp:
        spec = Path(tmp) / "spec.json"
        out = Path(tmp) / "out.json"
        spec.write_text(json.dumps({"placements": [[int(w) for w in p] for p in placements],
                                    "batch_size": batch_size, "device": device,
                                    "warmup": timing.warmup, "runs": timing.runs}))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={world}", "-m", "autoshard.measure.comm", str(spec), str(out)]
        env = os.environ | {"OMP_NUM_THREADS": "1"}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
        if done.returncode != 0 or not out.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"all-to-all measurement failed: {' | '.join(tail)}")
        return [[(float(f), float(b)) for f, b in ranks] for ranks in json.loads(out.read_text())]


def device_stages(compute: Sequence[ShardCost], comm: Sequence[tuple[float, float]]) -> pd.DataFrame:
    """DreamShard's four stages per device; the placement's cost is the max of their sums."""
    rows = [{"device": d, "forward_compute_ms": c.forward_ms, "forward_comm_ms": f,
             "backward_comm_ms": b, "backward_compute_ms": c.backward_ms}
            for d, (c, (f, b)) in enumerate(zip(compute, comm, strict=True))]
    table = pd.DataFrame(rows)
    table["total_ms"] = table[STAGES].sum(axis=1)
    return table


def synchronized_ms(stages: pd.DataFrame) -> float:
    """DreamShard's step cost of one placement: every stage ends at a barrier, so the step
    waits for the slowest device in each stage: the sum over the four stages of their maxima
    (never below `max_device_ms`, which lets each device run its four stages back to back)."""
    return float(stages[STAGES].max(axis=0).sum())


def max_device_ms(stages: pd.DataFrame) -> float:
    """The slowest device's four stages summed: the objective without the barriers."""
    return float(stages[STAGES].sum(axis=1).max())


def _time_placement(dist, widths: list[int], rows: int, spec: dict, device, cuda: bool) -> tuple[float, float]:
    """This rank's median forward and backward all-to-all ms of one placement."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = widths[rank]
    # Forward: send rows x mine to every rank; receive rows x widths[j] from each rank j.
    fwd_in = torch.randn(rows * world * mine, device=device)
    fwd_out = torch.empty(rows * sum(widths), device=device)
    fwd_split = ([rows * mine] * world, [rows * w for w in widths])
    times: dict[str, list[float]] = {"fwd": [], "bwd": []}
    for i in range(spec["warmup"] + spec["runs"]):
        for name, (inp, out, (send, recv)) in {
            "fwd": (fwd_in, fwd_out, fwd_split),
            "bwd": (fwd_out, fwd_in, (fwd_split[1], fwd_split[0])),
        }.items():
            dist.barrier()
            if cuda:
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send)
            if cuda:
                torch.cuda.synchronize(device)
            if i >= spec["warmup"]:
                times[name].append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times["fwd"]), statistics.median(times["bwd"])


def _worker(spec_path: str, out_path: str) -> None:
    """One torchrun process: time the forward and backward all-to-all of its device in every
    placement of the spec; rank 0 writes every rank's medians."""
    import torch.distributed as dist

    spec = json.loads(Path(spec_path).read_text())
    cuda = spec["device"] == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    world = dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    rows = spec["batch_size"] // world
    results = []
    for widths in spec["placements"]:
        medians = _time_placement(dist, widths, rows, spec, device, cuda)
        gathered = [None] * world
        dist.all_gather_object(gathered, medians)
        results.append(gathered)
    if dist.get_rank() == 0:
        Path(out_path).write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])


def plan_stages(backend, features: pd.DataFrame, shards: Sequence[Sequence[int]], batch_size: int,
                measure: bool, timing: TimingConfig) -> pd.DataFrame:
    """Four stages per device of a placement given as pool table ids per device.

    Compute comes from `backend`; communication is measured across one process per device
    when `measure` is true, else TorchRec's analytic estimate. Column `comm` says which.
    """
    compute = [backend.measure(s, batch_size) for s in shards]
    dims = [features.loc[list(s), "dim"].tolist() for s in shards]
    if measure:
        comm = measure_comm(dims, batch_size, backend.device, timing)
    else:
        pfs = [features.loc[list(s), "pooling_factor"].tolist() for s in shards]
        comm = analytic_comm(dims, pfs, batch_size, backend.device)
    return device_stages(compute, comm).assign(comm="measured" if measure else "analytic")

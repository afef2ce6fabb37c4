"""The device facts the GPU landscape records beside its rows: what the device is, its clocks
brought up before timing, and its copy bandwidth (the bound on bytes moved per second)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import torch

from autoshard.core.digest import cpu_model, machine
from autoshard.measure.timing import llc_bytes

CPU_MEMORY_GIB = 4.0   # a CPU run's memory limit when none is given
GPU_MEMORY_SHARE = 0.9  # a GPU run's, as a share of the device's memory
COPY_RUNS = 10


def describe(device: torch.device) -> dict:
    """The device (GPU name, L2 and memory; or the CPU and its last-level cache) and the versions."""
    out = {"type": device.type, "torch": torch.__version__, "versions": machine(device.type)}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        l2 = int(getattr(p, "L2_cache_size", 0) or 0)  # 0: the device does not say
        return out | {"name": p.name, "l2_bytes": l2, "memory_bytes": int(p.total_memory),
                      "sm_count": int(p.multi_processor_count), "capability": f"{p.major}.{p.minor}",
                      "cuda": torch.version.cuda}
    return out | {"name": cpu_model(), "llc_bytes": llc_bytes(), "cores": os.cpu_count()}


def memory_limit(device: torch.device, gib: float) -> int:
    """The backends' memory limit in bytes: `gib`, or by default most of the GPU's memory
    (`GPU_MEMORY_SHARE`), `CPU_MEMORY_GIB` on a CPU."""
    if gib > 0:
        return int(gib * 2**30)
    if device.type == "cuda":
        return int(GPU_MEMORY_SHARE * torch.cuda.get_device_properties(device).total_memory)
    return int(CPU_MEMORY_GIB * 2**30)


def _timer(device: torch.device) -> Callable[[Callable[[], object]], float]:
    """Seconds one call of a function takes on `device` (CUDA events on a GPU)."""
    def timed(fn: Callable[[], object]) -> float:
        if device.type != "cuda":
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    return timed


def spin(device: torch.device, seconds: float) -> dict:
    """Keep the device busy with matmuls for `seconds` (a GPU's clocks idle low and rise under
    load); the rate reached, in TFLOP/s."""
    if seconds <= 0:
        return {"seconds": 0.0, "tflops": None}
    n, dtype = (8192, torch.float16) if device.type == "cuda" else (256, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    timed, t0, flops, busy = _timer(device), time.perf_counter(), 0.0, 0.0
    while time.perf_counter() - t0 < seconds:
        busy += timed(lambda: [a @ a for _ in range(10)])
        flops += 10 * 2 * n**3
    return {"seconds": round(time.perf_counter() - t0, 3), "tflops": flops / busy / 1e12}


def copy_bandwidth(device: torch.device, mib: int) -> dict:
    """A device copy of `mib` MiB: read and written bytes per second (GB/s), the median and the
    best of `COPY_RUNS` after two untimed."""
    size = mib * 2**20
    seconds = _copy_seconds(device, size)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the two buffers, freed on return
    rates = [2 * size / s / 1e9 for s in seconds]
    return {"bytes": size, "gbps": float(np.median(rates)), "best_gbps": float(max(rates))}


def _copy_seconds(device: torch.device, size: int) -> list[float]:
    src = torch.ones(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    timed = _timer(device)
    return [timed(lambda: dst.copy_(src)) for _ in range(COPY_RUNS + 2)][2:]

"""The machine a pass ran on, and FBGEMM's harness figures there: what tells two VMs apart.

Two 2-core VMs of the same kind can differ eightfold in FBGEMM's row-wise Adagrad backward.
`machine_facts` records what FBGEMM's CPU dispatch looks at (the CPU, its flags, the ISA its
rule picks, the FBGEMM, OpenMP and glibc malloc settings in force); `harness_figures` times
the profile's harness configuration (one TBE of equal tables) and the memory figures that
explain a slow one: minor page faults per backward, a copy into touched memory and the first
touch of fresh memory.

What FBGEMM's CPU backward does (fbgemm_gpu 1.8, read from its source):
- every call converts each table's lookups to a CSC (`csr2csc`): about eight buffers of
  `lookups` ints per table from `posix_memalign`, freed again; whether glibc's defaults hand
  their pages back (and the next call faults them in afresh) depends on the heap's history;
- row-wise Adagrad runs two JIT kernels per block of 64 touched rows: FBGEMM's SpMDM gather
  (AVX-512 where `fbgemmInstructionSet` says so) and its row-wise Adagrad (always the AVX2
  generator, with scalar legacy-SSE `movss`/`addss`/`divss`/`sqrtss` per row and no
  `vzeroupper`); EXACT_SGD runs a compiled loop instead. Their cost follows the touched rows.

The eightfold is that Adagrad kernel meeting a CPU that charges for legacy SSE after 256-bit AVX:
each row mixes its 256-bit sums with about seven legacy-SSE scalar instructions while the
registers' upper halves are dirty. `sse_after_avx_ns` times one such instruction against the
same one after a `vzeroupper`. On the slow VMs (AMD EPYC Zen 3 under KVM) it is about 105 ns,
and the kernel switches from AVX to legacy SSE three times per row (after its horizontal add,
its extract and its broadcast): 3 x 105 = 315 ns, the row-wise Adagrad backward's excess over
SGD's there ((150 - 29) ms over 384,597 touched rows; 390 ns per touched row in all). The fast
VMs (AMD EPYC Zen 4) spend 48 ns per touched row in all (18 ms), which leaves no room for it;
their figure is recorded by the next run there. It is real: training with FBGEMM's CPU row-wise
Adagrad on such a machine pays it too, so the study measures it as it comes and records the
figure beside the others.

`python -m autoshard.measure.harness` prints both as one JSON line. Importing this module
imports neither torch nor FBGEMM.
"""

from __future__ import annotations

import json
import mmap
import os
import resource
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autoshard.core.digest import cpu_model

CPU_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
FBGEMM_ISAS = {"AVX2": "avx2", "AVX512": "avx512", "AVX512_E1": "avx512_vnni", "AVX512_256": "avx512_ymm",
               "AVX512_E1_256": "avx512_vnni_ymm"}  # FBGEMM_ENABLE_INSTRUCTIONS' values (FBGEMM src/Utils.cc)
SETTINGS = ("FBGEMM_ENABLE_INSTRUCTIONS", "FBGEMM_ENABLE_AVX512_256", "FBGEMM_NO_ASMJIT", "OMP_NUM_THREADS",
            "OMP_WAIT_POLICY", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_",
            "MALLOC_ARENA_MAX")
PAGE = resource.getpagesize()
CSC_ARRAYS = 8  # lookup-sized int32/float buffers `csr2csc` allocates per table and call (FBGEMM 1.8)
# glibc thresholds that keep freed buffers in the heap: blocks below the mmap threshold come from
# the heap (glibc's starts at 128 KiB; a CSC buffer at 65,536 lookups is 256 KiB), and up to the
# trim threshold of free heap top stays mapped; larger blocks are still mapped and returned alone.
MALLOC_KEEP = {"MALLOC_MMAP_THRESHOLD_": 256 << 20, "MALLOC_TRIM_THRESHOLD_": 512 << 20, "MALLOC_TOP_PAD_": 64 << 20}
MALLOPT = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_TOP_PAD_": -2, "MALLOC_MMAP_THRESHOLD_": -3}  # glibc malloc.h
_kept = False  # set once `keep_freed_memory` succeeded in this process


@dataclass(frozen=True)
class MachineFacts:
    """What FBGEMM's CPU dispatch and the measurements depend on, read from this machine."""

    cpu_model: str  # /proc/cpuinfo "model name"
    cpu_flags: dict[str, bool]  # each of CPU_FLAGS: present or not
    fbgemm_isa: str  # what FBGEMM's `fbgemmInstructionSet` rule picks from those flags and the settings
    adagrad_backward_path: str  # the kernels row-wise Adagrad's CPU backward runs with that ISA
    malloc_kept: bool  # freed memory kept in the heap (`keep_freed_memory` ran, or its environment)
    torch_threads: int
    torch_capability: str  # ATen's own vector ISA (torch.backends.cpu.get_cpu_capability)
    settings: dict[str, str]  # each of SETTINGS that is set in this process's environment


@dataclass(frozen=True)
class HarnessConfig:
    """One TBE of `tables` equal tables on the CPU: the profile's harness configuration."""

    tables: int = 8
    rows: int = 100_000
    dim: int = 32
    lookups: int = 16  # per bag
    batch: int = 4096
    threads: int = 1
    repetitions: int = 5  # timed calls after two warm-up calls; figures are medians
    memory_mib: int = 64  # size of the copy and first-touch buffers


@dataclass(frozen=True)
class HarnessFigures:
    """FBGEMM's harness figures on this machine (ms are medians over the repetitions)."""

    forward_ms: float
    backward_rowwise_adagrad_ms: float
    backward_sgd_ms: float
    minor_faults_per_backward: float  # row-wise Adagrad; each is one fresh 4 KiB page
    fresh_mib_per_backward: float  # minor faults x page size
    touched_rows_per_backward: int  # distinct rows over all tables: what the Adagrad kernels' work follows
    adagrad_ns_per_touched_row: float  # backward_rowwise_adagrad_ms per touched row
    copy_gb_s: float  # into a buffer already touched
    first_touch_gb_s: float  # writing freshly mapped memory: page faults included
    sse_after_avx_ns: float | None = None  # `sse_after_avx_ns()`; None where it cannot run
    config: HarnessConfig = field(default_factory=HarnessConfig)


def cpu_flags(cpuinfo: str) -> dict[str, bool]:
    """Each of CPU_FLAGS: listed in the first "flags" line of a /proc/cpuinfo text or not."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            present = set(value.split())
            return {name: name in present for name in CPU_FLAGS}
    return dict.fromkeys(CPU_FLAGS, False)


def fbgemm_isa(flags: dict[str, bool], environ: dict[str, str]) -> str:
    """The ISA FBGEMM's `fbgemmInstructionSet` picks (FBGEMM src/Utils.cc): avx512_vnni, avx512 or
    avx2 by the flags; FBGEMM_ENABLE_INSTRUCTIONS forces a lower one the CPU supports. (The
    `_ymm` variants with FBGEMM_ENABLE_AVX512_256 also need cpuinfo's package count, not read
    here.) Its embedding kernels are AVX-512 JIT code for avx512*, AVX2 JIT code otherwise."""
    avx512 = all(flags.get(f, False) for f in ("avx512f", "avx512bw", "avx512dq", "avx512vl"))
    detected = ("avx512_vnni" if flags.get("avx512_vnni") else "avx512" if avx512
                else "avx2" if flags.get("avx2") else "anyarch")
    forced = FBGEMM_ISAS.get(environ.get("FBGEMM_ENABLE_INSTRUCTIONS", "").upper())
    allowed = {"avx512_vnni": {"avx512_vnni", "avx512_vnni_ymm", "avx512", "avx512_ymm", "avx2"},
               "avx512": {"avx512", "avx512_ymm", "avx2"}, "avx2": {"avx2"}}.get(detected, set())
    return forced if forced in allowed else detected


def adagrad_backward_path(isa: str, environ: dict[str, str]) -> str:
    """The kernels row-wise Adagrad's CPU backward runs (fbgemm_gpu's backward template): the
    SpMDM gradient gather, AVX-512 JIT code where `isa` is a zmm one, AVX2 JIT code otherwise and
    a C++ fallback under FBGEMM_NO_ASMJIT; then the row-wise Adagrad update, always AVX2 JIT code
    (with legacy-SSE scalar steps) on an AVX2 machine."""
    if isa == "anyarch":
        return "spmdm:reference+adagrad:reference"
    gather = "reference" if "FBGEMM_NO_ASMJIT" in environ else "avx512-jit" if isa in ("avx512", "avx512_vnni") \
        else "avx2-jit"
    return f"spmdm:{gather}+adagrad:avx2-jit"


def _cpuinfo() -> str:
    path = Path("/proc/cpuinfo")
    return path.read_text() if path.exists() else ""


def machine_facts() -> MachineFacts:
    """This machine's facts (reads /proc/cpuinfo; imports torch for its threads)."""
    import torch

    flags = cpu_flags(_cpuinfo())
    environ = dict(os.environ)
    isa = fbgemm_isa(flags, environ)
    kept = _kept or all(environ.get(k) == v for k, v in measuring_environment().items())
    return MachineFacts(cpu_model=cpu_model(), cpu_flags=flags, fbgemm_isa=isa,
                        adagrad_backward_path=adagrad_backward_path(isa, environ), malloc_kept=kept,
                        torch_threads=torch.get_num_threads(),
                        torch_capability=torch.backends.cpu.get_cpu_capability(),
                        settings={k: environ[k] for k in SETTINGS if k in environ})


def measuring_environment() -> dict[str, str]:
    """glibc settings that keep freed memory in the process, for a measuring process's
    environment: with them FBGEMM's per-call CSC buffers are reused instead of faulted in
    afresh on every backward (glibc reads them at start; `keep_freed_memory` sets the same in
    a running process)."""
    return {name: str(value) for name, value in MALLOC_KEEP.items()}


def keep_freed_memory() -> bool:
    """Set `measuring_environment`'s glibc thresholds in this running process (mallopt); False
    where the C library is not glibc. A buffer freed after this stays in the heap for the next
    call; the mmap threshold set here also stops glibc from moving it as it does by default."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    global _kept
    _kept = all([mallopt(MALLOPT[name], value) == 1 for name, value in MALLOC_KEEP.items()])
    return _kept


def csc_pages(config: HarnessConfig) -> int:
    """Pages of the CSC buffers one backward allocates (`CSC_ARRAYS` of 4-byte entries per
    lookup, per table): the fresh pages a backward faults in where glibc returned them all."""
    return config.tables * CSC_ARRAYS * config.batch * config.lookups * 4 // PAGE


def _operator(config: HarnessConfig, optimizer: str):
    """A CPU TBE of the config's tables with `optimizer` fused into its backward."""
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    specs = [(config.rows, config.dim, EmbeddingLocation.HOST, ComputeDevice.CPU)] * config.tables
    return SplitTableBatchedEmbeddingBagsCodegen(
        specs, optimizer=EmbOptimType[optimizer], pooling_mode=PoolingMode.SUM, weights_precision=SparseType.FP32,
        learning_rate=0.01, device=torch.device("cpu"))


def _time_steps(config: HarnessConfig, optimizer: str) -> tuple[list[float], list[float], list[int]]:
    """Forward ms, backward ms and minor faults of each timed call (uniform lookups, fresh
    each call, as the profile's rotating feeds)."""
    import torch

    g = torch.Generator().manual_seed(0)
    op = _operator(config, optimizer)
    n = config.tables * config.batch * config.lookups
    offsets = torch.arange(0, n + 1, config.lookups, dtype=torch.int64)
    grad = torch.randn(config.batch, config.tables * config.dim, generator=g)
    forward, backward, faults = [], [], []
    for call in range(2 + config.repetitions):
        indices = torch.randint(0, config.rows, (n,), generator=g, dtype=torch.int64)
        t0 = time.perf_counter()
        out = op(indices, offsets)
        t1 = time.perf_counter()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t2 = time.perf_counter()
        out.backward(grad)
        t3 = time.perf_counter()
        after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        if call >= 2:
            forward.append((t1 - t0) * 1e3)
            backward.append((t3 - t2) * 1e3)
            faults.append(after - before)
    return forward, backward, faults


def copy_gb_s(mib: int) -> float:
    """GB/s written by copying `mib` MiB into a buffer touched before (best of three)."""
    import torch

    src = torch.ones(mib << 20, dtype=torch.uint8)
    dst = torch.zeros_like(src)
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(3))
    return src.numel() / best / 1e9


def first_touch_gb_s(mib: int) -> float:
    """GB/s of writing `mib` MiB of freshly mapped anonymous memory: each 4 KiB page's first
    write is a minor page fault, which is what a freed-and-returned buffer costs again."""
    import torch

    size = mib << 20
    best = float("inf")
    for _ in range(3):
        with mmap.mmap(-1, size) as fresh:
            view = torch.frombuffer(fresh, dtype=torch.uint8)
            best = min(best, _timed(lambda v=view: v.fill_(1)))
            del view
    return size / best / 1e9


# x86-64 machine code for `_sse_loop`: vaddps ymm3, ymm2, ymm2 (dirties ymm3's upper half),
# vzeroupper, addss xmm4, xmm1 (legacy SSE), dec rdi, jnz (rel8), ret.
VADDPS, VZEROUPPER, ADDSS = bytes.fromhex("c5ec58da"), bytes.fromhex("c5f877"), bytes.fromhex("f30f58e1")
DEC_RDI, JNZ, RET = bytes.fromhex("48ffcf"), 0x75, b"\xc3"


def _sse_loop(clean: bool) -> bytes:
    """A loop of `rdi` iterations, each a 256-bit AVX add then a legacy-SSE scalar add (with a
    `vzeroupper` between them where `clean`); it ends with a `vzeroupper` so the caller's state
    is clean again."""
    body = VADDPS + (VZEROUPPER if clean else b"") + ADDSS + DEC_RDI
    return body + bytes([JNZ, -(len(body) + 2) & 0xFF]) + VZEROUPPER + RET


def _loop_ns(code: bytes, iterations: int) -> float:
    import ctypes

    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    run = ctypes.CFUNCTYPE(None, ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
    best = min(_timed(lambda: run(iterations)) for _ in range(5))
    return best / iterations * 1e9


def sse_after_avx_ns(iterations: int = 200_000) -> float | None:
    """What one legacy-SSE scalar instruction costs after a 256-bit AVX write with the upper
    halves dirty, over the same after a `vzeroupper` (ns, best of five): the penalty FBGEMM's
    row-wise Adagrad kernel pays several times per touched row. None off x86-64 Linux with AVX,
    or where the system refuses an executable mapping."""
    if os.uname().machine != "x86_64" or not cpu_flags(_cpuinfo()).get("avx2"):
        return None
    try:
        return round(_loop_ns(_sse_loop(clean=False), iterations) - _loop_ns(_sse_loop(clean=True), iterations), 1)
    except (OSError, ValueError, AttributeError):
        return None


def _ms(times: list[float]) -> float:
    return round(statistics.median(times), 3)


def _timed(work) -> float:
    t0 = time.perf_counter()
    work()
    return time.perf_counter() - t0


def touched_rows(config: HarnessConfig) -> int:
    """Distinct rows the backward updates, summed over tables, for uniform lookups: the expected
    number, rows x (1 - (1 - 1/rows)^(batch x lookups)) per table."""
    draws = config.batch * config.lookups
    return round(config.tables * config.rows * (1 - (1 - 1 / config.rows) ** draws))


def harness_figures(config: HarnessConfig | None = None) -> HarnessFigures:
    """FBGEMM's harness figures at `config` (the defaults: about 2 s on a fast 2-core VM)."""
    import torch

    config = config or HarnessConfig()
    before = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        forward, adagrad, faults = _time_steps(config, "EXACT_ROWWISE_ADAGRAD")
        _, sgd, _ = _time_steps(config, "EXACT_SGD")
    finally:
        torch.set_num_threads(before)
    fault_median = float(statistics.median(faults))
    return HarnessFigures(
        forward_ms=_ms(forward), backward_rowwise_adagrad_ms=_ms(adagrad), backward_sgd_ms=_ms(sgd),
        minor_faults_per_backward=fault_median, fresh_mib_per_backward=round(fault_median * PAGE / 2**20, 2),
        touched_rows_per_backward=touched_rows(config),
        adagrad_ns_per_touched_row=round(_ms(adagrad) * 1e6 / touched_rows(config), 1),
        copy_gb_s=round(copy_gb_s(config.memory_mib), 2),
        first_touch_gb_s=round(first_touch_gb_s(config.memory_mib), 2),
        sse_after_avx_ns=sse_after_avx_ns(), config=config)


def fresh(env: dict[str, str] | None = None) -> dict:
    """`main`'s JSON line (the machine's facts and the harness figures) from a fresh process with
    glibc's default heap: the kept heap's settings taken out of this environment, `env` added.
    The one way a figure every machine can give is measured."""
    import subprocess
    import sys

    default_heap = {k: v for k, v in os.environ.items() if k not in MALLOC_KEEP}
    out = subprocess.run([sys.executable, "-m", "autoshard.measure.harness"], capture_output=True, text=True,
                         check=True, env=default_heap | (env or {})).stdout
    return json.loads(out.strip().splitlines()[-1])


def calibration() -> dict[str, HarnessFigures]:
    """The harness figures at the default configuration twice: in a fresh process with glibc's
    default heap (`default`, as a plain FBGEMM program runs) and in this one with freed memory
    kept (`kept`, as the study's fbgemm backend measures): the machine's speed, and what the heap
    does to it."""
    keep_freed_memory()
    kept = harness_figures()
    default = fresh()["harness"]
    default["config"] = HarnessConfig(**default["config"])
    return {"default": HarnessFigures(**default), "kept": kept}


def main() -> None:
    """Print this machine's facts and harness figures as one JSON line."""
    facts = machine_facts()
    print(json.dumps({"machine": asdict(facts), "harness": asdict(harness_figures())}))


if __name__ == "__main__":
    main()

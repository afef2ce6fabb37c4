"""The machine's facts and FBGEMM's harness figures (`measure.harness`): what they say must be
this machine and this configuration, and keeping freed memory must stop the backward's faults."""

import json
import math
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from autoshard.measure import harness
from autoshard.measure.harness import CPU_FLAGS, HarnessConfig, csc_pages, fbgemm_isa, machine_facts

pytest.importorskip("fbgemm_gpu")
CPUINFO = Path("/proc/cpuinfo")
# 65,536 lookups per table: each CSC buffer is 256 KiB, above glibc's default 128 KiB mmap
# threshold, so a default heap may hand them back; 2 small tables keep the run short
SMALL = HarnessConfig(tables=2, rows=10_000, dim=16, lookups=16, batch=4096, repetitions=4, memory_mib=8)


@pytest.mark.skipif(not CPUINFO.exists(), reason="needs /proc/cpuinfo")
def test_facts_name_this_cpu_and_its_flags():
    text = CPUINFO.read_text()
    model = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name"))
    first_flags = set(next(line for line in text.splitlines() if line.startswith("flags")).split(":", 1)[1].split())
    facts = machine_facts()
    assert facts.cpu_model == model
    assert facts.cpu_flags == {name: name in first_flags for name in CPU_FLAGS}
    assert json.loads(json.dumps(asdict(facts)))["cpu_model"] == model


def test_fbgemm_isa_follows_its_rule():
    avx512 = {"avx2": True, "avx512f": True, "avx512bw": True, "avx512dq": True, "avx512vl": True}
    assert fbgemm_isa(avx512 | {"avx512_vnni": True}, {}) == "avx512_vnni"
    assert fbgemm_isa(avx512, {}) == "avx512"
    assert fbgemm_isa(avx512 | {"avx512dq": False}, {}) == "avx2"  # FBGEMM needs all four for AVX-512
    assert fbgemm_isa(avx512, {"FBGEMM_ENABLE_INSTRUCTIONS": "avx2"}) == "avx2"  # forced down: allowed
    assert fbgemm_isa({"avx2": True}, {"FBGEMM_ENABLE_INSTRUCTIONS": "AVX512"}) == "avx2"  # forced up: ignored
    assert fbgemm_isa({}, {}) == "anyarch"


def test_backward_path_names_the_gather_the_isa_picks():
    assert harness.adagrad_backward_path("avx512_vnni", {}) == "spmdm:avx512-jit+adagrad:avx2-jit"
    assert harness.adagrad_backward_path("avx2", {}) == "spmdm:avx2-jit+adagrad:avx2-jit"
    assert harness.adagrad_backward_path("avx512", {"FBGEMM_NO_ASMJIT": "1"}).startswith("spmdm:reference")


def test_figures_echo_their_configuration():
    figures = harness.harness_figures(SMALL)
    assert figures.config == SMALL
    assert json.loads(json.dumps(asdict(figures)))["config"] == asdict(SMALL)
    assert figures.fresh_mib_per_backward == pytest.approx(figures.minor_faults_per_backward * harness.PAGE / 2**20,
                                                           abs=0.01)


def test_touched_rows_is_the_expected_distinct_count():
    # all of a small table is touched, a large one about once per lookup
    assert harness.touched_rows(HarnessConfig(tables=2, rows=10, batch=4096)) == 20
    assert harness.touched_rows(HarnessConfig(tables=1, rows=10**9, batch=64, lookups=1)) == 64
    config = HarnessConfig()  # 65,536 uniform lookups into 100,000 rows: 48,070 distinct per table
    assert harness.touched_rows(config) == pytest.approx(8 * 100_000 * (1 - math.exp(-0.65536)), rel=1e-4)


def test_measuring_environment_is_what_keep_freed_memory_sets():
    assert harness.measuring_environment() == {name: str(v) for name, v in harness.MALLOC_KEEP.items()}
    # a CSC buffer of the profile's largest batches stays below the mmap threshold: it is kept
    assert harness.MALLOC_KEEP["MALLOC_MMAP_THRESHOLD_"] > 65_536 * 64 * 4


KEPT = f"""
import json
from autoshard.measure import harness
assert harness.keep_freed_memory() and harness.machine_facts().malloc_kept
config = harness.HarnessConfig(**{json.dumps(asdict(SMALL))})
print(json.dumps(harness.harness_figures(config).minor_faults_per_backward))
"""


def test_kept_memory_stops_the_backward_faulting_in_its_buffers():
    # A backward's only lookup-sized allocations are its CSC buffers (csc_pages: 1,024 pages here);
    # kept in the heap, a warm backward reuses them and faults in only a few odd pages (64-97 on
    # an AMD EPYC VM, against 286-325 with glibc's defaults): fewer than a quarter of them. With
    # the other core busy one run once counted 261, so the fewest of three runs is held to it: the
    # default heap's count is above the bound in every run, a busy neighbour's only in some
    assert csc_pages(SMALL) == 2 * 8 * 65_536 * 4 // harness.PAGE
    counts = []
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", KEPT], capture_output=True, text=True, timeout=120, check=True)
        counts.append(json.loads(done.stdout.strip().splitlines()[-1]))
        if counts[-1] < csc_pages(SMALL) / 4:
            break
    assert min(counts) < csc_pages(SMALL) / 4, counts


def test_fresh_runs_the_default_heap_with_only_the_added_switches(monkeypatch):
    for name, value in harness.measuring_environment().items():
        monkeypatch.setenv(name, value)  # as a kept-heap parent (the profile stage) has them
    line = harness.fresh({"FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"})
    assert line["machine"]["malloc_kept"] is False
    assert {k: v for k, v in line["machine"]["settings"].items() if k.startswith(("MALLOC", "FBGEMM"))} == \
        {"FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}
    assert line["machine"]["fbgemm_isa"] == "avx2"
    assert line["harness"]["backward_rowwise_adagrad_ms"] > 0


X86_AVX2 = harness.os.uname().machine == "x86_64" and harness.cpu_flags(harness._cpuinfo()).get("avx2", False)


@pytest.mark.skipif(not X86_AVX2, reason="the probe's machine code is x86-64 with AVX")
def test_the_sse_loop_runs_as_many_iterations_as_asked():
    # a wrong jump offset would run the body once (or never return): ten times the iterations
    # must take several times as long, per iteration about the same
    code = harness._sse_loop(clean=True)
    assert code.endswith(harness.VZEROUPPER + harness.RET)
    short, long = harness._loop_ns(code, 100_000), harness._loop_ns(code, 1_000_000)
    assert 0.2 < long / short < 5  # ns per iteration: the same loop either way
    assert short * 100_000 > 1e3  # 100,000 iterations take more than a microsecond


@pytest.mark.skipif(not X86_AVX2, reason="the probe's machine code is x86-64 with AVX")
def test_the_penalty_is_the_dirty_loop_over_the_clean_one():
    dirty = harness._loop_ns(harness._sse_loop(clean=False), 200_000)
    clean = harness._loop_ns(harness._sse_loop(clean=True), 200_000)
    penalty = harness.sse_after_avx_ns()
    assert isinstance(penalty, float)
    assert dirty > 0.5 * clean  # the dirty loop does the clean one's work less a vzeroupper
    assert penalty == pytest.approx(dirty - clean, abs=max(5.0, 0.3 * abs(dirty - clean)))


def test_the_penalty_is_none_off_x86(monkeypatch):
    monkeypatch.setattr(harness.os, "uname", lambda: harness.os.uname_result(("Linux", "h", "6", "1", "aarch64")))
    assert harness.sse_after_avx_ns() is None

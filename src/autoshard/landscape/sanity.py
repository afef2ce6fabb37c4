"""The GPU landscape's sanity figures, from its rows: can these numbers be trusted, and what do
they say at first sight?

- repeatability: the reference shard, measured again and again through the run (CV of its cost);
- bytes moved per second: each forward's least traffic over its time, against the device copy;
- fusion: a prefix's cost over the sum of its tables' single costs, per prefix size;
- batch scaling: the reference shard's cost against the batch (slope, and the cost ratio over
  the batch ratio: 1 is linear, below 1 a fixed part);
- the two backends: `torch` over `torch_fused`, shard by shard.

A figure that has no rows to stand on is None (a run cut short by its budget).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import numpy as np

FUSED, PER_TABLE = "torch_fused", "torch"


def _total(row: dict) -> float:
    return row["forward_ms"] + row["backward_ms"]


def _median(values: Iterable[float]) -> float | None:
    values = list(values)
    return float(np.median(values)) if values else None


def _ok(rows: list[dict], backend: str) -> list[dict]:
    return [r for r in rows if r["backend"] == backend and r["status"] == "ok"]


def repeatability(rows: list[dict]) -> dict | None:
    """The most measured shard (the reference): how often, its mean total cost and CV."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(tuple(sorted(r["tables"])), r["batch_size"])].append(r)
    if not groups:
        return None
    key = max(groups, key=lambda k: (len(groups[k]), len(k[0])))
    out = {"tables": len(key[0]), "batch_size": key[1]}
    for backend in (FUSED, PER_TABLE):
        costs = [_total(r) for r in _ok(groups[key], backend)]
        cv = float(np.std(costs, ddof=1) / np.mean(costs)) if len(costs) > 1 else None
        out[backend] = {"n": len(costs), "mean_ms": float(np.mean(costs)) if costs else None, "cv": cv}
    return out


def bandwidth(rows: list[dict], copy_gbps: float) -> dict:
    """Per backend: forward bytes per second (GB/s) of the largest prefixes (median) and of any
    shard (max), and that max over the device copy's rate."""
    out = {}
    for backend in (FUSED, PER_TABLE):
        ok = _ok(rows, backend)
        rates = [r["forward_bytes"] / r["forward_ms"] / 1e6 for r in ok if r["forward_ms"] > 0]
        prefixes = [r for r in ok if r["kind"] == "prefix" and r["forward_ms"] > 0]
        widest = max((len(r["tables"]) for r in prefixes), default=0)
        largest = [r["forward_bytes"] / r["forward_ms"] / 1e6 for r in prefixes if len(r["tables"]) == widest]
        top = max(rates, default=None)
        out[backend] = {"largest_prefix_gbps": _median(largest), "max_gbps": top,
                        "max_over_copy": top / copy_gbps if top is not None and copy_gbps > 0 else None}
    return out


def fusion(rows: list[dict]) -> dict:
    """Per backend and prefix size: the prefix's cost over the sum of its tables' single costs
    (total, forward, backward), the median over the orders whose singles were all measured."""
    out = {}
    for backend in (FUSED, PER_TABLE):
        ok = _ok(rows, backend)
        single = {r["tables"][0]: r for r in ok if r["kind"] == "single"}
        ratios: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
        for r in (r for r in ok if r["kind"] == "prefix"):
            if all(t in single for t in r["tables"]):
                parts = [single[t] for t in r["tables"]]
                ratios[len(r["tables"])].append((
                    _total(r) / sum(_total(p) for p in parts),
                    r["forward_ms"] / sum(p["forward_ms"] for p in parts),
                    r["backward_ms"] / sum(p["backward_ms"] for p in parts)))
        out[backend] = {str(k): {"orders": len(v), "total": _median(x[0] for x in v),
                                 "forward": _median(x[1] for x in v), "backward": _median(x[2] for x in v)}
                        for k, v in sorted(ratios.items())}
    return out


def batch_scaling(rows: list[dict]) -> dict:
    """Per backend: the reference shard's total cost per batch, the least-squares slope (ms per
    1,000 bags) and intercept, and the cost ratio over the batch ratio (largest over smallest)."""
    out = {}
    for backend in (FUSED, PER_TABLE):
        by_batch = sorted((r["batch_size"], _total(r)) for r in _ok(rows, backend) if r["kind"] == "batch")
        if len(by_batch) < 2:
            out[backend] = None
            continue
        b, ms = (np.array(x, dtype=float) for x in zip(*by_batch, strict=True))
        slope, intercept = np.polyfit(b / 1000, ms, 1)
        out[backend] = {"batches": b.astype(int).tolist(), "total_ms": ms.tolist(), "ms_per_kbag": float(slope),
                        "intercept_ms": float(intercept), "linearity": float((ms[-1] / ms[0]) / (b[-1] / b[0]))}
    return out


def backend_ratio(rows: list[dict]) -> dict:
    """`torch` over `torch_fused` total cost, item by item: the median, overall and per kind."""
    pairs: dict[int, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        if r["status"] == "ok":
            pairs[r["item"]][r["backend"]] = r
    both = [(p[FUSED]["kind"], _total(p[PER_TABLE]) / _total(p[FUSED])) for p in pairs.values()
            if FUSED in p and PER_TABLE in p and _total(p[FUSED]) > 0]
    kinds = sorted({k for k, _ in both})
    return {"median": _median(v for _, v in both), "by_kind": {k: _median(v for j, v in both if j == k) for k in kinds}}


def summarize(head: dict, rows: list[dict], state: dict) -> dict:
    """The summary document: the device, how the run went, and the sanity figures."""
    device = head["device"]
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "too_large", "error")}
    copy = head["copy"]["gbps"]
    return {"format": head["format"], "device": {k: device.get(k) for k in (
                "type", "name", "l2_bytes", "llc_bytes", "memory_bytes", "torch", "cuda")},
            "run": state | {"rows": counts}, "spin_tflops": head["spin"]["tflops"], "copy_gbps": copy,
            "repeatability": repeatability(rows), "bandwidth": bandwidth(rows, copy), "fusion": fusion(rows),
            "batch_scaling": batch_scaling(rows), "torch_over_fused": backend_ratio(rows)}


def _f(value: float | None, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def summary_lines(s: dict) -> list[str]:
    """The summary as a few lines to print."""
    d, run = s["device"], s["run"]
    cache = d.get("l2_bytes") or d.get("llc_bytes") or 0
    lines = [f"{d['name']} ({'L2' if d['type'] == 'cuda' else 'LLC'} {cache / 2**20:.1f} MiB), torch {d['torch']}"
             + (f" (CUDA {d['cuda']})" if d.get("cuda") else ""),
             f"warm-up {_f(s['spin_tflops'])} TFLOP/s; device copy {s['copy_gbps']:.1f} GB/s",
             f"items {run['measured']} of {run['planned']} ({run['skipped']} skipped, stopped: {run['stopped']}), "
             f"rows {run['rows']}, {run['elapsed_s']:.1f} s"]
    rep = s["repeatability"]
    if rep:
        lines.append(f"repeatability ({rep['tables']} tables, batch {rep['batch_size']}): " + "; ".join(
            f"{b} n={rep[b]['n']} CV {_f(rep[b]['cv'], '.2%')}" for b in (FUSED, PER_TABLE)))
    lines.append("forward GB/s (largest prefix median / max / max over copy): " + "; ".join(
        f"{b} {_f(v['largest_prefix_gbps'], '.1f')} / {_f(v['max_gbps'], '.1f')} / {_f(v['max_over_copy'], '.2f')}"
        for b, v in s["bandwidth"].items()))
    for b, sizes in s["fusion"].items():
        lines.append(f"{b} prefix / sum of singles (total): "
                     + " ".join(f"{k}:{_f(v['total'], '.2f')}" for k, v in sizes.items()))
    for b, v in s["batch_scaling"].items():
        if v:
            lines.append(f"{b} batch {v['batches'][0]}..{v['batches'][-1]}: {_f(v['ms_per_kbag'])} ms per 1k bags, "
                         f"intercept {_f(v['intercept_ms'])} ms, linearity {_f(v['linearity'], '.2f')}")
    ratio = s["torch_over_fused"]
    lines.append(f"torch / torch_fused: median {_f(ratio['median'], '.2f')} ("
                 + ", ".join(f"{k} {_f(v, '.2f')}" for k, v in ratio["by_kind"].items()) + ")")
    return lines

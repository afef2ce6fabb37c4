"""Content digests for cache keys: a cache entry is reused only when everything that made it
is the same, so every key is the SHA-256 of the things themselves, never of their names.

`value_digest` hashes parameters (anything JSON can write), `array_digest` arrays,
`file_digest` files, `table_digests` each table of a pool (its features and its trace),
`source_digest` the package source a computation runs (the static import closure of the
modules named), and `machine` the hardware and library versions a measurement ran on.
"""

from __future__ import annotations

import ast
import hashlib
import json
import platform
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # numpy only at run time: the portable worker imports this module
    import pandas as pd

PACKAGE = "autoshard"
PACKAGE_DIR = Path(__file__).resolve().parents[1]
KEY_LENGTH = 16  # hex characters of a folder key


def value_digest(*parts) -> str:
    """SHA-256 of `parts` written as canonical JSON (sorted keys; other objects by `str`)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def array_digest(*arrays: np.ndarray) -> str:
    """SHA-256 of arrays: dtype, shape and bytes of each."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def file_digest(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def key(*digests_and_values) -> str:
    """A short folder name for a cache entry made of these digests and values."""
    return value_digest(*digests_and_values)[:KEY_LENGTH]


def table_digests(features: pd.DataFrame, indices: np.ndarray, offsets: np.ndarray, batch_size: int
                  ) -> list[str]:
    """Per table (row `t` of `features`, bags `t * batch_size ...` of the trace): the SHA-256
    of its feature values and of its bag lengths and indices."""
    columns = list(features.columns)
    out = []
    for t, row in enumerate(features.itertuples(index=False)):
        start, end = int(offsets[t * batch_size]), int(offsets[(t + 1) * batch_size])
        lengths = np.diff(offsets[t * batch_size:(t + 1) * batch_size + 1])
        h = hashlib.sha256(json.dumps([columns, list(row)], default=str).encode())
        h.update(array_digest(lengths.astype(np.int64), indices[start:end]).encode())
        out.append(h.hexdigest())
    return out


def _module_files(dotted: str) -> list[Path]:
    """Files of `autoshard.<dotted>`: the package `__init__`s on its path and the module itself."""
    parts = dotted.split(".")[1:]
    files = [PACKAGE_DIR / "__init__.py"]
    here = PACKAGE_DIR
    for i, part in enumerate(parts):
        here = here / part
        if here.is_dir():
            files.append(here / "__init__.py")
        elif i == len(parts) - 1 and here.with_suffix(".py").is_file():
            files.append(here.with_suffix(".py"))
        else:
            return []
    return [f for f in files if f.is_file()]


def _imports(path: Path, dotted: str) -> set[str]:
    """Dotted `autoshard.*` names the module imports anywhere (also inside functions);
    `from autoshard.x import y` yields both `autoshard.x` and `autoshard.x.y` (y may be a module)."""
    package = dotted if path.name == "__init__.py" else dotted.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
    return {m for m in out if m == PACKAGE or m.startswith(PACKAGE + ".")}


def source_files(modules: Iterable[str]) -> list[Path]:
    """Every package source file the `modules` (dotted names) import, directly or not."""
    todo, seen, files = list(modules), set(), set()
    for dotted in todo:
        if not _module_files(dotted)[1:] and dotted != PACKAGE:
            raise ValueError(f"{dotted}: no such module in {PACKAGE_DIR}")
    while todo:
        dotted = todo.pop()
        if dotted in seen:
            continue
        seen.add(dotted)
        for f in _module_files(dotted):
            if f not in files:
                files.add(f)
                owner = ".".join([PACKAGE, *f.relative_to(PACKAGE_DIR).with_suffix("").parts])
                todo += sorted(_imports(f, owner.removesuffix(".__init__")))
    return sorted(files)


def source_digest(*modules: str) -> str:
    """SHA-256 of the package source on the code path of `modules`: their static import closure
    (each file's path in the package and its bytes)."""
    h = hashlib.sha256()
    for f in source_files(modules):
        h.update(f.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0")
        h.update(f.read_bytes() + b"\0")
    return h.hexdigest()


def _version(*distributions: str) -> str:
    for name in distributions:
        try:
            return f"{name}=={metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return "absent"


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: str = "cpu") -> dict:
    """What a measurement depends on besides its inputs: platform, CPU model (and the GPU's on
    `cuda`) and the versions of the libraries that run the kernels."""
    gpu = "none"
    if device.startswith("cuda"):
        import torch

        gpu = torch.cuda.get_device_name()
    return {"gpu": gpu, "system": platform.system(), "machine": platform.machine(), "cpu": cpu_model(),
            "python": platform.python_version(), "numpy": _version("numpy"), "torch": _version("torch"),
            "fbgemm_gpu": _version("fbgemm-gpu", "fbgemm-gpu-cpu", "fbgemm-gpu-nightly",
                                   "fbgemm-gpu-nightly-cpu", "fbgemm-gpu-genai")}

"""Build a cost backend from the `profile` parameters."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch

from autoshard.core.digest import machine, source_digest, value_digest
from autoshard.core.errors import invalid
from autoshard.core.params import Fields, choice, read
from autoshard.measure.analytic import AnalyticBackend
from autoshard.measure.base import CostBackend
from autoshard.measure.fbgemm import OPTIMIZERS, FbgemmBackend
from autoshard.measure.names import BACKENDS, DEVICES
from autoshard.measure.timing import TimingConfig
from autoshard.measure.torch_bag import TorchBackend
from autoshard.measure.torch_fused import TorchFusedBackend

if TYPE_CHECKING:  # only a type here: the portable worker (no pandas) imports this module
    from autoshard.data.pool import Pool


@dataclass(frozen=True)
class BackendConfig:
    """How shards are measured: backend, device, batch, threads and the timing protocol."""

    backend: str = choice(BACKENDS)
    device: str
    optimizer: str = choice(OPTIMIZERS)
    batch_size: int
    threads: int
    timing: TimingConfig
    memory_limit_bytes: int

    @classmethod
    def from_fields(cls, f: Fields, timing: TimingConfig) -> BackendConfig:
        """The backend settings of a section (`profile`, a job's `backend`) with `timing`: its
        `device` resolved here, its memory limit given in GiB."""
        device = resolve_device(f.text("device", DEVICES), f.name("device"))
        memory_limit_bytes = int(f.number("memory_limit_gib", lo=0, lo_open=True) * 2**30)
        return read(cls, f, device=device, timing=timing, memory_limit_bytes=memory_limit_bytes)


# what a stored measurement depends on: the backends and what they import, and the interleaved
# rounds that also write each record's drift and attempts
MEASURING_CODE = (__name__, "autoshard.measure.interleaved")


def measurement_key(cfg: BackendConfig, pool: Pool, tables) -> str:
    """What any measurement of `tables` depends on: the tables' features and traces, the
    backend settings (backend, device, batch, threads, timing, memory limit), the measuring
    code (the `costs` package and what it imports), the libraries and the machine."""
    return value_digest(pool.digest(sorted({int(t) for t in tables})), asdict(cfg),
                        source_digest(*MEASURING_CODE), machine(cfg.device))


def resolve_device(device: str, field: str = "profile.device") -> str:
    """`auto` becomes `cuda` when a CUDA GPU is present, else `cpu`; `cuda` needs a GPU."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise invalid(field, device, "no CUDA GPU is available on this machine")
    return device


def make_backend(pool: Pool, cfg: BackendConfig) -> CostBackend:
    """The backend named by `cfg.backend`, on `cfg.device`."""
    device = torch.device(cfg.device)
    if cfg.backend == "fbgemm":
        return FbgemmBackend(pool, device, cfg.optimizer, cfg.timing, cfg.memory_limit_bytes, cfg.threads)
    if cfg.backend == "torch_fused":
        return TorchFusedBackend(pool, device, cfg.timing, cfg.memory_limit_bytes, cfg.threads, cfg.optimizer)
    if cfg.backend == "torch":
        return TorchBackend(pool, device, cfg.timing, cfg.memory_limit_bytes, cfg.threads, cfg.optimizer)
    if cfg.backend == "analytic":
        return AnalyticBackend(pool, cfg.device)
    raise invalid("profile.backend", cfg.backend, f"expected one of {', '.join(BACKENDS)}")

"""Where independent jobs run: a local process pool or a Ray cluster, behind one `Engine`.

A job is one call `fn(job)` of a module-level function on a picklable argument (a training run,
a chunk of shards to measure). Every engine returns the results in job order and each job
seeds itself, so what a stage computes does not depend on the engine that ran it. Checkpoints
and stores are written by the jobs to paths they are given, so a run started on one engine can
finish on the other (a Ray cluster then needs the same shared folder on every node).
"""

from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing import get_context
from typing import Protocol, TypeVar

from tqdm.auto import tqdm

from autoshard.core.errors import ConfigError, invalid
from autoshard.core.params import Section, bounded, choice

ENGINES = ("local", "ray")
J = TypeVar("J")
R = TypeVar("R")


class Engine(Protocol):
    """Runs `fn` on every job, independently, and returns the results in job order."""

    def map(self, fn: Callable[[J], R], jobs: Sequence[J], progress: str | None = None) -> list[R]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ComputeConfig(Section):
    """The `compute` section: the engine, the local engine's processes (a local Ray instance's
    CPUs), the Ray cluster's address (null: start a local instance), GPUs per Ray job, and how
    many measuring jobs run at a time (1 in params.yaml: measurements running side by side on a
    small machine contend for its cores and caches and time each other)."""

    section = "compute"
    engine: str = choice(ENGINES)
    workers: int
    address: str | None
    gpus_per_job: float = bounded(lo=0)
    measure_workers: int

    def __post_init__(self):
        if self.engine == "local" and self.address is not None:
            raise invalid("compute.address", self.address, "a cluster address needs compute.engine: ray")
        if self.engine == "local" and self.gpus_per_job:
            raise invalid("compute.gpus_per_job", self.gpus_per_job,
                          "GPUs are requested per job only with compute.engine: ray")


def _shown(results: Iterable[R], total: int, progress: str | None) -> Iterator[R]:
    return iter(tqdm(results, total=total, desc=progress)) if progress else iter(results)


class LocalEngine:
    """`workers` spawned processes on this machine, or this process when `workers` is 1."""

    def __init__(self, workers: int = 1):
        if workers < 1:
            raise invalid("compute.workers", workers, "must be at least 1")
        self.workers = workers

    def map(self, fn: Callable[[J], R], jobs: Sequence[J], progress: str | None = None) -> list[R]:
        if self.workers == 1:
            return list(_shown(map(fn, jobs), len(jobs), progress))
        with ProcessPoolExecutor(max_workers=min(self.workers, len(jobs)), mp_context=get_context("spawn")) as pool:
            futures = [pool.submit(fn, job) for job in jobs]
            return [f.result() for f in _shown(futures, len(futures), progress)]

    def close(self) -> None:
        """Nothing to release: each `map` has its own pool."""


def _call(fn: Callable[[J], R], job: J) -> R:
    return fn(job)


class RayEngine:
    """Ray tasks, one per job, each asking for one CPU and `gpus_per_job` GPUs: on the cluster
    at `address`, or on a local instance of `num_cpus` CPUs started here (and shut down by
    `close`). The nodes need this package importable (the same environment)."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None, gpus_per_job: float = 0):
        try:
            import ray
        except ImportError:
            raise ConfigError("compute.engine: ray (Ray is not installed: pip install ray==2.52.0)") from None
        self._ray = ray
        self._started = not ray.is_initialized()
        if self._started:
            local = {"num_cpus": num_cpus, "include_dashboard": False} if address is None else {}
            ray.init(address=address, log_to_driver=False, **local)
        self._task = ray.remote(num_cpus=1, num_gpus=gpus_per_job)(_call)

    def map(self, fn: Callable[[J], R], jobs: Sequence[J], progress: str | None = None) -> list[R]:
        refs = [self._task.remote(fn, job) for job in jobs]
        return [self._ray.get(ref) for ref in _shown(refs, len(refs), progress)]

    def close(self) -> None:
        """Shut Ray down if this engine started it."""
        if self._started and self._ray.is_initialized():
            self._ray.shutdown()


def make_engine(cfg: ComputeConfig) -> Engine:
    """The engine `cfg` names (a Ray engine without an address starts a local instance of
    `workers` CPUs)."""
    if cfg.engine == "ray":
        return RayEngine(cfg.address, cfg.workers if cfg.address is None else None, cfg.gpus_per_job)
    return LocalEngine(cfg.workers)


def measuring_engine(cfg: ComputeConfig) -> Engine | None:
    """The engine for measuring jobs, with `measure_workers` workers; None (measure in this
    process, on the stage's own backend) for the local engine with one worker."""
    if cfg.engine == "local" and cfg.measure_workers == 1:
        return None
    return make_engine(replace(cfg, workers=cfg.measure_workers))

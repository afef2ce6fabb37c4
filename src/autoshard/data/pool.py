"""The table pool of the study: features and traces, from the synthesizer or the real dataset."""

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from autoshard.core.atomic import atomic_dir
from autoshard.core.digest import table_digests, value_digest
from autoshard.core.errors import ConfigError, invalid
from autoshard.core.params import Section, choice
from autoshard.core.seeding import rng
from autoshard.data.features import table_features
from autoshard.data.synth import PoolConfig, synthesize
from autoshard.data.traces import Traces, load_dlrm, load_traces, save_traces

SOURCES = ("synthetic", "dlrm")


@dataclass
class Pool:
    """Per-table features (one row per table, `table` = position in the traces) and traces,
    both read-only once built (their digests are computed once)."""

    features: pd.DataFrame
    traces: Traces
    meta: dict = field(default_factory=dict)
    _digests: list[str] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def num_tables(self) -> int:
        return len(self.features)

    def table_digests(self) -> list[str]:
        """Per table: the SHA-256 of its features and its trace (what a measurement of it depends on)."""
        if self._digests is None:
            t = self.traces
            self._digests = table_digests(self.features, t.indices, t.offsets, t.batch_size)
        return self._digests

    def digest(self, tables=None) -> str:
        """The SHA-256 of the digests of `tables` (default: every table), in order."""
        own = self.table_digests()
        return value_digest([own[int(t)] for t in tables] if tables is not None else own)


@dataclass(frozen=True)
class DatasetConfig(Section):
    """The `dataset` section: where the pool comes from."""

    section = "dataset"
    source: str = choice(SOURCES)
    path: str


def build_pool(dataset: dict, pool: dict, seed: int, progress: bool = True) -> Pool:
    """Build the pool named by the `dataset` and `pool` parameter sections."""
    data_cfg = DatasetConfig.from_params(dataset)
    cfg = PoolConfig.from_params(pool)
    if data_cfg.source == "synthetic":
        specs, traces = synthesize(cfg, seed, progress=progress)
        rows, dims = specs.rows, specs.dims
        truth = {"zipf_alpha": specs.alphas, "pooling_factor_drawn": specs.pooling_factors}
    else:
        traces, rows, dims = _real_pool(data_cfg.path, cfg, seed)
        truth = {}
    features = table_features(traces, rows, dims, cfg.weight_bytes)
    for name, values in truth.items():
        features[name] = values
    meta = {"source": data_cfg.source, "seed": seed, "num_tables": traces.num_tables,
            "batch_size": traces.batch_size, "weight_bytes": cfg.weight_bytes,
            "num_indices": int(traces.indices.size)}
    if data_cfg.source == "dlrm":
        meta["path"] = data_cfg.path
    return Pool(features=features, traces=traces, meta=meta)


def _real_pool(path: str, cfg: PoolConfig, seed: int) -> tuple[Traces, np.ndarray, np.ndarray]:
    """The first `num_tables` tables and `batch_size` bags of the dataset file.

    Hash sizes are the largest index + 1 (the file stores none); tables larger than
    `pool.rows_max` are hashed down (index mod rows_max) so shards fit this machine;
    dims are drawn from `pool.dims` as AutoShard does.
    """
    full = load_dlrm(path)
    if cfg.num_tables > full.num_tables:
        raise invalid("pool.num_tables", cfg.num_tables,
                      f"the dataset {path} has only {full.num_tables} tables")
    if cfg.batch_size > full.batch_size:
        raise invalid("pool.batch_size", cfg.batch_size,
                      f"the dataset {path} holds only {full.batch_size} bags per table")
    b = full.batch_size
    head = Traces(indices=full.indices[:int(full.offsets[cfg.num_tables * b])],
                  offsets=full.offsets[:cfg.num_tables * b + 1],
                  lengths=full.lengths[:cfg.num_tables]).head(cfg.batch_size)
    indices = head.indices.astype(np.int64) % cfg.rows_max
    rows = np.array([max(1, int(head.table(t).max(initial=-1)) + 1) for t in range(head.num_tables)])
    rows = np.minimum(rows, cfg.rows_max)
    traces = Traces(indices=indices, offsets=head.offsets, lengths=head.lengths)
    dims = rng(seed, "pool", "dims").choice(np.array(cfg.dims), size=traces.num_tables)
    return traces, rows, dims


def save_pool(pool: Pool, folder: str | Path) -> None:
    """Write the pool (features parquet, traces, meta) all at once."""
    with atomic_dir(folder) as tmp:
        pool.features.to_parquet(tmp / "tables.parquet", index=False)
        save_traces(tmp / "traces", pool.traces)
        (tmp / "meta.json").write_text(json.dumps(pool.meta, indent=2) + "\n")


def load_pool(folder: str | Path, mmap: bool = True) -> Pool:
    """Load a pool written by `save_pool`; traces are memory-mapped by default."""
    folder = Path(folder)
    if not (folder / "tables.parquet").is_file():
        raise ConfigError(f"{folder}: no pool here (run `dvc repro synthesize`)")
    features = pd.read_parquet(folder / "tables.parquet")
    traces = load_traces(folder / "traces", mmap=mmap)
    if len(features) != traces.num_tables:
        raise ConfigError(f"{folder}: {len(features)} feature rows but traces of "
                          f"{traces.num_tables} tables")
    meta = json.loads((folder / "meta.json").read_text())
    return Pool(features=features, traces=traces, meta=meta)

"""The wide pool: tables whose dims, hash sizes and pooling factors span those of real models.

AutoShard's pool draws its dims from {16, 32}; real models use dims from 4 to 2048, and a cost
model fitted on the first says little about the second (issue 30). The wide pool is a second,
smaller pool, drawn like the main one (`data.synth`: log-normal hash sizes and pooling factors,
gamma-Poisson bag lengths, Zipf skew) from the `pool` section with the `wide` section's
overrides, from random streams of its own (so the main pool and its tasks stay as they were). A
table's hash size is cut so that it holds at most `table_mib_max` (weights and optimizer state:
dims to 1024 on a CPU); its tables are split into a train and a test half like the main pool's.
The profile measures shards of each half and the cost_model stage fits and tests a model on them
(`cost_model.json`'s `wide`).
"""

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from autoshard.core.atomic import atomic_file
from autoshard.core.errors import ConfigError, invalid
from autoshard.core.params import Section, bounded
from autoshard.data.features import table_features
from autoshard.data.pool import Pool, load_pool, save_pool
from autoshard.data.sizes import table_bytes
from autoshard.data.synth import PoolConfig, synthesize
from autoshard.data.tasks import split_pool

STREAM = "wide"  # the random streams' prefix, beside the main pool's "pool"


@dataclass(frozen=True)
class WideConfig(Section):
    """The `wide` section of params.yaml."""

    section = "wide"
    tables: int = bounded(lo=2)
    dims: tuple[int, ...]
    rows_median: int
    rows_sigma: float = bounded(lo=0)
    rows_max: int
    table_mib_max: float = bounded(lo=0, lo_open=True)
    pooling_factor_mean: float = bounded(lo=0, lo_open=True)
    pooling_factor_sigma: float = bounded(lo=0)
    pooling_factor_max: float = bounded(lo=0, lo_open=True)
    train_share: float = bounded(lo=0, hi=1, lo_open=True)
    random_shards: int = bounded(lo=0)       # random shards of train tables the profile measures ...
    test_random_shards: int = bounded(lo=0)  # ... and of test tables (the unseen-table test set)
    shard_tables: int = bounded(lo=1)        # a random shard's size is log-uniform in [1, this]

    def __post_init__(self):
        for i, d in enumerate(self.dims):
            if d % 4:
                raise invalid(f"wide.dims[{i}]", d, "not a multiple of 4, which the TBE kernel needs")
        if self.pooling_factor_mean > self.pooling_factor_max:
            raise invalid("wide.pooling_factor_mean", self.pooling_factor_mean,
                          f"above wide.pooling_factor_max = {self.pooling_factor_max}")

    def pool_config(self, pool: dict) -> PoolConfig:
        """The `pool` section's generator with this section's tables, dims, hash sizes and pooling."""
        base = PoolConfig.from_params(pool)
        return replace(base, num_tables=self.tables, dims=tuple(self.dims), rows_median=self.rows_median,
                       rows_sigma=self.rows_sigma, rows_min=min(base.rows_min, self.rows_max),
                       rows_max=self.rows_max, pooling_factor_mean=self.pooling_factor_mean,
                       pooling_factor_sigma=self.pooling_factor_sigma, pooling_factor_max=self.pooling_factor_max)


def build_wide(pool: dict, wide: dict, seed: int, progress: bool = True) -> tuple[Pool, np.ndarray, np.ndarray]:
    """The wide pool (its own streams, hash sizes cut to `table_mib_max`) and its train and test tables."""
    cfg = WideConfig.from_params(wide)
    gen = cfg.pool_config(pool)
    specs, traces = synthesize(gen, seed, progress=progress, stream=STREAM, rows_cap=_rows_cap(cfg, gen))
    features = table_features(traces, specs.rows, specs.dims, gen.weight_bytes)
    features["zipf_alpha"], features["pooling_factor_drawn"] = specs.alphas, specs.pooling_factors
    meta = {"source": "synthetic", "stream": STREAM, "seed": seed, "num_tables": traces.num_tables,
            "batch_size": traces.batch_size, "weight_bytes": gen.weight_bytes, "num_indices": int(traces.indices.size)}
    train, test = split_pool(cfg.tables, cfg.train_share, seed, stream=STREAM)
    return Pool(features=features, traces=traces, meta=meta), train, test


def _rows_cap(cfg: WideConfig, gen: PoolConfig):
    """Per dim, the most rows a table may have: `rows_max`, and at most `table_mib_max` held (its
    weights and optimizer state: `sizes.table_bytes`)."""
    def cap(dim: np.ndarray) -> np.ndarray:
        fits = np.floor(cfg.table_mib_max * 2**20 / table_bytes(1, dim, gen.weight_bytes)).astype(np.int64)
        return np.maximum(np.minimum(fits, gen.rows_max), 1)
    return cap


def save_wide(folder: str | Path, pool: Pool, train: np.ndarray, test: np.ndarray) -> None:
    """The pool (`save_pool`) under `folder`/pool and its split as `folder`/split.json."""
    folder = Path(folder)
    save_pool(pool, folder / "pool")
    with atomic_file(folder / "split.json") as tmp:
        tmp.write_text(json.dumps({"train_tables": train.tolist(), "test_tables": test.tolist()}) + "\n")


def load_wide(folder: str | Path) -> tuple[Pool, np.ndarray, np.ndarray]:
    """The wide pool written by `save_wide`, with its train and test tables."""
    folder = Path(folder)
    pool = load_pool(folder / "pool")
    try:
        split = json.loads((folder / "split.json").read_text())
        return pool, np.array(split["train_tables"]), np.array(split["test_tables"])
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise ConfigError(f"{folder / 'split.json'}: no wide split here ({exc.__class__.__name__}; run "
                          "`dvc repro synthesize`)") from None

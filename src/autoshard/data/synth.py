"""Synthetic table pools shaped like the open DLRM dataset, with index traces in its layout.

Per table: a hash size (log-normal rows), a dim, a mean pooling factor (log-normal across
tables, rescaled so the pool's mean matches the published ~15.8 lookups per bag), per-bag
lengths (gamma-Poisson, so empty bags occur), and Zipf-like index skew (some tables near
uniform). Each table draws from its own seeded stream.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from autoshard.core.errors import invalid
from autoshard.core.params import Section, bounded
from autoshard.core.seeding import rng
from autoshard.data.traces import Traces, from_lengths


@dataclass(frozen=True)
class PoolConfig(Section):
    """The `pool` section of params.yaml."""

    section = "pool"
    num_tables: int
    batch_size: int
    dims: tuple[int, ...]
    weight_bytes: int
    rows_median: int
    rows_sigma: float = bounded(lo=0)
    rows_min: int
    rows_max: int = bounded(hi=2**31 - 1)
    pooling_factor_mean: float = bounded(lo=0, lo_open=True)
    pooling_factor_sigma: float = bounded(lo=0)
    pooling_factor_max: float = bounded(lo=0, lo_open=True)
    bag_dispersion: float = bounded(lo=0, lo_open=True)
    uniform_share: float = bounded(lo=0, hi=1)
    uniform_alpha_max: float = bounded(lo=0)
    zipf_alpha_min: float = bounded(lo=0)
    zipf_alpha_max: float = bounded(lo=0)

    def __post_init__(self):
        for i, d in enumerate(self.dims):
            if d % 4:
                raise invalid(f"pool.dims[{i}]", d, "not a multiple of 4, which the TBE kernel needs")
        if self.rows_min > self.rows_max:
            raise invalid("pool.rows_min", self.rows_min, f"above pool.rows_max = {self.rows_max}")
        if self.zipf_alpha_min > self.zipf_alpha_max:
            raise invalid("pool.zipf_alpha_min", self.zipf_alpha_min,
                          f"above pool.zipf_alpha_max = {self.zipf_alpha_max}")
        if self.pooling_factor_mean > self.pooling_factor_max:
            raise invalid("pool.pooling_factor_mean", self.pooling_factor_mean,
                          f"above pool.pooling_factor_max = {self.pooling_factor_max}")


@dataclass
class TableSpecs:
    """The generator's per-table draws (ground truth the features are measured against)."""

    rows: np.ndarray
    dims: np.ndarray
    pooling_factors: np.ndarray
    alphas: np.ndarray


def draw_specs(cfg: PoolConfig, seed: int, stream: str = "pool",
               rows_cap: Callable[[np.ndarray], np.ndarray] | None = None) -> TableSpecs:
    """Draw every table's hash size, dim, mean pooling factor and skew from the random streams
    named `stream`; `rows_cap(dims)` bounds each table's hash size by its dim."""
    g = rng(seed, stream, "specs")
    n = cfg.num_tables
    rows = np.exp(g.normal(np.log(cfg.rows_median), cfg.rows_sigma, n))
    rows = np.clip(np.rint(rows), cfg.rows_min, cfg.rows_max).astype(np.int64)
    dims = g.choice(np.array(cfg.dims, dtype=np.int64), size=n)
    if rows_cap is not None:
        rows = np.minimum(rows, rows_cap(dims))
    pooling = _pooling_factors(g, n, cfg)
    uniform = g.random(n) < cfg.uniform_share
    alphas = np.where(uniform, g.uniform(0.0, cfg.uniform_alpha_max, n),
                      g.uniform(cfg.zipf_alpha_min, cfg.zipf_alpha_max, n))
    return TableSpecs(rows=rows, dims=dims, pooling_factors=pooling, alphas=alphas)


def _pooling_factors(g: np.random.Generator, n: int, cfg: PoolConfig) -> np.ndarray:
    """Log-normal mean pooling factors, capped, rescaled until the pool mean hits the target."""
    pf = np.exp(g.normal(0.0, cfg.pooling_factor_sigma, n))
    for _ in range(50):
        pf = np.minimum(pf * (cfg.pooling_factor_mean / pf.mean()), cfg.pooling_factor_max)
        if abs(pf.mean() / cfg.pooling_factor_mean - 1) < 1e-9:
            break
    return pf


def zipf_ranks(g: np.random.Generator, size: int, rows: int, alpha: float) -> np.ndarray:
    """Ranks in [0, rows) with P(rank r) roughly proportional to (r + 1) ** -alpha.

    Inverse-CDF sampling of a continuous power law on [1, rows + 1); alpha 0 is uniform.
    """
    u = g.random(size)
    n1 = rows + 1.0
    if abs(alpha - 1.0) < 1e-9:
        x = n1 ** u
    else:
        e = 1.0 - alpha
        x = (1.0 + u * (n1 ** e - 1.0)) ** (1.0 / e)
    return np.clip(np.floor(x).astype(np.int64) - 1, 0, rows - 1)


def scatter(g: np.random.Generator, ranks: np.ndarray, rows: int) -> np.ndarray:
    """Map popularity ranks to row ids by a random affine bijection, so hot rows are spread."""
    if rows == 1:
        return ranks
    while True:
        mult = int(g.integers(1, rows))
        if np.gcd(mult, rows) == 1:
            break
    shift = int(g.integers(0, rows))
    return (ranks * mult + shift) % rows


def bag_trace(g: np.random.Generator, rows: int, pooling_factor: float, alpha: float, batch_size: int,
              dispersion: float) -> tuple[np.ndarray, np.ndarray]:
    """The one trace generator (pool and `autoshard` command): per-bag lengths, gamma-Poisson
    with mean `pooling_factor` and shape `dispersion`, and flat indices, Zipf(`alpha`) ranks
    scattered over `rows`."""
    lengths = g.poisson(g.gamma(dispersion, pooling_factor / dispersion, batch_size)).astype(np.int64)
    ranks = zipf_ranks(g, int(lengths.sum()), rows, alpha)
    dtype = np.int32 if rows < np.iinfo(np.int32).max else np.int64
    return lengths, scatter(g, ranks, rows).astype(dtype)


def table_trace(cfg: PoolConfig, specs: TableSpecs, table: int, seed: int, stream: str = "pool"
                ) -> tuple[np.ndarray, np.ndarray]:
    """One table's per-bag lengths and flat indices for a batch of `cfg.batch_size` bags."""
    return bag_trace(rng(seed, stream, "trace", table), int(specs.rows[table]), specs.pooling_factors[table],
                     float(specs.alphas[table]), cfg.batch_size, cfg.bag_dispersion)


def synthesize(cfg: PoolConfig, seed: int, progress: bool = True, stream: str = "pool",
               rows_cap: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[TableSpecs, Traces]:
    """Draw the pool and generate its traces, table-major as in the DLRM dataset (`stream` and
    `rows_cap` as `draw_specs` takes them)."""
    from tqdm.auto import tqdm  # here: the portable worker regenerates traces (`table_trace`) without tqdm

    specs = draw_specs(cfg, seed, stream, rows_cap)
    lengths = np.empty((cfg.num_tables, cfg.batch_size), dtype=np.int64)
    parts = []
    for t in tqdm(range(cfg.num_tables), desc="synthesize traces", disable=not progress):
        lengths[t], idx = table_trace(cfg, specs, t, seed, stream)
        parts.append(idx)
    traces = from_lengths(np.concatenate(parts), lengths)
    traces.validate("synthetic pool")
    return specs, traces

"""The reuse histogram a table's synthetic trace would have, computed without the trace.

`synth.bag_trace` draws `lookups` indices whose popularity ranks follow a continuous power law
on [1, rows + 1) (`synth.zipf_ranks`: rank r has probability F(r + 2) - F(r + 1)), scattered over
the rows by a bijection, which leaves the access counts as they are. Rank r is then accessed
Binomial(lookups, p_r) times, close to Poisson(lookups * p_r), and the expected number of distinct
rows whose count falls in each of AutoShard's 17 bins (`features.reuse_histogram`) is a sum over
ranks of Poisson probabilities. The first ranks are summed one by one; the long tail in
geometric groups of ranks whose rates differ by a few percent, each group at its mean rate.
The histogram is the ratio of those expectations to the expected number of distinct rows: for
a table of 80 million rows it costs what a table of 100 rows does, and it agrees with the
histogram of a drawn trace to within the trace's own sampling noise (`tests/data/test_reuse.py`).
"""

from __future__ import annotations

import numpy as np

from autoshard.data.features import REUSE_BINS

EXACT_RANKS = 256     # ranks summed one by one
GROUP_GROWTH = 1.02   # the tail's groups: each this much wider than the last
RARE = 1e-3           # a rate below which a row's count is 0, 1 or 2 but for a share of 1e-6 at most


def rank_cdf(x: np.ndarray, rows: int, alpha: float) -> np.ndarray:
    """P(X < x) of `synth.zipf_ranks`' continuous power law on [1, rows + 1)."""
    n1 = rows + 1.0
    x = np.clip(x, 1.0, n1)
    if abs(alpha - 1.0) < 1e-9:
        return np.log(x) / np.log(n1)
    e = 1.0 - alpha
    return (x ** e - 1.0) / (n1 ** e - 1.0)


def rank_groups(rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(first rank, ranks) of each group: single ranks up to EXACT_RANKS, then geometric groups."""
    exact = np.arange(min(rows, EXACT_RANKS), dtype=np.int64)
    tail = np.empty(0, dtype=np.int64)
    if rows > EXACT_RANKS:
        count = int(np.ceil(np.log(rows / EXACT_RANKS) / np.log(GROUP_GROWTH))) + 1
        tail = np.geomspace(EXACT_RANKS, rows, count).astype(np.int64)
    first = np.unique(np.concatenate([exact, tail[tail < rows]]))
    return first, np.diff(np.append(first, rows))


def expected_histogram(rows: int, lookups: float, alpha: float) -> np.ndarray:
    """AutoShard's 17-bin reuse histogram expected of `lookups` draws over `rows` rows of skew
    `alpha` (see the module); zeros without lookups."""
    from scipy.special import pdtr  # P(Poisson(rate) <= k)

    if lookups <= 0:
        return np.zeros(REUSE_BINS)
    first, sizes = rank_groups(rows)
    mass = rank_cdf(first + sizes + 1.0, rows, alpha) - rank_cdf(first + 1.0, rows, alpha)
    if rows <= 1:
        mass = np.ones(1)
    rate = lookups * mass / sizes  # each group's ranks at their mean rate
    edges = np.array([1] + [2 ** k for k in range(1, REUSE_BINS - 1)], dtype=float)  # upper edges of bins 0..15
    none = np.exp(-rate)
    bins = np.zeros((len(rate), REUSE_BINS))
    rare = rate < RARE  # rows seen at most twice, but for a share below RARE**2: their first terms
    bins[rare, 0], bins[rare, 1] = rate[rare] * none[rare], rate[rare] ** 2 / 2 * none[rare]
    below = pdtr(edges[None, :], rate[~rare, None])  # P(count <= edge)
    bins[~rare] = np.diff(np.concatenate([none[~rare, None], below, np.ones((len(below), 1))], axis=1), axis=1)
    expected = (bins * sizes[:, None]).sum(axis=0)
    return expected / float(((1.0 - none) * sizes).sum())

"""The pool's aggregate statistics next to the published ones of the open DLRM dataset."""

from typing import NotRequired, TypedDict

import numpy as np
import pandas as pd

from autoshard.core.schema import StageTime
from autoshard.data.features import REUSE_COLUMNS
from autoshard.data.pool import Pool
from autoshard.data.tasks import Task


class WidePool(TypedDict):
    """The synthesize stage's wide pool: tables whose dims, hash sizes and pooling span real models'."""

    tables: int
    train_tables: int
    dims: list[int]
    rows: list[int]              # the smallest and largest hash size
    lookups_per_bag: list[float]  # the lowest and highest mean lookups per bag of a table
    largest_table_bytes: int


class Synthesis(StageTime):
    """reports/metrics/synthesize.json. Built by `data.calibration.synthesis_metrics`."""

    source: str
    tables: int
    batch_size: int
    indices: int
    distinct: int
    lookups_per_bag: float
    reuse_share: dict[str, float]
    reuse_l1_to_published: float
    pool_bytes: int
    largest_table_bytes: int
    tasks: dict[str, int]
    wide: NotRequired[WidePool]  # the wide pool (data.wide)


# Published aggregates of fbgemm_t856_bs65536 (856 tables x 65536 bags); see DESIGN.md.
PUBLISHED = {
    "tables": 856,
    "batch_size": 65536,
    "indices": 887_017_990,
    "distinct": 128_435_723,
    "reuse_share": {"(0,1]": 0.473, "(1,2]": 0.152, "(2,4]": 0.139, "(4,8]": 0.112,
                    "(8,16]": 0.072},
}
REUSE_GROUPS = [*PUBLISHED["reuse_share"], ">16"]


def reuse_shares(features: pd.DataFrame) -> np.ndarray:
    """Share of all distinct (table, index) pairs in each reuse group of REUSE_GROUPS."""
    counts = features[REUSE_COLUMNS].to_numpy() * features["distinct"].to_numpy()[:, None]
    share = counts.sum(axis=0) / max(1, features["distinct"].sum())
    return np.append(share[:5], share[5:].sum())


def published_reuse_shares() -> np.ndarray:
    head = np.array(list(PUBLISHED["reuse_share"].values()))
    return np.append(head, 1.0 - head.sum())


def compare_with_published(features: pd.DataFrame, batch_size: int) -> pd.DataFrame:
    """Side-by-side table: the pool's aggregates against the published dataset's."""
    pub = PUBLISHED
    rows = [
        ("tables", len(features), pub["tables"]),
        ("bags per table (batch)", batch_size, pub["batch_size"]),
        ("indices", int(features["lookups"].sum()), pub["indices"]),
        ("distinct (table, index) pairs", int(features["distinct"].sum()), pub["distinct"]),
        ("lookups per bag", features["lookups"].sum() / (len(features) * batch_size),
         pub["indices"] / (pub["tables"] * pub["batch_size"])),
        ("distinct / indices", features["distinct"].sum() / max(1, features["lookups"].sum()),
         pub["distinct"] / pub["indices"]),
    ]
    ours, theirs = reuse_shares(features), published_reuse_shares()
    rows += [(f"share of distinct indices accessed {g}", o, p)
             for g, o, p in zip(REUSE_GROUPS, ours, theirs, strict=True)]
    return pd.DataFrame(rows, columns=["statistic", "this pool", "published"])


def reuse_l1_distance(features: pd.DataFrame) -> float:
    """L1 distance between the pool's and the published reuse shares (0 = identical)."""
    return float(np.abs(reuse_shares(features) - published_reuse_shares()).sum())


def synthesis_metrics(pool: Pool, tasks: list[Task], seconds: float,
                      wide: tuple[Pool, np.ndarray] | None = None) -> Synthesis:
    """The synthesize stage's metrics: pool aggregates, calibration error, task counts and, with
    `wide` (the wide pool and its train tables), that pool's ranges."""
    f = pool.features
    counts: dict[str, int] = {}
    for t in tasks:
        key = f"{t.protocol}_{t.split}"
        counts[key] = counts.get(key, 0) + 1
    return {
        "source": pool.meta["source"],
        "tables": len(f),
        "batch_size": pool.traces.batch_size,
        "indices": int(f["lookups"].sum()),
        "distinct": int(f["distinct"].sum()),
        "lookups_per_bag": float(f["lookups"].sum() / (len(f) * pool.traces.batch_size)),
        "reuse_share": dict(zip(REUSE_GROUPS, reuse_shares(f).tolist(), strict=True)),
        "reuse_l1_to_published": reuse_l1_distance(f),
        "pool_bytes": int(f["size_bytes"].sum()),
        "largest_table_bytes": int(f["size_bytes"].max()),
        "tasks": counts,
        "seconds": seconds,
    } | ({"wide": wide_summary(*wide)} if wide is not None else {})


def wide_summary(pool: Pool, train_tables: np.ndarray) -> WidePool:
    """The wide pool's size and the ranges of its dims, hash sizes and lookups per bag."""
    f = pool.features
    per_bag = f["lookups"].to_numpy() / pool.traces.batch_size
    return {"tables": len(f), "train_tables": len(train_tables), "dims": sorted(int(d) for d in f["dim"].unique()),
            "rows": [int(f["rows"].min()), int(f["rows"].max())],
            "lookups_per_bag": [float(per_bag.min()), float(per_bag.max())],
            "largest_table_bytes": int(f["size_bytes"].max())}

"""From the profile table to the cost model's data: one row per distinct measured shard, split
into train / validation / seen-table test, plus an unseen-table test set (test-pool tables)."""

import numpy as np
import pandas as pd

from autoshard.core.errors import ConfigError
from autoshard.core.seeding import rng

REQUIRED = ("tables", "kind", "status", "backend", "forward_ms", "backward_ms", "total_ms")
COSTS = ["forward_ms", "backward_ms", "total_ms"]
SEEN_MULTI = "seen tables, multi-table shards"
UNSEEN_MULTI = "unseen tables, multi-table shards"


def measured_shards(profile: pd.DataFrame, backend: str) -> pd.DataFrame:
    """Distinct measured shards of `backend`: costs averaged over rounds, first kind kept."""
    missing = [c for c in REQUIRED if c not in profile.columns]
    if missing:
        raise ConfigError(f"profile table: missing columns {', '.join(missing)}")
    rows = profile[profile["backend"] == backend]
    if rows.empty:
        have = ", ".join(sorted(map(str, profile["backend"].unique()))) or "none"
        raise ConfigError(f"profile table: no rows for backend {backend!r} (it has: {have})")
    rows = rows[rows["status"] == "ok"]
    nan = rows[COSTS].isna().any(axis=1)
    if nan.any():
        bad = rows[nan].iloc[0]
        column = next(c for c in COSTS if pd.isna(bad[c]))
        raise ConfigError(f"profile table: NaN {column} for the measured shard of tables "
                          f"{list(bad['tables'])}")
    key = rows["tables"].map(lambda t: tuple(sorted(int(x) for x in t)))
    grouped = rows.assign(key=key).groupby("key", sort=False)
    out = grouped[COSTS].mean()
    out["kind"] = grouped["kind"].first()
    out["rounds"] = grouped.size()
    out = out.reset_index().rename(columns={"key": "tables"})
    out["num_tables"] = out["tables"].map(len)
    return out


def split_shards(shards: pd.DataFrame, train_tables: np.ndarray, test_tables: np.ndarray,
                 val_share: float, test_share: float, seed: int) -> dict[str, pd.DataFrame]:
    """`train`, `val`, `test_seen` (train-pool shards, split at random) and `test_unseen`
    (shards made only of test-pool tables). Shards that mix the pools are left out."""
    train_set, test_set = set(map(int, train_tables)), set(map(int, test_tables))
    seen = shards[shards["tables"].map(lambda t: set(t) <= train_set)]
    unseen = shards[shards["tables"].map(lambda t: set(t) <= test_set)]
    order = rng(seed, "cost_model", "split").permutation(len(seen))
    n_val, n_test = int(round(val_share * len(seen))), int(round(test_share * len(seen)))
    parts = {"val": order[:n_val], "test_seen": order[n_val:n_val + n_test],
             "train": order[n_val + n_test:]}
    out = {name: seen.iloc[np.sort(idx)].reset_index(drop=True) for name, idx in parts.items()}
    out["test_unseen"] = unseen.reset_index(drop=True)
    for name, part in out.items():
        if part.empty:
            raise ConfigError(f"cost model data: the {name} set is empty ({len(shards)} shards measured)")
    return out


def with_costs(split: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """`split` (rows of `measured_shards`) with each shard's costs taken from `other`, another
    measurement of the same shards (`measured_shards` of the profile's independent second pass)."""
    costs = other.set_index(other["tables"].map(tuple))[COSTS]
    keys = split["tables"].map(tuple)
    lacking = keys[~keys.isin(costs.index)]
    if len(lacking):
        raise ConfigError(f"remeasured profile: shard {list(lacking.iloc[0])} was not measured again "
                          f"({len(lacking)} of {len(split)} shards lack a second measurement)")
    return split.assign(**{c: costs.loc[list(keys), c].to_numpy() for c in COSTS})


def single_costs(shards: pd.DataFrame) -> pd.Series:
    """Measured cost (ms) of each table alone, indexed by table id."""
    singles = shards[shards["num_tables"] == 1]
    return pd.Series(singles["total_ms"].to_numpy(), index=[int(t[0]) for t in singles["tables"]])


def test_sets(splits: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The comparison's test sets: multi-table shards of seen and of unseen tables (what a
    planner compares), and unseen tables alone (the sum of single costs is exact there)."""
    def multi(s: pd.DataFrame) -> pd.DataFrame:
        return s[s["num_tables"] > 1].reset_index(drop=True)

    unseen = splits["test_unseen"]
    return {SEEN_MULTI: multi(splits["test_seen"]),
            UNSEEN_MULTI: multi(unseen),
            "unseen tables, single": unseen[unseen["num_tables"] == 1].reset_index(drop=True)}


def model_test_sets(splits: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The hybrid comparison's test sets: multi-table shards of seen and of unseen tables, and
    the unseen ones again by how they were drawn (`test_random`, `test_heuristic`: random
    shards and the devices of heuristic plans)."""
    sets = test_sets(splits)
    out = {SEEN_MULTI: sets[SEEN_MULTI], UNSEEN_MULTI: sets[UNSEEN_MULTI]}
    for kind, part in sets[UNSEEN_MULTI].groupby("kind", sort=True):
        out[f"{UNSEEN_MULTI} ({kind})"] = part.reset_index(drop=True)
    return out

"""Reading a user's own tables for the `autoshard` command: a CSV or YAML table list, or a pool
folder with traces, checked field by field, turned into the 21 features the models read.

Table lists have one row per table: `name, rows, dim, pooling_factor` and, optionally, an
index-skew `zipf_alpha` or the 17 reuse-histogram bins `reuse_bin_0..reuse_bin_16`. When the bins
are absent they are computed from a synthetic trace of the table, made by the pool's own
generator (`synth.bag_trace`): `trace_batch` bags whose lengths are gamma-Poisson around the
table's mean pooling factor (the pool's `bag_dispersion`), indices drawn from a Zipf law with
the table's `zipf_alpha` (default `DEFAULT_ZIPF_ALPHA`, a moderately skewed table) scattered over
its rows, seeded by the table's name. The same traces are what `autoshard score` measures.
"""

import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from autoshard.core.errors import ConfigError
from autoshard.data.features import REUSE_BINS, REUSE_COLUMNS, reuse_histogram
from autoshard.data.synth import bag_trace
from autoshard.data.traces import Traces, access_counts, from_lengths

REQUIRED = ("name", "rows", "dim", "pooling_factor")
BINS = tuple(f"reuse_bin_{i}" for i in range(REUSE_BINS))
OPTIONAL = ("zipf_alpha", *BINS)
DEFAULT_ZIPF_ALPHA = 1.05
DEFAULT_TRACE_BATCH = 2048  # the profile stage's batch: the cost model's features were measured so
DEFAULT_BAG_DISPERSION = 1.0  # params.yaml's pool.bag_dispersion: the pool the models learnt from


@dataclass
class UserTables:
    """The tables, in file order: `features` (FEATURE_COLUMNS, `size_bytes`, `name`) and, made
    when first asked for, index traces to measure them with."""

    features: pd.DataFrame
    source: str
    trace_batch: int = DEFAULT_TRACE_BATCH
    _traces: Traces | None = None

    @property
    def names(self) -> list[str]:
        return self.features["name"].tolist()

    @property
    def traces(self) -> Traces:
        """The tables' traces: the pool's, or synthetic ones (`table_trace`) for a table list."""
        if self._traces is None:
            f = self.features
            parts = [table_trace(n, int(r), float(pf), float(a), self.trace_batch)
                     for n, r, pf, a in zip(f["name"], f["rows"], f["pooling_factor"], f["zipf_alpha"], strict=True)]
            self._traces = from_lengths(np.concatenate([p[1] for p in parts]), np.stack([p[0] for p in parts]))
        return self._traces


def read_tables(path: str | Path, weight_bytes: int = 4, trace_batch: int = DEFAULT_TRACE_BATCH) -> UserTables:
    """The tables of a `.csv`, `.yaml`/`.yml` file or a pool folder (`data/pool` layout), checked."""
    path = Path(path)
    if path.is_dir():
        return _from_pool(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    raw = _read_rows(path)
    rows = _checked(raw, path)
    return _features(rows, path, weight_bytes, trace_batch)


def _read_rows(path: Path) -> pd.DataFrame:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (binary content)") from None
    if not text.strip():
        raise ConfigError(f"{path}: the file is empty")
    if "\x00" in text:
        raise ConfigError(f"{path}: not a text file (binary content)")
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
        doc = doc.get("tables") if isinstance(doc, dict) else doc
        if not isinstance(doc, list) or not all(isinstance(r, dict) for r in doc):
            raise ConfigError(f"{path}: expected a list of tables (mappings), or `tables:` holding one")
        return pd.DataFrame(doc, dtype=object)
    if path.suffix.lower() != ".csv":
        raise ConfigError(f"{path}: unknown table file type {path.suffix!r} (expected .csv, .yaml or a pool folder)")
    from io import StringIO

    try:
        return pd.read_csv(StringIO(text), dtype=str, skipinitialspace=True, keep_default_na=False)
    except pd.errors.ParserError as exc:
        raise ConfigError(f"{path}: not a valid CSV table ({str(exc).strip().splitlines()[-1]})") from None


def _checked(raw: pd.DataFrame, path: Path) -> pd.DataFrame:
    """Columns present and known, every value a valid number, names distinct."""
    columns = [str(c).strip() for c in raw.columns]
    raw.columns = columns
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise ConfigError(f"{path}: missing column {missing[0]!r} (needs {', '.join(REQUIRED)})")
    extra = [c for c in columns if c not in REQUIRED and c not in OPTIONAL]
    if extra:
        raise ConfigError(f"{path}: unknown column {extra[0]!r} (known: {', '.join(REQUIRED)}, zipf_alpha, "
                          f"reuse_bin_0..reuse_bin_{REUSE_BINS - 1})")
    bins = [c for c in BINS if c in columns]
    if bins and len(bins) != len(BINS):
        absent = next(c for c in BINS if c not in columns)
        raise ConfigError(f"{path}: missing column {absent!r} (give all {REUSE_BINS} reuse bins or none)")
    if raw.empty:
        raise ConfigError(f"{path}: no tables (the file has a header only)")
    names = raw["name"].map(lambda v: "" if v is None else str(v).strip())
    where = [f"{path}: row {i + 1}" + (f" ({n})" if n else "") for i, n in enumerate(names)]
    if (names == "").any():
        raise ConfigError(f"{where[int(np.flatnonzero(names == '')[0])]}, field name: empty")
    out = pd.DataFrame({"name": names})
    out["rows"] = _column(raw, "rows", where, lo=1, whole=True)
    out["dim"] = _column(raw, "dim", where, lo=1, whole=True)
    odd = np.flatnonzero(out["dim"].to_numpy() % 4)
    if len(odd):
        i = int(odd[0])
        raise ConfigError(f"{where[i]}, field dim: {out['dim'].iloc[i]} (not a multiple of 4, which FBGEMM's "
                          "kernels need)")
    out["pooling_factor"] = _column(raw, "pooling_factor", where, lo=0)
    out["zipf_alpha"] = DEFAULT_ZIPF_ALPHA
    if "zipf_alpha" in raw:
        given = raw["zipf_alpha"].map(lambda v: v is not None and str(v).strip() not in ("", "nan"))
        alpha = _column(raw[given], "zipf_alpha", [w for w, g in zip(where, given, strict=True) if g], lo=0)
        out.loc[given.to_numpy(), "zipf_alpha"] = alpha
    if bins:
        values = np.stack([_column(raw, c, where, lo=0) for c in BINS], axis=1)
        off = np.flatnonzero(~np.isclose(values.sum(axis=1), 1.0, atol=1e-3))
        if len(off):
            i = int(off[0])
            raise ConfigError(f"{where[i]}, fields reuse_bin_*: they sum to {values[i].sum():.4f} (shares: expected 1)")
        out[REUSE_COLUMNS] = values
    duplicated = np.flatnonzero(out["name"].duplicated().to_numpy())
    if len(duplicated):
        i = int(duplicated[0])
        raise ConfigError(f"{path}: row {i + 1}, field name: {out['name'].iloc[i]!r} (a duplicate table name)")
    return out


def _column(raw: pd.DataFrame, column: str, where: list[str], lo: float, whole: bool = False) -> np.ndarray:
    """One column as numbers; the first value that is not a finite number >= `lo` (and whole,
    if asked) is an error naming its row and field."""
    text = raw[column].map(lambda v: "" if v is None or isinstance(v, bool) else str(v).strip())
    numbers = pd.to_numeric(text, errors="coerce").to_numpy(dtype=float)
    checks = [(~np.isfinite(numbers), "not a number"), (numbers < lo, f"must be at least {lo}")]
    if whole:
        checks.append((np.isfinite(numbers) & (numbers != np.round(numbers)), "expected a whole number"))
    for bad, why in checks:
        hits = np.flatnonzero(bad)
        if len(hits):
            i = int(hits[0])
            raise ConfigError(f"{where[i]}, field {column}: {raw[column].iloc[i]!r} ({why})")
    return numbers.astype(np.int64) if whole else numbers


def table_trace(name: str, rows: int, pooling_factor: float, alpha: float, batch: int,
                dispersion: float = DEFAULT_BAG_DISPERSION) -> tuple[np.ndarray, np.ndarray]:
    """A synthetic trace of one table by the pool's generator (`synth.bag_trace`), seeded by the
    table's name."""
    return bag_trace(name_rng(name), rows, pooling_factor, alpha, batch, dispersion)


def name_rng(name: str) -> np.random.Generator:
    """The random stream of a user's table: seeded by its name, so its trace never changes."""
    return np.random.default_rng(zlib.crc32(name.encode()))


def _features(rows: pd.DataFrame, path: Path, weight_bytes: int, batch: int) -> UserTables:
    """The 21 features of each table: its own columns, and the reuse histogram it was given or
    that of its synthetic trace (computed one table at a time, not kept)."""
    features = pd.DataFrame({"table": np.arange(len(rows)), "dim": rows["dim"], "rows": rows["rows"],
                             "pooling_factor": rows["pooling_factor"].astype(float),
                             "size_bytes": rows["rows"] * rows["dim"] * weight_bytes})
    if all(c in rows.columns for c in REUSE_COLUMNS):
        histograms = rows[REUSE_COLUMNS].to_numpy(dtype=float)
    else:
        histograms = np.stack([reuse_histogram(access_counts(
            table_trace(r.name, int(r.rows), float(r.pooling_factor), float(r.zipf_alpha), batch)[1], int(r.rows)))
            for r in rows.itertuples()])
    features[REUSE_COLUMNS] = histograms
    features["name"] = rows["name"].to_numpy()
    features["zipf_alpha"] = rows["zipf_alpha"].to_numpy(dtype=float)
    return UserTables(features=features.reset_index(drop=True), source=str(path), trace_batch=batch)


def _from_pool(folder: Path) -> UserTables:
    from autoshard.data.pool import load_pool

    try:
        pool = load_pool(folder)
    except FileNotFoundError as exc:
        raise ConfigError(f"{folder}: not a pool folder ({exc.filename} is missing)") from None
    features = pool.features.copy()
    features["name"] = [f"table_{t}" for t in features["table"]]
    return UserTables(features=features, source=str(folder), trace_batch=pool.traces.batch_size, _traces=pool.traces)


def parse_memory(text: str, field: str = "--memory-per-device") -> int:
    """Bytes from `16GiB`, `16 GB`, `512MiB`, `1.5e10` (decimal units are powers of 1000,
    binary ones of 1024; a bare number is bytes)."""
    units = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
             "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    s = str(text).strip()
    number = s.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ").strip()
    unit = s[len(s.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")):].strip().lower()
    try:
        value = float(number)
    except ValueError:
        raise ConfigError(f"{field}: {text!r} (expected a size such as 16GiB, 16 GB or 1.5e10)") from None
    if unit not in units:
        raise ConfigError(f"{field}: {text!r} (unknown unit {unit!r}; use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{field}: {text!r} (must be a positive size)")
    return int(value * units[unit])

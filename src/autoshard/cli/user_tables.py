"""Reading a user's own tables for the `autoshard` command: a CSV or YAML table list, or a pool
folder with traces, checked field by field, turned into the 21 features the models read.

Table lists have one row per table: `name, rows, dim, pooling_factor` and, optionally, an
index-skew `zipf_alpha`, the 17 reuse-histogram bins `reuse_bin_0..reuse_bin_16`, the `module`
the table belongs to (a module path such as `sparse.ebc`: one table name may occur in two
modules, and a table is then named `module.name`) and its `pooling`: `pooled` (the default, an
EmbeddingBagCollection's) or `sequence` (an EmbeddingCollection's: one embedding out per
lookup, which the memory of training counts, `data.footprint`). When the bins are absent they
are those a synthetic trace of the table would have (`data.reuse`, computed without drawing it):
the pool's own generator (`synth.bag_trace`), `trace_batch` bags whose lengths are gamma-Poisson
around the table's mean pooling factor (the pool's `bag_dispersion`), indices drawn from a Zipf
law with the table's `zipf_alpha` (default `DEFAULT_ZIPF_ALPHA`, a moderately skewed table)
scattered over its rows, seeded by the table's name. Those traces, drawn when first needed, are
what `autoshard score` and the measured methods measure.
"""

import csv
import io
import math
import zlib
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache, partial
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from autoshard.core.errors import ConfigError
from autoshard.core.inputs import (
    MAX_DIM,
    MAX_MEMORY,
    MAX_POOLING_FACTOR,
    MAX_ROWS,
    MAX_TABLES,
    MAX_ZIPF_ALPHA,
    decimal,
    module_path,
    number,
    read_text,
    shown,
    table_name,
)
from autoshard.data.features import REUSE_BINS, REUSE_COLUMNS
from autoshard.data.footprint import shard_footprint
from autoshard.data.reuse import expected_histogram
from autoshard.data.sizes import table_bytes
from autoshard.data.synth import bag_trace
from autoshard.data.traces import Traces, from_lengths

REQUIRED = ("name", "rows", "dim", "pooling_factor")
BINS = tuple(f"reuse_bin_{i}" for i in range(REUSE_BINS))
OPTIONAL = ("zipf_alpha", "module", "pooling", *BINS)
POOLINGS = ("pooled", "sequence")
DEFAULT_ZIPF_ALPHA = 1.05
DEFAULT_TRACE_BATCH = 4096  # params.yaml's pool.batch_size: the pool's features, which the models learnt
# from, are computed over this many bags (the profile then measures the first profile.batch_size of them)
DEFAULT_BAG_DISPERSION = 1.0  # params.yaml's pool.bag_dispersion: the pool the models learnt from
MAX_TRACE_LOOKUPS = 2**28  # 2 GiB of int64 indices to measure with


@dataclass
class UserTables:
    """The tables, in file order: `features` (FEATURE_COLUMNS, `size_bytes`, `name` qualified by
    its module, and for a table list `sequence`) and, made when first asked for, index traces to
    measure them with."""

    features: pd.DataFrame
    source: str
    trace_batch: int = DEFAULT_TRACE_BATCH
    _traces: Traces | None = None

    @property
    def names(self) -> list[str]:
        return self.features["name"].tolist()

    @property
    def weight_bytes(self) -> np.ndarray:
        """Bytes per weight of each table (`size_bytes` less the row state, per element)."""
        f = self.features
        per_element = (f["size_bytes"] - table_bytes(f["rows"], 0, 4)) / (f["rows"] * f["dim"])
        return np.rint(per_element.to_numpy(dtype=float)).astype(np.int64)

    @property
    def sequence(self) -> np.ndarray:
        """Whether each table is a sequence feature's (a pool's tables are pooled)."""
        f = self.features
        return f["sequence"].to_numpy(dtype=bool) if "sequence" in f else np.zeros(len(f), dtype=bool)

    def memory(self, batch: int, tables=None, widths=None) -> np.ndarray:
        """Bytes each whole table takes while training at a batch of `batch` samples: weights,
        optimizer state, and input and output buffers (`data.footprint`, TorchRec's accounting);
        with `tables` and `widths`, each column shard's (of table `tables[i]`, `widths[i]` wide)."""
        f = self.features
        ids = np.arange(len(f)) if tables is None else np.asarray(tables, dtype=np.int64)
        columns = f["dim"].to_numpy()[ids] if widths is None else np.asarray(widths)
        return np.array([shard_footprint(int(r), int(c), int(w), batch, float(pf), bool(q)) for r, c, w, pf, q in
                         zip(f["rows"].to_numpy()[ids], columns, self.weight_bytes[ids],
                             f["pooling_factor"].to_numpy()[ids], self.sequence[ids], strict=True)], dtype=np.int64)

    @property
    def traces(self) -> Traces:
        """The tables' traces: the pool's, or synthetic ones (`table_trace`) for a table list."""
        if self._traces is None:
            f = self.features
            lookups = int(f["pooling_factor"].sum() * self.trace_batch)
            if lookups > MAX_TRACE_LOOKUPS:
                raise ConfigError(f"{self.source}: the tables' synthetic traces would hold about {lookups} lookups "
                                  f"(at most {MAX_TRACE_LOOKUPS}: fewer tables or lower pooling factors)")
            parts = [table_trace(n, int(r), float(pf), float(a), self.trace_batch)
                     for n, r, pf, a in zip(f["name"], f["rows"], f["pooling_factor"], f["zipf_alpha"], strict=True)]
            self._traces = from_lengths(np.concatenate([p[1] for p in parts]), np.stack([p[0] for p in parts]))
        return self._traces


def read_tables(path: str | Path, weight_bytes: int = 4, trace_batch: int = DEFAULT_TRACE_BATCH,
                reuse: bool = True) -> UserTables:
    """The tables of a `.csv`, `.yaml`/`.yml` file or a pool folder (`data/pool` layout), checked.
    `reuse=False` leaves out the reuse histograms a table list does not give (what TorchRec's
    estimate reads does not include them, and computing them is most of reading 2,000 tables)."""
    path = Path(path)
    if path.is_dir():
        return _from_pool(path)
    columns, records = _read_rows(path)
    rows = _checked(columns, records, path)
    return _features(rows, path, weight_bytes, trace_batch, reuse)


def tables_from_records(records: list[dict], source: str, weight_bytes: int = 4,
                        trace_batch: int = DEFAULT_TRACE_BATCH) -> UserTables:
    """The tables of `records` (name, rows, dim, pooling_factor[, zipf_alpha]), checked as a file's
    rows are; `source` names them in errors (for example "TorchRec's sharding options")."""
    columns = list(dict.fromkeys(k for r in records for k in r))
    return _features(_checked(columns, records, Path(source)), Path(source), weight_bytes, trace_batch)


class StrictLoader(yaml.SafeLoader):
    """YAML without anchors and aliases (an alias bomb is refused at its first alias), and
    without a key given twice in one mapping (which YAML would settle silently, keeping the last)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            line = self.peek_event().start_mark.line + 1
            raise yaml.YAMLError(f"line {line}: aliases (*name) are not accepted")
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
        twice = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
        if twice is not None:
            raise yaml.YAMLError(f"line {node.start_mark.line + 1}: field {twice!r} given twice")
        return super().construct_mapping(node, deep)


def _read_rows(path: Path) -> tuple[list[str], list[dict]]:
    """The column names and one mapping per table, as written (values not yet checked)."""
    text = read_text(path, "table file").removeprefix("\ufeff")  # a spreadsheet's byte-order mark
    if not text.strip():
        raise ConfigError(f"{path}: the file is empty")
    if path.suffix.lower() in (".yaml", ".yml"):
        return _yaml_rows(text, path)
    if path.suffix.lower() != ".csv":
        raise ConfigError(f"{path}: unknown table file type {shown(path.suffix)} (expected .csv, .yaml or a pool "
                          "folder)")
    reader = csv.reader(io.StringIO(text), skipinitialspace=True, strict=True)
    try:
        lines = [r for r in reader if any(v.strip() for v in r)]
    except csv.Error as exc:
        raise ConfigError(f"{path}: not a valid CSV table (line {reader.line_num}: {exc})") from None
    columns = [c.strip() for c in lines[0]]
    twice = next((c for i, c in enumerate(columns) if c in columns[:i]), None)
    if twice is not None:
        raise ConfigError(f"{path}: header: column {shown(twice)} named twice")
    for i, line in enumerate(lines[1:], start=1):
        if len(line) != len(columns):
            raise ConfigError(f"{path}: row {i}: {len(line)} fields, the header has {len(columns)}")
    return columns, [dict(zip(columns, line, strict=True)) for line in lines[1:]]


def _yaml_rows(text: str, path: Path) -> tuple[list[str], list[dict]]:
    try:
        doc = yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader, without aliases
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({shown(str(exc).splitlines()[0], 120)})") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid YAML (nested too deeply)") from None
    doc = doc.get("tables") if isinstance(doc, dict) else doc
    if not isinstance(doc, list) or not all(isinstance(r, dict) for r in doc):
        raise ConfigError(f"{path}: expected a list of tables (mappings), or `tables:` holding one")
    columns: list[str] = []
    for i, row in enumerate(doc, start=1):
        for key in row:
            if not isinstance(key, str):
                raise ConfigError(f"{path}: row {i}: field {shown(key)} (a field name is a string)")
            if key not in columns:
                columns.append(key)
    return columns, doc


def _checked(columns: list[str], records: list[dict], path: Path) -> pd.DataFrame:
    """Columns present and known, every value a number in its range, names distinct."""
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise ConfigError(f"{path}: missing column {missing[0]!r} (needs {', '.join(REQUIRED)})")
    extra = [c for c in columns if c not in REQUIRED and c not in OPTIONAL]
    if extra:
        raise ConfigError(f"{path}: unknown column {shown(extra[0])} (known: {', '.join(REQUIRED)}, zipf_alpha, "
                          f"module, pooling, reuse_bin_0..reuse_bin_{REUSE_BINS - 1})")
    bins = [c for c in BINS if c in columns]
    if bins and len(bins) != len(BINS):
        absent = next(c for c in BINS if c not in columns)
        raise ConfigError(f"{path}: missing column {absent!r} (give all {REUSE_BINS} reuse bins or none)")
    if not records:
        raise ConfigError(f"{path}: no tables (the file has a header only)")
    if len(records) > MAX_TABLES:
        raise ConfigError(f"{path}: {len(records)} tables (at most {MAX_TABLES})")
    out: dict[str, list] = {c: [] for c in ("name", "rows", "dim", "pooling_factor", "zipf_alpha", "sequence",
                                            *bins)}
    seen: set[str] = set()
    for i, record in enumerate(records, start=1):
        name = table_name(record.get("name"), f"{path}: row {i}")
        module = _text(record, "module", f"{path}: row {i} ({name})")
        if module:
            name = f"{module_path(module, f'{path}: row {i} ({name}), field module')}.{name}"
        where = f"{path}: row {i} ({name})"
        if name in seen:
            inside = f" in module {shown(module)}" if module else " (give the tables a module column)"
            raise ConfigError(f"{path}: row {i}, field name: {shown(name)} (a duplicate table name{inside})")
        seen.add(name)
        pooling = _text(record, "pooling", where) or "pooled"
        if pooling not in POOLINGS:
            raise ConfigError(f"{where}, field pooling: {shown(pooling)} (expected {' or '.join(POOLINGS)})")
        out["sequence"].append(pooling == "sequence")
        field = partial(_field, record, where)
        dim = field("dim", 1, MAX_DIM, whole=True)
        if dim % 4:
            raise ConfigError(f"{where}, field dim: {dim} (not a multiple of 4, which FBGEMM's kernels need)")
        out["name"].append(name)
        out["rows"].append(field("rows", 1, MAX_ROWS, whole=True))
        out["dim"].append(dim)
        out["pooling_factor"].append(field("pooling_factor", 0, MAX_POOLING_FACTOR))
        out["zipf_alpha"].append(field("zipf_alpha", 0, MAX_ZIPF_ALPHA, default=DEFAULT_ZIPF_ALPHA))
        shares = [field(c, 0, 1) for c in bins]
        if bins and not math.isclose(sum(shares), 1.0, abs_tol=1e-3):
            raise ConfigError(f"{where}, fields reuse_bin_*: they sum to {sum(shares):.4f} (shares: expected 1)")
        for c, share in zip(bins, shares, strict=True):
            out[c].append(share)
    modules = {"." in n for n in out["name"]}
    if len(modules) > 1:
        i = next(i for i, n in enumerate(out["name"]) if ("." in n) != ("." in out["name"][0]))
        raise ConfigError(f"{path}: row {i + 1} ({out['name'][i]}), field module: "
                          f"{'given' if '.' in out['name'][i] else 'blank'}, unlike row 1's (give every table a "
                          "module or none: a model is one embedding module or a tree of them)")
    frame = pd.DataFrame(out)
    frame[["rows", "dim"]] = frame[["rows", "dim"]].astype(np.int64)
    return frame.rename(columns=dict(zip(BINS, REUSE_COLUMNS, strict=True)))


def _text(record: dict, column: str, where: str) -> str:
    """A text field's value, stripped ("" for a blank or absent one)."""
    value = record.get(column)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if not isinstance(value, str):
        raise ConfigError(f"{where}, field {column}: {shown(value)} (expected text)")
    return value.strip()


def _field(record: dict, where: str, column: str, lo: float, hi: float, whole: bool = False,
           default: float | None = None) -> int | float:
    """One value of a table's row, checked (see `inputs.number`); `default` stands in for a blank."""
    value = record.get(column)
    if default is not None and (value is None or str(value).strip() in ("", "nan")):
        return default
    if value is None:
        raise ConfigError(f"{where}, field {column}: missing")
    checked = number(value, f"{where}, field {column}", lo, hi, whole)
    return checked if whole else checked + 0.0  # "-0" is 0.0: a negative zero fails numpy's `scale >= 0` checks


def table_trace(name: str, rows: int, pooling_factor: float, alpha: float, batch: int,
                dispersion: float = DEFAULT_BAG_DISPERSION) -> tuple[np.ndarray, np.ndarray]:
    """A synthetic trace of one table by the pool's generator (`synth.bag_trace`), seeded by the
    table's name."""
    return bag_trace(name_rng(name), rows, pooling_factor, alpha, batch, dispersion)


def name_rng(name: str) -> np.random.Generator:
    """The random stream of a user's table: seeded by its name, so its trace never changes."""
    return np.random.default_rng(zlib.crc32(name.encode()))


def _features(rows: pd.DataFrame, path: Path, weight_bytes: int, batch: int, reuse: bool = True) -> UserTables:
    """The 21 features of each table: its own columns, and the reuse histogram it was given or
    (unless not `reuse`) the one its synthetic trace would have (`data.reuse`: no trace drawn, one
    computation per distinct shape)."""
    features = pd.DataFrame({"table": np.arange(len(rows)), "dim": rows["dim"], "rows": rows["rows"],
                             "pooling_factor": rows["pooling_factor"].astype(float),
                             "size_bytes": np.array([table_bytes(r, d, weight_bytes) for r, d in  # exact: Python ints
                                                     zip(rows["rows"].tolist(), rows["dim"].tolist(), strict=True)],
                                                    dtype=np.int64)})
    if all(c in rows.columns for c in REUSE_COLUMNS):
        features[REUSE_COLUMNS] = rows[REUSE_COLUMNS].to_numpy(dtype=float)
    elif reuse:
        features[REUSE_COLUMNS] = np.stack([_histogram(int(r.rows), float(r.pooling_factor) * batch,
                                                       float(r.zipf_alpha)) for r in rows.itertuples()])
    features["name"] = rows["name"].to_numpy()
    features["zipf_alpha"] = rows["zipf_alpha"].to_numpy(dtype=float)
    features["sequence"] = rows["sequence"].to_numpy(dtype=bool)
    return UserTables(features=features.reset_index(drop=True), source=str(path), trace_batch=batch)


@lru_cache(maxsize=65_536)
def _histogram(rows: int, lookups: float, alpha: float) -> np.ndarray:
    return expected_histogram(rows, lookups, alpha)


def _from_pool(folder: Path) -> UserTables:
    from autoshard.data.pool import load_pool

    try:
        pool = load_pool(folder)
    except FileNotFoundError as exc:
        raise ConfigError(f"{folder}: not a pool folder ({exc.filename} is missing)") from None
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - parquet, numpy and JSON each fail their own way on a damaged pool
        raise ConfigError(f"{folder}: not a readable pool folder ({exc.__class__.__name__})") from None
    features = pool.features.copy()
    features["name"] = [f"table_{t}" for t in features["table"]]
    return UserTables(features=features, source=str(folder), trace_batch=pool.traces.batch_size, _traces=pool.traces)


def parse_memory(text: str, field: str = "--memory-per-device") -> int:
    """Bytes from `16GiB`, `16 GB`, `512MiB`, `1.5e10` (decimal units are powers of 1000,
    binary ones of 1024; a bare number is bytes)."""
    units = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
             "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    s = str(text).strip()
    digits = s.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ").strip()
    unit = s[len(s.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")):].strip().lower()
    value = decimal(digits)
    if value is None:
        raise ConfigError(f"{field}: {shown(text)} (expected a size such as 16GiB, 16 GB or 1.5e10)")
    if unit not in units:
        raise ConfigError(f"{field}: {shown(text)} (unknown unit {shown(unit)}; use B, KB, MB, GB, TB, KiB, MiB, GiB, "
                          "TiB)")
    if not value.is_finite() or value <= 0:
        raise ConfigError(f"{field}: {shown(text)} (must be a positive size)")
    if value > Decimal(MAX_MEMORY) / units[unit]:  # compared before multiplying: 1e999999 cannot overflow
        raise ConfigError(f"{field}: {shown(text)} (between 1 byte and {MAX_MEMORY} bytes, 1 PiB)")
    size = int(value * units[unit])
    if size < 1:
        raise ConfigError(f"{field}: {shown(text)} (between 1 byte and {MAX_MEMORY} bytes, 1 PiB)")
    return size

"""One content-addressed store of shard measurements, shared by every stage that measures.

A measurement is filed under two keys: the settings it was taken under (`space`: the
`measurement_key` of the backend settings, timing protocol, measuring code, libraries, machine
and every table's features and trace, plus a pass tag for deliberate re-measurements) and the
shard (`shard_key`: its sorted table ids, "3,17,40"). A shard measured once under a space is
read back by every later stage, run or engine instead of being measured again.

A space measured elsewhere (rows of `autoshard measure` on a GPU node) is filed under its own
key, the worker's settings and machine, never this machine's (`import_rows`, with a
`space.json` that says what the key is made of); a stage or `autoshard score` reads it only when
named explicitly (`store_for`), and then measures nothing into it: a shard missing there is an
error, since timing it here would file this machine's numbers under another machine's key.

A space is a folder of batch files. A batch file is written once, atomically, and never
changed (append-only): a crash leaves whole files or none, several workers (processes, Ray
nodes sharing the folder) can write side by side, and an interrupted run resumes with what is
there. When two files hold the same shard, the first file by name wins, so reads do not depend
on which worker finished first. An unreadable file is set aside and its shards measured again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from autoshard.core.atomic import atomic_file
from autoshard.core.digest import key, machine, source_digest, value_digest
from autoshard.core.errors import ConfigError
from autoshard.core.inputs import shown
from autoshard.measure.backends import MEASURING_CODE, BackendConfig, measurement_key

if TYPE_CHECKING:  # only a type here: the portable worker (no pandas) imports this module
    from autoshard.data.pool import Pool

FIELDS = ("forward_ms", "backward_ms", "forward_iqr_ms", "backward_iqr_ms", "cv", "drift", "attempts")
BATCH_GLOB = "batch-*.json"
SPACE_FILE = "space.json"  # what a space's key is made of (written by `import_rows`)
SPACE_KEY = re.compile(r"[0-9a-f]{16}")


def shard_key(tables: Iterable[int]) -> str:
    """A shard's name in the store: its sorted table ids joined by commas."""
    return ",".join(str(t) for t in sorted(int(t) for t in tables))


def shard_tables(name: str) -> list[int]:
    """The table ids of a `shard_key`."""
    return [int(t) for t in name.split(",")]


def space(cfg: BackendConfig, pool: Pool) -> str:
    """The settings key: measurements are reused only for the same tables (every table's
    features and trace), backend and timing settings, measuring code, libraries and machine
    (`measurement_key`)."""
    return key(measurement_key(cfg, pool, range(pool.num_tables)))


def settings(cfg: BackendConfig, pool: Pool) -> dict:
    """What `space` is made of, as JSON (every table's digest, the backend settings, the
    measuring code's digest, the machine): a worker's rows carry it, so a space can be checked
    against its key and against the tables of the stage that reads it."""
    return described_settings(cfg, pool.digest(list(range(pool.num_tables))))


def described_settings(cfg: BackendConfig, tables: str) -> dict:
    """`settings` for the pool whose tables' digest is `tables` (the portable worker gets it
    from its job: computing it needs the pool's features)."""
    return {"tables": tables, "backend": asdict(cfg), "code": source_digest(*MEASURING_CODE),
            "machine": machine(cfg.device)}


def settings_key(described: Mapping) -> str:
    """The space key of `settings(cfg, pool)`: equal to `space(cfg, pool)`."""
    return key(value_digest(described["tables"], described["backend"], described["code"], described["machine"]))


class MeasurementStore:
    """The measurements of one settings space, in the folder `root/<space>`; a `foreign` one
    (named explicitly, measured elsewhere) is only read."""

    def __init__(self, root: str | Path, space_key: str, foreign: bool = False):
        self.folder = Path(root) / space_key
        self.foreign = foreign

    @classmethod
    def for_settings(cls, root: str | Path, cfg: BackendConfig, pool: Pool) -> MeasurementStore:
        """The store of `cfg` on `pool` under `root` (see `space`)."""
        return cls(root, space(cfg, pool))

    def tagged(self, tag: str) -> MeasurementStore:
        """The space of a deliberate independent pass (a repeat, a second measurement of the
        same plans) under the same settings; "" is this one."""
        return MeasurementStore(self.folder.parent, key(self.folder.name, tag), self.foreign) if tag else self

    def described(self) -> dict | None:
        """The space's `settings` as its importer filed them; None for a space measured here."""
        path = self.folder / SPACE_FILE
        try:
            described = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            described = None
        if not isinstance(described, dict) or not {"tables", "backend"} <= set(described):
            raise ConfigError(f"{path}: not a space description (import the rows again into a fresh store)")
        return described

    def describe(self, described: Mapping) -> None:
        """File what the space's key is made of, once."""
        path = self.folder / SPACE_FILE
        if not path.exists():
            with atomic_file(path) as tmp:
                tmp.write_text(json.dumps(described, sort_keys=True, indent=1))

    def refuse_measuring(self, todo: Collection[str], what: str) -> None:
        """Raise when `todo` (shards of `what` that are not stored) would be measured into a
        foreign space: they would be this machine's times under another machine's key."""
        if self.foreign and todo:
            raise ConfigError(
                f"measurement space {self.folder.name}: {len(todo)} shards of {what} are missing from it (it was "
                "measured elsewhere: measure them there and `autoshard store import` the rows; nothing is "
                "measured here into another machine's space)")

    def read(self) -> dict[str, dict]:
        """Every stored measurement by shard key (first file by name wins)."""
        out: dict[str, dict] = {}
        for path in sorted(self.folder.glob(BATCH_GLOB)):
            try:
                records = json.loads(path.read_text())["records"]
            except (OSError, ValueError, KeyError, TypeError):
                path.rename(path.with_name(f".broken-{path.name}"))  # measured again, kept for a look
                continue
            for name, record in records.items():
                out.setdefault(name, record)
        return out

    def missing(self, shards: Iterable[Sequence[int]], known: Mapping[str, dict] | None = None) -> list[str]:
        """The shard keys of `shards` not stored yet (in `known`, a `read` of this store), sorted,
        each once."""
        known = self.read() if known is None else known
        return sorted({shard_key(s) for s in shards} - set(known))

    def write(self, records: Mapping[str, Mapping], label: str) -> Path:
        """Add one batch (`records` by shard key, each with the fields of FIELDS and `status`) as
        a new file; `label` says who measured it. Writing the same batch twice keeps the first, also
        when two writers finish it at once (a killed stage's kernel and its rerun, two workers)."""
        path = self.folder / f"batch-{key(label, sorted(records))[:24]}.json"
        if not path.exists():
            with atomic_file(path, first_wins=True) as tmp:
                tmp.write_text(json.dumps({"label": label, "records": records}, sort_keys=True))
        return path


def store_for(root: str | Path, cfg: BackendConfig, pool: Pool, space_override: str | None = None,
              field: str = "profile.measurements_space") -> MeasurementStore:
    """The store of `cfg` on `pool` under `root`, or, with `space_override`, the space of that
    key, read-only (`foreign`): it must exist and, if imported, hold the same tables (features
    and traces) measured at the same batch size. `field` names the option in errors."""
    if space_override is None:
        return MeasurementStore.for_settings(root, cfg, pool)
    if not SPACE_KEY.fullmatch(space_override):
        raise ConfigError(f"{field}: {shown(space_override)} (expected a space key, 16 hex digits)")
    store = MeasurementStore(root, space_override, foreign=True)
    if not store.folder.is_dir():
        raise ConfigError(f"{field}: {shown(space_override)} (no such space in {root})")
    described = store.described()
    if described is not None:
        if described["tables"] != pool.digest(list(range(pool.num_tables))):
            raise ConfigError(f"{field}: {shown(space_override)} (measured on other tables: their features or "
                              "traces differ from these)")
        if described["backend"]["batch_size"] != cfg.batch_size:
            raise ConfigError(f"{field}: {shown(space_override)} (measured at batch size "
                              f"{described['backend']['batch_size']}, not {cfg.batch_size})")
    return store


def import_rows(root: str | Path, space_key: str, described: Mapping, records: Mapping[str, Mapping],
                label: str, tag: str = "") -> tuple[MeasurementStore, bool]:
    """File a worker's `records` (checked, `from_worker_rows`) under their own space
    `space_key` (the key of `described`, the worker's settings and machine; `tag`: a pass of it),
    as one write-once batch labelled `label`; also whether the batch is new (re-importing the
    same rows changes nothing)."""
    base = MeasurementStore(root, space_key)
    store = base.tagged(tag)
    existing = {p.name for p in store.folder.glob(BATCH_GLOB)}
    base.describe(described)
    path = store.write(records, label)
    return store, path.name not in existing


def record(costs: Sequence[float] | None, drift: float, attempts: int,
           calibration_ms: float = float("nan")) -> dict:
    """A store record from a batch's per-shard values (`interleaved.FIELDS` then the CV; None
    for a shard too large for the device), the batch's drift (`interleaved.round_drift`) and
    attempts, and the calibration shard's median time in that batch (None when unknown): the unit in which a
    machine that got faster or slower between two batches cancels out."""
    calibration = float(calibration_ms) if calibration_ms == calibration_ms else None
    if costs is None or costs[0] != costs[0]:  # NaN: not measurable
        return {"status": "too_large", **dict.fromkeys(FIELDS[:5]), "drift": drift, "attempts": attempts,
                "calibration_ms": calibration}
    return {"status": "ok", **dict(zip(FIELDS[:5], (float(c) for c in costs), strict=True)),
            "drift": drift, "attempts": attempts, "calibration_ms": calibration}


def from_worker_rows(rows: Sequence[Mapping]) -> dict[str, dict]:
    """Records from `measure.worker` rows (one timing pass each: no CV, no drift), to `write`."""
    out = {}
    for row in rows:
        costs = None if row["status"] != "ok" else [row["forward_ms"], row["backward_ms"], row["forward_iqr_ms"],
                                                    row["backward_iqr_ms"], float("nan")]
        out[shard_key(row["tables"])] = record(costs, 0.0, 1)
    return out


def values(entry: Mapping) -> list[float]:
    """A record's `interleaved.FIELDS` and CV as floats (NaN where none was measured)."""
    return [float("nan") if entry[f] is None else float(entry[f]) for f in FIELDS[:5]]

"""One content-addressed store of shard measurements, shared by every stage that measures.

A measurement is filed under two keys: the settings it was taken under (`space`: the
`measurement_key` of the backend settings, timing protocol, measuring code, libraries, machine
and every table's features and trace, plus a pass tag for deliberate re-measurements) and the
shard (`shard_key`: its sorted table ids, "3,17,40"). A shard measured once under a space is
read back by every later stage, run or engine instead of being measured again.

A space is a folder of batch files. A batch file is written once, atomically, and never
changed (append-only): a crash leaves whole files or none, several workers (processes, Ray
nodes sharing the folder) can write side by side, and an interrupted run resumes with what is
there. When two files hold the same shard, the first file by name wins, so reads do not depend
on which worker finished first. An unreadable file is set aside and its shards measured again.
"""

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from autoshard.core.atomic import atomic_file
from autoshard.core.digest import key
from autoshard.data.pool import Pool
from autoshard.measure.backends import BackendConfig, measurement_key

FIELDS = ("forward_ms", "backward_ms", "forward_iqr_ms", "backward_iqr_ms", "cv", "drift", "attempts")
BATCH_GLOB = "batch-*.json"


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


class MeasurementStore:
    """The measurements of one settings space, in the folder `root/<space>`."""

    def __init__(self, root: str | Path, space_key: str):
        self.folder = Path(root) / space_key

    @classmethod
    def for_settings(cls, root: str | Path, cfg: BackendConfig, pool: Pool) -> "MeasurementStore":
        """The store of `cfg` on `pool` under `root` (see `space`)."""
        return cls(root, space(cfg, pool))

    def tagged(self, tag: str) -> "MeasurementStore":
        """The space of a deliberate independent pass (a repeat, a second measurement of the
        same plans) under the same settings; "" is this one."""
        return MeasurementStore(self.folder.parent, key(self.folder.name, tag)) if tag else self

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
        a new file; `label` says who measured it. Writing the same batch twice keeps the first."""
        path = self.folder / f"batch-{key(label, sorted(records))[:24]}.json"
        if not path.exists():
            with atomic_file(path) as tmp:
                tmp.write_text(json.dumps({"label": label, "records": records}, sort_keys=True))
        return path


def record(costs: Sequence[float] | None, drift: float, attempts: int,
           calibration_ms: float = float("nan")) -> dict:
    """A store record from a batch's per-shard values (`interleaved.FIELDS` then the CV; None
    for a shard too large for the device), its calibration drift and attempts, and the
    calibration shard's median time in that batch (None when unknown): the unit in which a
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

"""Index traces in the open DLRM dataset's layout: load, save, and per-table access counts."""

import gzip
import json
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autoshard.core.errors import ConfigError


@dataclass
class Traces:
    """Index traces of T tables over a batch of B bags each."""

    indices: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray

    @property
    def num_tables(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[1])

    def span(self, table: int) -> tuple[int, int]:
        """Start and end of `table`'s indices in the flat array."""
        b = self.batch_size
        return int(self.offsets[table * b]), int(self.offsets[(table + 1) * b])

    def table(self, table: int) -> np.ndarray:
        start, end = self.span(table)
        return self.indices[start:end]

    def validate(self, source: str) -> None:
        """Check the layout invariants; errors name `source` (a file or 'synthetic pool')."""
        lengths, offsets, indices = self.lengths, self.offsets, self.indices
        if lengths.ndim != 2 or lengths.shape[0] < 1 or lengths.shape[1] < 1:
            raise ConfigError(f"{source}: lengths must have shape (T, B), got {lengths.shape}")
        t, b = lengths.shape
        if offsets.shape != (t * b + 1,):
            raise ConfigError(
                f"{source}: offsets has shape {offsets.shape}, expected ({t * b + 1},) for "
                f"lengths of shape {lengths.shape}")
        if indices.ndim != 1 or offsets[0] != 0 or offsets[-1] != indices.shape[0]:
            raise ConfigError(
                f"{source}: offsets run from {offsets[0]} to {offsets[-1]} but there are "
                f"{indices.shape[0]} indices")
        if not np.array_equal(np.diff(offsets), lengths.reshape(-1)):
            raise ConfigError(f"{source}: offsets do not match lengths")
        if indices.size and indices.min() < 0:
            raise ConfigError(f"{source}: negative index {indices.min()}")

    def head(self, batch_size: int) -> "Traces":
        """The first `batch_size` bags of every table."""
        if batch_size > self.batch_size:
            raise ConfigError(
                f"batch_size: {batch_size} (the traces hold only {self.batch_size} bags per table)")
        b = self.batch_size
        parts = [self.indices[self.offsets[t * b]:self.offsets[t * b + batch_size]]
                 for t in range(self.num_tables)]
        return from_lengths(np.concatenate(parts), self.lengths[:, :batch_size])


def from_lengths(indices: np.ndarray, lengths: np.ndarray) -> Traces:
    """Build traces from flat indices and per-bag lengths, deriving the offsets."""
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths.reshape(-1), out=offsets[1:])
    return Traces(indices=indices, offsets=offsets, lengths=lengths)


def access_counts(indices: np.ndarray, rows: int) -> np.ndarray:
    """How often each distinct index of one table is accessed (zeros dropped)."""
    if indices.size == 0:
        return np.zeros(0, dtype=np.int64)
    if rows <= 8 * indices.size:
        counts = np.bincount(indices, minlength=rows)
        return counts[counts > 0]
    return np.unique(indices, return_counts=True)[1]


def load_dlrm(path: str | Path) -> Traces:
    """Load the open DLRM dataset file (`.pt` or `.pt.gz`): a tuple (indices, offsets, lengths)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"dataset.path: {str(path)!r} (file not found; fetch it with "
                          "`dvc update data.dvc`)")
    import torch

    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as fh:
            data = torch.load(fh, weights_only=True, map_location="cpu")
    except (OSError, EOFError, RuntimeError, pickle.UnpicklingError, ValueError) as exc:
        first_line = (str(exc).splitlines() or [""])[0][:120]
        raise ConfigError(f"{path}: not a readable dataset file "
                          f"({exc.__class__.__name__}: {first_line})") from None
    if not (isinstance(data, tuple | list) and len(data) == 3
            and all(isinstance(x, torch.Tensor) for x in data)):
        raise ConfigError(f"{path}: expected a tuple (indices, offsets, lengths) of tensors, "
                          f"got {type(data).__name__}")
    indices, offsets, lengths = (x.numpy() for x in data)
    traces = Traces(indices=indices, offsets=offsets.astype(np.int64), lengths=lengths)
    traces.validate(str(path))
    return traces


def save_dlrm(path: str | Path, traces: Traces) -> None:
    """Write traces as a dataset file in the open DLRM layout (gzip when the name ends in .gz)."""
    import torch

    path = Path(path)
    data = tuple(torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64))
                 for x in (traces.indices, traces.offsets, traces.lengths))
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as fh:
        torch.save(data, fh)


def save_traces(folder: Path, traces: Traces) -> None:
    """Store traces as compact .npy arrays (int32 indices when every index fits)."""
    folder.mkdir(parents=True, exist_ok=True)
    big = traces.indices.size and traces.indices.max() >= np.iinfo(np.int32).max
    np.save(folder / "indices.npy", traces.indices.astype(np.int64 if big else np.int32))
    np.save(folder / "offsets.npy", traces.offsets.astype(np.int64))
    np.save(folder / "lengths.npy", traces.lengths.astype(np.int32))
    (folder / "traces.json").write_text(json.dumps(
        {"num_tables": traces.num_tables, "batch_size": traces.batch_size,
         "num_indices": int(traces.indices.size)}, indent=2) + "\n")


def load_traces(folder: str | Path, mmap: bool = True) -> Traces:
    """Load traces written by `save_traces` (memory-mapped by default) and check them."""
    folder = Path(folder)
    try:
        mode = "r" if mmap else None
        traces = Traces(indices=np.load(folder / "indices.npy", mmap_mode=mode),
                        offsets=np.load(folder / "offsets.npy", mmap_mode=mode),
                        lengths=np.load(folder / "lengths.npy", mmap_mode=mode))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{folder}: traces missing or unreadable ({exc})") from None
    traces.validate(str(folder))
    return traces


"""Write outputs all at once: a failed run leaves the previous output or nothing, never half.

A temporary file or folder is named for its writer (`.NAME.PID@HOST.random`): a writer killed
outright (`kill -9`, no chance to clean up) leaves its temporary behind, and the next write into
the same folder on the same host removes every temporary whose process is gone, so a rerun after
a kill ends with no half-written file. Temporaries of live processes, and of other hosts sharing
the folder, are left alone.
"""

import os
import re
import shutil
import socket
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HOST = f"{zlib.crc32(socket.gethostname().encode()):08x}"
WRITER = re.compile(r"\.(\d+)@([0-9a-f]{8})\.[^.]+$")  # the end of a temporary's name: .PID@HOST.random


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary folder beside `path`; it replaces `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep(path.parent)
    tmp = Path(tempfile.mkdtemp(prefix=_prefix(path), dir=path.parent))
    tmp.chmod(0o777 & ~_umask())
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = path.with_name(f".{path.name}.old")
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_file(path: str | Path, first_wins: bool = False) -> Iterator[Path]:
    """Yield a temporary file path beside `path`; it is renamed to `path` on success. With
    `first_wins`, a `path` that exists by then (another writer finished first) is kept as it is."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep(path.parent)
    fd, name = tempfile.mkstemp(prefix=_prefix(path), dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    tmp.chmod(0o666 & ~_umask())
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if not first_wins:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)  # fails where `path` exists: never replaces it
    except FileExistsError:
        pass
    except OSError:  # a file system without hard links: replaced, as without `first_wins`
        os.replace(tmp, path)
        return
    tmp.unlink()


def sweep(folder: str | Path) -> list[Path]:
    """Remove the temporaries in `folder` of writers on this host that are no longer running
    (killed before they could clean up); return what was removed."""
    removed = []
    for entry in os.scandir(folder):
        found = WRITER.search(entry.name) if entry.name.startswith(".") else None
        if found is None or found[2] != HOST or _running(int(found[1])):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            Path(entry.path).unlink(missing_ok=True)
        removed.append(Path(entry.path))
    return removed


def _prefix(path: Path) -> str:
    return f".{path.name}.{os.getpid()}@{HOST}."


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

"""Safe output for the `autoshard` command: an output path is checked before any work starts
(never an input, a symlink, a device, a FIFO or a folder, never the other output, in a folder
that exists), and written all at once in its folder; every failure, SIGINT and SIGTERM
included, removes the temporary files, so a run leaves its outputs complete or not at all."""

from __future__ import annotations

import os
import signal
import stat
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from autoshard.cli.stop import stop
from autoshard.core.errors import ConfigError

NAME_MAX = 200  # leaves room for the temporary file's prefix and suffix within 255 bytes
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived: the command stops, cleaning up, with status 128 + the signal."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.status = 128 + signum


def _raise(signum: int, frame) -> None:
    """Raise `Interrupted`, unless the signal came while a module was being imported: an exception
    there can unwind through an extension's initialisation (torch, FBGEMM) and abort the process,
    so the command stops at once instead; nothing is being written then (see `write_files`)."""
    if _importing(frame):
        stop(signum)
    raise Interrupted(signum)


def _importing(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


@contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT and SIGTERM raise `Interrupted` inside the block (so `finally` and cleanup run);
    only the main thread can receive signals, elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = [signal.signal(s, _raise) for s in SIGNALS]
    try:
        yield
    finally:
        for s, handler in zip(SIGNALS, before, strict=True):
            signal.signal(s, handler)


@contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is done (a temporary file is created and
    recorded, or the outputs are renamed, as one step)."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _same(a: Path, b: Path) -> bool:
    try:
        if a.resolve() == b.resolve():
            return True
        return os.path.samefile(a, b)
    except (OSError, RuntimeError):  # a missing file, or a symlink loop (RuntimeError before Python 3.13)
        return False


def check_outputs(outputs: dict[str, Path | None], inputs: list[Path | None]) -> None:
    """Refuse, before any work, an output (option -> path) that could destroy a file or fail to
    be written: see the module's docstring."""
    given = {option: path for option, path in outputs.items() if path is not None}
    for option, path in given.items():
        name = path.name
        if not name or name in (".", ".."):
            raise ConfigError(f"{option}: {path} (not a file name)")
        if len(os.fsencode(name)) > NAME_MAX:
            raise ConfigError(f"{option}: a file name of {len(os.fsencode(name))} bytes (at most {NAME_MAX})")
        folder = path.parent
        if not folder.is_dir():
            raise ConfigError(f"{option}: {path} (the folder {folder} does not exist)")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ConfigError(f"{option}: {path} (the folder {folder} is not writable)")
        try:
            st = path.lstat()
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise ConfigError(f"{option}: {path} (a symbolic link; give the file it points to, or another name)")
        if st is not None and not stat.S_ISREG(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a device, FIFO or socket"
            raise ConfigError(f"{option}: {path} ({kind}, not a file to write)")
        for source in inputs:
            if source is not None and _same(path, Path(source)):
                raise ConfigError(f"{option}: {path} (an input of this command; it would be overwritten)")
    options = list(given)
    for i, a in enumerate(options):
        for b in options[i + 1:]:
            if _same(given[a], given[b]):
                raise ConfigError(f"{b}: {given[b]} (the same file as {a})")


def write_files(files: dict[Path, str]) -> None:
    """Write each text to its path all at once: every temporary file is made in the target's
    folder, and renamed only when all are written; on any failure none is left behind."""
    temps: list[Path] = []
    path = next(iter(files))
    try:
        for path, text in files.items():
            with _signals_held():
                fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
                temps.append(Path(name))
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(name, 0o666 & ~_umask())
        with _signals_held():
            for target, tmp in zip(files, list(temps), strict=True):
                path = target
                os.replace(tmp, target)
                temps.remove(tmp)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write ({exc.strerror})") from None
    finally:
        with _signals_held():  # a second Ctrl-C cannot cut the cleanup short
            for tmp in temps:
                tmp.unlink(missing_ok=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

"""The `autoshard` console script: interruptible from its first instruction. SIGINT and SIGTERM
get the command's own handling before the command's modules (pandas, NumPy, later torch) are
imported, so an interrupt while they load is the one line of any interrupted run, not a
traceback. Imports nothing of the package but `cli.stop` until the handlers are in place."""

import signal
import sys

from autoshard.cli.stop import stop  # the standard library only: nothing heavy before the handlers


def _early(signum: int, frame) -> None:
    stop(signum)


def run() -> None:
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _early)
    from autoshard.cli.main import main

    sys.exit(main())

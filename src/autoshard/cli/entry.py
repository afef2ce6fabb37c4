"""The `autoshard` console script: interruptible from its first instruction. SIGINT and SIGTERM
get the command's own handling before the command's modules (pandas, NumPy, later torch) are
imported, so an interrupt while they load is the one line of any interrupted run, not a
traceback. Imports nothing of the package until the handlers are in place."""

import os
import signal
import sys


def stop(signum: int, prog: str = "autoshard") -> None:
    """Leave now, with the one line and status an interrupted command has (nothing is being
    written: outputs are written with these signals held, `cli.output.write_files`)."""
    sys.stderr.write(f"{prog}: interrupted by {signal.Signals(signum).name}; no partial output left\n")
    sys.stderr.flush()
    os._exit(128 + signum)


def _early(signum: int, frame) -> None:
    stop(signum)


def run() -> None:
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _early)
    from autoshard.cli.main import main

    sys.exit(main())

"""How an interrupted command leaves: one line and status 128 + the signal, no partial output.
Imports only the standard library, so that `cli.entry` can install it before anything else."""

import os
import signal
import sys


def stop(signum: int, prog: str = "autoshard") -> None:
    """Leave now, with the one line and status an interrupted command has (nothing is being
    written: outputs are written with these signals held, `cli.output.write_files`)."""
    sys.stderr.write(f"{prog}: interrupted by {signal.Signals(signum).name}; no partial output left\n")
    sys.stderr.flush()
    os._exit(128 + signum)

"""`python -m autoshard.pipeline.report`: the report stage (see `build`)."""

import sys

from autoshard.pipeline.report.build import main

if __name__ == "__main__":  # a module walk that imports this file does not run the report
    sys.exit(main())

"""`python -m autoshard.pipeline.report`: the report stage (see `build`)."""

import sys

from autoshard.pipeline.report.build import main

sys.exit(main())

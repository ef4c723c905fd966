"""`python -m worker` runs the toolbus command line."""

import sys

from worker.cli import main

sys.exit(main())

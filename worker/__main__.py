"""`python -m toolbus` runs the toolbus command line."""

import sys

from toolbus.cli import main

sys.exit(main())

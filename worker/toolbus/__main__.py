"""`python -m toolbus` runs the toolbus command line."""

import sys

from toolbus.cli.entry import main

sys.exit(main())

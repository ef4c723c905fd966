"""`python -m toolbus` runs the toolbus command line."""

import sys

from toolbus.cli.main import main

sys.exit(main())

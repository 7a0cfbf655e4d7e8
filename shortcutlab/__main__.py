"""`python -m shortcutlab ...` runs the command line, as the `shortcutlab` console script does."""

import sys

from shortcutlab.cli import main

sys.exit(main())

"""``python -m repromatrix``."""

import sys

from repromatrix.cli import main

sys.exit(main())

"""``python -m tbljax``: the `tbljax` command."""

import sys

from tbljax._src.tools.cli import main

sys.exit(main())

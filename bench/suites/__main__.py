"""``python3 -m bench.suites``: see :mod:`bench.suites.runner`."""

import sys

from .runner import main

sys.exit(main(sys.argv[1:]))

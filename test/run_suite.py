#!/usr/bin/env python3
"""Kept for old command lines: ``python3 test/run_suite.py ARGS`` is ``python3 -m bench.suites ARGS``
(the suites: ``bench/suites/__init__.py``; the runner: ``bench/suites/runner.py``; the Marlin JIT
build: ``scripts/build_marlin_jit.py``)."""

import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench.suites.runner import main

    sys.exit(main(sys.argv[1:]))

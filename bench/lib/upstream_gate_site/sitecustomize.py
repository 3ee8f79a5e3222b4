"""Benchmark-only start-up hook (this folder first on PYTHONPATH): with BENCH_LIFT_SPLITKV_GATE=1,
``bench.lib.upstream_gate.install_from_env`` in every Python process started so (the engine's
spawned schedulers too); then any other ``sitecustomize`` further down ``sys.path`` runs as usual."""

import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
if os.environ.get("BENCH_LIFT_SPLITKV_GATE") == "1":
    from bench.lib import upstream_gate  # the repository root is on PYTHONPATH after this folder

    upstream_gate.install_from_env()
for _p in sys.path:  # the sitecustomize this one shadows
    _f = os.path.join(_p or ".", "sitecustomize.py")
    if os.path.abspath(_p or ".") != _here and os.path.isfile(_f):
        _spec = importlib.util.spec_from_file_location("_sitecustomize_next", _f)
        _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
        break

"""Benchmark-only: SGLang's own split-KV verify path (``verify_splitkv_fwd``) switched on in an
engine on CUDA, by lifting its gfx95 gate in the lab's processes (never in the plugin).

SGLang 0.5.16's ``TritonAttnBackend`` already calls ``verify_splitkv_fwd`` on TARGET_VERIFY
(``forward_extend``) when ``self.use_verify_splitkv`` is set, and sets it to
``is_gfx95_supported() and SGLANG_ENABLE_SPLITKV_VERIFY and topk == 1``
(``srt/layers/attention/triton_backend.py``). :func:`lift_splitkv_gate` wraps the class's
``__init__`` so that the flag is ``SGLANG_ENABLE_SPLITKV_VERIFY and topk == 1`` on any device;
with ``upstream_src`` the backend calls that source's ``verify_splitkv_fwd`` instead of the
installed one (0.5.23's declines MLA, whose 576/512 shape 0.5.16's would launch). Every call is
counted; a line ``UPSTREAM_GATE verify_splitkv_fwd ran|declined`` is printed (stderr) the first
time each outcome happens, and ``stats()`` gives the counts. Under a CUDA graph the Python
function runs at capture only: ``ran`` at capture means the graph holds the split-KV kernels.

Engines (``python -m bench verify``) run their schedulers in spawned processes; to reach them,
put ``bench/lib/upstream_gate_site`` first on ``PYTHONPATH``, the repository root after it, and set
``BENCH_LIFT_SPLITKV_GATE=1`` (optionally ``BENCH_UPSTREAM_SRC``: a folder or tarball as for
``python -m bench kernel --upstream-src``): its ``sitecustomize`` calls :func:`install_from_env`
in every Python process started so.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

TARGET = "sglang.srt.layers.attention.triton_backend"
ENV = "BENCH_LIFT_SPLITKV_GATE"
_STATS = {"ran": 0, "declined": 0, "backends": 0, "source": None}


def stats() -> dict:
    """Counts of ``verify_splitkv_fwd`` calls that ran / declined, backends patched, its source."""
    return dict(_STATS)


def _counted(fn):
    def verify_splitkv_fwd(*args, **kwargs):
        ok = fn(*args, **kwargs)
        key = "ran" if ok else "declined"
        _STATS[key] += 1
        if _STATS[key] == 1:
            q = args[0]
            print(f"UPSTREAM_GATE verify_splitkv_fwd {key} (first time; q {tuple(q.shape)}, source "
                  f"{_STATS['source']})", file=sys.stderr, flush=True)
        return ok
    return verify_splitkv_fwd


def patch_backend_module(module, upstream_src: str | None = None) -> None:
    """Wrap ``module.TritonAttnBackend.__init__`` (``module``: SGLang's triton_backend): the gate
    without gfx95, and the counted (optionally source-loaded) ``verify_splitkv_fwd``. Raises
    RuntimeError (one line) when the release has no such path or the source cannot be loaded."""
    cls = getattr(module, "TritonAttnBackend", None)
    if cls is None or "use_verify_splitkv" not in open(module.__file__).read():
        raise RuntimeError(f"{module.__file__}: no TritonAttnBackend.use_verify_splitkv in this SGLang")
    fn = None
    if upstream_src:
        from bench import upstream_kernels as uk

        k = uk.load_kernels(["splitkv"], upstream_src)["splitkv"]
        if k.fn is None:
            raise RuntimeError(f"{ENV}: {k.error}")
        fn, _STATS["source"] = k.fn, f"{k.origin} sglang {k.version} {k.path}"
    else:
        _STATS["source"] = "installed"
    orig = cls.__init__
    envs = module.envs

    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        self.use_verify_splitkv = bool(envs.SGLANG_ENABLE_SPLITKV_VERIFY.get()) and self.topk == 1
        import torch

        base = fn if fn is not None else self.verify_splitkv_fwd
        self.verify_splitkv_fwd = torch.compiler.disable(_counted(base))
        _STATS["backends"] += 1

    cls.__init__ = __init__


class _AfterImport(importlib.abc.MetaPathFinder):
    """Patches TARGET right after it is executed (then leaves ``sys.meta_path``)."""

    def __init__(self, upstream_src):
        self.upstream_src = upstream_src

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module
        src = self.upstream_src

        def exec_module(module):
            run(module)
            patch_backend_module(module, src)
            print(f"UPSTREAM_GATE lifted in pid {os.getpid()} (source {_STATS['source']})", file=sys.stderr,
                  flush=True)

        spec.loader.exec_module = exec_module
        return spec


def install_from_env() -> bool:
    """With ``BENCH_LIFT_SPLITKV_GATE=1``: patch the triton backend now if it is imported, else
    right after its import (``BENCH_UPSTREAM_SRC`` as :func:`patch_backend_module`'s source).
    Returns whether it did anything."""
    if os.environ.get(ENV) != "1":
        return False
    src = os.environ.get("BENCH_UPSTREAM_SRC") or None
    if TARGET in sys.modules:
        patch_backend_module(sys.modules[TARGET], src)
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(src))
    return True

"""What only sglang 0.5.23 needs; imported from ``sglang_adapter`` only (the one other module that
may import ``sglang.srt``), and only when ``sglang_adapter.API_0523``.

0.5.23 differences handled here:

* ``ServerArgs`` is a msgspec Struct whose fields keep the operator's *raw* input; resolution
  (``resolve_once()``) records its decisions as declarations, read through
  ``sglang.srt.arg_groups.overrides.resolving_view`` (e.g. ``NEXTN`` stays in the field, the view
  says ``EAGLE``; ``speculative_num_draft_tokens`` 7 stays, the view says ``num_steps + 1``).
* the decode-graph runner is chosen by ``ModelRunner._decode_cuda_graph_runner_cls()`` and built
  as ``cls(model_runner)``: :func:`verify_runner_cls` is our runner with that constructor.
* ``KVWriteLoc`` carries a ``physical`` mark (``KVWriteLoc.for_batch``), and the unified-pool
  page-table translation moved from ``TritonAttnBackend._translate_kv_loc`` to the runner's
  ``KVIndexTranslator`` (``is_translating``).
"""

from __future__ import annotations

import functools
from typing import Any


def resolved(server_args: Any) -> Any:
    from sglang.srt.arg_groups.overrides import resolving_view

    return resolving_view(server_args)


def kv_write_loc(forward_batch):
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    return KVWriteLoc.for_batch(forward_batch)


def kv_translation_active(backend) -> bool:
    translator = getattr(backend, "kv_index_translator", None)
    return bool(getattr(translator, "is_translating", False))


@functools.lru_cache(maxsize=None)
def verify_runner_cls():
    """``VerifyCudaGraphRunner`` constructible as SGLang 0.5.23 builds a decode-graph runner,
    ``cls(model_runner)``: config and counters come from the chain backend, capture is timed and
    its GPU memory counted as on 0.5.16 (``sglang_adapter.capture_verify_runner``)."""
    from sglang_verify_graph import sglang_adapter as sa
    from sglang_verify_graph.runner import VerifyCudaGraphRunner

    class VerifyCudaGraphRunnerV0523(VerifyCudaGraphRunner):
        __doc__ = VerifyCudaGraphRunner.__doc__

        def __init__(self, model_runner, **kwargs):
            if kwargs:
                raise RuntimeError(f"VerifyCudaGraphRunner: unexpected arguments {sorted(kwargs)}")
            sa.capture_verify_runner(
                model_runner, lambda mr, cfg, counters: VerifyCudaGraphRunner.__init__(self, mr, cfg, counters))

    return VerifyCudaGraphRunnerV0523

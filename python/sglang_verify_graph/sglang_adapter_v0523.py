"""What only sglang 0.5.23 needs; imported from ``sglang_adapter`` only (the one other module that
may import ``sglang.srt``), and only when ``sglang_adapter.API_0523``. Imports nothing from this
package.

0.5.23 differences handled here:

* ``ServerArgs`` is a msgspec Struct whose fields keep the operator's *raw* input; resolution
  (``resolve_once()``) records its decisions as declarations, read through
  ``sglang.srt.arg_groups.overrides.resolving_view`` (e.g. ``NEXTN`` stays in the field, the view
  says ``EAGLE``; ``speculative_num_draft_tokens`` 7 stays, the view says ``num_steps + 1``).
* the decode-graph runner is chosen by ``ModelRunner._decode_cuda_graph_runner_cls()`` and built
  as ``cls(model_runner)`` (``capture.verify_runner_cls_0523`` is our runner with that
  constructor);
* ``KVWriteLoc`` carries a ``physical`` mark (``KVWriteLoc.for_batch``), and the unified-pool
  page-table translation moved from ``TritonAttnBackend._translate_kv_loc`` to the runner's
  ``KVIndexTranslator`` (``is_translating``).
"""

from __future__ import annotations

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

"""sglang_verify_graph: an SGLang plugin adding ``--enable-verify-cuda-graph``.

A dedicated CUDA-graph runner for the EAGLE/EAGLE-3 target-verify step with
``--speculative-eagle-topk 1`` (a causal chain of ``num_steps + 1`` tokens per request), whose
attention is a decode-class split-KV kernel over the page table. Entry point:
``sglang_verify_graph.plugin:register`` in the ``sglang.srt.plugins`` group.
"""

__version__ = "0.1.0"

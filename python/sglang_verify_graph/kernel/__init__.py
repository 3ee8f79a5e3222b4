"""Project GPU kernels (Triton) for the verify CUDA graph: the topk=1 chain verify attention."""

from sglang_verify_graph.kernel.chain_verify_attention import (  # noqa: F401
    ChainVerifyShape,
    chain_verify_attention_fwd,
    chain_verify_attention_ref,
    choose_num_kv_splits,
    workspace_numel,
)

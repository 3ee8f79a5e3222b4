"""The chain verify attention kernel (Triton): the topk=1 chain's split-KV attention over the
page table, for the verify graph and the draft extend."""

from sglang_verify_graph.kernel.chain_verify_attention import (  # noqa: F401
    DRAFT_EXTEND_TEST_FAULTS,
    TEST_FAULTS,
    ChainVerifyShape,
    check_test_fault,
    chain_verify_attention_fwd,
    chain_verify_attention_ref,
    choose_num_kv_splits,
    launch_config,
    launch_with_config,
    workspace_numel,
)

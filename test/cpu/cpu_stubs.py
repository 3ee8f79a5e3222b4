"""Stand-ins shared by the CPU tests of the chain backends and the runner: SGLang's forward modes,
a resolved config, and a chain backend with the state ``forward_extend`` reads. A plain module
(not ``conftest``), so that ``from cpu_stubs import ...`` names this file whichever conftest
pytest loaded last."""

from types import SimpleNamespace


def forward_mode(name: str):
    """SGLang's ``ForwardMode.<name>``."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return getattr(ForwardMode, name)


def chain_config(**overrides):
    """A resolved ``VerifyGraphConfig`` for the chain backends' CPU tests: EAGLE3, triton, top-k 1,
    num_steps 2 (3 draft tokens, as :func:`chain_backend_stub`), page size 1."""
    from sglang_verify_graph.config import VerifyGraphConfig

    return VerifyGraphConfig(**{
        "num_steps": 2, "num_draft_tokens": 3, "topk": 1, "speculative_algorithm": "EAGLE3",
        "attention_backend": "triton", "page_size": 1, "max_running_requests": None,
        "num_kv_splits": None, "log_every": 0, **overrides})


def chain_backend_stub(cls, h=4, kvh=2, d=16, ndt=3, bs=2, **layer_fields):
    """``(backend, layer, q, k)``: a chain backend of class ``cls`` (``chain_backend``) with the
    state ``forward_extend`` reads and no model runner (a 64-slot K/V pool of zeros, prefix 5 per
    request, KV writes stubbed), one layer (``layer_fields`` override its attributes), and random
    ``q`` [bs * ndt, h * d] / ``k`` [bs * ndt, kvh, d] float32."""
    import torch

    from sglang_verify_graph.kernel import ChainVerifyShape
    from sglang_verify_graph import chain_backend as cb

    backend = cls.__new__(cls)
    kbuf = torch.zeros(64, kvh, d)
    backend.token_to_kv_pool = SimpleNamespace(get_key_buffer=lambda i: kbuf,
                                               get_value_buffer=lambda i: kbuf)
    backend.req_to_token = torch.zeros(4, 32, dtype=torch.int32)
    backend.chain_shape = ChainVerifyShape(h, kvh, d, d, ndt)
    backend._chain_meta = cb.ChainMetadata(torch.zeros(bs, dtype=torch.int64),
                                           torch.full((bs,), 5, dtype=torch.int64), 1,
                                           torch.empty(4096), torch.empty(256))
    backend._set_kv_buffer = lambda *a, **k: None
    backend.verify_cfg = chain_config()
    layer = SimpleNamespace(**{
        "layer_id": 0, "tp_q_head_num": h, "qk_head_dim": d, "v_head_dim": d, "scaling": d ** -0.5,
        "sliding_window_size": -1, "is_cross_attention": False, "xai_temperature_len": -1,
        "logit_cap": 0.0, "logit_capping_method": "tanh", "k_scale": None, "k_scale_float": 1.0,
        "v_scale_float": 1.0, **layer_fields})
    q, k = torch.randn(bs * ndt, h * d), torch.randn(bs * ndt, kvh, d)
    return backend, layer, q, k

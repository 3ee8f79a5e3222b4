"""ChainVerifyTritonBackend.forward_extend serves the layers it can compute: an FP8 checkpoint's
unit KV scales on a bf16 KV cache change nothing, so such a layer is served, not refused."""

from __future__ import annotations

from types import SimpleNamespace

import torch



def test_fp8_checkpoint_layer_with_unit_kv_scale_is_served(monkeypatch):
    """sglang 0.5.16 ``Fp8Config.get_quant_method`` returns ``Fp8KVCacheMethod`` for every
    ``RadixAttention`` (fp8.py), whose ``process_weights_after_loading`` sets ``k_scale`` /
    ``v_scale`` to 1.0 when the checkpoint has no KV scales. With a bf16 KV cache the pool ignores
    the scales (``set_kv_buffer`` only divides when it converts dtype), so the chain kernel's result
    equals upstream's: the layer is served (a refusal here would stop DeepSeek-V3 / Kimi-K2 FP8
    checkpoints at the graph capture)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang_verify_graph import chain_backend as cb
    from sgl_verify_kernel import ChainVerifyShape

    h, kvh, d, ndt, bs = 4, 2, 16, 2, 1
    backend = cb.ChainVerifyTritonBackend.__new__(cb.ChainVerifyTritonBackend)
    kbuf = torch.zeros(32, kvh, d)
    backend.token_to_kv_pool = SimpleNamespace(get_key_buffer=lambda i: kbuf,
                                               get_value_buffer=lambda i: kbuf)
    backend.req_to_token = torch.zeros(2, 16, dtype=torch.int32)
    backend.chain_shape = ChainVerifyShape(h, kvh, d, d, ndt)
    backend._chain_meta = cb.ChainMetadata(torch.zeros(bs, dtype=torch.int64),
                                           torch.ones(bs, dtype=torch.int64), 1,
                                           torch.empty(1024), torch.empty(64))
    backend._set_kv_buffer = lambda *a, **k: None
    monkeypatch.setattr(cb.adapter, "kv_write_loc", lambda *a, **k: None)
    calls = []
    monkeypatch.setattr(cb, "chain_verify_attention_fwd", lambda *a, **k: calls.append(a))

    one = torch.nn.Parameter(torch.tensor(1.0), requires_grad=False)
    layer = SimpleNamespace(
        layer_id=0, tp_q_head_num=h, qk_head_dim=d, v_head_dim=d, scaling=d ** -0.5,
        sliding_window_size=-1, is_cross_attention=False, xai_temperature_len=-1,
        logit_cap=0.0, logit_capping_method="tanh",
        k_scale=one, v_scale=one, k_scale_float=1.0, v_scale_float=1.0,  # fp8 ckpt, no KV scales
    )
    fb = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY,
                         out_cache_loc=torch.zeros(bs * ndt, dtype=torch.int64))
    q = torch.randn(bs * ndt, h * d)
    k = torch.randn(bs * ndt, kvh, d)
    backend.forward_extend(q, k, k.clone(), layer, fb)
    assert len(calls) == 1

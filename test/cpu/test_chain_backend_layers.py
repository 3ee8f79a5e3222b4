"""ChainVerifyTritonBackend.forward_extend serves the layers it can compute: an FP8 checkpoint's
unit KV scales on a bf16 KV cache change nothing, so such a layer is served, not refused."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from cpu_stubs import chain_backend_stub


def test_fp8_checkpoint_layer_with_unit_kv_scale_is_served(monkeypatch):
    """sglang 0.5.16 ``Fp8Config.get_quant_method`` returns ``Fp8KVCacheMethod`` for every
    ``RadixAttention`` (fp8.py), whose ``process_weights_after_loading`` sets ``k_scale`` /
    ``v_scale`` to 1.0 when the checkpoint has no KV scales. With a bf16 KV cache the pool ignores
    the scales (``set_kv_buffer`` only divides when it converts dtype), so the chain kernel's result
    equals upstream's: the layer is served (a refusal here would stop DeepSeek-V3 / Kimi-K2 FP8
    checkpoints at the graph capture)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang_verify_graph import chain_backend as cb

    h, kvh, d, ndt, bs = 4, 2, 16, 2, 1
    one = torch.nn.Parameter(torch.tensor(1.0), requires_grad=False)
    backend, layer, q, k = chain_backend_stub(  # fp8 checkpoint, no KV scales
        cb.ChainVerifyTritonBackend, h, kvh, d, ndt, bs, k_scale=one, v_scale=one)
    monkeypatch.setattr(cb.adapter, "kv_write_loc", lambda *a, **k: None)
    calls = []
    monkeypatch.setattr(cb, "chain_verify_attention_fwd", lambda *a, **k: calls.append(a))

    fb = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY,
                         out_cache_loc=torch.zeros(bs * ndt, dtype=torch.int64))
    backend.forward_extend(q, k, k.clone(), layer, fb)
    assert len(calls) == 1

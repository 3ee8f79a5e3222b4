"""CPU tests for the defects an external review found (see the review report).

Each test states the behaviour the project promises (README / docstrings) or that SGLang 0.5.16
needs, and fails on the code as reviewed. Tests that still fail are marked
``xfail(strict=True)`` so CI stays green and flags the day a fix lands (XPASS -> remove the mark).

* F1  FP8 checkpoints (every ``RadixAttention`` of an ``fp8`` quant config gets ``k_scale`` = 1.0
      even with a bf16 KV cache) are refused by ``ChainVerifyTritonBackend.forward_extend``.
* F2  ``--enable-page-major-kv-layout`` (Triton-only, so it passes every other check) gives 4-D
      strided K/V views that the chain backend/kernel index as ``[slots, kv_heads, dim]``.
* F3  ``sglang_adapter.register`` calls ``HookRegistry.apply_hooks()`` while plugins are still
      loading: hooks that plugins loaded later register on an already-patched target are dropped.
* F4  With ``--disable-cuda-graph-padding`` a batch size that is not a captured bucket is counted
      as ``capture_hidden_mode_mismatch``.
* F5  ``--kv-cache-dtype fp8_*`` / ``--enable-deterministic-inference`` pass the launch-time
      validation; the chain backend refuses them only in the scheduler, after model load.
* F6  When SGLang wraps the chain backend (hybrid linear-attention / sparse wrappers), the capture
      hook silently captures upstream's runner although the flag was requested.
* F7  The kernel's launcher accepts shapes it computes wrongly (heads not divisible by KV heads,
      q with a non-unit last-dim stride) and leaves NaN or garbage in ``o`` without an error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sglang_verify_graph.config import EnvSettings, VerifyGraphConfigError, build_config
from sglang_verify_graph.sglang_adapter import API_0523

ROOT = Path(__file__).resolve().parents[2]
ON = EnvSettings(enable=True)
only_0516 = pytest.mark.skipif(API_0523, reason="reviewed against sglang 0.5.16 internals")


def _clean_env():
    return {k: v for k, v in os.environ.items()
            if k not in ("SGLANG_ENABLE_VERIFY_CUDA_GRAPH", "SGLANG_PLUGINS")
            and not k.startswith("SGLANG_VERIFY_GRAPH_")}


# ---- F1: FP8 checkpoints (k_scale == 1.0 on a bf16 KV cache) ------------------------------------
def test_fp8_checkpoint_layer_with_unit_kv_scale_is_served(monkeypatch):
    """sglang 0.5.16 ``Fp8Config.get_quant_method`` returns ``Fp8KVCacheMethod`` for every
    ``RadixAttention`` (fp8.py), whose ``process_weights_after_loading`` sets ``k_scale`` /
    ``v_scale`` to 1.0 when the checkpoint has no KV scales. With a bf16 KV cache the pool ignores
    the scales (``set_kv_buffer`` only divides when it converts dtype), so the chain kernel's result
    equals upstream's. Today the first verify forward (the graph capture) raises RuntimeError, so
    DeepSeek-V3 / Kimi-K2 FP8 checkpoints cannot start with --enable-verify-cuda-graph."""
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
    monkeypatch.setattr(cb.sa, "kv_write_loc", lambda *a, **k: None)
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


# ---- F2: page-major KV layout --------------------------------------------------------------------


@only_0516  # 0.5.23 itself rejects --enable-page-major-kv-layout without unified memory
def test_page_major_kv_layout_is_rejected_at_launch(real_args):
    """0.5.16 ``PageMajorMHATokenToKVPool`` hands out 4-D strided views
    ``(num_pages, page_size, heads, dim)`` (memory_pool.py) and the flag *requires* the Triton
    backend, so it passes every check. ``ChainVerifyTritonBackend.__init__`` then takes
    ``k_buf.shape[1]`` (page size) as ``num_kv_heads`` and the kernel addresses slot ``loc`` at
    ``loc * stride(0)`` (a page stride): wrong keys or an illegal memory access. Since 6b108df the
    backend refuses 4-D views, but only in the scheduler after the model has loaded; the README
    promises one line at launch for a conflicting setting."""
    sa = real_args(enable_page_major_kv_layout=True, page_size=16)
    assert sa.enable_page_major_kv_layout  # SGLang accepts it with triton
    with pytest.raises(VerifyGraphConfigError):
        build_config(sa, ON)


# ---- F3: apply_hooks() during plugin loading drops later plugins' hooks ---------------------------
_LATER_PLUGIN = textwrap.dedent("""
    import argparse
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang_verify_graph import plugin

    plugin.register()            # what load_plugins() runs for our entry point ...

    def later_plugin_flag(result, parser):   # ... then for a plugin after us in entry-point order
        parser.add_argument("--later-plugin-flag", action="store_true")

    HookRegistry.register("sglang.srt.server_args.ServerArgs.add_cli_args",
                          later_plugin_flag, HookType.AFTER)
    HookRegistry.apply_hooks()   # load_plugins() applies all hooks once, at the end

    from sglang.srt.server_args import ServerArgs
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    print("LATER", "--later-plugin-flag" in parser._option_string_actions)
    print("OURS", "--enable-verify-cuda-graph" in parser._option_string_actions)
""")


def test_register_keeps_hooks_of_plugins_loaded_after_us():
    """``load_plugins()`` runs every plugin's ``register`` and calls ``HookRegistry.apply_hooks()``
    once at the end; ``apply_hooks`` skips targets already in ``_patched``. Our ``register`` calls
    ``apply_hooks()`` itself, so a plugin loaded after ours that hooks e.g.
    ``ServerArgs.add_cli_args`` (to add its own flag) is silently ignored."""
    proc = subprocess.run([sys.executable, "-c", _LATER_PLUGIN], env=_clean_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OURS True" in proc.stdout
    assert "LATER True" in proc.stdout, proc.stdout


# ---- F4: fallback reason under --disable-cuda-graph-padding ---------------------------------------
@only_0516  # the fake runner mirrors 0.5.16's can_run_graph; 0.5.23's reads other attributes
def test_uncaptured_bs_without_padding_is_not_called_hidden_mode_mismatch():
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

    from sglang_verify_graph import counters as C
    from sglang_verify_graph.runner import VerifyCudaGraphRunner

    runner = VerifyCudaGraphRunner.__new__(VerifyCudaGraphRunner)
    captured = (1, 2, 4, 8)
    runner.__dict__.update(
        counters=C.VerifyCounters(), disable_padding=True, capture_bs=list(captured), max_bs=8,
        captured_req_width=4, ragged_verify_mode=False, require_mlp_tp_gather=False,
        require_mlp_sync=False, enable_two_batch_overlap=False, enable_pdmux=False,
        is_encoder_decoder=False, capture_hidden_mode=CaptureHiddenMode.FULL,
        backend=SimpleNamespace(can_run=lambda fb, key: key.size in captured),
        model_runner=SimpleNamespace(spec_algorithm=SimpleNamespace(is_ngram=lambda: False)),
    )
    fb = SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY, replace_embeds=None, batch_size=3,
        capture_hidden_mode=CaptureHiddenMode.FULL, lora_ids=None,
        spec_info=SimpleNamespace(num_tokens_per_req=4, capture_hidden_mode=CaptureHiddenMode.FULL),
    )
    assert runner.can_run_graph(fb) is False  # upstream: bs 3 is not a captured bucket
    reason = runner.counters._last_reason
    assert reason != C.REASON_HIDDEN_MODE, (reason, runner.counters._last_detail)


# ---- F5: settings known at launch that only the scheduler refuses --------------------------------
@pytest.mark.parametrize("overrides", [dict(kv_cache_dtype="fp8_e4m3"),
                                       dict(enable_deterministic_inference=True)],
                         ids=["kv-fp8", "deterministic"])
def test_backend_only_conflicts_fail_at_launch(real_args, overrides):
    """README: "a conflicting setting stops the launch with one line naming the flag and the fix".
    Both settings are on the resolved ServerArgs, yet ``build_config`` accepts them and the launch
    dies later in the scheduler with a traceback."""
    with pytest.raises(VerifyGraphConfigError):
        build_config(real_args(**overrides), ON)


# ---- F6: silent fallback when SGLang wraps the chain backend -------------------------------------
def test_wrapped_chain_backend_does_not_silently_fall_back():
    """``attn_backend_wrapper`` (attention_registry.py) wraps the backend our triton factory built
    for hybrid linear-attention / sparse models (e.g. ``HybridLinearAttnBackend(full_attn_backend=
    ChainVerifyTritonBackend)``). The hook then returns upstream's capture: no VerifyCudaGraphRunner,
    no counters in /get_server_info, no QLEN_ONLY mask, and no error although the flag is on."""
    from sglang_verify_graph import chain_backend as cb
    from sglang_verify_graph import sglang_adapter

    chain = cb.ChainVerifyTritonBackend.__new__(cb.ChainVerifyTritonBackend)
    wrapper = SimpleNamespace(full_attn_backend=chain)
    model_runner = SimpleNamespace(attn_backend=wrapper, is_draft_worker=False)
    upstream = type("UpstreamDecodeCudaGraphRunner", (), {})

    try:
        if API_0523:  # 0.5.23 picks the runner class in ModelRunner._decode_cuda_graph_runner_cls
            got = sglang_adapter.decode_runner_cls_hook(lambda mr: upstream, model_runner)
        else:  # 0.5.16 captures in cuda_graph_setup.capture_decode_graph
            got = sglang_adapter.capture_decode_graph_hook(lambda **kw: upstream,
                                                           model_runner=model_runner)
    except Exception:
        return  # a clear refusal (or unwrapping) is acceptable
    assert got is not upstream, "flag requested, chain backend built, upstream runner captured"


# ---- F7: launcher accepts shapes the kernel computes wrongly -------------------------------------
_KERNEL_PROBE = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {kern!r})
    import torch
    from sgl_verify_kernel import ChainVerifyShape, chain_verify_attention_fwd, workspace_numel
    case = sys.argv[1]
    g = torch.Generator().manual_seed(0)
    ndt, d, bs = 2, 16, 1
    h, kvh = (6, 4) if case == "heads" else (4, 2)
    k = torch.randn(64, kvh, d, generator=g)
    r2t = torch.arange(1, 33, dtype=torch.int32).view(1, 32)
    rpi = torch.zeros(bs, dtype=torch.int64); sl = torch.tensor([10])
    if case == "stride":
        q = torch.randn(bs * ndt, d, h, generator=g).transpose(1, 2)  # q.stride(-1) != 1
    else:
        q = torch.randn(bs * ndt, h, d, generator=g)
    shape = ChainVerifyShape(h, kvh, d, d, ndt)
    n_out, n_lse = workspace_numel(shape, bs, 1)
    o = torch.full((bs * ndt, h, d), float("nan"))
    try:
        chain_verify_attention_fwd(q, k, k, o, r2t, rpi, sl, shape, 1, d ** -0.5,
                                   torch.empty(n_out), torch.empty(n_lse))
    except ValueError as e:
        print("RESULT", json.dumps({{"raised": str(e)}})); raise SystemExit(0)
    # float64 reference: draft j of the request sees keys r2t[0, :10 + j + 1]
    ref = torch.empty(bs * ndt, h, d, dtype=torch.float64)
    for j in range(ndt):
        locs = r2t[0, : 10 + j + 1].long()
        for hh in range(h):
            kk = k[locs, min(hh // max(h // kvh, 1), kvh - 1)].double()
            p = torch.softmax(kk @ q[j, hh].double() * d ** -0.5, 0)
            ref[j, hh] = p @ kk
    err = ((o.double() - ref).norm() / ref.norm()).item()
    print("RESULT", json.dumps({{"nan": bool(torch.isnan(o).any()), "err": err}}))
""")


@pytest.mark.parametrize("case", ["heads", "stride"])
def test_kernel_launcher_rejects_shapes_it_cannot_compute(case):
    """Heads 6 / KV heads 4: group = 1, stage 1 never writes heads 4 and 5 and stage 2 merges
    uninitialised scratch for them (NaN or garbage in ``o``).
    q with stride(-1) != 1: the kernel adds ``offs_d`` unscaled, reading the wrong elements.
    Either must raise ValueError instead of returning garbage."""
    code = _KERNEL_PROBE.format(kern=str(ROOT / "sgl-kernel"))
    env = dict(_clean_env(), TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", code, case], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    if "raised" in result:
        return
    assert not result["nan"] and result["err"] < 1e-4, result

"""Per-version CPU checks (sglang 0.5.16 and 0.5.23; CI runs this tier once per version).

* the installed version is one the adapter supports, and the adapter picked its code paths;
* in a fresh interpreter, with the feature on: ``plugin.install`` reports no missing hook
  target, the flag is in SGLang's own parser, ``prepare_server_args`` + the version's validation
  point accept a good launch and stop a bad one with one line, and (0.5.23) the installed
  ``ModelRunner._decode_cuda_graph_runner_cls`` returns our runner for an EAGLE topk=1 target;
* the hook functions decide correctly on stubs (ours only for the EAGLE topk=1 target with the
  chain backend, upstream's otherwise);
* every SGLang class attribute, method and signature that runner.py / chain_backend.py /
  selftest.py / the adapter rely on exists in the installed SGLang source.

Version-specific tests skip on the other version.
"""

import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from sglang_verify_graph import capture, plugin
from sglang_verify_graph import sglang_adapter as sa
from sglang_verify_graph.config import ENV_ENABLE, FLAG

only_0523 = pytest.mark.skipif(not sa.API_0523, reason="sglang 0.5.23 code path")
only_0516 = pytest.mark.skipif(sa.API_0523, reason="sglang 0.5.16 code path")


def test_installed_version_is_supported():
    assert sa.SGLANG_VERSION in sa.SUPPORTED_VERSIONS
    assert sa.API_0523 == (sa.SGLANG_VERSION == "0.5.23")
    assert sa.VALIDATES_AT_CONSTRUCTION == (not sa.API_0523)


def test_version_parsing():
    assert sa._version_tuple("0.5.16") == (0, 5, 16)
    assert sa._version_tuple("0.5.23.post1") == (0, 5, 23)
    assert sa._version_tuple("0.6.0rc1+cu130") == (0, 6, 0)


# ---- fresh interpreter: register, parse, validate --------------------------------------------
_DRIVER = textwrap.dedent("""
    import argparse, json, os, sys
    from types import SimpleNamespace
    from sglang_verify_graph import plugin, sglang_adapter as sa
    out = {"missing": plugin.install(runtime=True)}
    from sglang.srt.server_args import ServerArgs, prepare_server_args
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    out["flag_in_parser"] = "--enable-verify-cuda-graph" in parser._option_string_actions
    from sglang.srt.layers.attention import attention_registry
    out["triton_factory"] = bool(getattr(attention_registry.ATTENTION_BACKENDS["triton"],
                                         "_verify_graph_factory", False))
    if sa.API_0523:
        from sglang.srt.model_executor.model_runner import ModelRunner
        from sglang_verify_graph.chain_backend import ChainVerifyTritonBackend
        from sglang_verify_graph.runner import VerifyCudaGraphRunner
        class Algo:
            def is_uno(self): return False
            def is_eagle(self): return True
        stub = SimpleNamespace(spec_algorithm=Algo(), is_draft_worker=False,
                               server_args=SimpleNamespace(speculative_eagle_topk=1),
                               attn_backend=object.__new__(ChainVerifyTritonBackend))
        cls = ModelRunner._decode_cuda_graph_runner_cls(stub)
        out["runner_cls_ours"] = issubclass(cls, VerifyCudaGraphRunner)
        stub.attn_backend = object()
        stub.is_draft_worker = True  # (an EAGLE topk=1 *target* without it is refused)
        out["runner_cls_plain"] = ModelRunner._decode_cuda_graph_runner_cls(stub).__name__
    sa_obj = prepare_server_args(sys.argv[1:])
    if hasattr(sa_obj, "resolve_once"):
        sa_obj.resolve_once()
    out["enabled"] = getattr(sa_obj, "_enable_verify_cuda_graph", None)
    out["ndt"] = getattr(getattr(sa_obj, "_verify_cuda_graph_config", None), "num_draft_tokens", None)
    print("RESULT " + json.dumps(out))
""")


def _run(argv):
    env = {k: v for k, v in os.environ.items()
           if k != "SGLANG_PLUGINS" and not k.startswith("SGLANG_VERIFY_GRAPH_")}
    env[ENV_ENABLE] = "1"
    proc = subprocess.run([sys.executable, "-c", _DRIVER, *argv], env=env, capture_output=True,
                          text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    return proc, (json.loads(lines[-1][len("RESULT "):]) if lines else None)


def _argv(tiny_model_dirs, *extra):
    target, draft = tiny_model_dirs
    return ["--model-path", target, "--device", "cpu", "--skip-tokenizer-init",
            "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", draft,
            "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
            "--attention-backend", "triton", FLAG, *extra]


def test_hooks_resolve_install_and_flag_validates(tiny_model_dirs):
    proc, out = _run(_argv(tiny_model_dirs))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out["missing"] == []
    assert out["flag_in_parser"] and out["triton_factory"]
    assert out["enabled"] is True and out["ndt"] == 3
    if sa.API_0523:
        assert out["runner_cls_ours"] is True
        assert out["runner_cls_plain"] == "DecodeCudaGraphRunner"


def test_validation_error_is_one_line_exit_2(tiny_model_dirs):
    proc, out = _run(_argv(tiny_model_dirs, "--attention-backend", "flashinfer"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [f"error: {FLAG}: serves flashinfer verify only for MLA targets (DeepSeek-V3 / "
                      "Kimi-K2.5 class); this target has no MLA (--attention-backend = flashinfer). "
                      "Fix: pass --attention-backend triton (or fa3)."]
    assert "Traceback" not in proc.stderr


# ---- hook decisions on stubs -----------------------------------------------------------------
class _Algo:
    def __init__(self, eagle=True):
        self.eagle = eagle

    def is_eagle(self):
        return self.eagle

    def is_uno(self):
        return False


def _model_runner(chain=True, draft=False, topk=1, eagle=True):
    from sglang_verify_graph.chain_backend import ChainVerifyTritonBackend

    backend = object.__new__(ChainVerifyTritonBackend) if chain else object()
    return SimpleNamespace(spec_algorithm=_Algo(eagle), is_draft_worker=draft,
                           server_args=SimpleNamespace(speculative_eagle_topk=topk),
                           attn_backend=backend)


@only_0523
@pytest.mark.parametrize("kwargs,ours", [
    (dict(), True),
    (dict(chain=False), False),
    (dict(draft=True), False),
    (dict(topk=4), False),
    (dict(eagle=False), False),
])
def test_0523_runner_cls_hook(kwargs, ours):
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    from sglang_verify_graph.runner import VerifyCudaGraphRunner

    original = getattr(ModelRunner._decode_cuda_graph_runner_cls, "__wrapped__",
                       ModelRunner._decode_cuda_graph_runner_cls)
    cls = plugin.decode_runner_cls_hook(original, _model_runner(**kwargs))
    assert issubclass(cls, DecodeCudaGraphRunner)
    assert issubclass(cls, VerifyCudaGraphRunner) == ours
    if not ours:
        assert cls is DecodeCudaGraphRunner


@only_0523
def test_0523_runner_cls_is_built_with_model_runner_only(monkeypatch):
    """SGLang 0.5.23 builds the class as ``cls(model_runner)``: ours takes config and counters
    from the chain backend and fills the capture counters."""
    from sglang_verify_graph import counters as C
    from sglang_verify_graph.runner import VerifyCudaGraphRunner

    seen = {}

    def fake_init(self, model_runner, cfg, counters):
        seen.update(model_runner=model_runner, cfg=cfg, counters=counters)
        counters.capture_bs = [1, 2]

    monkeypatch.setattr(VerifyCudaGraphRunner, "__init__", fake_init)
    cfg = SimpleNamespace(log_every=0)
    mr = SimpleNamespace(attn_backend=SimpleNamespace(verify_cfg=cfg), device="cpu", gpu_id=0)
    runner = capture.verify_runner_cls_0523()(mr)
    assert isinstance(runner, VerifyCudaGraphRunner)
    assert seen["model_runner"] is mr and seen["cfg"] is cfg
    assert C.get_counters() is seen["counters"] and seen["counters"].capture_bs == [1, 2]
    with pytest.raises(RuntimeError, match="unexpected arguments"):
        capture.verify_runner_cls_0523()(mr, attn_backend=None)


@only_0516
def test_0516_capture_hook_passes_through_without_chain_backend():
    calls = []
    result = plugin.capture_decode_graph_hook(lambda **kw: calls.append(kw) or "upstream",
                                          model_runner=_model_runner(chain=False))
    assert result == "upstream" and len(calls) == 1


def test_resolved_view_reads_declarations():
    record = SimpleNamespace(speculative_algorithm="NEXTN", speculative_eagle_topk=1)
    if sa.API_0523:
        record._resolved_overrides = [("test", {"speculative_algorithm": "EAGLE"})]
        assert sa.resolved(record).speculative_algorithm == "EAGLE"
    else:
        assert sa.resolved(record) is record
    assert sa.resolved(record).speculative_eagle_topk == 1


def test_can_run_dp_reads_the_versions_field():
    fb = SimpleNamespace(can_run_dp_cuda_graph=False, can_run_decode_cuda_graph=False)
    assert sa.can_run_dp(fb) is False
    setattr(fb, "can_run_decode_cuda_graph" if sa.API_0523 else "can_run_dp_cuda_graph", True)
    assert sa.can_run_dp(fb) is True


# ---- the SGLang surface our modules use ------------------------------------------------------
def _source(cls):
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return ""


def _has(cls, name):
    for klass in inspect.getmro(cls):
        if name in vars(klass) or name in getattr(klass, "__annotations__", {}):
            return True
        src, n = _source(klass), re.escape(name)
        if re.search(rf"self\.{n}\s*(:[^=\n]*)?=[^=]", src) or re.search(rf"self\.{n}\s*,[^\n]*=", src):
            return True
    return False


def _missing(cls, names):
    return [n for n in names if not _has(cls, n)]


def test_decode_graph_runner_surface():
    cls = sa.decode_cuda_graph_runner_cls()
    assert _missing(cls, [
        "capture_forward_mode", "captured_req_width", "capture_bs", "max_bs", "buffers",
        "raw_num_token", "bs", "raw_bs", "require_mlp_tp_gather", "require_mlp_sync",
        "enable_two_batch_overlap", "capture_hidden_mode", "model_runner", "can_run_graph", "disable_padding",
        "load_batch", "execute", "get_spec_info", "_pad_to_bucket",
    ]) == []
    assert list(inspect.signature(cls.load_batch).parameters)[:3] == ["self", "forward_batch", "pp_proxy_tensors"]
    assert list(inspect.signature(cls.execute).parameters)[:3] == ["self", "forward_batch", "pp_proxy_tensors"]
    assert list(inspect.signature(cls.get_spec_info).parameters) == ["self", "num_tokens"]
    assert list(inspect.signature(cls.__init__).parameters)[:2] == ["self", "model_runner"]


def test_triton_backend_surface():
    cls = sa.triton_attn_backend_cls()
    names = ["sliding_window_size", "use_sliding_window_kv_pool", "dcp_size", "enable_deterministic",
             "token_to_kv_pool", "num_head", "use_mla", "device_core_count", "device",
             "req_to_token", "_set_kv_buffer", "init_forward_metadata_out_graph",
             "init_forward_metadata", "init_cuda_graph_state", "forward_extend"]
    names.append("kv_index_translator" if sa.API_0523 else "_translate_kv_loc")
    assert _missing(cls, names) == []
    from sglang_verify_graph.chain_backend import ChainVerifyTritonBackend

    ours = inspect.signature(ChainVerifyTritonBackend.forward_extend).parameters
    theirs = inspect.signature(cls.forward_extend).parameters
    assert list(ours) == list(theirs)
    assert "in_capture" in inspect.signature(cls.init_forward_metadata_out_graph).parameters
    assert list(inspect.signature(cls.__init__).parameters)[:2] == ["self", "model_runner"]


def test_forward_batch_surface():
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    names = ["replace_embeds", "spec_info", "batch_size", "original_global_num_tokens_cpu",
             "can_run_tbo", "forward_mode", "req_pool_indices", "seq_lens", "out_cache_loc",
             "input_ids", "positions", "needs_forward_metadata_init"]
    names += (["can_run_decode_cuda_graph", "out_cache_loc_is_physical"] if sa.API_0523
              else ["can_run_dp_cuda_graph"])
    assert _missing(ForwardBatch, names) == []


def test_model_runner_and_layer_surface():
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.model_runner import ModelRunner

    names = ["spec_aux_config", "is_draft_worker", "spec_algorithm", "server_args", "attn_backend",
             "model_config", "device", "gpu_id", "model"]
    if sa.API_0523:
        names.append("_decode_cuda_graph_runner_cls")
    assert _missing(ModelRunner, names) == []
    assert _missing(RadixAttention, [
        "layer_id", "tp_q_head_num", "qk_head_dim", "v_head_dim", "scaling", "logit_cap",
        "logit_capping_method", "sliding_window_size", "is_cross_attention", "k_scale",
        "xai_temperature_len", "k_scale_float", "v_scale_float"]) == []


def test_speculative_and_scheduler_surface():
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc
    from sglang.srt.speculative.eagle_utils import TreeMaskMode
    from sglang.srt.speculative.eagle_worker_common import build_eagle_verify_input

    params = inspect.signature(build_eagle_verify_input).parameters
    for name in ("target_worker", "topk", "tree_mask_mode"):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    assert TreeMaskMode.QLEN_ONLY is not None
    assert _has(GetInternalStateReqOutput, "internal_state")
    assert callable(Scheduler.get_internal_state)
    assert hasattr(KVWriteLoc, "for_batch") == sa.API_0523 or not sa.API_0523
    from sglang.srt.layers.attention.triton_backend import logit_capping_mod  # noqa: F401
    if not sa.API_0523:
        from sglang.srt.model_executor.model_runner_components.cuda_graph_setup import (  # noqa: F401
            DecodeGraphCapture,
        )

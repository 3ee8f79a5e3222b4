"""Per-release CPU checks (every SGLang release 0.5.16-0.5.23; CI runs this file on each).

* the installed release is one the adapter supports, and every API change point the adapter
  declares agrees with the installed SGLang's own source (so a change point placed at the wrong
  release fails on the releases it misjudges);
* in a fresh interpreter, with the feature on: ``plugin.install`` reports no missing hook
  target, the flag is in SGLang's own parser, ``prepare_server_args`` + the release's validation
  point accept a good launch and stop a bad one with one line, and (0.5.17 on) the installed
  ``ModelRunner._decode_cuda_graph_runner_cls`` returns our runner for an EAGLE topk=1 target;
* the hook functions decide correctly on stubs (ours only for the EAGLE topk=1 target with the
  chain backend, upstream's otherwise);
* every SGLang class attribute, method and signature that runner.py / chain_backend.py /
  selftest.py / the adapter rely on exists in the installed SGLang source.

Release-specific tests skip on the releases they do not apply to.
"""

import dataclasses
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from sglang_verify_graph import plugin
from sglang_verify_graph.compat import sglang_adapter as sa
from sglang_verify_graph.config import ENV_ENABLE, FLAG

runner_cls_hook = pytest.mark.skipif(not sa.RUNNER_CLS_HOOK, reason="sglang 0.5.17+ code path")
before_runner_cls_hook = pytest.mark.skipif(sa.RUNNER_CLS_HOOK, reason="sglang 0.5.16 code path")


def test_installed_version_is_supported():
    assert sa.IN_RANGE
    assert sa.SGLANG_VERSION in sa.SUPPORTED_VERSIONS
    assert sa.SUPPORTED_VERSIONS[0] == sa.SUPPORTED_RANGE[0]
    assert sa.SUPPORTED_VERSIONS[-1] == sa.SUPPORTED_RANGE[1]


def test_package_metadata_admits_the_supported_range_only():
    """``pip install`` beside any supported release keeps that SGLang: the installed
    distribution's one requirement is the adapter's range, as ``pyproject.toml`` spells it."""
    import tomllib
    from importlib.metadata import requires
    from pathlib import Path

    from packaging.requirements import Requirement

    lo, hi = sa.SUPPORTED_RANGE
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["dependencies"] == [sa.REQUIREMENT]
    (installed,) = [Requirement(r) for r in requires("sglang-verify-graph")]
    assert installed.name == "sglang" and installed.specifier == Requirement(sa.REQUIREMENT).specifier
    admitted = [v for v in ("0.5.15", lo, *sa.SUPPORTED_VERSIONS, hi, f"{hi}.post1", "0.5.24rc1", "0.5.24")
                if installed.specifier.contains(v, prereleases=True)]
    assert admitted == [lo, *sa.SUPPORTED_VERSIONS, hi, f"{hi}.post1"]
    assert [sa._version_tuple(v) <= sa._version_tuple(hi) for v in (f"{hi}.post1", "0.5.24rc1")] == [True, False]


def test_the_scripts_releases_are_the_adapters():
    """``setup_cpu_env.sh`` and ``run_cpu_tests.sh`` test the releases ``sglang_versions.sh`` reads
    from ``pyproject.toml``: the adapter's list."""
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "sglang_versions.sh"
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True).stdout
    assert tuple(out.split()) == sa.SUPPORTED_VERSIONS


def test_version_parsing():
    assert sa._version_tuple("0.5.16") == (0, 5, 16)
    assert sa._version_tuple("0.5.23.post1") == (0, 5, 23)
    assert sa._version_tuple("0.6.0rc1+cu130") == (0, 6, 0)


# ---- each change point against the installed SGLang's source ---------------------------------
def test_runner_cls_hook_point():
    """0.5.17: the runner class comes from ``ModelRunner._decode_cuda_graph_runner_cls`` (which
    ``capture_decode_graph`` calls) and ``DecodeGraphCapture`` is gone."""
    from sglang.srt.model_executor import model_runner
    from sglang.srt.model_executor.model_runner_components import cuda_graph_setup

    setup_src = inspect.getsource(cuda_graph_setup.capture_decode_graph)
    assert sa.RUNNER_CLS_HOOK == hasattr(model_runner.ModelRunner, "_decode_cuda_graph_runner_cls")
    assert sa.RUNNER_CLS_HOOK == ("_decode_cuda_graph_runner_cls" in setup_src)
    assert sa.RUNNER_CLS_HOOK == (not hasattr(cuda_graph_setup, "DecodeGraphCapture"))


def test_hidden_mode_check_point():
    src = inspect.getsource(sa.decode_cuda_graph_runner_cls().can_run_graph)
    assert sa.CAN_RUN_GRAPH_CHECKS_HIDDEN_MODE == ("capture_hidden_mode" in src)


def test_dp_batch_size_point():
    cls = sa.decode_cuda_graph_runner_cls()
    src = inspect.getsource(cls.can_run_graph)
    assert sa.DP_BATCH_SIZE_HELPER == hasattr(cls, "_max_dp_batch_size")
    assert sa.DP_BATCH_SIZE_HELPER == ("_max_dp_batch_size(forward_batch)" in src)
    assert sa.DP_BATCH_SIZE_HELPER == ("max(forward_batch.original_global_num_tokens_cpu)" not in src)


def test_resolve_once_point():
    """0.5.19: construction resolves nothing, ``resolve_once`` does; the config merger, the DP
    vote field and the KV index translation moved with it."""
    import importlib.util

    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.server_args import ServerArgs

    post_init = inspect.getsource(ServerArgs.__post_init__)
    assert sa.RESOLVE_ONCE == hasattr(ServerArgs, "resolve_once")
    assert sa.RESOLVE_ONCE == ("run_resolution_pipeline" not in post_init
                               and "_handle_" not in post_init)
    assert sa.RESOLVE_ONCE == (importlib.util.find_spec("sglang.srt.server_args_config_parser") is None)
    assert sa.RESOLVE_ONCE == _has(ForwardBatch, "can_run_decode_cuda_graph")
    assert sa.RESOLVE_ONCE == (not _has(ForwardBatch, "can_run_dp_cuda_graph"))
    assert sa.RESOLVE_ONCE == _has(TritonAttnBackend, "kv_index_translator")
    assert sa.RESOLVE_ONCE == (not _has(TritonAttnBackend, "_translate_kv_loc"))


def test_draft_extend_select_index_point():
    from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import (
        EAGLEDraftExtendCudaGraphRunner,
    )

    params = list(inspect.signature(EAGLEDraftExtendCudaGraphRunner.execute).parameters)
    assert params[:2] == ["self", "forward_batch"]
    assert sa.DRAFT_EXTEND_SELECT_INDEX == (params[2:3] == ["select_index"])


def test_kv_write_loc_point():
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    fields = [f.name for f in dataclasses.fields(KVWriteLoc)]
    assert fields[:3] == ["loc", "swa_loc", "full_loc"]
    assert sa.KV_WRITE_LOC_FOR_BATCH == hasattr(KVWriteLoc, "for_batch")


# ---- fresh interpreter: register, parse, validate --------------------------------------------
_DRIVER = textwrap.dedent("""
    import argparse, json, os, sys
    from types import SimpleNamespace
    from sglang_verify_graph import plugin
    from sglang_verify_graph.compat import sglang_adapter as sa
    from sglang_verify_graph.config import build_config
    out = {"missing": plugin.install(runtime=True)}
    from sglang.srt.server_args import ServerArgs, prepare_server_args
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    out["flag_in_parser"] = "--enable-verify-cuda-graph" in parser._option_string_actions
    from sglang.srt.layers.attention import attention_registry
    out["triton_factory"] = bool(getattr(attention_registry.ATTENTION_BACKENDS["triton"],
                                         "_verify_graph_factory", False))
    sa_obj = prepare_server_args(sys.argv[1:])
    if hasattr(sa_obj, "resolve_once"):
        sa_obj.resolve_once()
    out["enabled"] = os.environ.get("SGLANG_ENABLE_VERIFY_CUDA_GRAPH") == "1"
    out["ndt"] = build_config(sa.resolved(sa_obj)).num_draft_tokens
    if sa.RUNNER_CLS_HOOK:
        from sglang.srt.model_executor.model_runner import ModelRunner
        from sglang_verify_graph.chain_backend import ChainVerifyTritonBackend
        from sglang_verify_graph.runner import VerifyCudaGraphRunner
        class Algo:
            def is_uno(self): return False
            def is_eagle(self): return True
        def stub(draft, backend):
            return SimpleNamespace(spec_algorithm=Algo(), is_draft_worker=draft, server_args=sa_obj,
                                   attn_backend=backend)
        cls = ModelRunner._decode_cuda_graph_runner_cls(stub(False, object.__new__(ChainVerifyTritonBackend)))
        out["runner_cls_ours"] = cls is VerifyCudaGraphRunner
        out["runner_cls_plain"] = ModelRunner._decode_cuda_graph_runner_cls(stub(True, object())).__name__
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
    if sa.RUNNER_CLS_HOOK:
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


@pytest.fixture
def flag_on(monkeypatch):
    """The flag's config for every model runner (``plan.flag_config``): chain, num_steps 2."""
    from sglang_verify_graph import plan

    from cpu_stubs import chain_config

    monkeypatch.setattr(plan, "flag_config", lambda mr: chain_config())


@runner_cls_hook
@pytest.mark.parametrize("kwargs,ours", [
    (dict(), True),
    (dict(draft=True), False),
    (dict(topk=4), False),
    (dict(eagle=False), False),
])
def test_runner_cls_hook(flag_on, kwargs, ours):
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    from sglang_verify_graph.runner import VerifyCudaGraphRunner

    original = getattr(ModelRunner._decode_cuda_graph_runner_cls, "__wrapped__",
                       ModelRunner._decode_cuda_graph_runner_cls)
    cls = plugin.decode_runner_cls_hook(original, _model_runner(**kwargs))
    assert cls is (VerifyCudaGraphRunner if ours else DecodeCudaGraphRunner)


@runner_cls_hook
def test_runner_cls_hook_refuses_a_target_that_lost_the_chain_backend(flag_on):
    from sglang.srt.model_executor.model_runner import ModelRunner

    from sglang_verify_graph.errors import VerifyGraphConfigError

    original = getattr(ModelRunner._decode_cuda_graph_runner_cls, "__wrapped__",
                       ModelRunner._decode_cuda_graph_runner_cls)
    with pytest.raises(VerifyGraphConfigError, match="remove --enable-verify-cuda-graph"):
        plugin.decode_runner_cls_hook(original, _model_runner(chain=False))


@before_runner_cls_hook
def test_capture_hook_passes_through_without_chain_backend():
    calls = []
    result = plugin.capture_decode_graph_hook(lambda **kw: calls.append(kw) or "upstream",
                                          model_runner=_model_runner(chain=False))
    assert result == "upstream" and len(calls) == 1


def test_resolved_view_reads_declarations():
    record = SimpleNamespace(speculative_algorithm="NEXTN", speculative_eagle_topk=1)
    if sa.RESOLVE_ONCE:
        record._resolved_overrides = [("test", {"speculative_algorithm": "EAGLE"})]
        assert sa.resolved(record).speculative_algorithm == "EAGLE"
    else:
        assert sa.resolved(record) is record
    assert sa.resolved(record).speculative_eagle_topk == 1


def test_can_run_dp_reads_the_versions_field():
    fb = SimpleNamespace(can_run_dp_cuda_graph=False, can_run_decode_cuda_graph=False)
    assert sa.can_run_dp(fb) is False
    setattr(fb, "can_run_decode_cuda_graph" if sa.RESOLVE_ONCE else "can_run_dp_cuda_graph", True)
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
    names.append("kv_index_translator" if sa.RESOLVE_ONCE else "_translate_kv_loc")
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
    names += ["can_run_decode_cuda_graph" if sa.RESOLVE_ONCE else "can_run_dp_cuda_graph"]
    if sa.KV_WRITE_LOC_FOR_BATCH:  # KVWriteLoc.for_batch reads it
        names.append("out_cache_loc_is_physical")
    assert _missing(ForwardBatch, names) == []


def test_model_runner_and_layer_surface():
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.model_runner import ModelRunner

    names = ["spec_aux_config", "is_draft_worker", "spec_algorithm", "server_args", "attn_backend",
             "model_config", "device", "gpu_id", "model"]
    if sa.RUNNER_CLS_HOOK:
        names.append("_decode_cuda_graph_runner_cls")
    assert _missing(ModelRunner, names) == []
    assert _missing(RadixAttention, [
        "layer_id", "tp_q_head_num", "qk_head_dim", "v_head_dim", "scaling", "logit_cap",
        "logit_capping_method", "sliding_window_size", "is_cross_attention", "k_scale",
        "xai_temperature_len", "k_scale_float", "v_scale_float"]) == []


def test_speculative_and_scheduler_surface():
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.speculative.eagle_utils import TreeMaskMode
    from sglang.srt.speculative.eagle_worker_common import build_eagle_verify_input

    params = inspect.signature(build_eagle_verify_input).parameters
    for name in ("target_worker", "topk", "tree_mask_mode"):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    assert TreeMaskMode.QLEN_ONLY is not None
    assert _has(GetInternalStateReqOutput, "internal_state")
    assert callable(Scheduler.get_internal_state)
    assert _has(Scheduler, "tp_cpu_group")  # the hook gathers every TP rank's counters over it
    from sglang.srt.layers.attention.triton_backend import logit_capping_mod  # noqa: F401
    if not sa.RUNNER_CLS_HOOK:
        from sglang.srt.model_executor.model_runner_components.cuda_graph_setup import (  # noqa: F401
            DecodeGraphCapture,
        )

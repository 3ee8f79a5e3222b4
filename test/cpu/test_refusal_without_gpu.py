"""A setting that conflicts with ``--enable-verify-cuda-graph`` whatever SGLang's resolution
decides gets the one-line error on any machine: ``config.check_given`` judges the values as given,
in a BEFORE hook of the validation point, before SGLang's resolution (which on a machine without
an accelerator raises its own traceback). This CPU tier has no GPU, so it is such a machine."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from sglang_verify_graph.config import EnvSettings, VerifyGraphConfigError, check_given

ON = EnvSettings(enable=True)


def _raw(**given):
    """Server arguments as given on the command line (unset = None, flags False)."""
    base = dict(speculative_algorithm="EAGLE3", speculative_eagle_topk=None,
                speculative_num_steps=None, speculative_num_draft_tokens=None,
                speculative_adaptive=False, attention_backend=None,
                prefill_attention_backend=None, decode_attention_backend=None,
                disable_cuda_graph=False, disable_decode_cuda_graph=False,
                cuda_graph_backend_decode=None, cuda_graph_config=None,
                enable_dp_attention=False, pp_size=1, enable_two_batch_overlap=False,
                kv_cache_dtype="auto", enable_deterministic_inference=False,
                enable_page_major_kv_layout=False)
    base.update(given)
    return SimpleNamespace(**base)


@pytest.mark.parametrize("given,flag", [
    (dict(speculative_algorithm=None), "--speculative-algorithm"),
    (dict(speculative_algorithm="NGRAM"), "--speculative-algorithm"),
    (dict(speculative_eagle_topk=4), "--speculative-eagle-topk"),
    (dict(speculative_adaptive=True), "--speculative-adaptive"),
    (dict(disable_cuda_graph=True), "--disable-cuda-graph"),
    (dict(enable_dp_attention=True), "--enable-dp-attention"),
    (dict(pp_size=2), "--pp-size"),
    (dict(attention_backend="torch_native"), "--attention-backend"),
    (dict(decode_attention_backend="torch_native"), "--decode-attention-backend"),
    (dict(attention_backend="triton", kv_cache_dtype="fp8_e4m3"), "--kv-cache-dtype"),
    (dict(prefill_attention_backend="flashinfer", decode_attention_backend="triton"),
     "--prefill-attention-backend"),
])
def test_a_given_conflict_is_refused_before_resolution(given, flag):
    with pytest.raises(VerifyGraphConfigError) as info:
        check_given(_raw(**given), ON)
    assert info.value.flag == flag and "\n" not in str(info.value)


@pytest.mark.parametrize("given", [
    dict(),  # top-k, steps and backend unset: SGLang decides, build_config judges the result
    dict(speculative_eagle_topk=1, speculative_num_steps=3, speculative_num_draft_tokens=7),
    dict(kv_cache_dtype="fp8_e4m3"),  # backend unset: a native backend may serve it
    dict(attention_backend="flashinfer", kv_cache_dtype="fp8_e4m3"),
    dict(speculative_algorithm="NEXTN"),
], ids=["unset", "ndt-set-by-sglang", "kv-fp8-backend-unset", "kv-fp8-native", "nextn"])
def test_what_only_sglang_decides_is_left_to_the_resolved_check(given):
    check_given(_raw(**given), ON)


def test_nothing_is_judged_while_the_flag_is_off():
    check_given(_raw(speculative_eagle_topk=4), EnvSettings())


def _clean_env():
    return {k: v for k, v in os.environ.items()
            if k != "SGLANG_ENABLE_VERIFY_CUDA_GRAPH" and not k.startswith("SGLANG_VERIFY_GRAPH_")}


def _no_accelerator() -> bool:
    import torch

    return not torch.cuda.is_available()


needs_no_gpu = pytest.mark.skipif(not _no_accelerator(), reason="checks the machine without a GPU")


@needs_no_gpu
@pytest.mark.parametrize("extra,flag", [
    (["--speculative-eagle-topk", "4"], "--speculative-eagle-topk"),
    (["--disable-cuda-graph"], "--disable-cuda-graph"),
    (["--attention-backend", "triton", "--kv-cache-dtype", "fp8_e4m3"], "--kv-cache-dtype"),
    (None, "--speculative-algorithm"),
    (["--prefill-attention-backend", "flashinfer", "--decode-attention-backend", "triton"],
     "--prefill-attention-backend"),
    (["--attention-backend", "flashmla"], "--attention-backend"),
], ids=["topk4", "no-cuda-graph", "kv-fp8", "no-speculation", "prefill-decode", "mla-only-no-mla"])
def test_launch_server_without_gpu_ends_with_one_line(tiny_model_dirs, extra, flag):
    target, draft = tiny_model_dirs
    spec = [] if extra is None else ["--speculative-algorithm", "EAGLE3",
                                     "--speculative-draft-model-path", str(draft), *extra]
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(target),
           "--skip-tokenizer-init", *spec, "--enable-verify-cuda-graph"]
    proc = subprocess.run(cmd, env=_clean_env(), capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out and "No accelerator" not in out, out[-3000:]
    errors = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and f"({flag} = " in errors[0], errors


_ENGINE_ARGS = textwrap.dedent("""
    import sys
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang.srt.server_args import ServerArgs
    from sglang_verify_graph.config import VerifyGraphConfigError
    try:
        args = ServerArgs(model_path=sys.argv[1], speculative_algorithm="EAGLE3",
                          speculative_draft_model_path=sys.argv[2], speculative_eagle_topk=4)
        getattr(args, "resolve_once", lambda: None)()  # what sglang.Engine runs on 0.5.23
    except VerifyGraphConfigError as e:
        print("REFUSED", e.flag)
    except Exception as e:
        print("OTHER", type(e).__name__, str(e)[:200])
""")


@needs_no_gpu
def test_engine_arguments_without_gpu_raise_the_config_error(tiny_model_dirs):
    target, draft = tiny_model_dirs
    env = dict(_clean_env(), SGLANG_ENABLE_VERIFY_CUDA_GRAPH="1")
    proc = subprocess.run([sys.executable, "-c", _ENGINE_ARGS, str(target), str(draft)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "REFUSED --speculative-eagle-topk" in proc.stdout, proc.stdout + proc.stderr[-2000:]


@needs_no_gpu
def test_malformed_variable_without_the_flag_is_one_line(tiny_model_dirs):
    """The plugin's variables belong to it: a malformed one stops a launch in one line even when
    the flag is not given (SGLang 0.5.23 judges the record after from_cli_args, too)."""
    target, _ = tiny_model_dirs
    env = dict(_clean_env(), SGLANG_VERIFY_GRAPH_NUM_KV_SPLITS="abc")
    proc = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--model-path", str(target),
                           "--skip-tokenizer-init"], env=env, capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in out, out[-3000:]
    errors = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "SGLANG_VERIFY_GRAPH_NUM_KV_SPLITS" in errors[0], errors

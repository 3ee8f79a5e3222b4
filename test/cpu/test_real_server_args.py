"""Validation against REAL sglang 0.5.16 ServerArgs, resolved on CPU.

``ServerArgs.__post_init__`` runs fine without a GPU given ``device="cpu"`` and a model folder
holding only config.json (it reads the HF config, never weights), so the validation sees the
genuine resolved fields (cuda_graph_config folding, NEXTN->EAGLE aliasing, topk/ndt resolution).
In-process tests build ServerArgs *without* our hooks and call build_config on them; the
subprocess tests go through sglang's real plugin loading (``load_plugins()`` -> our entry point
-> HookRegistry) and ``prepare_server_args(argv)``, isolated from this test process.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sglang_verify_graph.config import (
    ENV_ENABLE,
    FLAG,
    EnvSettings,
    VerifyGraphConfigError,
    build_config,
)

ON = EnvSettings(enable=True)


def test_duck_typed_fields_exist_on_real_server_args(make_args):
    import dataclasses

    from sglang.srt.server_args import ServerArgs

    # make_args() is the duck-typed stand-in used by the other validation tests.
    if dataclasses.is_dataclass(ServerArgs):  # 0.5.16
        names = {f.name for f in dataclasses.fields(ServerArgs)}
    else:  # 0.5.23: msgspec Struct
        names = set(ServerArgs.__struct_fields__)
    ours = {k for k in vars(make_args()) if not k.startswith("_")}
    assert ours <= names, sorted(ours - names)


def test_good_real_server_args(real_args):
    cfg = build_config(real_args(), ON)
    assert (cfg.num_steps, cfg.num_draft_tokens, cfg.topk) == (3, 4, 1)
    assert cfg.speculative_algorithm == "EAGLE3"
    assert cfg.attention_backend == "triton"
    assert cfg.decode_graph_backend == "full"
    assert cfg.page_size == 1
    assert cfg.max_running_requests == 48  # sglang's speculative default
    assert cfg.cuda_graph_bs and max(cfg.cuda_graph_bs) == cfg.cuda_graph_max_bs


def test_real_nextn_resolves_to_eagle(real_args):
    assert build_config(real_args(speculative_algorithm="NEXTN"), ON).speculative_algorithm == "EAGLE"


def test_real_ndt_is_resolved_to_steps_plus_one(real_args):
    # sglang itself forces num_draft_tokens = steps + 1 for topk 1, so this passes.
    assert build_config(real_args(speculative_num_draft_tokens=7), ON).num_draft_tokens == 4


@pytest.mark.parametrize("overrides,flag", [
    (dict(speculative_algorithm=None, speculative_draft_model_path=None,
          speculative_num_steps=None, speculative_eagle_topk=None,
          speculative_num_draft_tokens=None), "--speculative-algorithm"),
    (dict(speculative_eagle_topk=4, speculative_num_draft_tokens=8), "--speculative-eagle-topk"),
    (dict(speculative_adaptive=True), "--speculative-adaptive"),
    (dict(disable_cuda_graph=True), "--disable-cuda-graph"),
    (dict(disable_decode_cuda_graph=True), "--disable-decode-cuda-graph"),
    (dict(cuda_graph_backend_decode="disabled"), "--cuda-graph-backend-decode"),
    (dict(cuda_graph_config={"decode": {"backend": "disabled"}}), "--cuda-graph-config"),
    (dict(attention_backend="torch_native"), "--attention-backend"),
    (dict(decode_attention_backend="torch_native"), "--decode-attention-backend"),
    (dict(enable_two_batch_overlap=True), "--enable-two-batch-overlap"),
], ids=["no-spec", "topk4", "adaptive", "disable-cuda-graph", "disable-decode-graph",
        "graph-backend-decode", "graph-config-json", "torch-native", "decode-override", "tbo"])
def test_bad_real_server_args(real_args, overrides, flag):
    server_args = real_args(**overrides)
    with pytest.raises(VerifyGraphConfigError) as info:
        build_config(server_args, ON)
    assert info.value.flag == flag
    assert "\n" not in str(info.value) and str(info.value).startswith(f"{FLAG}: ")


def test_real_server_args_off_by_default(real_args):
    assert build_config(real_args(speculative_eagle_topk=4, speculative_num_draft_tokens=8),
                        EnvSettings()) is None


# ---- end to end through sglang's plugin loading, in a fresh interpreter ----------------------
_DRIVER = textwrap.dedent("""
    import json, os, pickle, sys
    from sglang.srt.plugins import load_plugins
    load_plugins()
    mode, argv = sys.argv[1], sys.argv[2:]
    if mode == "cli":
        from sglang.srt.server_args import prepare_server_args
        sa = prepare_server_args(argv)
    else:
        from sglang.srt.server_args import ServerArgs
        sa = ServerArgs(**json.loads(argv[0]))
    if hasattr(sa, "resolve_once"):  # sglang 0.5.23: what launch_server / Engine call next
        sa.resolve_once()
    clone = pickle.loads(pickle.dumps(sa))  # what a scheduler process receives, with os.environ
    from sglang_verify_graph.compat.sglang_adapter import resolved
    from sglang_verify_graph.config import build_config
    cfg = build_config(resolved(clone))
    print("RESULT " + json.dumps({
        "env": os.environ.get("SGLANG_ENABLE_VERIFY_CUDA_GRAPH"),
        "ndt": getattr(cfg, "num_draft_tokens", None),
    }))
""")


def _run(mode, args, tiny_model_dirs, env_on=False):
    env = {k: v for k, v in os.environ.items()
           if k not in (ENV_ENABLE, "SGLANG_PLUGINS") and not k.startswith("SGLANG_VERIFY_GRAPH_")}
    if env_on:
        env[ENV_ENABLE] = "1"
    proc = subprocess.run([sys.executable, "-c", _DRIVER, mode, *args], env=env,
                          capture_output=True, text=True, timeout=300)
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
    return proc, result


def _argv(tiny_model_dirs, *extra):
    target, draft = tiny_model_dirs
    return ["--model-path", target, "--device", "cpu", "--skip-tokenizer-init",
            "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", draft,
            "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "4", "--attention-backend", "triton", *extra]


def test_cli_flag_accepted_and_carried_to_children(tiny_model_dirs):
    proc, result = _run("cli", _argv(tiny_model_dirs, FLAG), tiny_model_dirs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result == {"env": "1", "ndt": 4}


def test_cli_without_flag_changes_nothing(tiny_model_dirs):
    proc, result = _run("cli", _argv(tiny_model_dirs), tiny_model_dirs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result == {"env": None, "ndt": None}


def test_cli_bad_setting_one_error_line_exit_2(tiny_model_dirs):
    argv = _argv(tiny_model_dirs, FLAG, "--speculative-eagle-topk", "4",
                 "--speculative-num-draft-tokens", "8")
    proc, result = _run("cli", argv, tiny_model_dirs)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert result is None
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {FLAG}: supports only a linear draft chain (top-k 1) "
                      "(--speculative-eagle-topk = 4). Fix: pass --speculative-eagle-topk 1."]
    assert "Traceback" not in proc.stderr


def test_engine_style_kwargs_with_env(tiny_model_dirs):
    target, draft = tiny_model_dirs
    kwargs = dict(model_path=target, device="cpu", skip_tokenizer_init=True,
                  speculative_algorithm="EAGLE3", speculative_draft_model_path=draft,
                  speculative_num_steps=2, speculative_eagle_topk=1,
                  speculative_num_draft_tokens=3, attention_backend="triton")
    proc, result = _run("kwargs", [json.dumps(kwargs)], tiny_model_dirs, env_on=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result == {"env": "1", "ndt": 3}

    kwargs["attention_backend"] = "torch_native"
    proc, result = _run("kwargs", [json.dumps(kwargs)], tiny_model_dirs, env_on=True)
    assert proc.returncode == 1 and result is None
    assert "VerifyGraphConfigError" in proc.stderr
    assert "(--attention-backend = torch_native). Fix: pass --attention-backend triton." in proc.stderr


_ENGINE_DRIVER = textwrap.dedent("""
    import json, sys
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang.srt.server_args import ServerArgs
    try:
        sa = ServerArgs(**json.loads(sys.argv[1]))
        if hasattr(sa, "resolve_once"):
            sa.resolve_once()
        print("RESULT ok")
    except Exception as e:
        print("RESULT raised " + type(e).__name__ + ": " + str(e))
""")


def test_malformed_env_is_an_error_not_an_exit(tiny_model_dirs):
    """README: a malformed SGLANG_VERIFY_GRAPH_* variable is one `error:` line and exit 2 on the
    command line, and VerifyGraphConfigError from sglang.Engine-style construction (a SystemExit
    in the plugin would end the user's program instead)."""
    target, draft = tiny_model_dirs
    env = {k: v for k, v in os.environ.items()
           if k not in (ENV_ENABLE, "SGLANG_PLUGINS") and not k.startswith("SGLANG_VERIFY_GRAPH_")}
    env["SGLANG_VERIFY_GRAPH_LOG_EVERY"] = "abc"
    proc = subprocess.run([sys.executable, "-c", _DRIVER, "cli", *_argv(tiny_model_dirs, FLAG)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "SGLANG_VERIFY_GRAPH_LOG_EVERY" in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    kwargs = dict(model_path=target, device="cpu", skip_tokenizer_init=True,
                  speculative_algorithm="EAGLE3", speculative_draft_model_path=draft,
                  speculative_num_steps=2, speculative_eagle_topk=1,
                  speculative_num_draft_tokens=3, attention_backend="triton")
    env[ENV_ENABLE] = "1"
    proc = subprocess.run([sys.executable, "-c", _ENGINE_DRIVER, json.dumps(kwargs)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    assert line.startswith("RESULT raised VerifyGraphConfigError: ") and "LOG_EVERY" in line, line

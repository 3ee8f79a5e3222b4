"""CPU tier: which attention backends the verify graph serves and how (``backends.py``).

Failure modes guarded: a backend the graph cannot serve starting a server that silently runs
upstream's verify; a hybrid prefill/decode backend routing TARGET_VERIFY through the other
phase's backend; an MHA EAGLE-3 draft on an MLA-only target backend
(``flashmla``), which SGLang 0.5.16 lets start and then crashes at draft
backend init (``'ModelConfig' object has no attribute 'kv_lora_rank'``); the chain kernel's
limits (quantized KV) wrongly applied to native backends; the capture hook giving our runner to
a backend object of the wrong class.
"""

import json
from types import SimpleNamespace

import pytest

from sglang_verify_graph import backends
from sglang_verify_graph import plan as P
from sglang_verify_graph.config import EnvSettings, VerifyGraphConfigError, build_config

ON = EnvSettings(enable=True)


@pytest.mark.parametrize("name,kind", [("triton", "chain"), ("fa3", "native"),
                                       ("flashmla", "native"), ("flashinfer", "native")])
def test_supported_backends_and_kind(make_args, name, kind, mla_draft):
    cfg = build_config(make_args(attention_backend=name, speculative_draft_model_path=mla_draft), ON)
    assert cfg.attention_backend == name and cfg.verify_attention == kind


@pytest.mark.parametrize("name", ["flashinfer_mla", "torch_native", "trtllm_mla", "cutlass_mla"])
def test_unsupported_backend_names_the_flag(make_args, name):
    with pytest.raises(VerifyGraphConfigError) as info:
        build_config(make_args(attention_backend=name), ON)
    assert info.value.flag == "--attention-backend" and "triton" in info.value.fix


def test_prefill_and_decode_must_agree(make_args):
    with pytest.raises(VerifyGraphConfigError) as info:
        build_config(make_args(attention_backend="fa3", prefill_attention_backend="triton"), ON)
    assert info.value.flag == "--prefill-attention-backend"  # the flag the user gave
    assert info.value.value == "triton" and "the other phase uses fa3" in str(info.value)
    with pytest.raises(VerifyGraphConfigError) as info:
        build_config(make_args(decode_attention_backend="fa3"), ON)
    assert info.value.flag == "--decode-attention-backend" and info.value.value == "fa3"


def test_quantized_kv_refused_for_the_chain_kernel_only(make_args, mla_draft):
    with pytest.raises(VerifyGraphConfigError) as info:
        build_config(make_args(kv_cache_dtype="fp8_e4m3"), ON)
    assert info.value.flag == "--kv-cache-dtype"
    cfg = build_config(make_args(attention_backend="flashmla", kv_cache_dtype="fp8_e4m3",
                                 speculative_draft_model_path=mla_draft), ON)
    assert cfg.verify_attention == "native"


@pytest.fixture
def mla_draft(tmp_path):
    d = tmp_path / "mla-draft"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["Eagle3DeepseekV2ForCausalLM"], "kv_lora_rank": 512,
        "qk_rope_head_dim": 64}))
    return str(d)


@pytest.mark.parametrize("backend", ["flashmla"])
def test_mha_draft_on_mla_only_backend_stops(make_args, tiny_model_dirs, backend):
    _, llama_draft = tiny_model_dirs
    with pytest.raises(VerifyGraphConfigError) as info:
        build_config(make_args(attention_backend=backend,
                               speculative_draft_model_path=llama_draft), ON)
    err = info.value
    assert err.flag == "--speculative-draft-attention-backend"
    assert err.fix == "pass --speculative-draft-attention-backend triton (or fa3)"
    assert f"cannot run on {backend}" in str(err)
    # the fix works; an MLA-only draft backend does not
    ok = make_args(attention_backend=backend, speculative_draft_model_path=llama_draft,
                   speculative_draft_attention_backend="triton")
    assert build_config(ok, ON).attention_backend == backend
    with pytest.raises(VerifyGraphConfigError):
        build_config(make_args(attention_backend=backend, speculative_draft_model_path=llama_draft,
                               speculative_draft_attention_backend="flashmla"), ON)


def test_mla_draft_fa3_and_hub_ids_pass(make_args, tiny_model_dirs, mla_draft):
    _, llama_draft = tiny_model_dirs
    assert build_config(make_args(attention_backend="flashmla",
                                  speculative_draft_model_path=mla_draft), ON)
    assert build_config(make_args(attention_backend="fa3",
                                  speculative_draft_model_path=llama_draft), ON)
    assert backends.checkpoint_is_mla("org/some-hub-draft") is None  # not a local folder: unchecked
    assert backends.checkpoint_is_mla(llama_draft) is False and backends.checkpoint_is_mla(mla_draft) is True


class FlashMLABackend:  # named like SGLang's class (layers/attention/flashmla_backend.py)
    pass


class SomeHybridWrapper:
    pass


def _model_runner(make_args, backend_obj, mla_draft, **overrides):
    args = make_args(attention_backend="flashmla", speculative_draft_model_path=mla_draft,
                     **overrides)
    algo = SimpleNamespace(is_eagle=lambda: True)
    return SimpleNamespace(attn_backend=backend_obj, server_args=args, spec_algorithm=algo,
                           is_draft_worker=False)


def test_capture_routing_by_backend_class(make_args, mla_draft, monkeypatch):
    assert P.runner_kind(
        _model_runner(make_args, FlashMLABackend(), mla_draft)) == "native"
    wrapped = _model_runner(make_args, SomeHybridWrapper(), mla_draft)
    assert P.runner_kind(wrapped) is None
    with pytest.raises(VerifyGraphConfigError) as info:
        P.refuse_if_flag_lost(wrapped)
    assert info.value.value == "SomeHybridWrapper"
    draft = _model_runner(make_args, FlashMLABackend(), mla_draft)
    draft.is_draft_worker = True  # the draft keeps upstream's runner
    assert P.runner_kind(draft) is None


# ---- through SGLang's plugin loading and prepare_server_args (real resolution: page 64) ------
_DRIVER = """
import sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
sa = prepare_server_args(sys.argv[1:])
if hasattr(sa, "resolve_once"):  # sglang 0.5.23 validates here
    sa.resolve_once()
from sglang_verify_graph.compat.sglang_adapter import resolved
from sglang_verify_graph.config import build_config
cfg = build_config(resolved(sa))
print("RESULT", cfg.attention_backend, cfg.verify_attention, cfg.page_size)
"""


@pytest.fixture(scope="module")
def kimi_models(tmp_path_factory):
    import os
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("kimi")
    subprocess.run([sys.executable, "-m", "bench.models.dummy_models", str(out),
                    "--only", "kimi-small-mla,kimi-k25-small"],
                   check=True, capture_output=True, timeout=120)
    return str(out)


@pytest.mark.parametrize("draft,extra,expect", [
    ("kimi-small-mla-eagle3", [], "RESULT flashmla native 64"),
    ("kimi-k25-small-eagle3", ["--speculative-draft-attention-backend", "triton"],
     "RESULT flashmla native 64"),
    ("kimi-k25-small-eagle3", [], "error: --enable-verify-cuda-graph: the EAGLE-3 draft is an MHA "
     "model and cannot run on flashmla"),
])
def test_real_cli_flashmla_drafter_kinds(kimi_models, draft, extra, expect):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_VERIFY_GRAPH_")
           and k not in ("SGLANG_ENABLE_VERIFY_CUDA_GRAPH", "SGLANG_PLUGINS")}
    argv = ["--model-path", os.path.join(kimi_models, "kimi-small-mla"), "--device", "cpu",
            "--skip-tokenizer-init", "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", os.path.join(kimi_models, draft),
            "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "4", "--attention-backend", "flashmla",
            "--enable-verify-cuda-graph", *extra]
    proc = subprocess.run([sys.executable, "-c", _DRIVER, *argv], env=env, capture_output=True,
                          text=True, timeout=300)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines()
             if ln.startswith(("RESULT", "error:"))]
    assert len(lines) == 1 and lines[0].startswith(expect), (proc.returncode, lines,
                                                              proc.stderr[-2000:])
    assert proc.returncode == (2 if expect.startswith("error") else 0)
    assert "Traceback" not in proc.stderr


def test_flashinfer_and_flashmla_are_for_mla_targets_only(make_args, tiny_model_dirs, mla_draft):
    """SGLang's ``flashinfer`` factory gives MLA models FlashInferMLAAttnBackend (decode-class) and
    MHA models a tree-masked prefill kernel, which the graph does not serve."""
    llama_target, llama_draft = tiny_model_dirs
    for backend in ("flashinfer", "flashmla"):
        with pytest.raises(VerifyGraphConfigError) as info:
            build_config(make_args(attention_backend=backend, model_path=llama_target,
                                   speculative_draft_model_path=mla_draft), ON)
        assert info.value.flag == "--attention-backend" and "only for MLA targets" in str(info.value)
    # an MHA draft is fine on flashinfer (SGLang builds the MHA backend for it)
    cfg = build_config(make_args(attention_backend="flashinfer", model_path=mla_draft,
                                 speculative_draft_model_path=llama_draft), ON)
    assert cfg.verify_attention == "native"
    assert backends.NATIVE_BACKEND_CLASSES["flashinfer"] == ("FlashInferMLAAttnBackend",)


def test_verify_that_did_not_replay_our_graph_is_counted_with_its_reason():
    """A refused TARGET_VERIFY batch runs eagerly (or through another graph runner) in
    ``ModelRunner._forward_raw``: the plugin's hook there counts it under the reason our
    ``can_run_graph`` recorded; a replay of our graph, other forward modes, and model runners
    without our runner are not counted."""
    from sglang_verify_graph.counters import REASON_BS_ABOVE_MAX, VerifyCounters
    from sglang_verify_graph.plugin import forward_raw_hook

    counters = VerifyCounters()
    ours = SimpleNamespace(counters=counters)
    model_runner = SimpleNamespace(decode_cuda_graph_runner=ours)

    def batch(verify, bs=3):
        return SimpleNamespace(batch_size=bs, forward_mode=SimpleNamespace(
            is_target_verify=lambda: verify, is_draft_extend_v2=lambda: False))

    def eager(mr, fb, *args, **kwargs):
        return "eager"

    def replay(mr, fb, *args, **kwargs):
        counters.count_replay(4, 3)
        return "graph"

    counters.note_refusal(REASON_BS_ABOVE_MAX, "bs=12 > max captured 8")
    assert forward_raw_hook(eager, model_runner, batch(True, bs=12), None) == "eager"
    assert forward_raw_hook(replay, model_runner, batch(True), None) == "graph"
    forward_raw_hook(eager, model_runner, batch(False), None)  # decode/extend: not a verify
    forward_raw_hook(eager, SimpleNamespace(decode_cuda_graph_runner=None), batch(True), None)
    assert dict(counters.fallbacks) == {REASON_BS_ABOVE_MAX: 1}
    assert (counters.replays, counters.replayed_requests, counters.padded_rows) == (1, 3, 1)
    assert counters.eager_requests == 12


def test_verify_steps_are_sglangs_count_checked_against_replays_and_fallbacks(monkeypatch):
    """``verify_steps`` / ``verify_requests`` come from SGLang's worker entering its verify
    (``plugin.verify_step_hook``), not from our replay and fallback counts: a verify step whose
    forward neither replayed our graph nor passed ``ModelRunner._forward_raw`` leaves
    ``replays + fallback_total`` short of ``verify_steps``."""
    from sglang_verify_graph import plugin
    from sglang_verify_graph.counters import VerifyCounters

    counters = VerifyCounters()
    monkeypatch.setattr(plugin, "get_counters", lambda: counters)
    batch = SimpleNamespace(batch_size=lambda: 5)

    def graphed(worker, b):
        counters.count_replay(8, b.batch_size())
        return "verified"

    assert plugin.verify_step_hook(graphed, "worker", batch) == "verified"
    snap = counters.snapshot()
    assert (snap["verify_steps"], snap["verify_requests"]) == (1, 5)
    assert snap["replays"] + snap["fallback_total"] == snap["verify_steps"]
    assert snap["replayed_requests"] + snap["eager_requests"] == snap["verify_requests"]

    plugin.verify_step_hook(lambda worker, b: "unseen", "worker", batch)  # bypassed both counts
    snap = counters.snapshot()
    assert (snap["verify_steps"], snap["verify_requests"]) == (2, 10)
    assert snap["replays"] + snap["fallback_total"] == 1 < snap["verify_steps"]

    monkeypatch.setattr(plugin, "get_counters", lambda: None)  # no verify runner in this process
    assert plugin.verify_step_hook(lambda worker, b: "plain", "worker", batch) == "plain"
    assert counters.verify_steps == 2


def test_eager_cliff_is_announced_at_start():
    """When max_running_requests exceeds the largest captured bucket, start-up says which batch
    sizes will verify eagerly and the flag that graphs them."""
    from sglang_verify_graph.counters import REASON_BS_ABOVE_MAX, eager_cliff_warning

    assert eager_cliff_warning(32, [1, 2, 4, 8, 16, 32]) is None
    assert eager_cliff_warning(None, [1, 2]) is None and eager_cliff_warning(8, []) is None
    line = eager_cliff_warning(48, [1, 2, 4, 8, 16, 32])
    assert "batches of 33..48 requests will run eagerly" in line
    assert REASON_BS_ABOVE_MAX in line and "--cuda-graph-max-bs-decode 48" in line
    assert "--max-running-requests 32" in line and "\n" not in line


def _config_dir(tmp_path, name, cfg):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def test_a_wrapped_text_config_is_read_for_mla(tmp_path):
    """Multimodal checkpoints (Kimi-K2.5) keep the language model's settings under
    ``text_config``; a config.json that is not an object is not judged."""
    wrapped = _config_dir(tmp_path, "kimi", {"architectures": ["KimiK25ForConditionalGeneration"],
                                             "text_config": {"kv_lora_rank": 512}})
    assert backends.checkpoint_is_mla(wrapped) is True
    assert backends.checkpoint_is_mla(_config_dir(tmp_path, "mha", {"text_config": {"num_key_value_heads": 8},
                                                                    "kv_lora_rank": 512})) is False
    assert backends.checkpoint_is_mla(_config_dir(tmp_path, "list", [1, 2])) is None
    assert backends.checkpoint_is_mla(str(tmp_path / "missing")) is None and backends.checkpoint_is_mla(None) is None


def _given(**fields):
    """A server-args object as the command line gives it (only the given fields exist)."""
    return SimpleNamespace(**{"speculative_algorithm": "EAGLE3", **fields})


def test_check_given_judges_only_the_fields_that_were_given():
    from sglang_verify_graph.config import check_given

    check_given(_given(), EnvSettings(enable=True))  # nothing else given: SGLang's resolution decides
    check_given(_given(prefill_attention_backend="triton"), EnvSettings(enable=True))  # one phase only: no pair to compare
    with pytest.raises(VerifyGraphConfigError, match="--prefill-attention-backend"):
        check_given(_given(prefill_attention_backend="torch_native"), EnvSettings(enable=True))
    # a given cuda_graph_config is resolved later (build_config), the raw flags are judged now
    disabled = SimpleNamespace(decode=SimpleNamespace(backend="disabled"))
    check_given(_given(cuda_graph_config=disabled), EnvSettings(enable=True))
    with pytest.raises(VerifyGraphConfigError, match="--disable-cuda-graph"):
        check_given(_given(disable_cuda_graph=True), EnvSettings(enable=True))


def test_check_given_reads_the_flag_from_the_environment():
    from sglang_verify_graph.config import check_given

    off = _given(speculative_eagle_topk=4)
    check_given(off, EnvSettings(enable=False))
    with pytest.raises(VerifyGraphConfigError, match="--speculative-eagle-topk"):
        check_given(off, EnvSettings(enable=True))


def test_check_given_checks_a_given_backend_against_local_checkpoints(tiny_model_dirs, mla_draft):
    """flashinfer on an MHA target, flashmla with an MHA draft: refused before SGLang resolves."""
    from sglang_verify_graph.config import check_given

    target, draft = tiny_model_dirs
    with pytest.raises(VerifyGraphConfigError, match=r"only for MLA targets .*--attention-backend = flashinfer"):
        check_given(_given(attention_backend="flashinfer", model_path=target), EnvSettings(enable=True))
    with pytest.raises(VerifyGraphConfigError, match="--speculative-draft-attention-backend"):
        check_given(_given(attention_backend="flashmla", model_path=mla_draft,
                           speculative_draft_model_path=draft), EnvSettings(enable=True))
    check_given(_given(attention_backend="flashmla", model_path=mla_draft, speculative_draft_model_path=mla_draft),
                EnvSettings(enable=True))


def test_mla_only_refusals_print_their_exact_lines(make_args, tiny_model_dirs, mla_draft):
    target, draft = tiny_model_dirs
    with pytest.raises(VerifyGraphConfigError) as info:
        build_config(make_args(attention_backend="flashinfer", model_path=target), ON)
    assert str(info.value) == (
        "--enable-verify-cuda-graph: serves flashinfer verify only for MLA targets (DeepSeek-V3 / Kimi-K2.5 "
        "class); this target has no MLA (--attention-backend = flashinfer). Fix: pass --attention-backend "
        "triton (or fa3).")
    for given in (None, "flashmla"):  # unset, or itself MLA-only
        with pytest.raises(VerifyGraphConfigError) as info:
            build_config(make_args(attention_backend="flashmla", model_path=mla_draft,
                                   speculative_draft_model_path=draft,
                                   speculative_draft_attention_backend=given), ON)
        assert str(info.value) == (
            "--enable-verify-cuda-graph: the EAGLE-3 draft is an MHA model and cannot run on flashmla, which "
            "serves MLA only (SGLang would fail at draft backend init) (--speculative-draft-attention-backend "
            f"= {given}). Fix: pass --speculative-draft-attention-backend triton (or fa3).")


def test_a_draft_path_not_given_is_not_judged(mla_draft):
    from sglang_verify_graph.config import check_given

    check_given(_given(attention_backend="flashmla", model_path=mla_draft), EnvSettings(enable=True))


def test_an_unknown_backend_kind_names_the_backend():
    with pytest.raises(KeyError) as info:
        backends.verify_attention_kind("torch_native")
    assert info.value.args == ("torch_native",)


@pytest.mark.parametrize("field", ["attn_dp_size", "pp_size"])
def test_unset_parallel_sizes_are_one(make_args, field):
    """sglang 0.5.23's ``attn_dp_size`` (absent in 0.5.16) and ``pp_size`` unset (``None``)."""
    assert build_config(make_args(**{field: None}), ON).tp_size == 1


def test_an_unsupported_base_backend_is_named_even_when_one_phase_overrides_it(make_args):
    """``--attention-backend torch_native --prefill-attention-backend triton``: decode would run
    torch_native, and that (not the prefill/decode split) is what the line names."""
    for phase in ("prefill", "decode"):
        with pytest.raises(VerifyGraphConfigError) as info:
            build_config(make_args(attention_backend="torch_native", **{f"{phase}_attention_backend": "triton"}), ON)
        assert (info.value.flag, info.value.value) == ("--attention-backend", "torch_native")


def test_a_decode_override_on_an_object_without_a_prefill_field_is_named():
    args = SimpleNamespace(speculative_algorithm="EAGLE3", speculative_eagle_topk=1,
                           speculative_num_steps=3, speculative_num_draft_tokens=4, attention_backend="triton",
                           decode_attention_backend="fa3")
    with pytest.raises(VerifyGraphConfigError) as info:
        build_config(args, ON)
    assert (info.value.flag, info.value.value) == ("--decode-attention-backend", "fa3")
    assert "the other phase uses triton" in str(info.value)

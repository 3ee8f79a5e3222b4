"""build_config: every rejected setting names its flag and fix on one line; good settings build."""

import pickle
import re
from types import SimpleNamespace

import pytest

from sglang_verify_graph.config import (
    FLAG,
    SUPPORTED_ATTENTION_BACKENDS,
    EnvSettings,
    VerifyGraphConfig,
    VerifyGraphConfigError,
    build_config,
)

ON = EnvSettings(enable=True)
DISABLED_GRAPHS = SimpleNamespace(decode=SimpleNamespace(backend="disabled", max_bs=32, bs=None))

# (id, overrides, flag, shown value, substring of the fix)
BAD = [
    ("no-spec", dict(speculative_algorithm=None), "--speculative-algorithm", "None",
     "--speculative-algorithm EAGLE3 --speculative-draft-model-path <draft>"),
    ("standalone", dict(speculative_algorithm="STANDALONE"), "--speculative-algorithm",
     "STANDALONE", f"remove {FLAG}"),
    ("ngram", dict(speculative_algorithm="NGRAM"), "--speculative-algorithm", "NGRAM",
     "--speculative-algorithm EAGLE3"),
    ("dflash", dict(speculative_algorithm="DFLASH"), "--speculative-algorithm", "DFLASH",
     "--speculative-algorithm EAGLE3"),
    ("topk4", dict(speculative_eagle_topk=4, speculative_num_draft_tokens=8),
     "--speculative-eagle-topk", "4", "--speculative-eagle-topk 1"),
    ("topk-unset", dict(speculative_eagle_topk=None), "--speculative-eagle-topk", "None",
     "--speculative-eagle-topk 1"),
    ("adaptive", dict(speculative_adaptive=True), "--speculative-adaptive", "True",
     "remove --speculative-adaptive"),
    ("zero-steps", dict(speculative_num_steps=0, speculative_num_draft_tokens=1),
     "--speculative-num-steps", "0", "--speculative-num-steps N"),
    ("ndt-mismatch", dict(speculative_num_draft_tokens=6), "--speculative-num-draft-tokens",
     "6", "--speculative-num-draft-tokens 4"),
    ("torch_native", dict(attention_backend="torch_native"), "--attention-backend",
     "torch_native", "--attention-backend triton"),
    ("trtllm_mha", dict(attention_backend="trtllm_mha"), "--attention-backend", "trtllm_mha",
     "--attention-backend triton"),
    ("backend-unresolved", dict(attention_backend=None), "--attention-backend", "None",
     "--attention-backend triton"),
    ("decode-override", dict(decode_attention_backend="torch_native"),
     "--decode-attention-backend", "torch_native", "--decode-attention-backend triton"),
    ("prefill-override", dict(prefill_attention_backend="trtllm_mha"),
     "--prefill-attention-backend", "trtllm_mha", "--prefill-attention-backend triton"),
    ("prefill-decode-differ", dict(prefill_attention_backend="fa3"),
     "--prefill-attention-backend", "fa3", "pass only --attention-backend triton"),
    ("disable-cuda-graph", dict(disable_cuda_graph=True, cuda_graph_config=DISABLED_GRAPHS),
     "--disable-cuda-graph", "True", "remove --disable-cuda-graph"),
    ("disable-decode-graph",
     dict(disable_decode_cuda_graph=True, cuda_graph_config=DISABLED_GRAPHS),
     "--disable-decode-cuda-graph", "True", "remove --disable-decode-cuda-graph"),
    ("decode-graph-backend-disabled",
     dict(cuda_graph_backend_decode="disabled", cuda_graph_config=DISABLED_GRAPHS),
     "--cuda-graph-backend-decode", "disabled", "remove --cuda-graph-backend-decode"),
    ("graph-config-disabled", dict(cuda_graph_config=DISABLED_GRAPHS), "--cuda-graph-config",
     "decode.backend=disabled", '{"decode":{"backend":"full"}}'),
    ("graph-config-dict", dict(cuda_graph_config={"decode": {"backend": "disabled"}}),
     "--cuda-graph-config", "decode.backend=disabled", "--cuda-graph-config"),
    ("unresolved-disable-cuda-graph", dict(disable_cuda_graph=True, cuda_graph_config=None),
     "--disable-cuda-graph", "True", "remove --disable-cuda-graph"),
    ("dp-attention", dict(enable_dp_attention=True), "--enable-dp-attention", "True",
     "remove --enable-dp-attention"),
    ("pipeline", dict(pp_size=2), "--pp-size", "2", "--pp-size 1"),
    ("tbo", dict(enable_two_batch_overlap=True), "--enable-two-batch-overlap", "True",
     "remove --enable-two-batch-overlap"),
]

LINE = re.compile(r"^--enable-verify-cuda-graph: (?P<problem>[^\n]+) \((?P<flag>\S+) = "
                  r"(?P<value>[^\n]*)\)\. Fix: (?P<fix>[^\n]+)\.$")


@pytest.mark.parametrize("overrides,flag,value,fix", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_setting_is_rejected_with_flag_and_fix(make_args, overrides, flag, value, fix):
    with pytest.raises(VerifyGraphConfigError) as info:
        build_config(make_args(**overrides), ON)
    err = info.value
    text = str(err)
    match = LINE.match(text)
    assert match, text
    assert err.flag == flag and match["flag"] == flag
    assert match["value"] == value
    assert fix in err.fix and fix in match["fix"]
    assert "\n" not in text and not text.endswith("..")
    assert isinstance(err, ValueError)


def test_every_bad_case_is_accepted_once_fixed(make_args):
    # Guards the table: the base namespace itself must be valid.
    assert isinstance(build_config(make_args(), ON), VerifyGraphConfig)


def test_good_settings_build_the_config(make_args):
    cfg = build_config(make_args(speculative_num_steps=5, speculative_num_draft_tokens=6,
                                 page_size=16, max_running_requests=64, tp_size=2), ON)
    assert cfg == VerifyGraphConfig(
        num_steps=5, num_draft_tokens=6, topk=1, speculative_algorithm="EAGLE3",
        attention_backend="triton", page_size=16, max_running_requests=64,
        num_kv_splits=None, log_every=0, decode_graph_backend="full", cuda_graph_max_bs=32,
        cuda_graph_bs=(1, 2, 4, 8), disable_cuda_graph_padding=False, tp_size=2,
    )
    assert cfg.num_draft_tokens == cfg.num_steps + 1
    hash(cfg)  # frozen, hashable (bs stored as a tuple)
    with pytest.raises(Exception):
        cfg.num_steps = 2


@pytest.mark.parametrize("algo,expected", [("EAGLE3", "EAGLE3"), ("EAGLE", "EAGLE"),
                                           ("eagle3", "EAGLE3"), ("NEXTN", "EAGLE")])
def test_accepted_algorithms(make_args, algo, expected):
    # sglang 0.5.16 resolves NEXTN to EAGLE before our post-init hook sees it.
    assert build_config(make_args(speculative_algorithm=algo), ON).speculative_algorithm == expected


def test_triton_everywhere_via_overrides_is_accepted(make_args):
    args = make_args(attention_backend="flashinfer", prefill_attention_backend="triton",
                     decode_attention_backend="triton")
    assert build_config(args, ON).attention_backend == "triton"
    assert SUPPORTED_ATTENTION_BACKENDS == ("triton", "fa3", "flashmla", "flashinfer")


def test_legacy_disable_flag_loses_to_resolved_config(make_args):
    # --disable-cuda-graph --cuda-graph-backend-decode full: sglang resolves decode to full.
    cfg = build_config(make_args(disable_cuda_graph=True), ON)
    assert cfg.decode_graph_backend == "full"


def test_attention_backend_is_checked_before_cuda_graphs(make_args):
    # torch_native makes sglang turn decode graphs off; the root cause is the backend.
    args = make_args(attention_backend="torch_native", cuda_graph_config=DISABLED_GRAPHS)
    with pytest.raises(VerifyGraphConfigError) as info:
        build_config(args, ON)
    assert info.value.flag == "--attention-backend"


def test_disabled_returns_none_even_for_bad_settings(make_args):
    args = make_args(speculative_algorithm=None, attention_backend="fa3")
    assert build_config(args, EnvSettings(enable=False)) is None


def test_env_flag_enables_validation(make_args):
    args = make_args(speculative_eagle_topk=2)
    assert build_config(args, EnvSettings(enable=False)) is None
    with pytest.raises(VerifyGraphConfigError):
        build_config(args, EnvSettings(enable=True))


def test_error_format_and_pickling():
    err = VerifyGraphConfigError("needs\nsomething  here", "--x", 3, "do\nthat.")
    assert str(err) == f"{FLAG}: needs something here (--x = 3). Fix: do that."
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is VerifyGraphConfigError
    assert (clone.problem, clone.flag, clone.value, clone.fix) == (err.problem, "--x", 3, "do that")
    assert str(clone) == str(err)


# The whole one line each bad setting prints (after "--enable-verify-cuda-graph: "): what a user
# reads, so a changed word of a problem or a fix is a visible change (the table above matches
# the fix as a substring only).
MESSAGES = {
    'no-spec': 'needs EAGLE-3 (or EAGLE) speculative decoding (--speculative-algorithm = None). Fix: pass --speculative-algorithm EAGLE3 --speculative-draft-model-path <draft> --speculative-eagle-topk 1, or remove --enable-verify-cuda-graph.',
    'standalone': 'needs EAGLE-3 (or EAGLE) speculative decoding (--speculative-algorithm = STANDALONE). Fix: pass --speculative-algorithm EAGLE3 --speculative-draft-model-path <draft> --speculative-eagle-topk 1, or remove --enable-verify-cuda-graph.',
    'ngram': 'needs EAGLE-3 (or EAGLE) speculative decoding (--speculative-algorithm = NGRAM). Fix: pass --speculative-algorithm EAGLE3 --speculative-draft-model-path <draft> --speculative-eagle-topk 1, or remove --enable-verify-cuda-graph.',
    'dflash': 'needs EAGLE-3 (or EAGLE) speculative decoding (--speculative-algorithm = DFLASH). Fix: pass --speculative-algorithm EAGLE3 --speculative-draft-model-path <draft> --speculative-eagle-topk 1, or remove --enable-verify-cuda-graph.',
    'topk4': 'supports only a linear draft chain (top-k 1) (--speculative-eagle-topk = 4). Fix: pass --speculative-eagle-topk 1.',
    'topk-unset': 'supports only a linear draft chain (top-k 1) (--speculative-eagle-topk = None). Fix: pass --speculative-eagle-topk 1.',
    'adaptive': 'does not support adaptive speculative decoding (it swaps the verify graph runner per step) (--speculative-adaptive = True). Fix: remove --speculative-adaptive.',
    'zero-steps': 'needs at least one draft step (--speculative-num-steps = 0). Fix: pass --speculative-num-steps N with N >= 1 (e.g. 3).',
    'ndt-mismatch': 'with top-k 1 the draft-token count must be num_steps + 1 = 4 (--speculative-num-draft-tokens = 6). Fix: pass --speculative-num-draft-tokens 4 or omit it.',
    'torch_native': 'supports the triton, fa3, flashmla, flashinfer attention backends for target verify (--attention-backend = torch_native). Fix: pass --attention-backend triton.',
    'trtllm_mha': 'supports the triton, fa3, flashmla, flashinfer attention backends for target verify (--attention-backend = trtllm_mha). Fix: pass --attention-backend triton.',
    'backend-unresolved': 'supports the triton, fa3, flashmla, flashinfer attention backends for target verify (--attention-backend = None). Fix: pass --attention-backend triton.',
    'decode-override': 'supports the triton, fa3, flashmla, flashinfer attention backends for target verify (--decode-attention-backend = torch_native). Fix: pass --decode-attention-backend triton or remove it.',
    'prefill-override': 'supports the triton, fa3, flashmla, flashinfer attention backends for target verify (--prefill-attention-backend = trtllm_mha). Fix: pass --prefill-attention-backend triton or remove it.',
    'prefill-decode-differ': 'needs one attention backend for prefill and decode (the other phase uses triton; with two, target verify could run on either) (--prefill-attention-backend = fa3). Fix: pass only --attention-backend triton.',
    'disable-cuda-graph': 'needs decode CUDA graphs (the verify graph replaces them) (--disable-cuda-graph = True). Fix: remove --disable-cuda-graph.',
    'disable-decode-graph': 'needs decode CUDA graphs (the verify graph replaces them) (--disable-decode-cuda-graph = True). Fix: remove --disable-decode-cuda-graph.',
    'decode-graph-backend-disabled': 'needs decode CUDA graphs (the verify graph replaces them) (--cuda-graph-backend-decode = disabled). Fix: remove --cuda-graph-backend-decode disabled.',
    'graph-config-disabled': 'needs decode CUDA graphs, but the resolved cuda_graph_config disables them (set by --cuda-graph-config or forced off by another setting; see the server log) (--cuda-graph-config = decode.backend=disabled). Fix: set --cuda-graph-config \'{"decode":{"backend":"full"}}\' or remove the setting that disables decode CUDA graphs.',
    'graph-config-dict': 'needs decode CUDA graphs, but the resolved cuda_graph_config disables them (set by --cuda-graph-config or forced off by another setting; see the server log) (--cuda-graph-config = decode.backend=disabled). Fix: set --cuda-graph-config \'{"decode":{"backend":"full"}}\' or remove the setting that disables decode CUDA graphs.',
    'unresolved-disable-cuda-graph': 'needs decode CUDA graphs (the verify graph replaces them) (--disable-cuda-graph = True). Fix: remove --disable-cuda-graph.',
    'dp-attention': 'does not support DP attention yet (--enable-dp-attention = True). Fix: remove --enable-dp-attention.',
    'pipeline': 'does not support pipeline parallelism yet (--pp-size = 2). Fix: use --pp-size 1.',
    'tbo': 'does not support two-batch overlap yet (--enable-two-batch-overlap = True). Fix: remove --enable-two-batch-overlap.',
}
EXTRA_BAD = [
    ("attn-dp", dict(attn_dp_size=2),
     "does not support DP attention yet (--attn-dp-size = 2). Fix: use --attn-dp-size 1."),
    ("kv-fp8", dict(kv_cache_dtype="fp8_e4m3"),
     "does not support a quantized KV cache yet (--kv-cache-dtype = fp8_e4m3). Fix: use --kv-cache-dtype auto."),
    ("deterministic", dict(enable_deterministic_inference=True),
     "does not support deterministic inference yet (--enable-deterministic-inference = True). "
     "Fix: remove --enable-deterministic-inference."),
    ("page-major", dict(enable_page_major_kv_layout=True),
     "does not support the page-major KV layout yet (--enable-page-major-kv-layout = True). "
     "Fix: remove --enable-page-major-kv-layout."),
]


@pytest.mark.parametrize("overrides,message", [(b[1], MESSAGES[b[0]]) for b in BAD] + [b[1:] for b in EXTRA_BAD],
                         ids=[b[0] for b in BAD] + [b[0] for b in EXTRA_BAD])
def test_each_bad_setting_prints_its_exact_line(make_args, overrides, message):
    with pytest.raises(VerifyGraphConfigError) as info:
        build_config(make_args(**overrides), ON)
    assert str(info.value) == f"{FLAG}: {message}"


@pytest.mark.parametrize("kv", ["auto", None, "bfloat16", "bf16", "float16", "fp16", "half"])
def test_model_dtype_kv_caches_are_served_by_the_chain_kernel(make_args, kv):
    assert build_config(make_args(kv_cache_dtype=kv), ON).attention_backend == "triton"


def test_unset_sizes_default_to_one_and_the_nan_test_needs_the_selftest(make_args):
    """``page_size`` / ``tp_size`` unset (``None``) are 1; the NaN injection is on only with the
    self-test; no bucket list stays ``None``; the environment's settings are carried."""
    cfg = build_config(make_args(page_size=None, tp_size=None, disable_cuda_graph_padding=1,
                                 cuda_graph_config=SimpleNamespace(decode=SimpleNamespace(backend="full", max_bs=None,
                                                                                          bs=None))),
                       EnvSettings(enable=True, selftest_nan=True, num_kv_splits=4, log_every=7))
    assert (cfg.page_size, cfg.tp_size, cfg.selftest, cfg.selftest_nan) == (1, 1, False, False)
    assert (cfg.cuda_graph_bs, cfg.cuda_graph_max_bs, cfg.disable_cuda_graph_padding) == (None, None, True)
    assert (cfg.num_kv_splits, cfg.log_every, cfg.draft_extend_attention) == (4, 7, "chain")
    cfg = build_config(make_args(), EnvSettings(enable=True, selftest=True, selftest_nan=True,
                                                draft_extend="upstream"))
    assert (cfg.selftest, cfg.selftest_nan, cfg.draft_extend_attention) == (True, True, "upstream")
    assert build_config(make_args(), EnvSettings(enable=True, selftest=True)).selftest_nan is False


def test_build_config_uses_the_environment_it_was_given(make_args, monkeypatch):
    """``sglang.Engine`` in a process whose os.environ lacks the flag: the given environment
    decides, not os.environ."""
    monkeypatch.delenv("SGLANG_ENABLE_VERIFY_CUDA_GRAPH")
    args = make_args()
    cfg = build_config(args, EnvSettings(enable=True, log_every=5))
    assert isinstance(cfg, VerifyGraphConfig) and cfg.log_every == 5
    assert build_config(args, EnvSettings(enable=False)) is None


def _bare(**fields):
    """A duck-typed server-args object that has only the given fields (another SGLang version's
    object, or one built by hand): a missing field reads as unset, never as an AttributeError."""
    return SimpleNamespace(**fields)


def test_a_bare_object_is_judged_on_what_it_has():
    base = dict(speculative_algorithm="EAGLE3")
    with pytest.raises(VerifyGraphConfigError, match=r"\(--speculative-eagle-topk = None\)"):
        build_config(_bare(**base), ON)
    base["speculative_eagle_topk"] = 1
    with pytest.raises(VerifyGraphConfigError, match=r"\(--speculative-num-steps = None\)"):
        build_config(_bare(**base), ON)
    base["speculative_num_steps"] = 1
    with pytest.raises(VerifyGraphConfigError, match=r"\(--speculative-num-draft-tokens = None\)\. "
                                                     r"Fix: pass --speculative-num-draft-tokens 2 or omit it"):
        build_config(_bare(**base), ON)
    base["speculative_num_draft_tokens"] = 2
    with pytest.raises(VerifyGraphConfigError, match=r"\(--attention-backend = None\)"):
        build_config(_bare(**base), ON)
    base["attention_backend"] = "triton"
    cfg = build_config(_bare(**base), ON)  # no graph, parallel or KV fields: nothing disables them
    assert (cfg.num_steps, cfg.num_draft_tokens, cfg.decode_graph_backend, cfg.page_size, cfg.tp_size) == (1, 2, None, 1, 1)
    assert (cfg.cuda_graph_bs, cfg.max_running_requests, cfg.disable_cuda_graph_padding) == (None, None, False)


def test_one_draft_step_is_enough(make_args):
    cfg = build_config(make_args(speculative_num_steps=1, speculative_num_draft_tokens=2), ON)
    assert (cfg.num_steps, cfg.num_draft_tokens) == (1, 2)


def test_a_bare_object_without_speculation_is_refused_for_it():
    with pytest.raises(VerifyGraphConfigError, match=r"\(--speculative-algorithm = None\)"):
        build_config(_bare(), ON)

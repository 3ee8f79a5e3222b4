"""``VerifyCudaGraphRunner.refusal_reason`` names the condition of upstream's
``DecodeCudaGraphRunner.can_run_graph`` that refused a batch, for each SGLang version:

* the conditions upstream reads are pinned per version (an SGLang upgrade that adds or drops one
  fails here, naming it), each mapped to our reason or to why it cannot refuse our target;
* on a runner built without capture, each reachable condition alone makes upstream refuse, and
  our reason for that batch is the mapped one.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from types import SimpleNamespace

import pytest

from sglang_verify_graph import counters as C
from sglang_verify_graph.compat import sglang_adapter as adapter

UNREACHABLE = "not reachable"

# attribute of forward_batch / self read by upstream's can_run_graph -> our reason
CONDITIONS = {
    "0.5.16": {
        "forward_batch": {
            "replace_embeds": C.REASON_REPLACE_EMBEDS,
            "spec_info": C.REASON_WIDTH,
            "batch_size": C.REASON_BS_ABOVE_MAX,
            "original_global_num_tokens_cpu": C.REASON_BS_ABOVE_MAX,
            "can_run_dp_cuda_graph": C.REASON_DP_SYNC,
            "can_run_tbo": C.REASON_TBO,
            "capture_hidden_mode": C.REASON_HIDDEN_MODE,
            "forward_mode": f"{UNREACHABLE}: only with ragged verify mode (not used for topk 1)",
            "encoder_lens": f"{UNREACHABLE}: EAGLE targets are decoder-only",
            "input_ids": f"{UNREACHABLE}: NGRAM speculation only",
        },
        "self": {
            "captured_req_width": C.REASON_WIDTH,
            "disable_padding": C.REASON_BS_NOT_CAPTURED,
            "backend": C.REASON_BS_NOT_CAPTURED,
            "max_bs": C.REASON_BS_ABOVE_MAX,
            "require_mlp_tp_gather": C.REASON_BS_ABOVE_MAX,
            "require_mlp_sync": C.REASON_DP_SYNC,
            "enable_two_batch_overlap": C.REASON_TBO,
            "capture_hidden_mode": C.REASON_HIDDEN_MODE,
            "ragged_verify_mode": f"{UNREACHABLE}: ragged verify is off for topk 1",
            "_can_run_ragged_verify_graph": f"{UNREACHABLE}: ragged verify is off for topk 1",
            "_make_graph_key": f"{UNREACHABLE}: builds the bucket key, refuses nothing",
            "enable_pdmux": f"{UNREACHABLE}: builds the bucket key, refuses nothing",
            "_resolve_lora_variant": f"{UNREACHABLE}: builds the bucket key, refuses nothing",
            "is_encoder_decoder": f"{UNREACHABLE}: EAGLE targets are decoder-only",
            "model_runner": f"{UNREACHABLE}: NGRAM speculation only",
        },
    },
}


def _release(previous: str, fb_drop=(), fb_add=None, self_drop=(), self_add=None) -> dict:
    """The conditions of a release: ``previous``'s with the listed reads dropped and added."""
    prev = CONDITIONS[previous]
    fb = {k: v for k, v in prev["forward_batch"].items() if k not in fb_drop}
    me = {k: v for k, v in prev["self"].items() if k not in self_drop}
    return {"forward_batch": {**fb, **(fb_add or {})}, "self": {**me, **(self_add or {})}}


# 0.5.17: no capture-hidden-mode check (the mode is fixed at capture).
CONDITIONS["0.5.17"] = _release("0.5.16", fb_drop=("capture_hidden_mode",), self_drop=("capture_hidden_mode",))
# 0.5.18: the DP batch size through a method.
CONDITIONS["0.5.18"] = _release("0.5.17", fb_drop=("original_global_num_tokens_cpu",), self_add={
    "_max_dp_batch_size": f"{UNREACHABLE}: DP attention is refused at launch"})
# 0.5.19: the DP vote renamed.
CONDITIONS["0.5.19"] = _release("0.5.18", fb_drop=("can_run_dp_cuda_graph",),
                                fb_add={"can_run_decode_cuda_graph": C.REASON_DP_SYNC})
# 0.5.20: the bucket key takes an attention variant.
CONDITIONS["0.5.20"] = _release("0.5.19", self_add={
    "_resolve_attention_variant": f"{UNREACHABLE}: builds the bucket key, refuses nothing"})
for _v in ("0.5.21", "0.5.22", "0.5.23"):
    CONDITIONS[_v] = _release("0.5.20")

REASONS = {v for k, v in vars(C).items() if k.startswith("REASON_")}


def _attributes_read(fn) -> dict[str, set[str]]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    seen = {"forward_batch": set(), "self": set()}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in seen:
            seen[node.value.id].add(node.attr)
    return seen


def test_upstream_conditions_are_pinned_for_this_version():
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    pinned = CONDITIONS[adapter.SGLANG_VERSION]
    read = _attributes_read(DecodeCudaGraphRunner.can_run_graph)
    for owner in ("forward_batch", "self"):
        assert read[owner] == set(pinned[owner]), (
            f"upstream can_run_graph reads {owner}.{sorted(read[owner] ^ set(pinned[owner]))} "
            "differently from the pinned list: map the change to a refusal reason")
        for attr, reason in pinned[owner].items():
            assert reason in REASONS or reason.startswith(UNREACHABLE), (owner, attr, reason)


def test_every_mapped_reason_is_one_refusal_reason_can_return():
    """Each reason a reachable condition maps to is produced by our refusal_reason's source, so
    no condition is mapped to a reason our code cannot give."""
    from sglang_verify_graph.runner import VerifyCudaGraphRunner

    src = inspect.getsource(VerifyCudaGraphRunner.refusal_reason)
    names = {v: k for k, v in vars(C).items() if k.startswith("REASON_")}
    for owner in CONDITIONS[adapter.SGLANG_VERSION].values():
        for reason in owner.values():
            if reason in REASONS:
                assert f"C.{names[reason]}" in src, reason


# ---- behaviour: each reachable condition alone ---------------------------------------------------
def _runner_and_batch(**runner_overrides):
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

    from sglang_verify_graph.runner import VerifyCudaGraphRunner

    runner = VerifyCudaGraphRunner.__new__(VerifyCudaGraphRunner)
    captured = (1, 2, 4, 8)
    runner.__dict__.update(
        counters=C.VerifyCounters(), disable_padding=False, capture_bs=list(captured), max_bs=8,
        captured_req_width=4, ragged_verify_mode=False, require_mlp_tp_gather=False,
        require_mlp_sync=False, enable_two_batch_overlap=False, enable_pdmux=False,
        is_encoder_decoder=False, capture_hidden_mode=CaptureHiddenMode.FULL,
        backend=SimpleNamespace(can_run=lambda fb, key: key.size in captured),
        model_runner=SimpleNamespace(spec_algorithm=SimpleNamespace(is_ngram=lambda: False)),
        record_nolora_graph=False, attention_graph_variants=None,  # bucket-key inputs of later releases
    )
    runner.__dict__.update(runner_overrides)
    fb = SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY, replace_embeds=None, batch_size=4,
        capture_hidden_mode=CaptureHiddenMode.FULL, lora_ids=None, can_run_tbo=True,
        can_run_dp_cuda_graph=True, can_run_decode_cuda_graph=True,
        spec_info=SimpleNamespace(num_tokens_per_req=4, capture_hidden_mode=CaptureHiddenMode.FULL),
    )
    return runner, fb


def _hidden_mode_mismatch(runner, fb):
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    fb.capture_hidden_mode = fb.spec_info.capture_hidden_mode = CaptureHiddenMode.LAST
    runner.capture_hidden_mode = CaptureHiddenMode.FULL  # the graph keeps every hidden state


CASES = {
    C.REASON_REPLACE_EMBEDS: lambda r, fb: setattr(fb, "replace_embeds", object()),
    C.REASON_WIDTH: lambda r, fb: setattr(fb.spec_info, "num_tokens_per_req", 3),
    C.REASON_BS_NOT_CAPTURED: lambda r, fb: (setattr(r, "disable_padding", True),
                                             setattr(fb, "batch_size", 3)),
    C.REASON_BS_ABOVE_MAX: lambda r, fb: setattr(fb, "batch_size", 12),
    C.REASON_DP_SYNC: lambda r, fb: (setattr(r, "require_mlp_sync", True),
                                     setattr(fb, "can_run_dp_cuda_graph", False),
                                     setattr(fb, "can_run_decode_cuda_graph", False)),
    C.REASON_TBO: lambda r, fb: (setattr(r, "enable_two_batch_overlap", True),
                                 setattr(fb, "can_run_tbo", False)),
}
if adapter.CAN_RUN_GRAPH_CHECKS_HIDDEN_MODE:
    CASES[C.REASON_HIDDEN_MODE] = _hidden_mode_mismatch


def test_an_unrefused_batch_replays():
    runner, fb = _runner_and_batch()
    assert runner.can_run_graph(fb) is True
    assert runner.counters._last_reason is None


@pytest.mark.parametrize("reason", sorted(CASES))
def test_each_condition_alone_is_refused_under_its_reason(reason):
    runner, fb = _runner_and_batch()
    CASES[reason](runner, fb)
    assert runner.can_run_graph(fb) is False  # upstream's own decision
    assert runner.counters._last_reason == reason, runner.counters._last_detail


# ---- the detail logged with each reason, and each switch read only when it is on ---------------
DETAILS = {
    C.REASON_REPLACE_EMBEDS: "",
    C.REASON_WIDTH: "3 != 4",
    C.REASON_BS_NOT_CAPTURED: "bs=3 not in capture_bs with --disable-cuda-graph-padding",
    C.REASON_BS_ABOVE_MAX: "bs=12 > max captured 8; raise --cuda-graph-max-bs-decode or lower --max-running-requests",
    C.REASON_DP_SYNC: "",
    C.REASON_TBO: "",
    C.REASON_HIDDEN_MODE: "graph captured FULL",
}


@pytest.mark.parametrize("reason", sorted(CASES))
def test_each_refusal_is_logged_with_its_detail(reason):
    """The detail goes into the fallback warning (``counters.count_eager_verify``)."""
    runner, fb = _runner_and_batch()
    CASES[reason](runner, fb)
    runner.can_run_graph(fb)
    assert runner.counters._last_detail == DETAILS[reason]


def _reason(runner, fb):
    return runner.refusal_reason(fb)


@pytest.mark.parametrize("spec_info", [None, SimpleNamespace(), SimpleNamespace(num_tokens_per_req=0)],
                         ids=["no-spec", "spec-without-width", "width-0"])
def test_a_batch_that_states_no_width_is_not_a_width_refusal(spec_info):
    runner, fb = _runner_and_batch()
    fb.spec_info, fb.batch_size = spec_info, 12
    assert _reason(runner, fb) == (C.REASON_BS_ABOVE_MAX, DETAILS[C.REASON_BS_ABOVE_MAX])


def test_one_token_per_request_against_a_wider_graph_is_a_width_refusal():
    runner, fb = _runner_and_batch()
    fb.spec_info.num_tokens_per_req = 1
    assert _reason(runner, fb) == (C.REASON_WIDTH, "1 != 4")


def test_with_mlp_tp_gather_the_largest_rank_batch_decides():
    """Under MLP TP gather every rank replays the bucket of the largest batch across ranks."""
    runner, fb = _runner_and_batch(require_mlp_tp_gather=True)
    fb.original_global_num_tokens_cpu, fb.batch_size = [3, 12], 4
    assert _reason(runner, fb)[1].startswith("bs=12 > max captured 8")


def _other_reason():
    return C.REASON_HIDDEN_MODE if adapter.CAN_RUN_GRAPH_CHECKS_HIDDEN_MODE else C.REASON_OTHER


def test_the_largest_bucket_itself_is_not_above_the_largest_bucket():
    runner, fb = _runner_and_batch()
    fb.batch_size = 8
    assert _reason(runner, fb)[0] == _other_reason()


@pytest.mark.parametrize("switch_on", [False, True])
def test_dp_and_tbo_are_judged_only_when_their_switch_is_on(monkeypatch, switch_on):
    """A batch that could not run DP / TBO is refused for it only when the runner needs DP sync /
    runs two-batch overlap; a runner that needs them refuses only a batch that cannot."""
    monkeypatch.setattr(adapter, "can_run_dp", lambda fb: fb.dp_ok)
    runner, fb = _runner_and_batch(require_mlp_sync=switch_on, enable_two_batch_overlap=switch_on)
    fb.dp_ok, fb.can_run_tbo = switch_on, switch_on  # switch on: the batch can; off: it cannot
    assert _reason(runner, fb)[0] == _other_reason()
    fb.dp_ok = True
    runner.enable_two_batch_overlap, fb.can_run_tbo = True, False
    assert _reason(runner, fb) == (C.REASON_TBO, "")
    runner.require_mlp_sync, fb.dp_ok = True, False
    assert _reason(runner, fb) == (C.REASON_DP_SYNC, "")


def test_a_refusal_no_condition_explains_has_no_detail(monkeypatch):
    monkeypatch.setattr(adapter, "CAN_RUN_GRAPH_CHECKS_HIDDEN_MODE", False)  # sglang 0.5.17 on
    runner, fb = _runner_and_batch()
    assert _reason(runner, fb) == (C.REASON_OTHER, "")

"""CPU tier: under tensor parallelism every rank must take the same path (graph or eager) with the
same bucket in the same verify step, or the all-reduces inside the graph deadlock (NCCL hang).

VerifyCudaGraphRunner's decision is SGLang's ``can_run_graph`` plus our counting, and the bucket
is ``_pad_to_bucket(raw_bs, capture_bs)``: both read only values every TP rank shares (batch
size, tokens per request, forward mode, the DP-gathered token counts). This test runs the real
methods (no capture: the runner object is built without ``__init__``) on batches that are equal
in those shared values but differ in everything rank-local (KV slots, page-table rows, sequence
lengths, token ids), and checks the decisions agree; and that flipping a shared value changes
the decision on every rank alike.
"""

from types import SimpleNamespace

import pytest
import torch

from sglang_verify_graph import counters as C
from sglang_verify_graph.runner import VerifyCudaGraphRunner


class _Algo:
    def is_ngram(self):
        return False


def _runner(capture_bs=(1, 2, 4, 8), width=3, mlp_sync=False):
    r = object.__new__(VerifyCudaGraphRunner)
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

    r.capture_bs = list(capture_bs)
    r.max_bs = max(capture_bs)
    r.captured_req_width = width
    r.ragged_verify_mode = False
    r.require_mlp_tp_gather = mlp_sync
    r.require_mlp_sync = mlp_sync
    r.enable_pdmux = False
    r.disable_padding = False
    r.is_encoder_decoder = False
    r.enable_two_batch_overlap = False
    r.capture_hidden_mode = CaptureHiddenMode.FULL
    r.capture_forward_mode = ForwardMode.TARGET_VERIFY
    r.model_runner = SimpleNamespace(spec_algorithm=_Algo())
    r.record_nolora_graph = False  # sglang 0.5.23: lora/nolora graph variants off
    r.counters = C.VerifyCounters()
    return r


def _batch(bs, width=3, seed=0, global_tokens=None, dp_ok=True):
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

    g = torch.Generator().manual_seed(seed)
    return SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY,
        batch_size=bs,
        replace_embeds=None,
        spec_info=SimpleNamespace(num_tokens_per_req=width, capture_hidden_mode=CaptureHiddenMode.FULL),
        capture_hidden_mode=CaptureHiddenMode.FULL,
        # rank-local values: different on every rank
        seq_lens=torch.randint(1, 10000, (bs,), generator=g),
        req_pool_indices=torch.randperm(64, generator=g)[:bs],
        out_cache_loc=torch.randint(1, 1 << 20, (bs * width,), generator=g),
        input_ids=torch.randint(0, 32000, (bs * width,), generator=g),
        original_global_num_tokens_cpu=global_tokens,
        can_run_dp_cuda_graph=dp_ok,  # sglang 0.5.16 name
        can_run_decode_cuda_graph=dp_ok,  # sglang 0.5.23 name
        encoder_lens=None,
        can_run_tbo=True,
    )


def _decide(runner, fb):
    ok = runner.can_run_graph(fb)
    bucket = runner._pad_to_bucket(fb.batch_size, runner.capture_bs) if ok else None
    return ok, bucket


@pytest.mark.parametrize("bs", list(range(1, 12)))
def test_ranks_agree_when_only_rank_local_values_differ(bs):
    ranks = [_runner() for _ in range(8)]
    decisions = {_decide(r, _batch(bs, seed=rank)) for rank, r in enumerate(ranks)}
    assert len(decisions) == 1, decisions
    ok, bucket = decisions.pop()
    assert ok == (bs <= 8)
    if ok:
        assert bucket == min(b for b in (1, 2, 4, 8) if b >= bs)


def test_shared_value_flip_moves_every_rank_alike():
    ranks = [_runner() for _ in range(4)]
    assert {_decide(r, _batch(8, seed=i)) for i, r in enumerate(ranks)} == {(True, 8)}
    assert {_decide(r, _batch(9, seed=i)) for i, r in enumerate(ranks)} == {(False, None)}
    for r in ranks:
        assert r.counters._last_reason == C.REASON_BS_ABOVE_MAX
    # a batch whose tokens-per-request differs from the captured width (shared) -> eager everywhere
    assert {_decide(r, _batch(2, width=2, seed=i)) for i, r in enumerate(ranks)} == {(False, None)}


def test_dp_gathered_decision_uses_the_global_maximum():
    """With gathered MLP buffers the bucket follows max(original_global_num_tokens_cpu), which the
    DP ranks all-gathered: a rank with a small local batch still picks the shared bucket."""
    ranks = [_runner(mlp_sync=True) for _ in range(4)]
    global_tokens = [3, 1, 7, 2]
    out = set()
    for i, r in enumerate(ranks):
        fb = _batch(global_tokens[i], seed=i, global_tokens=global_tokens)
        out.add(r.can_run_graph(fb))
    assert out == {True}
    too_big = [3, 1, 9, 2]
    assert {r.can_run_graph(_batch(too_big[i], seed=i, global_tokens=too_big))
            for i, r in enumerate(ranks)} == {False}


_TP_RANK_SCRIPT = """
import json, sys
from types import SimpleNamespace
import torch.distributed as dist
from sglang_verify_graph import counters as C, plugin

rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
c = C.install_counters(C.VerifyCounters())
for _ in range(3):
    c.count_verify_step(2)
    c.count_replay(2, 2)
if rank == 1:  # this rank ran one more verify step, eagerly: the disagreement the server test hunts
    c.count_verify_step(9)
    c.note_refusal(C.REASON_BS_ABOVE_MAX)
    c.count_eager_verify(9)
result = SimpleNamespace(internal_state={"rank": rank})
plugin.internal_state_hook(result, SimpleNamespace(tp_cpu_group=dist.group.WORLD), "request")
print("STATE", json.dumps({"state": result.internal_state, "own": c.snapshot()}))
dist.destroy_process_group()
"""


def test_every_tp_ranks_counters_reach_rank_zeros_internal_state():
    """``/get_server_info`` serves TP rank 0's ``internal_state`` only: the hook gathers every TP
    rank's counters into it over the scheduler's ``tp_cpu_group`` (two real gloo ranks here), so
    a rank that ran a verify step eagerly while rank 0 replayed is seen, and
    ``rank_disagreement`` names it."""
    import json
    import os
    import socket
    import subprocess
    import sys

    from bench.lib.server import rank_disagreement, tp_rank_counters

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_VERIFY_GRAPH_")}
    procs = [subprocess.Popen([sys.executable, "-c", _TP_RANK_SCRIPT, str(r), port], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    got = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        got.append(json.loads(out.split("STATE", 1)[1]))
    own = [g["own"] for g in got]
    assert own[0]["verify_steps"] == 3 and own[1]["verify_steps"] == 4  # the ranks did differ
    for rank, g in enumerate(got):  # an all-gather: every rank's state holds the same list
        assert g["state"]["verify_cuda_graph"] == own[rank]
        assert g["state"]["verify_cuda_graph_tp_ranks"] == own, rank
    [ranks] = tp_rank_counters([got[0]["state"]])
    assert ranks == own
    problem = rank_disagreement(ranks)
    assert problem is not None and problem.startswith("TP rank 1 differs"), problem
    assert "verify_steps" in problem and "fallbacks" in problem, problem
    assert rank_disagreement([own[0], dict(own[0], capture_seconds=9.9)]) is None  # the rank's own
    assert tp_rank_counters([{"verify_cuda_graph": own[0]}]) == [[own[0]]]  # TP 1: no gathered list
    assert rank_disagreement([own[0], None]).startswith("TP rank 1 reports no verify counters")

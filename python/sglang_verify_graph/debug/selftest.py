"""Probes of the verify graph: objects the runner calls around every TARGET_VERIFY replay.
:data:`NO_PROBE` (the default) does nothing; :class:`GraphSelfTest` is the in-server self-test
(GPU tests only; ``SGLANG_VERIFY_GRAPH_SELFTEST=1``), which for every replayed verify step

1. poisons every static GPU input buffer (all rows) with an extreme value before ``load_batch``,
   so any padded row the runner fails to neutralise indexes far out of range (device assert /
   illegal memory access, the failure mode of sgl-project/sglang#10892);
2. after the replay, runs the same batch eagerly (same chain attention, SGLang's eager model
   forward) and compares the real rows' ``next_token_logits`` and EAGLE-3 aux hidden states;
   with the chain kernel, runs it once more through SGLang's own TARGET_VERIFY attention (the
   triton backend's ``extend_attention_fwd`` with the chain's full tree mask,
   :func:`chain_tree_mask`), an independent reference: per-row errors, per draft position;
3. checks that the static buffers' device addresses never changed since capture;
4. with ``SGLANG_VERIFY_GRAPH_SELFTEST_NAN=1``: from ``load_batch`` of a padded bucket until the
   replay is enqueued (stream-ordered copies), the embedding row of the padding token (``PAD_TOKEN_ID``, the token of
   every padded row) holds NaN, so every padded row carries NaN through every layer; real rows
   must stay finite and equal to eager (``nonfinite_rows`` counts real rows with NaN/inf logits
   or aux hidden states).

Results accumulate in the counters (``/get_server_info`` -> ``verify_cuda_graph.selftest``).
It synchronizes the stream (reads errors back): never enable it when measuring speed.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import Counter

import torch

from sglang_verify_graph.compat import sglang_adapter as adapter
from sglang_verify_graph.buffers import PAD_TOKEN_ID
from sglang_verify_graph.debug.probes import DraftExtendProbe, VerifyProbe

logger = logging.getLogger("sglang_verify_graph")

POISON = 1 << 40  # far beyond any vocab, position, KV slot or page-table row
_POISONED = ("input_ids", "positions", "out_cache_loc", "req_pool_indices", "seq_lens")


def worst(current: float, new: float) -> float:
    """The larger error, NaN-aware (NaN wins: Python's ``max(0.0, nan)`` would drop it)."""
    if math.isnan(current) or math.isnan(new):
        return math.nan
    return max(current, new)


def chain_tree_mask(seq_lens: torch.Tensor, num_draft_tokens: int) -> torch.Tensor:
    """SGLang's FULL_MASK tree mask of a topk=1 draft chain, as the triton backend's TARGET_VERIFY
    path reads it: per request ``num_draft_tokens`` rows of ``seq_len + num_draft_tokens`` bools
    (row-major, requests concatenated), the prefix all True and draft ``j`` seeing drafts
    ``0..j``.

    Args:
        seq_lens: ``[bs]`` int prefix lengths (without the drafts), on the mask's device.
        num_draft_tokens: tokens per request in the verify forward.

    Returns:
        ``[sum(num_draft_tokens * (seq_lens + num_draft_tokens))]`` bool on ``seq_lens.device``.
    """
    ndt, dev = num_draft_tokens, seq_lens.device
    chain = torch.tril(torch.ones(ndt, ndt, dtype=torch.bool, device=dev))
    return torch.cat([torch.cat([torch.ones(ndt, n, dtype=torch.bool, device=dev), chain], 1).flatten()
                      for n in seq_lens.tolist()])


def row_rel_err(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row relative error ``|a_i - b_i| / |b_i|`` (fp32, ``[rows]``) of two ``[rows, n]``
    tensors (Frobenius norm of each row)."""
    a, b = a.float(), b.float()
    return (a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-12)


class GraphSelfTest(VerifyProbe):
    """The graph-vs-eager self-test (module docstring); results in ``runner.counters.selftest``."""

    def __init__(self, runner, inject_nan: bool = False):
        self.addresses = {n: getattr(runner.buffers, n).data_ptr() for n in _POISONED}
        self.result = runner.counters.selftest
        self.result.update(checks=0, logits_max_rel_err=0.0, hidden_max_rel_err=0.0,
                           argmax_mismatch=0, addresses_stable=True, bs_seen={}, raw_bs_seen={},
                           nonfinite_rows=0, nan_injected_replays=0)
        self.upstream = self.result.setdefault("upstream", {}) if getattr(runner, "chain", True) else None
        if self.upstream is not None:
            ndt = runner.verify_cfg.num_draft_tokens
            self.upstream.update(checks=0, rows=0, argmax_mismatch=0, nonfinite_rows=0,
                                 logits_row_max_rel_err=[0.0] * ndt, hidden_row_max_rel_err=[0.0] * ndt)
        self._bs = Counter()
        self._raw_bs = Counter()
        self._nan_row = adapter.local_embedding_row(runner.model_runner, PAD_TOKEN_ID) if inject_nan else None
        self._saved_row = self._nan_row.clone() if self._nan_row is not None else None
        self._nan_live = False

    def poison(self, runner) -> None:
        """Before a full ``load_batch``: every static input buffer (all rows) to :data:`POISON`,
        and a check that none moved since capture."""
        for name in _POISONED:
            buf = getattr(runner.buffers, name)
            if buf.data_ptr() != self.addresses[name]:
                self.result["addresses_stable"] = False
            buf.fill_(POISON)

    def inject_nan(self, runner, forward_batch) -> None:
        """After ``load_batch`` filled a padded bucket (``bs > raw_bs``): NaN into the padding
        token's embedding row, which the coming replay reads for its padded rows.

        Skipped (and counted as ``nan_skipped_real_pad_token``) when a real row holds the padding
        token itself (it would read the NaN too). Waits for the device first, so no work queued
        earlier on another stream (e.g. the draft, which shares the embedding tensor, under
        ``SGLANG_ENABLE_OVERLAP_PLAN_STREAM``) can see the NaN row."""
        if self._nan_row is None or runner.bs <= runner.raw_bs:
            return
        if bool((forward_batch.input_ids[:runner.raw_num_token] == PAD_TOKEN_ID).any()):
            self.result["nan_skipped_real_pad_token"] = (
                self.result.get("nan_skipped_real_pad_token", 0) + 1)
            return
        torch.cuda.synchronize()
        self._nan_row.fill_(float("nan"))
        self._nan_live = True
        self.result["nan_injected_replays"] += 1

    def restore_nan(self) -> None:
        """After the replay was enqueued: put the embedding row back (stream-ordered)."""
        if self._nan_live:
            self._nan_row.copy_(self._saved_row)
            self._nan_live = False

    @staticmethod
    def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
        a, b = a.float(), b.float()
        return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()

    # ---- probe hooks ------------------------------------------------------------------------
    def before_load(self, runner, forward_batch) -> None:
        self.restore_nan()  # never let an injection outlive its cycle
        self.poison(runner)

    def after_load(self, runner, forward_batch) -> None:
        self.inject_nan(runner, forward_batch)

    def after_enqueue(self, runner) -> None:
        self.restore_nan()

    def after_replay(self, runner, forward_batch, graph_out) -> None:
        self.compare(runner, forward_batch, graph_out)

    def compare(self, runner, forward_batch, graph_out) -> None:
        """Run the batch eagerly and accumulate the errors of the real rows."""
        backend = runner.model_runner.attn_backend
        logits = graph_out.next_token_logits.clone()
        hidden = graph_out.hidden_states.clone() if graph_out.hidden_states is not None else None
        backend.init_forward_metadata(forward_batch)
        if getattr(runner, "chain", True):
            # same split count as the replayed bucket, so attention reduces in the same order
            backend._chain_meta = dataclasses.replace(
                backend._chain_meta, num_kv_splits=backend.num_kv_splits_for(runner.bs))
        # The model's own forward, not ModelRunner.forward: not counted as an eager fallback.
        ref = runner.model_runner.model.forward(
            forward_batch.input_ids, forward_batch.positions, forward_batch)
        r = self.result
        r["checks"] += 1
        r["rows"] = r.get("rows", 0) + logits.shape[0]
        r["nonfinite_rows"] += int((~torch.isfinite(logits).all(-1)).sum().item())
        if hidden is not None:
            r["nonfinite_rows"] += int((~torch.isfinite(hidden).all(-1)).sum().item())
        r["logits_max_rel_err"] = worst(r["logits_max_rel_err"], self._rel(logits, ref.next_token_logits))
        r["argmax_mismatch"] += int((logits.argmax(-1) != ref.next_token_logits.argmax(-1)).sum().item())
        if hidden is not None and ref.hidden_states is not None:
            r["hidden_max_rel_err"] = worst(r["hidden_max_rel_err"], self._rel(hidden, ref.hidden_states))
        elif (hidden is None) != (ref.hidden_states is None):
            r["hidden_missing"] = r.get("hidden_missing", 0) + 1
        self._bs[runner.bs] += 1
        self._raw_bs[runner.raw_bs] += 1
        r["bs_seen"] = dict(self._bs)
        r["raw_bs_seen"] = dict(self._raw_bs)
        if self.upstream is not None:
            self.compare_upstream(runner, forward_batch, logits, hidden)

    def compare_upstream(self, runner, forward_batch, logits, hidden) -> None:
        """The same batch through SGLang's own TARGET_VERIFY attention (``reference`` mode of
        ``ChainVerifyTritonBackend``, the chain's FULL_MASK tree mask in ``spec_info``), eagerly;
        accumulates in ``selftest["upstream"]`` the per-row relative errors of the replay's real
        rows (max per draft position, ``[num_draft_tokens]``), argmax mismatches and
        non-finite rows."""
        backend = runner.model_runner.attn_backend
        spec = forward_batch.spec_info
        ndt = runner.verify_cfg.num_draft_tokens
        saved_mask = spec.custom_mask
        spec.custom_mask = chain_tree_mask(forward_batch.seq_lens[:runner.raw_bs], ndt)
        backend.reference = True
        try:
            backend.init_forward_metadata(forward_batch)
            ref = runner.model_runner.model.forward(
                forward_batch.input_ids, forward_batch.positions, forward_batch)
        finally:
            backend.reference = False
            spec.custom_mask = saved_mask
        u = self.upstream
        u["checks"] += 1
        u["rows"] += logits.shape[0]
        u["nonfinite_rows"] += int((~torch.isfinite(ref.next_token_logits).all(-1)).sum().item())
        u["argmax_mismatch"] += int((logits.argmax(-1) != ref.next_token_logits.argmax(-1)).sum().item())
        pairs = [("logits_row_max_rel_err", logits, ref.next_token_logits)]
        if hidden is not None and ref.hidden_states is not None:
            pairs.append(("hidden_row_max_rel_err", hidden, ref.hidden_states))
        for key, ours, theirs in pairs:
            err = row_rel_err(ours, theirs).view(-1, ndt).amax(0).tolist()  # per draft position
            u[key] = [worst(a, b) for a, b in zip(u[key], err)]


# ---- draft extend ---------------------------------------------------------------------------
_DRAFT_EXTEND_POISONED = ("seq_lens", "out_cache_loc", "positions", "req_pool_indices")
_SPEC_FIELDS = ("positions", "num_correct_drafts", "num_accept_tokens", "extend_seq_lens_cpu",
                "extend_seq_lens_tensor")


class DraftExtendSelfTest(DraftExtendProbe):
    """The draft-extend self-test; results in ``selftest["draft_extend"]`` of the counters.

    Before each replay: the runner's static ``seq_lens``, ``out_cache_loc``, ``positions`` and
    ``req_pool_indices`` (all rows; ``execute`` neutralises the padded ones) to :data:`POISON`, and
    the chain kernel's fp32 scratch to NaN. After it: the same batch through SGLang's own
    ``DRAFT_EXTEND_V2`` attention (``ChainDraftExtendTritonBackend.reference``: the triton
    backend's ``extend_attention_fwd`` over a freshly built ``kv_indices``), eagerly, with the
    batch's own ``spec_info`` as ``execute`` found it; the real rows' ``next_token_logits`` and
    hidden states are compared (relative Frobenius error, argmax mismatches, non-finite rows)."""

    def __init__(self, runner, selftest: dict):
        self.result = selftest.setdefault("draft_extend", {})
        self.result.update(checks=0, logits_max_rel_err=0.0, hidden_max_rel_err=0.0,
                           argmax_mismatch=0, nonfinite_rows=0, rows=0, bs_seen={}, raw_bs_seen={})
        self._bs, self._raw_bs = Counter(), Counter()
        self._spec = {}

    def before_execute(self, runner, forward_batch) -> None:
        for name in _DRAFT_EXTEND_POISONED:
            buf = getattr(runner.buffers, name, None)
            if buf is not None:
                buf.fill_(POISON)
        static = getattr(runner.draft_extend_attn_backend, "_chain_static", None)
        for buf in static or ():
            buf.fill_(float("nan"))
        spec = forward_batch.spec_info
        self._spec = {k: getattr(spec, k) for k in _SPEC_FIELDS if hasattr(spec, k)}

    def after_execute(self, runner, forward_batch, graph_out, select_index=None) -> None:
        backend = runner.draft_extend_attn_backend
        spec = forward_batch.spec_info
        after = {k: getattr(spec, k) for k in self._spec}
        for k, v in self._spec.items():
            setattr(spec, k, v)
        logits = graph_out.next_token_logits.clone()
        hidden = graph_out.hidden_states.clone() if graph_out.hidden_states is not None else None
        backend.reference = True
        try:
            backend.init_forward_metadata(forward_batch)
            with adapter.attention_context(backend):
                ref = runner.model_runner.model.forward(
                    forward_batch.input_ids, forward_batch.positions, forward_batch)
        finally:
            backend.reference = False
            for k, v in after.items():
                setattr(spec, k, v)
        r = self.result
        r["checks"] += 1
        r["rows"] += logits.shape[0]
        r["nonfinite_rows"] += int((~torch.isfinite(logits).all(-1)).sum().item())
        pick = (lambda x: x[select_index]) if select_index is not None else (lambda x: x[:logits.shape[0]])
        ref_logits = pick(ref.next_token_logits)
        r["logits_max_rel_err"] = worst(r["logits_max_rel_err"], GraphSelfTest._rel(logits, ref_logits))
        r["argmax_mismatch"] += int((logits.argmax(-1) != ref_logits.argmax(-1)).sum().item())
        if hidden is not None and ref.hidden_states is not None:
            r["nonfinite_rows"] += int((~torch.isfinite(hidden).all(-1)).sum().item())
            r["hidden_max_rel_err"] = worst(
                r["hidden_max_rel_err"], GraphSelfTest._rel(hidden, pick(ref.hidden_states)))
        self._bs[runner.bs] += 1
        self._raw_bs[runner.raw_bs] += 1
        r["bs_seen"], r["raw_bs_seen"] = dict(self._bs), dict(self._raw_bs)

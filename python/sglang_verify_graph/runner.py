"""VerifyCudaGraphRunner: the target model's decode-graph runner for EAGLE/EAGLE-3 with
``speculative_eagle_topk == 1``, installed in place of SGLang's ``DecodeCudaGraphRunner``.

Policy lives here (which batches replay, which bucket, what a refusal is called); mechanics stay
SGLang's: bucket list (``capture_bs``, padded ``bs`` >= ``raw_bs``), static input buffers and their
padding, largest-bucket-first capture inside ``graph_capture()`` into the global graph memory
pool, replay. What differs from upstream's graphed TARGET_VERIFY:

* attention is the split-KV chain kernel of ``ChainVerifyTritonBackend`` (decode-class: KV read
  once per split for all ``num_draft_tokens`` queries of a KV head; no tree mask), or, for the
  native backends of ``backends.py`` (fa3; flashmla and flashinfer on MLA targets), the backend's own
  decode-class verify kernel;
* no per-replay attention metadata (no kv_indices build, no mask copy);
* every replay is counted here and every eager fallback where SGLang dispatches it
  (``plugin.forward_raw_hook``), under the reason :meth:`VerifyCudaGraphRunner.refusal_reason`
  gives; the counters are served by ``/get_server_info``;
* debug aids (the self-test) are probe objects (``debug.probes.VerifyProbe``, made by
  ``debug.make_verify_probe``) that do nothing by default.

One constructor for every supported SGLang release, ``VerifyCudaGraphRunner(model_runner)``, as
SGLang builds its own decode-graph runner: the config comes from the model runner's plan
(``plan.verify_plan``), the counters are installed, the capture is timed and its GPU memory
counted, and a capture that runs out of GPU memory raises :data:`OOM_MESSAGE`.

Errors: ``RuntimeError`` when constructed with keyword arguments or on a runner whose plan is not
ours with the attention backend it names (a wiring bug, never silently ignored); ``RuntimeError``
:data:`OOM_MESSAGE` for an out-of-memory capture (the original error chained).
"""

from __future__ import annotations

import logging
import time

from sglang_verify_graph import counters as C
from sglang_verify_graph.buffers import PAD_TOKEN_ID, VerifyStaticBuffers
from sglang_verify_graph.compat import sglang_adapter as adapter
from sglang_verify_graph.debug import NO_PROBE, make_verify_probe
from sglang_verify_graph.plan import CHAIN, expected_backends, runner_kind, verify_plan

logger = logging.getLogger("sglang_verify_graph")

OOM_MESSAGE = (
    "--enable-verify-cuda-graph: capturing the verify graphs ran out of GPU memory. "
    "Fix: lower --cuda-graph-max-bs-decode (fewer/smaller buckets) or --mem-fraction-static.")
"""The one line a capture that runs out of GPU memory raises (as ``RuntimeError``)."""


class VerifyCudaGraphRunner(adapter.decode_cuda_graph_runner_cls()):
    """Captures one TARGET_VERIFY graph per bucket of ``capture_bs`` requests x
    ``num_draft_tokens`` tokens and replays it for every verify step that fits."""

    def __init__(self, model_runner, **kwargs):
        if kwargs:
            raise RuntimeError(f"VerifyCudaGraphRunner: unexpected arguments {sorted(kwargs)}")
        plan, kind = verify_plan(model_runner), runner_kind(model_runner)
        backend = model_runner.attn_backend
        if kind is None:
            raise RuntimeError(f"VerifyCudaGraphRunner needs {' / '.join(expected_backends(plan)) or 'the flag'}"
                               f", got {type(backend).__name__}")
        cfg = plan.config
        self.chain = kind == CHAIN  # else: the backend's own verify
        self.verify_cfg = cfg
        self.counters = counters = C.install_counters(C.VerifyCounters(log_every=cfg.log_every))
        self.probe = NO_PROBE  # capture never loads a batch; the self-test starts after it
        before = adapter.available_gpu_memory(model_runner)
        t0 = time.perf_counter()
        try:
            super().__init__(model_runner)  # builds buffers and captures (largest bucket first)
        except Exception as e:
            if "out of memory" in str(e).lower():
                raise RuntimeError(OOM_MESSAGE) from e
            raise
        if not self.capture_forward_mode.is_target_verify() or self.captured_req_width != cfg.num_draft_tokens:
            raise RuntimeError(
                f"VerifyCudaGraphRunner captured {self.capture_forward_mode.name} x {self.captured_req_width} "
                f"tokens/request, expected TARGET_VERIFY x {cfg.num_draft_tokens}")
        n_out, n_lse = backend.chain_workspace_numel if self.chain else (0, 0)
        self.static_buffers = VerifyStaticBuffers(
            max_bs=self.max_bs, num_draft_tokens=cfg.num_draft_tokens,
            hidden_size=model_runner.model_config.hidden_size,
            num_aux_hidden=adapter.num_aux_hidden_states(model_runner),
            vocab_size=model_runner.model_config.vocab_size,
            chain_out_numel=n_out, chain_lse_numel=n_lse,
        )
        self.static_buffers.check_inputs(self.buffers)
        counters.capture_bs = list(self.capture_bs)
        counters.num_draft_tokens = cfg.num_draft_tokens
        counters.capture_seconds = time.perf_counter() - t0
        counters.graph_mem_gib = before - adapter.available_gpu_memory(model_runner)
        counters.attention = (f"chain split-KV ({'MLA' if backend.use_mla else 'MHA'})" if self.chain
                              else f"native {cfg.attention_backend} ({type(backend).__name__})")
        logger.debug("verify graph static buffers: %s", self.static_buffers.describe())
        logger.info(
            "VerifyCudaGraphRunner captured TARGET_VERIFY graphs: capture_bs=%s, num_draft_tokens=%d "
            "tokens/request, attention=%s, %.2f s, %.3f GiB",
            counters.capture_bs, counters.num_draft_tokens, counters.attention,
            counters.capture_seconds, counters.graph_mem_gib)
        cliff = C.eager_cliff_warning(getattr(model_runner, "max_running_requests", None), counters.capture_bs)
        if cliff:
            logger.warning("%s", cliff)
        self.probe = make_verify_probe(self, cfg)

    # ---- policy ---------------------------------------------------------------------------
    def can_run_graph(self, forward_batch) -> bool:
        ok = super().can_run_graph(forward_batch)
        if not ok and forward_batch.forward_mode.is_target_verify():
            self.counters.note_refusal(*self.refusal_reason(forward_batch))
        return ok

    def refusal_reason(self, forward_batch) -> tuple[str, str]:
        """The first condition of upstream's can_run_graph that refuses this batch."""
        if forward_batch.replace_embeds is not None:
            return C.REASON_REPLACE_EMBEDS, ""
        spec = forward_batch.spec_info
        width = getattr(spec, "num_tokens_per_req", 0)  # 0 also when spec_info is None
        if width > 0 and width != self.captured_req_width:
            return C.REASON_WIDTH, f"{width} != {self.captured_req_width}"
        bs = (adapter.dp_batch_size(self, forward_batch) if self.require_mlp_tp_gather
              else forward_batch.batch_size)
        if self.disable_padding and bs not in self.capture_bs:
            return C.REASON_BS_NOT_CAPTURED, (f"bs={bs} not in capture_bs with "
                                              "--disable-cuda-graph-padding")
        if bs > self.max_bs:
            return C.REASON_BS_ABOVE_MAX, (f"bs={bs} > max captured {self.max_bs}; raise "
                                           "--cuda-graph-max-bs-decode or lower --max-running-requests")
        if self.require_mlp_sync and not adapter.can_run_dp(forward_batch):
            return C.REASON_DP_SYNC, ""
        if self.enable_two_batch_overlap and not forward_batch.can_run_tbo:
            return C.REASON_TBO, ""
        if not adapter.CAN_RUN_GRAPH_CHECKS_HIDDEN_MODE:  # sglang 0.5.17 on: no hidden-mode refusal
            return C.REASON_OTHER, ""
        return C.REASON_HIDDEN_MODE, f"graph captured {self.capture_hidden_mode.name}"

    # ---- mechanics hooks -------------------------------------------------------------------
    def get_spec_info(self, num_tokens: int):
        spec_info = super().get_spec_info(num_tokens)
        if spec_info is not None and self.chain:
            spec_info.custom_mask = None  # the chain kernel reads no tree mask
        return spec_info

    def load_batch(self, forward_batch, pp_proxy_tensors=None):
        full_fill = forward_batch.needs_forward_metadata_init()  # else: pre-planned re-entry
        if full_fill:
            self.probe.before_load(self, forward_batch)
        super().load_batch(forward_batch, pp_proxy_tensors)
        # SGLang resets the padded tail of positions / out_cache_loc / req_pool_indices /
        # seq_lens but leaves stale input_ids there (FOREACH_COPY); neutralise it on purpose,
        # once per batch (the re-entry copies only input_ids[:raw_num_token]).
        n, padded = self.raw_num_token, self.bs * self.captured_req_width
        if full_fill and padded > n:
            self.buffers.input_ids[n:padded].fill_(PAD_TOKEN_ID)
        if full_fill:
            self.probe.after_load(self, forward_batch)

    def execute(self, forward_batch, pp_proxy_tensors=None):
        if not forward_batch.forward_mode.is_target_verify():
            return super().execute(forward_batch, pp_proxy_tensors=pp_proxy_tensors)
        try:
            out = super().execute(forward_batch, pp_proxy_tensors=pp_proxy_tensors)
        finally:
            self.probe.after_enqueue(self)
        self.counters.count_replay(self.bs, self.raw_bs)
        self.probe.after_replay(self, forward_batch, out)
        return out

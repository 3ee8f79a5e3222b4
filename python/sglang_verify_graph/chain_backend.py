"""The attention path of the verify graph: SGLang's triton backend with TARGET_VERIFY served by
the split-KV chain kernel (``sglang_verify_graph.kernel``), for MHA/GQA (Llama) and absorbed MLA
(DeepSeek-V3 / Kimi-K2.5, where q/k are 576 = kv_lora_rank 512 + rope 64 wide and v is the
512-wide latent).

Two backends, one per EAGLE-3 model runner, each serving one forward mode with the kernel and
every other mode as SGLang's triton backend unchanged:

* :class:`ChainVerifyTritonBackend`, the *target*'s backend (SGLang's own
  ``register_attention_backend("triton")`` registry, see ``plugin.triton_factory``):
  ``ForwardMode.TARGET_VERIFY``; ``seq_lens`` is the prefix, the chain follows it.
* :class:`ChainDraftExtendTritonBackend`, the *draft*'s draft-extend backend
  (``DraftBackendFactory.create_draft_extend_backend``, through ``draft_extend.draft_extend_backend_for``):
  ``ForwardMode.DRAFT_EXTEND_V2``, the fixed-width forward of the ``num_draft_tokens`` verified
  tokens per request that SGLang's spec-v2 worker runs after each verify; ``seq_lens`` already
  includes the chain (prefix + ``num_draft_tokens``), and its K/V slots are the verify's
  ``out_cache_loc`` (= ``req_to_token[req, prefix : prefix + num_draft_tokens]``).

The graph and the rare eager forward (a batch above the largest bucket) use the same kernel, and
nothing reads a tree mask: with ``speculative_eagle_topk == 1`` the draft tree is a causal chain.

Per-replay metadata: none. The kernel reads ``req_pool_indices`` and ``seq_lens`` from the
graph's static input buffers and the page table (``req_to_token``) directly; upstream instead
rebuilds a flat ``kv_indices`` array and copies a tree mask of
``num_draft_tokens * (seq_len + num_draft_tokens)`` bytes per request on every replay.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch

from sglang_verify_graph.kernel import (
    TEST_FAULTS,
    ChainVerifyShape,
    chain_verify_attention_fwd,
    choose_num_kv_splits,
    workspace_numel,
)
from sglang_verify_graph.compat import sglang_adapter as adapter
from sglang_verify_graph.config import VerifyGraphConfig
from sglang_verify_graph.env import ENV_TEST_FAULT, TEST_FAULT_LAUNCHES
from sglang_verify_graph.errors import VerifyGraphConfigError

logger = logging.getLogger("sglang_verify_graph")

_TILE_SPLITS = (16, 32, 64, 128)

WRONG_LAYER_KV = "wrong_layer_kv"
"""The verify backend's own test fault (``SGLANG_VERIFY_GRAPH_TEST_FAULT``, tests only): the chain
kernel, unfaulted, reads the K/V buffers of :func:`wrong_kv_layer`'s layer instead of the layer's
own. The layer's fresh chain K/V is still written to its own buffers; the layer read from holds,
at the chain's slots, that layer's chain K/V of this forward when it runs earlier (``layer_id -
1``), and whatever that layer last wrote there when it runs later (the first layer reads the
second's: not this forward's chain)."""


def wrong_kv_layer(layer_id: int, start_layer: int, layer_num: int) -> int:
    """The layer whose K/V buffers :data:`WRONG_LAYER_KV` makes layer ``layer_id`` read:
    ``layer_id - 1``, and ``start_layer + 1`` for the pool's first layer ``start_layer`` (the pool
    holds layers ``start_layer .. start_layer + layer_num - 1``, ints).

    Raises:
        VerifyGraphConfigError: ``layer_num < 2`` (no other layer to read; one line)."""
    if layer_num < 2:
        raise VerifyGraphConfigError(
            problem=f"test fault {WRONG_LAYER_KV} needs a KV pool of two or more layers",
            flag=ENV_TEST_FAULT, value=f"{WRONG_LAYER_KV} (KV pool layers: {layer_num})",
            fix=f"unset {ENV_TEST_FAULT} or serve a model with two or more attention layers",
        )
    return layer_id - 1 if layer_id > start_layer else start_layer + 1


def rope_tile(head_dim_qk: int) -> int:
    """Trailing part of Dk loaded as its own tile: 576 -> 64 (MLA), 192 -> 64, 128 -> 0."""
    main = 1 << (head_dim_qk.bit_length() - 1)
    rest = head_dim_qk - main
    return rest if rest in _TILE_SPLITS else 0


@dataclass(frozen=True)
class ChainMetadata:
    """What the chain kernel reads in one verify forward (graph: static buffer views)."""

    req_pool_indices: torch.Tensor  # [bs] int64
    seq_lens: torch.Tensor  # [bs] int64, prefix length without drafts
    num_kv_splits: int
    att_out: torch.Tensor  # fp32 scratch
    att_lse: torch.Tensor  # fp32 scratch


class _ChainTritonBackend(adapter.triton_attn_backend_cls()):
    """TritonAttnBackend whose :meth:`serves` forward mode is the chain kernel. Raises
    VerifyGraphConfigError at construction when the model uses a feature the chain kernel does not
    serve."""

    role = "verify"
    seq_lens_include_chain = False  # seq_lens of the served mode: prefix (False) or prefix + chain
    unsupported_fix = "remove --enable-verify-cuda-graph for this model"

    def serves(self, forward_mode) -> bool:
        raise NotImplementedError

    @property
    def test_fault(self) -> Optional[str]:
        """The test fault of this backend's launches (``SGLANG_VERIFY_GRAPH_TEST_FAULT``, tests
        only): the config's when ``env.TEST_FAULT_LAUNCHES`` gives it this backend's ``role``
        (``"verify"`` / ``"draft-extend"``), else None (a fault never reaches the other launch)."""
        fault = self.verify_cfg.test_fault
        return fault if fault is not None and TEST_FAULT_LAUNCHES.get(fault) == self.role else None

    def _kv_layer_id(self, layer_id: int) -> int:
        """The layer whose K/V buffers the kernel reads for layer ``layer_id``: its own, or
        :func:`wrong_kv_layer`'s under :data:`WRONG_LAYER_KV` (VerifyGraphConfigError, one line,
        for a pool of one layer)."""
        if self.test_fault != WRONG_LAYER_KV:
            return layer_id
        pool = self.token_to_kv_pool
        return wrong_kv_layer(layer_id, getattr(pool, "start_layer", 0) or 0, pool.layer_num)

    def __init__(self, model_runner, cfg: VerifyGraphConfig):
        super().__init__(model_runner)
        self.verify_cfg = cfg
        problems = []
        if self.sliding_window_size is not None and self.sliding_window_size > 0:
            problems.append("sliding-window attention")
        if self.use_sliding_window_kv_pool or adapter.kv_translation_active(self):
            problems.append("hybrid / unified KV pool")
        if self.dcp_size > 1:
            problems.append("decode context parallelism")
        if self.enable_deterministic:
            problems.append("--enable-deterministic-inference")
        pool = self.token_to_kv_pool
        layer0 = getattr(pool, "start_layer", 0) or 0
        k_buf = pool.get_key_buffer(layer0)
        v_buf = pool.get_value_buffer(layer0)
        if k_buf.dim() != 3 or v_buf.dim() != 3:
            problems.append("a page-major KV layout (drop --enable-page-major-kv-layout)")
        if k_buf.dtype != model_runner.model_config.dtype:
            problems.append(f"KV cache dtype {k_buf.dtype} (needs the model dtype; drop --kv-cache-dtype)")
        if problems:
            raise VerifyGraphConfigError(
                problem=f"the chain {self.role} attention does not support this model's KV setup",
                flag="model / KV cache", value=", ".join(problems),
                fix=self.unsupported_fix,
            )
        if self.test_fault == WRONG_LAYER_KV:
            self._kv_layer_id(layer0)  # refuse a one-layer pool at construction, not mid-capture
        dk, dv = k_buf.shape[-1], v_buf.shape[-1]
        self.chain_shape = ChainVerifyShape(
            num_q_heads=self.num_head, num_kv_heads=k_buf.shape[1], head_dim_qk=dk,
            head_dim_v=dv, num_draft_tokens=cfg.num_draft_tokens, rope_dim=rope_tile(dk),
        )
        self._chain_static: Optional[tuple[torch.Tensor, torch.Tensor]] = None
        self._chain_meta: Optional[ChainMetadata] = None
        logger.info("chain %s attention: %s (%s)", self.role, self.chain_shape,
                    "absorbed MLA" if self.use_mla else "MHA/GQA")

    # ---- sizing ---------------------------------------------------------------------------
    def num_kv_splits_for(self, bs: int) -> int:
        return choose_num_kv_splits(self.chain_shape, bs, self.device_core_count,
                                    self.verify_cfg.num_kv_splits)

    def _workspace_for(self, bs: int) -> tuple[int, int]:
        return workspace_numel(self.chain_shape, bs, self.num_kv_splits_for(bs))

    # ---- graph state ----------------------------------------------------------------------
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, *args, **kwargs):
        """Allocate the chain kernel's fp32 scratch for every bucket up to ``max_bs`` (shared by
        all layers and buckets). Upstream's graph buffers (flat kv_indices of
        ``max_num_tokens * max_context_len`` int64 and, for verify, a tree mask of as many bytes)
        are not allocated: the chain kernel needs neither, and the served mode is the only one
        this backend's graphs capture."""
        n_out = n_lse = 0
        for bs in range(1, max_bs + 1):
            o, l = self._workspace_for(bs)
            n_out, n_lse = max(n_out, o), max(n_lse, l)
        self._chain_static = (
            torch.empty(n_out, dtype=torch.float32, device=self.device),
            torch.empty(n_lse, dtype=torch.float32, device=self.device),
        )
        self.chain_workspace_numel = (n_out, n_lse)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        if not self.serves(forward_batch.forward_mode):
            return super().init_forward_metadata_out_graph(forward_batch, in_capture=in_capture)
        if in_capture:
            bs = forward_batch.batch_size
            att_out, att_lse = self._chain_static
            self._chain_meta = ChainMetadata(
                forward_batch.req_pool_indices[:bs], forward_batch.seq_lens[:bs],
                self.num_kv_splits_for(bs), att_out, att_lse,
            )
        # Replay: the captured kernels read the static req_pool_indices / seq_lens buffers,
        # which the runner has just filled; nothing to build.

    def init_forward_metadata(self, forward_batch):
        if not self.serves(forward_batch.forward_mode):
            return super().init_forward_metadata(forward_batch)
        bs = forward_batch.batch_size
        n_out, n_lse = self._workspace_for(bs)
        if self._chain_static is not None and self._chain_static[0].numel() >= n_out \
                and self._chain_static[1].numel() >= n_lse:
            att_out, att_lse = self._chain_static
        else:
            att_out = torch.empty(n_out, dtype=torch.float32, device=self.device)
            att_lse = torch.empty(n_lse, dtype=torch.float32, device=self.device)
        self._chain_meta = ChainMetadata(forward_batch.req_pool_indices, forward_batch.seq_lens,
                                         self.num_kv_splits_for(bs), att_out, att_lse)

    # ---- the forward ----------------------------------------------------------------------
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None,
                       score_mod=None, aux_tensors=None):
        if not self.serves(forward_batch.forward_mode):
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache,
                                          sinks=sinks, score_mod=score_mod, aux_tensors=aux_tensors)
        unsupported = [name for name, bad in (
            ("attention sinks", sinks is not None), ("score_mod", score_mod is not None),
            ("sliding window", layer.sliding_window_size is not None and layer.sliding_window_size > -1),
            ("cross attention", layer.is_cross_attention),
            # FP8 checkpoints give every layer k_scale = v_scale = 1.0 even with a bf16 KV cache
            # (SGLang's Fp8KVCacheMethod); unit scales change nothing, other values would.
            ("non-unit KV scales", layer.k_scale is not None
             and (layer.k_scale_float != 1.0 or layer.v_scale_float != 1.0)),
            ("xai temperature", (layer.xai_temperature_len or -1) > 0),
        ) if bad]
        if unsupported or k is None or v is None:
            raise RuntimeError(f"chain {self.role} attention: layer {layer.layer_id} uses "
                               f"{unsupported or 'no fresh K/V'}; {self.unsupported_fix}")
        meta = self._chain_meta
        if save_kv_cache:
            self._set_kv_buffer(forward_batch, layer, adapter.kv_write_loc(forward_batch), k, v)
        o = q.new_empty((q.shape[0], layer.tp_q_head_num * layer.v_head_dim))
        cap = adapter.logit_cap(layer)
        kv_layer = self._kv_layer_id(layer.layer_id)
        fault = self.test_fault
        chain_verify_attention_fwd(
            q.view(-1, layer.tp_q_head_num, layer.qk_head_dim),
            self.token_to_kv_pool.get_key_buffer(kv_layer),
            self.token_to_kv_pool.get_value_buffer(kv_layer),
            o.view(-1, layer.tp_q_head_num, layer.v_head_dim),
            self.req_to_token, meta.req_pool_indices, meta.seq_lens, self.chain_shape, meta.num_kv_splits,
            layer.scaling, meta.att_out, meta.att_lse, cap,
            seq_lens_include_chain=self.seq_lens_include_chain,
            fault=fault if fault in TEST_FAULTS else None,
        )
        return o


class ChainVerifyTritonBackend(_ChainTritonBackend):
    """The target's backend: ``TARGET_VERIFY`` is the chain kernel (``seq_lens`` = prefix).

    ``reference = True`` serves ``TARGET_VERIFY`` with SGLang's own path instead (the triton
    backend's ``extend_attention_fwd`` over a freshly built ``kv_indices`` and the batch's tree
    mask: the self-test's independent reference, ``selftest.GraphSelfTest``); it is never set
    while serving."""

    reference = False

    def serves(self, forward_mode) -> bool:
        return forward_mode.is_target_verify() and not self.reference

    def get_verify_buffers_to_fill_after_draft(self):
        # No tree-mask scratch: the chain needs no mask (see plugin.build_verify_input_hook).
        return [None, None]


class ChainDraftExtendTritonBackend(_ChainTritonBackend):
    """The draft's draft-extend backend: ``DRAFT_EXTEND_V2`` is the chain kernel (``seq_lens`` =
    prefix + ``num_draft_tokens``; a padded row of the draft-extend graph, ``seq_lens`` = 1 and
    ``req_pool_indices`` = 0, reads the ``num_draft_tokens`` zero slots of page-table row 0).

    ``reference = True`` serves ``DRAFT_EXTEND_V2`` with SGLang's own path instead (the self-test's
    independent reference, ``selftest.DraftExtendSelfTest``); it is never set while serving."""

    role = "draft-extend"
    seq_lens_include_chain = True
    unsupported_fix = "set SGLANG_VERIFY_GRAPH_DRAFT_EXTEND=upstream"
    reference = False

    def serves(self, forward_mode) -> bool:
        return forward_mode.is_draft_extend_v2() and not self.reference

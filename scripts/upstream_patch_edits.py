"""The edits ``make_upstream_patch.py`` makes to existing SGLang files (0.5.23 layout), and the
new files it takes from ``scripts/upstream_pr/``.

Each ``edit_<file>_<pr>(lines, rel)`` takes a file's lines (``rel``: its path in the patch, for
messages) and returns them edited, anchored on lines of SGLang 0.5.23; a missing anchor raises
:class:`AnchorError`, one line naming the file and the anchor. The ``_pr2`` edits apply to the
text the ``_pr1`` edits produced (the series is cumulative).

PR 1 (target verify): ``srt/environ.py`` gets ``SGLANG_ENABLE_CHAIN_VERIFY``;
``kernels/ops/attention/__init__.py`` inventories ``chain_verify_fwd``; ``TritonAttnBackend``
(``srt/layers/attention/triton_backend.py``) decides ``use_chain_verify`` once at construction
(``_can_use_chain_kernel``), imports the kernel only then, asks for the QLEN_ONLY verify mask
(``maybe_create_verify_mask(is_read=False)``), reads no custom mask for the chain, hands the
kernel its fp32 scratch (eager: ``_chain_workspace``; CUDA graphs: ``cuda_graph_attn_logits``) and
offers each TARGET_VERIFY ``forward_extend`` call to it (``_forward_chain``) before the split-KV
paths and ``extend_attention_fwd``, which serve every call it refuses.

PR 2 (draft extend): ``SGLANG_ENABLE_CHAIN_DRAFT_EXTEND``; the draft's draft-extend backend
(``is_draft_worker``, not ``skip_prefill``) decides ``use_chain_draft_extend`` and offers each
``DRAFT_EXTEND_V2`` call to the same kernel with ``seq_lens_include_chain``.
"""

from __future__ import annotations

import re
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent / "upstream_pr"
DRAFT_EXTEND_BEGIN = "# <draft-extend>\n"
DRAFT_EXTEND_END = "# </draft-extend>\n"


class AnchorError(RuntimeError):
    pass


# ---- anchors ---------------------------------------------------------------------------------
def find(lines: list[str], needle: str, start: int, rel: str, exact: bool = False,
         end: int | None = None) -> int:
    """Index of the first line at or after ``start`` (before ``end``) that is ``needle``
    (``exact``) or contains it. Raises AnchorError naming ``rel`` and the anchor."""
    for i in range(start, len(lines) if end is None else end):
        if (lines[i].rstrip("\n") == needle) if exact else (needle in lines[i]):
            return i
    raise AnchorError(f"{rel}: anchor not found after line {start + 1}: {needle!r}")


def block_end(lines: list[str], start: int) -> int:
    """Index of the first non-blank line after ``start`` indented no deeper than line ``start``
    (the end of the block ``start`` opens; ``len(lines)`` at the end of the file)."""
    indent = len(lines[start]) - len(lines[start].lstrip())
    for i in range(start + 1, len(lines)):
        if lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) <= indent:
            return i
    return len(lines)


def method(lines: list[str], signature: str, rel: str) -> tuple[int, int]:
    """``(first, end)`` line indices of the method whose ``def`` line starts with ``signature``:
    from that line to the next method, decorator or top-level statement."""
    first = find(lines, signature, 0, rel)
    if not lines[first].startswith(signature):
        raise AnchorError(f"{rel}: anchor not found after line 1: {signature!r}")
    for i in range(first + 1, len(lines)):
        if re.match(r"(    )?(def |class |@)|[^\s#)]", lines[i]):
            return first, i
    return first, len(lines)


def text_lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


# ---- srt/environ.py --------------------------------------------------------------------------
def edit_environ_pr1(lines: list[str], rel: str) -> list[str]:
    i = find(lines, "    SGLANG_ENABLE_SPLITKV_VERIFY = EnvBool(True)", 0, rel, exact=True)
    lines[i + 1:i + 1] = text_lines(
        "    # Split-KV chain kernel for the EAGLE topk == 1 target verify on the Triton\n"
        "    # backend (CUDA): one program per KV head and KV split for all draft rows, reading\n"
        "    # req_to_token. A call it does not serve (FP8 KV cache, sinks, sliding window, ...)\n"
        "    # falls back to extend_attention_fwd.\n"
        "    SGLANG_ENABLE_CHAIN_VERIFY = EnvBool(False)\n"
    )
    return lines


def edit_environ_pr2(lines: list[str], rel: str) -> list[str]:
    i = find(lines, "    SGLANG_ENABLE_CHAIN_VERIFY = EnvBool(False)", 0, rel, exact=True)
    lines[i + 1:i + 1] = text_lines(
        "    # The same kernel for the draft's DRAFT_EXTEND_V2 (Triton backend, CUDA, topk == 1).\n"
        "    SGLANG_ENABLE_CHAIN_DRAFT_EXTEND = EnvBool(False)\n"
    )
    return lines


# ---- kernels/ops/attention/__init__.py -------------------------------------------------------
def edit_attention_ops_pr1(lines: list[str], rel: str) -> list[str]:
    i = find(lines, '    ("verify_splitkv", "verify_splitkv_fwd"),', 0, rel, exact=True)
    lines[i + 1:i + 1] = ['    ("chain_verify", "chain_verify_fwd"),\n']
    return lines


# ---- srt/layers/attention/triton_backend.py --------------------------------------------------
CAN_USE_CHAIN_KERNEL = '''def _can_use_chain_kernel(
    topk, sliding_window_size, dcp_size, enable_deterministic, kv_index_translator
):
    # The split-KV chain kernel (chain_verify_fwd) reads req_to_token slot ids of a
    # causal chain: CUDA, topk == 1, and no sliding window, decode context
    # parallelism, deterministic inference or translated (unified) KV ids.
    return (
        _is_cuda
        and topk == 1
        and not (sliding_window_size is not None and sliding_window_size > 0)
        and dcp_size == 1
        and not enable_deterministic
        and not getattr(kv_index_translator, "is_translating", False)
    )


'''

INIT_CHAIN = '''        # Split-KV chain kernel for the topk == 1 target verify (CUDA; forward_extend
        # falls back to the paths below for each call it does not serve).
        self.use_chain_verify = (
            envs.SGLANG_ENABLE_CHAIN_VERIFY.get()
            and not self.is_draft_runner
            and _can_use_chain_kernel(
                self.topk,
                self.sliding_window_size,
                self.dcp_size,
                self.enable_deterministic,
                self.kv_index_translator,
            )
        )
        if self.use_chain_verify:
            from sglang.kernels.ops.attention.chain_verify import (
                chain_verify_fwd,
                workspace_numel_bound,
            )

            self.chain_verify_fwd = torch.compiler.disable(chain_verify_fwd)
            self.chain_workspace_numel = workspace_numel_bound
'''

EAGER_VERIFY = '''            if self.use_chain_verify:
                # topk == 1: the tree is the causal chain, so no mask is read; the
                # chain kernel gets its fp32 scratch here (forward_extend).
                custom_mask = None
                attn_logits, attn_lse = self._chain_workspace(bs, num_tokens_per_req)
'''

DISPATCH = '''        # Split-KV chain kernel (topk == 1, CUDA): reads req_to_token and returns
        # False, writing nothing, for a call it does not serve.
        if (
            score_mod is None
            and self._chain_serves(forward_batch.forward_mode)
            and self._forward_chain(
                q,
                o,
                layer,
                forward_batch,
                causal,
                logits_soft_cap,
                sinks,
                sliding_window_size,
                k_descale,
                v_descale,
            )
        ):
            return o

'''

CHAIN_METHODS = '''    def _chain_serves(self, forward_mode: ForwardMode) -> bool:
        """Whether forward_extend offers a batch of ``forward_mode`` to the chain kernel."""
        return self.use_chain_verify and forward_mode.is_target_verify()

    def _chain_workspace(self, bs: int, num_tokens_per_req: int):
        """Fresh fp32 scratch ``(attn_logits, attn_lse)`` (1-D) of the chain kernel for an
        eager batch of ``bs`` requests; CUDA graphs use ``cuda_graph_attn_logits`` / ``_lse``,
        which hold it too (``max_num_tokens`` rows of ``max_kv_splits`` splits)."""
        n_out, n_lse = self.chain_workspace_numel(
            self.num_head,
            self.v_head_dim,
            num_tokens_per_req,
            bs,
            self.max_kv_splits,
            self.device_core_count,
        )
        return (
            torch.empty(n_out, dtype=torch.float32, device=self.device),
            torch.empty(n_lse, dtype=torch.float32, device=self.device),
        )

    def _forward_chain(
        self,
        q: torch.Tensor,
        o: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        causal: bool,
        logits_soft_cap: float,
        sinks: Optional[torch.Tensor],
        sliding_window_size: int,
        k_descale: float,
        v_descale: float,
    ) -> bool:
        """Run the chain kernel for ``layer`` (``chain_verify_fwd``, after the KV write) and
        return True, or return False, writing nothing, for a call it does not serve (ragged
        verify, FP8 KV cache, sinks, ...): the caller then runs ``extend_attention_fwd``.
        Reads no tensor values, so it is safe inside CUDA-graph capture."""
        metadata = self.forward_metadata
        spec_info = forward_batch.spec_info
        if (
            metadata.attn_logits is None
            or getattr(spec_info, "ragged_verify_layout", None) is not None
        ):
            return False
        num_tokens_per_req = self._target_verify_num_tokens_per_req(spec_info)
        return self.chain_verify_fwd(
            q.view(-1, layer.tp_q_head_num, layer.qk_head_dim),
            o.view(-1, layer.tp_q_head_num, layer.v_head_dim),
            self.token_to_kv_pool.get_key_buffer(layer.layer_id),
            self.token_to_kv_pool.get_value_buffer(layer.layer_id),
            self.req_to_token,
            forward_batch.req_pool_indices,
            forward_batch.seq_lens,
            num_tokens_per_req,
            layer.scaling,
            metadata.attn_logits,
            metadata.attn_lse,
            max_kv_splits=self.max_kv_splits,
            num_sms=self.device_core_count,
            logit_cap=logits_soft_cap or 0.0,
            is_causal=causal,
            sliding_window_size=sliding_window_size,
            sinks=sinks,
            xai_temperature_len=layer.xai_temperature_len,
            k_scale=k_descale,
            v_scale=v_descale,
        )

'''


def _replace_in(lines, start, end, old: str, new: str, rel: str) -> int:
    """Replace the line ``old`` (exact) between ``start`` and ``end`` by ``new`` (one or more
    lines); returns its index."""
    i = find(lines, old, start, rel, exact=True, end=end)
    lines[i:i + 1] = text_lines(new)
    return i


def edit_triton_backend_pr1(lines: list[str], rel: str) -> list[str]:
    # the construction-time decision, next to _should_use_verify_shared_kv
    i = find(lines, "def logit_capping_mod(logit_capping_method, logit_cap):", 0, rel, exact=True)
    lines[i:i] = text_lines(CAN_USE_CHAIN_KERNEL)

    # __init__: after the last attribute the decision reads
    first, end = method(lines, "    def __init__(", rel)
    i = find(lines, "        self.is_draft_runner = model_runner.is_draft_worker", first, rel,
             exact=True, end=end)
    lines[i + 1:i + 1] = ["\n"] + text_lines(INIT_CHAIN)

    # eager TARGET_VERIFY metadata: no custom mask, the kernel's scratch
    first, end = method(lines, "    def init_forward_metadata(self, forward_batch: ForwardBatch):", rel)
    branch = find(lines, "        elif forward_batch.forward_mode.is_target_verify():", first, rel,
                  exact=True, end=end)
    i = find(lines, "            attn_lse = None", branch, rel, exact=True, end=block_end(lines, branch))
    lines[i + 1:i + 1] = text_lines(EAGER_VERIFY)

    # CUDA-graph state: the QLEN_ONLY mask (its build is not read by the chain)
    first, end = method(lines, "    def init_cuda_graph_state(", rel)
    i = find(lines, "        self._verify_mask = maybe_create_verify_mask(", first, rel, exact=True,
             end=end)
    lines[i:i] = ["        # The chain kernel reads no mask: QLEN_ONLY (is_read=False) for it.\n"]
    _replace_in(lines, i, block_end(lines, i + 1), "            is_read=True,",
                "            is_read=not self.use_chain_verify,\n", rel)

    # CUDA-graph replay: no tree-mask copy for the chain
    first, end = method(lines, "    def _update_target_verify_buffers(", rel)
    _replace_in(lines, first, end,
                "        if spec_info is not None and spec_info.custom_mask is not None:",
                "        if (\n"
                "            spec_info is not None\n"
                "            and spec_info.custom_mask is not None\n"
                "            and not self.use_chain_verify\n"
                "        ):\n", rel)

    # CUDA-graph capture metadata: no custom mask, the kernel's scratch
    first, end = method(lines, "    def _build_cuda_graph_forward_metadata(", rel)
    branch = find(lines, "        elif forward_mode.is_target_verify():", first, rel, exact=True,
                  end=end)
    stop = block_end(lines, branch)
    i = find(lines, "                and spec_info.custom_mask is not None", branch, rel, exact=True,
             end=stop)
    lines[i + 1:i + 1] = ["                and not self.use_chain_verify\n"]
    stop += 1
    _replace_in(lines, branch, stop, "                attn_logits=None,",
                "                attn_logits=(\n"
                "                    self.cuda_graph_attn_logits if self.use_chain_verify else None\n"
                "                ),\n", rel)
    stop += 2
    _replace_in(lines, branch, stop, "                attn_lse=None,",
                "                attn_lse=self.cuda_graph_attn_lse if self.use_chain_verify else None,\n",
                rel)

    # forward_extend: the chain kernel before the split-KV verify paths
    first, end = method(lines, "    def forward_extend(", rel)
    i = find(lines, "        # Split-KV EAGLE-verify fast path (ROCm/Triton). On target-verify", first,
             rel, exact=True, end=end)
    lines[i:i] = text_lines(DISPATCH)

    i = find(lines, "    def _forward_extend_kernel(self, layer, *args, **kwargs):", 0, rel, exact=True)
    lines[i:i] = text_lines(CHAIN_METHODS)
    return lines


INIT_DRAFT_EXTEND = '''        # The same kernel for the draft's DRAFT_EXTEND_V2 (its draft-extend backend).
        self.use_chain_draft_extend = (
            envs.SGLANG_ENABLE_CHAIN_DRAFT_EXTEND.get()
            and self.is_draft_runner
            and not self.skip_prefill
            and _can_use_chain_kernel(
                self.topk,
                self.sliding_window_size,
                self.dcp_size,
                self.enable_deterministic,
                self.kv_index_translator,
            )
        )
'''

EAGER_DRAFT_EXTEND = '''            if (
                self.use_chain_draft_extend
                and forward_batch.forward_mode.is_draft_extend_v2()
            ):
                # The chain kernel's fp32 scratch (forward_extend).
                attn_logits, attn_lse = self._chain_workspace(bs, self.num_draft_tokens)
'''


def edit_triton_backend_pr2(lines: list[str], rel: str) -> list[str]:
    first, end = method(lines, "    def __init__(", rel)
    i = find(lines, "        if self.use_chain_verify:", first, rel, exact=True, end=end)
    lines[i:i + 1] = text_lines(INIT_DRAFT_EXTEND) + [
        "        if self.use_chain_verify or self.use_chain_draft_extend:\n"]

    # eager DRAFT_EXTEND_V2 metadata (the extend branch of init_forward_metadata)
    first, end = method(lines, "    def init_forward_metadata(self, forward_batch: ForwardBatch):", rel)
    i = find(lines, "        swa_out_cache_loc = None", first, rel, exact=True, end=end)
    j = i - 1
    while not lines[j].strip():
        j -= 1
    if lines[j].rstrip("\n") != "            num_kv_splits = None":
        raise AnchorError(f"{rel}: expected '            num_kv_splits = None' before line {i + 1}")
    lines[j + 1:j + 1] = text_lines(EAGER_DRAFT_EXTEND)

    # CUDA-graph capture metadata of DRAFT_EXTEND_V2
    first, end = method(lines, "    def _build_cuda_graph_forward_metadata(", rel)
    branch = find(lines, "        elif forward_mode.is_draft_extend_v2():", first, rel, exact=True,
                  end=end)
    stop = block_end(lines, branch)
    _replace_in(lines, branch, stop, "                attn_logits=None,",
                "                attn_logits=(\n"
                "                    self.cuda_graph_attn_logits\n"
                "                    if self.use_chain_draft_extend\n"
                "                    else None\n"
                "                ),\n", rel)
    stop += 4
    _replace_in(lines, branch, stop, "                attn_lse=None,",
                "                attn_lse=(\n"
                "                    self.cuda_graph_attn_lse if self.use_chain_draft_extend else None\n"
                "                ),\n", rel)

    # the modes offered to the kernel, and the draft extend's lengths
    first, end = method(lines, "    def _chain_serves(self, forward_mode: ForwardMode) -> bool:", rel)
    _replace_in(lines, first, end,
                "        return self.use_chain_verify and forward_mode.is_target_verify()",
                "        return (self.use_chain_verify and forward_mode.is_target_verify()) or (\n"
                "            self.use_chain_draft_extend and forward_mode.is_draft_extend_v2()\n"
                "        )\n", rel)
    first, end = method(lines, "    def _forward_chain(", rel)
    _replace_in(lines, first, end,
                "        num_tokens_per_req = self._target_verify_num_tokens_per_req(spec_info)",
                "        # DRAFT_EXTEND_V2: seq_lens include the chain of num_draft_tokens.\n"
                "        draft_extend = forward_batch.forward_mode.is_draft_extend_v2()\n"
                "        num_tokens_per_req = (\n"
                "            self.num_draft_tokens\n"
                "            if draft_extend\n"
                "            else self._target_verify_num_tokens_per_req(spec_info)\n"
                "        )\n", rel)
    first, end = method(lines, "    def _forward_chain(", rel)
    i = find(lines, "            logit_cap=logits_soft_cap or 0.0,", first, rel, exact=True, end=end)
    lines[i + 1:i + 1] = ["            seq_lens_include_chain=draft_extend,\n"]
    return lines


# ---- new files from scripts/upstream_pr/ ------------------------------------------------------
def template(name: str, draft_extend: bool) -> str:
    """``scripts/upstream_pr/<name>`` as PR 1 (``draft_extend`` False: the lines between the
    ``# <draft-extend>`` / ``# </draft-extend>`` markers dropped) or PR 2 (kept); the marker lines
    never appear. Raises AnchorError on unbalanced markers."""
    text = (TEMPLATES / name).read_text()
    if text.count(DRAFT_EXTEND_BEGIN) != text.count(DRAFT_EXTEND_END):
        raise AnchorError(f"scripts/upstream_pr/{name}: unbalanced draft-extend markers")
    pattern = re.escape(DRAFT_EXTEND_BEGIN) + r"(.*?)" + re.escape(DRAFT_EXTEND_END)
    return re.sub(pattern, (lambda m: m.group(1)) if draft_extend else "", text, flags=re.S)

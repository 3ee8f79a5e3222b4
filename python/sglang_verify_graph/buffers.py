"""Every static buffer the verify graph reads or writes, with its shape, dtype and what padded
rows hold (the storage policy; the runner decides, the capture code records).

The input buffers are SGLang's own ``DecodeInputBuffers`` (shared with the other graph runners
through SGLang's buffer registry); this module declares the contract our graph relies on and
checks the live tensors against it at capture. Rows ``raw_bs <= i < bs`` of a padded replay are
neutralised on purpose:

* they write K/V only to ``PAD_SLOT`` (slot 0, which SGLang's allocator never hands out), and
* they attend over ``seq_lens = SEQ_LEN_PAD`` (1) + ``num_draft_tokens`` keys of page-table row
  ``PAD_REQ_POOL_INDEX`` (0), whose entries are valid slot ids, so no index can leave the pool.

Padded rows' logits are computed and discarded (``execute`` returns ``[:raw_bs * ndt]``);
every op in the verify forward is row-local (attention per row, MLP/MoE per token, all-reduce
elementwise per token position), so garbage or NaN in a padded row never reaches a real row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PAD_SLOT = 0
PAD_REQ_POOL_INDEX = 0
SEQ_LEN_PAD = 1
PAD_TOKEN_ID = 0
PAD_POSITION = 0


@dataclass(frozen=True)
class StaticBuffer:
    """One static buffer: name, shape (in elements), dtype, and the value padded rows hold."""

    name: str
    shape: tuple
    dtype: torch.dtype
    pad: str


@dataclass(frozen=True)
class VerifyStaticBuffers:
    """The static buffers of the verify graph for ``max_bs`` requests x ``num_draft_tokens``.

    ``chain_out_numel`` / ``chain_lse_numel``: fp32 split-KV partials of the chain attention,
    shared by all layers and buckets (sized for the bucket that needs most, see
    ``sglang_verify_graph.kernel.workspace_numel``).
    """

    max_bs: int
    num_draft_tokens: int
    hidden_size: int
    num_aux_hidden: int
    vocab_size: int
    chain_out_numel: int
    chain_lse_numel: int

    @property
    def max_num_tokens(self) -> int:
        return self.max_bs * self.num_draft_tokens

    def declare(self) -> list[StaticBuffer]:
        t, b = self.max_num_tokens, self.max_bs
        return [
            StaticBuffer("input_ids", (t,), torch.int64, f"token {PAD_TOKEN_ID}"),
            StaticBuffer("positions", (t,), torch.int64, f"position {PAD_POSITION}"),
            StaticBuffer("out_cache_loc", (t,), torch.int64, f"KV slot {PAD_SLOT} (reserved)"),
            StaticBuffer("req_pool_indices", (b,), torch.int64, f"page-table row {PAD_REQ_POOL_INDEX}"),
            StaticBuffer("seq_lens", (b,), torch.int64, f"{SEQ_LEN_PAD} (prefix keys)"),
            StaticBuffer("next_token_logits", (t, self.vocab_size), None, "computed, discarded"),
            StaticBuffer("hidden_states (aux, FULL)", (t, self.hidden_size * self.num_aux_hidden),
                         None, "computed, discarded"),
            StaticBuffer("chain_att_out", (self.chain_out_numel,), torch.float32, "scratch"),
            StaticBuffer("chain_att_lse", (self.chain_lse_numel,), torch.float32, "scratch"),
        ]

    def check_inputs(self, buffers) -> None:
        """Check SGLang's DecodeInputBuffers against the declaration. Raises RuntimeError."""
        for spec in self.declare()[:5]:
            live = getattr(buffers, spec.name, None)
            if live is None:
                raise RuntimeError(f"verify graph: static buffer {spec.name} missing")
            if live.shape[0] < spec.shape[0] or (spec.dtype is not None and live.dtype != spec.dtype
                                                 and spec.name != "seq_lens"):
                raise RuntimeError(
                    f"verify graph: static buffer {spec.name} is {tuple(live.shape)} {live.dtype}, "
                    f"expected at least {spec.shape} {spec.dtype}")

    def describe(self) -> str:
        return "; ".join(f"{s.name}{list(s.shape)} pad={s.pad}" for s in self.declare())

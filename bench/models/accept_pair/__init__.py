"""A Llama target + EAGLE-3 draft whose agreement is set by construction (real weights, no hub).

    python -m bench models pair OUT_DIR [--agree 0.7] [--seed 0] [--attention]
    python -m bench models pair OUT_DIR --shape llama8b --attention [--agree 0.36,0.55,0.65,0.77]
    python -m bench models pair OUT_DIR --draft-attention [--agree 0.7] [--seed 0]

writes ``OUT_DIR/llama-pair`` (LlamaForCausalLM) and ``OUT_DIR/llama-pair-eagle3``
(LlamaForCausalLMEagle3): config.json, tokenizer (``bench.models.dummy_models.write_model``) and
``model.safetensors`` with every weight SGLang loads, plus ``pair_maps.json`` (the maps below).
``--attention`` writes ``OUT_DIR/llama-pair-attn`` and ``OUT_DIR/llama-pair-attn-eagle3`` instead:
the same maps, but a target whose greedy token goes through its layer-0 attention (below).
Random dummy weights give an accept length of 1.0 (the draft never agrees), so accept-length
bookkeeping bugs (sgl-project/sglang#16974) cannot show; this
pair makes every accepted count 0..num_steps occur, mixed within a batch, and predictable.

Construction (``H`` hidden, ``V`` vocab, ``V <= H / 2``; ``e_t`` = unit vector ``t``, ``u_t`` =
unit vector ``V + t``):

* target: ``embed_tokens[t] = e_t``; every layer's ``o_proj`` and ``down_proj`` are zero (q/k/v
  and gate/up are random, so the attention kernels still read and write real KV), so the residual
  stream of token ``t`` stays ``e_t`` at every layer; ``lm_head[g(t), t] = 1``. Greedy next
  token: exactly ``g(t)``, a random cyclic permutation of the ids >= 3 (0/1/2 = pad/bos/eos map
  to themselves), with no near-ties.
* draft (SGLang 0.5.16 ``llama_eagle3.py``): the aux hidden states (the residual entering the
  captured layers) are ``e_y`` three times; ``fc`` maps the first copy to ``u_y``. Its one layer
  has ``o_proj = 0``, so its output state is ``h + mlp(norm(h))``; the MLP is a lookup table
  (intermediate unit ``k`` reads input dim ``k`` through gate and up, ``down`` writes
  ``target - source`` scaled by the unit's activation): ``u_y -> e_{D1(y)}`` and
  ``e_t -> e_{G(t)}``. ``lm_head[t, t] = 1`` reads the state's token.
* So in an EAGLE-3 cycle whose bonus token ``b = g(y)`` follows the last accepted token ``y``,
  the drafts are ``d_1 = D1(y)``, ``d_{k+1} = G(d_k)``; the target accepts ``d_1`` iff
  ``D1(y) = g(g(y))`` and ``d_{k+1}`` iff ``G(d_k) = g(d_k)``. ``D1`` and ``G`` agree with the
  target on a random share ``--agree`` of the ids and name another token elsewhere.

:func:`simulate` replays greedy EAGLE-3 on these maps and gives the accepted-draft count of every
cycle, which the server test compares with SGLang's ``spec_correct_drafts_histogram``.
Needs torch and safetensors (the GPU machine has both); the maps need only the standard library.

The attention pair (``attention=True``; the plain pair's target never reads its attention output,
so a wrong verify attention at draft positions >= 1 cannot change its tokens). Every prompt starts
with BOS (id 1) at position 0; ``V`` is a power of two, ``b = log2 V`` bits. Each id ``t`` has a
unique ``b``-bit code (:func:`make_codes`): ``b - 1`` bits ``h(t)`` (as +-1) and a sign ``s(t)``;
ids 0/1 share ``h`` (so no single fault makes the target emit pad or BOS).

* residual: ``e_t`` plus 1 in the bias dim ``V`` (the embedding); layer 0's attention adds
  ``b + 1`` features in dims ``V + 1 ..``: ``h`` of the token its self head attends to, then
  ``(s(t), -s(t))`` from the two BOS heads when BOS is visible, ``(-1, -1)`` when it is not.
  Every other head and every MLP write nothing (``o_proj`` columns / ``down_proj`` zero), so
  later layers leave the residual alone; their q/k/v stay random (real KV).
* self head (q head 0, KV head 0): q and k read only the bias dim (constant before RoPE), so the
  score of a key at offset ``d = m - n`` is ``sum_i A_i cos((d + 1) w_i)`` over the 32 fastest
  rotary planes (HF/SGLang neox RoPE, ``rope_theta``): it peaks at the next token (``d = -1``).
  Visible under the correct causal limit, the token itself (``d = 0``) wins by 35 logits over
  every ``d`` in 1..2048; with the limit one further it attends to the next token (by 14.4), one
  short to the previous one (by 16.5) (bfloat16 q/k). Its value: ``h(token)``.
* BOS heads (q heads 2, 3, KV head 1): k reads only ``e_BOS`` (4 slowest planes: 24 logits at
  position 0, > 22 at 2048; every other key scores 0), q reads the token: ``+s(t)`` / ``-s(t)``;
  value +1 for BOS, -1 otherwise. So head 2 gives ``s(t)``, head 3 ``-s(t)``; without BOS
  (a dropped first KV split, a wrong first page-table entry) both give -1.
* lm_head: ``logit(n) = w(n) . f + 2 [n = g(p(t))]`` (times the final norm, ~9.2), ``w(n)`` the
  features that ``g^-1(n)`` produces, ``p(t)`` the id with ``t``'s code and the other sign.
  Correct features: ``g(t)`` by 2 (18 logits). Self head on another token ``a``: ``g`` of the id
  with code ``(h(a), s(t))``; BOS missing: ``g(p(t))``, each by the same margin.
  :func:`attention_prediction` is that rule, :func:`reference_logits` the float forward.
* draft: the plain pair's. ``fc`` reads only the token dims of the aux states, so the bias and
  the features (correct or faulted) never reach it.

The draft-attention pair (``--draft-attention``: ``OUT_DIR/llama-pair-draft-attn`` and its
``-eagle3``; :mod:`bench.models.accept_pair.draft_attn`): the plain target with a draft whose
proposals go through its own attention (self heads on the row's own key, valued by its input id;
a BOS head), so a wrong draft-extend attention changes the accepted drafts while the target
keeps the outputs; :mod:`.draft_attn_sim` predicts them under each draft-extend test fault,
:mod:`.draft_reference` is the draft's float forward.

The Llama-3.1-8B-shape pair (``--shape llama8b [--attention]``; :data:`LLAMA8B`, the timing of a
real Llama-3.1-8B and its EAGLE-3 draft with an accept length set by construction) writes
``OUT_DIR/llama8b-pair[-attn]`` and its ``-eagle3``:

* the construction above at :data:`VOCAB` ids in layer 0 (the self head's planes at rope_theta
  500000 with the llama3 ``rope_scaling``, as SGLang's ``Llama3RotaryEmbedding`` rotates them; the
  BOS heads are q heads 4 and 5, KV head 1's first two); layers 1-31 at full size with random
  q/k/v and gate/up and zero ``o_proj`` / ``down_proj``: real compute, no write to the residual;
  embedding and lm_head padded with zero rows to vocab 128256 (no prompt holds an id >= 512,
  and a zero row's logit 0 stays below the greedy token's, which is positive);
* the draft: one layer of hidden 4096, intermediate 14336, 32 / 8 heads, ``draft_vocab_size``
  32000 (the lm_head rows beyond 512 zero, ``d2t`` zeros: SGLang 0.5.16's ``llama_eagle3.py``
  turns it into ``hot_token_id = d2t + arange``, the identity; ``t2d`` is not read), aux layer
  ids [1, 15, 28]; no ``embed_tokens`` (the EAGLE-3 worker's ``set_embed`` shares the target's);
* weights in ``pytorch_model.bin`` (``torch.save``), where every layer's tensors are views of a
  few shared storages, stored once: 2.4 + 0.8 GiB instead of 16 + 1.9 GiB of safetensors. SGLang
  0.5.16's ``DefaultModelLoader`` reads ``*.bin`` when a folder has no ``*.safetensors``
  (``torch.load(weights_only=True)``) and copies each tensor into that layer's own parameter.
  Written in 33 s on 2 busy CPU cores (5.7 GB peak memory);
* agreement classes (:func:`make_class_maps`): the ids >= 3 split into one class per ``--agree``
  value, ``g`` one cycle per class, so a request's accept length is set by the class of its last
  prompt token (:func:`speedup_prompts`) and one pair serves several accept lengths. The default
  classes (:data:`AGREE_LLAMA8B`) and the accept length :func:`simulate` gives a request of each
  at num_steps 3 and 128 new tokens (SGLang's completion tokens / verify steps; 64-512 new tokens:
  within 0.2):

  =========  =====  =====  =====  =====
  agree      0.36   0.55   0.65   0.77
  accept     1.52   2.00   2.46   2.98
  =========  =====  =====  =====  =====
"""

from __future__ import annotations

# The package's modules: config (widths, constants, shapes), simulator (maps, what SGLang's
# verify accepts), reference (a float forward of the target), builder (weights, folders), cli.
from bench.models.accept_pair.config import (  # noqa: F401
    _configs, ACCEPT_TARGETS, AGREE_LLAMA8B, AUX_IDS, BOS, BOS_HEADS, bos_heads, BOS_PLANES,
    BOS_SCORE, estimated_bytes, FAULTS, feature_dims, GATE_Z, HEAD_DIM, HEADS, HIDDEN,
    INTERMEDIATE, KV_HEADS, LAYERS, LLAMA3_ROPE_SCALING, LLAMA8B, MIN_KEYS_PER_SPLIT, NAMES,
    NUM_STEPS, PairShape, PARTNER_BONUS, RMS_EPS, rope_inv_freq, ROPE_THETA, SELF_HEAD,
    SELF_PLANES, SELF_SCORE, shape_configs, SHAPES, SPECIAL, SPEEDUP_NEW_TOKENS, VOCAB,
)
from bench.models.accept_pair.simulator import (  # noqa: F401
    accepted_histogram, attention_prediction, attention_prompts, calibrate_agree,
    chain_predictions, class_accept_length, code_bits, make_class_maps, make_codes, make_maps,
    pair_maps, sglang_accept_length, simulate, speedup_prompts, trim_histogram,
)
from bench.models.accept_pair.reference import (  # noqa: F401
    AttentionFault, reference_logits,
)
from bench.models.accept_pair.builder import (  # noqa: F401
    _attention_target, build_shape_weights, build_weights, unique_bytes, write_pair,
    write_shape_pair,
)

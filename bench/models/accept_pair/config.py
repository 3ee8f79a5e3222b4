"""The constructed pair's widths and constants: the small pair's (``HIDDEN``, ``VOCAB``, ...),
the attention pair's head layout and scores, the real-shape pairs (:class:`PairShape`,
``LLAMA8B``) with their calibrated agreement classes, and their configs."""

from __future__ import annotations

import dataclasses


HIDDEN, VOCAB, HEADS, KV_HEADS, HEAD_DIM, LAYERS, INTERMEDIATE = 1024, 512, 8, 4, 128, 4, 2048
AUX_IDS = [0, 1, 2]  # SGLang captures the residual entering layers 1, 2, 3 (< LAYERS)
SPECIAL = 3  # ids 0/1/2: pad/bos/eos, fixed points of every map
BOS = 1
GATE_Z = 4.0  # pre-activation of a lookup unit: silu(4) * 4 = 15.7
ROPE_THETA, RMS_EPS = 10000.0, 1e-5  # the target config's (dummy_models._llama)
NAMES = {False: "llama-pair", True: "llama-pair-attn"}  # target folder; the draft's adds "-eagle3"

# attention pair (``attention=True``)
SELF_HEAD, BOS_HEADS = 0, (2, 3)  # q heads of layer 0 (KV heads 0 and 1 with 2 q heads each)
SELF_PLANES = 32  # the self head's rotary planes: the fastest 32 of head_dim / 2
SELF_SCORE = 120.0  # the self head's score (logits, after sm_scale) of the peak offset
BOS_PLANES = 4  # the BOS heads' rotary planes: the slowest 4
BOS_SCORE = 24.0  # the BOS heads' score of the BOS key at position 0 (logits)
PARTNER_BONUS = 2.0  # lm_head weight of e_t for g(p(t)), in units of the feature weight 1
MIN_KEYS_PER_SPLIT = 64  # the chain kernel's (sglang_verify_graph.kernel): keys per KV split at least
FAULTS = ("causal_plus_one", "causal_minus_one", "drop_first_split")
"""Verify-attention faults :func:`simulate` models (the chain kernel's test fault switch)."""

def _configs() -> tuple:
    from bench.models import dummy_models as mm

    target = mm._llama(HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE, VOCAB, 8192, ROPE_THETA,
                       head_dim=HEAD_DIM)
    assert target["rms_norm_eps"] == RMS_EPS and target["rope_scaling"] is None, target
    draft = mm._eagle3_draft(dict(target), AUX_IDS, HIDDEN)
    mm.check_pair("llama-pair", target, draft)
    return mm, target, draft


def feature_dims(vocab: int = VOCAB) -> dict:
    """The attention pair's residual dims: ``{"bias": V, "self": [V + 1 .. V + b - 1],
    "bos": [V + b, V + b + 1]}`` (``b = log2 V``)."""
    bits = vocab.bit_length() - 1
    return {"bias": vocab, "self": list(range(vocab + 1, vocab + bits)),
            "bos": [vocab + bits, vocab + bits + 1]}


def rope_inv_freq(head_dim: int = HEAD_DIM, theta: float = ROPE_THETA, scaling: dict | None = None):
    """The rotary frequencies (rad per position, float32 ``[head_dim / 2]``) as SGLang 0.5.16's
    ``RotaryEmbedding._compute_inv_freq`` computes them (neox style: plane ``i`` rotates dims
    ``i`` and ``i + head_dim / 2``). ``scaling``: a config's ``rope_scaling``; ``rope_type``
    ``llama3`` applies ``Llama3RotaryEmbedding._compute_inv_freq`` (planes of wavelength below
    ``original_max_position_embeddings / high_freq_factor`` unchanged, above ``.. /
    low_freq_factor`` divided by ``factor``, smoothly interpolated between). Raises ValueError
    for another ``rope_type``."""
    import math

    import torch

    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind != "llama3":
        raise ValueError(f"rope_scaling type {kind!r}: only llama3 is modelled")
    factor, lo, hi = scaling["factor"], scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    orig = scaling["original_max_position_embeddings"]
    wave = 2 * math.pi / inv
    smooth = (orig / wave - lo) / (hi - lo) if lo != hi else 0
    return torch.where(wave < orig / hi, inv, torch.where(
        wave > orig / lo, inv / factor, (1 - smooth) * inv / factor + smooth * inv))


def bos_heads(heads: int = HEADS, kv_heads: int = KV_HEADS) -> tuple:
    """The attention pair's two BOS q heads: the first two q heads of KV head 1 (``(2, 3)`` for
    :data:`HEADS` / :data:`KV_HEADS`, ``(4, 5)`` at 32 q / 8 KV heads)."""
    group = heads // kv_heads
    return (group, group + 1)

# ---------------------------------------------------------------- real-shape pairs, agreement classes
LLAMA3_ROPE_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192, "rope_type": "llama3"}
"""Llama-3.1-8B's ``rope_scaling`` (``dummy_models.llama_8b``)."""


@dataclasses.dataclass(frozen=True)
class PairShape:
    """The widths of one constructed pair.

    ``vocab``: the construction's ids ``0 .. vocab - 1`` (V of the module docstring);
    ``vocab_size``: the config's vocabulary, the rows of the target's embedding and lm_head
    (rows ``>= vocab`` are zero); ``draft_vocab``: the draft's ``draft_vocab_size`` (its lm_head
    rows; rows ``>= vocab`` zero, ``d2t`` all 0, so draft id ``i`` is target id ``i``);
    ``aux_ids``: ``eagle_aux_hidden_state_layer_ids``; ``rope_scaling``: the config's (None or
    :data:`LLAMA3_ROPE_SCALING`).
    """

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    vocab_size: int
    draft_vocab: int
    aux_ids: tuple
    rope_theta: float
    rope_scaling: dict | None
    max_position: int

    def folder(self, attention: bool) -> str:
        """The target's folder name (the draft's adds ``-eagle3``)."""
        return self.name + ("-attn" if attention else "")


LLAMA8B = PairShape("llama8b-pair", 4096, 32, 32, 8, 128, 14336, VOCAB, 128256, 32000, (1, 15, 28),
                    500000.0, LLAMA3_ROPE_SCALING, 131072)
"""Llama-3.1-8B (``dummy_models.llama_8b``: hidden 4096, 32 layers, 32 q / 8 KV heads of 128,
intermediate 14336, vocab 128256, rope_theta 500000 with llama3 scaling, 131072 positions) and its
EAGLE-3 draft's shape (one layer of the same widths, aux layer ids [1, 15, 28], draft vocab 32000)."""
SHAPES = {"llama8b": LLAMA8B}
NUM_STEPS = 3  # the num_steps the agreement classes are calibrated for
ACCEPT_TARGETS = (1.5, 2.0, 2.5, 3.0)
AGREE_LLAMA8B = (0.36, 0.55, 0.65, 0.77)
"""The per-position agreement of each class of the llama8b pair (:func:`make_class_maps`, seed 0,
:data:`VOCAB` ids): the values :func:`calibrate_agree` picks for :data:`ACCEPT_TARGETS` at
num_steps 3 with :data:`SPEEDUP_NEW_TOKENS` new tokens per request (SGLang's accept length =
completion tokens / verify steps; ``test_accept_pair.py`` checks each within 0.15)."""
SPEEDUP_NEW_TOKENS = 128
"""New tokens per request the classes are calibrated at: a request walks ``new_tokens - 1`` >=
its class's cycle (127 or 128 ids), so its accept length is the class's, whatever its start."""

def shape_configs(shape: PairShape) -> tuple:
    """``(dummy_models module, target config, draft config)`` of ``shape`` (``dummy_models``'
    Llama and EAGLE-3 config builders; checked with ``check_pair``)."""
    from bench.models import dummy_models as mm

    target = mm._llama(shape.hidden, shape.layers, shape.heads, shape.kv_heads, shape.intermediate,
                       shape.vocab_size, shape.max_position, shape.rope_theta,
                       head_dim=shape.head_dim, rope_scaling=shape.rope_scaling)
    draft = mm._eagle3_draft(dict(target), list(shape.aux_ids), shape.hidden, shape.draft_vocab)
    mm.check_pair(shape.folder(False), target, draft)
    return mm, target, draft

def estimated_bytes(shape: PairShape) -> int:
    """Bytes of both ``pytorch_model.bin`` files of ``shape`` (bfloat16, shared storages once):
    the target's padded embedding and lm_head, layer 0's attention, the shared layer tensors,
    and the draft (fc, its layer's attention and lookup MLP, padded lm_head, d2t)."""
    H, I = shape.hidden, shape.intermediate
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    target = (2 * shape.vocab_size * H + (2 * q + 2 * kv) * H  # embed, lm_head; layer 0 q/k/v/o
              + 2 * I * H + (q + 2 * kv) * H + H * max(I, q) + H)  # gate, up, q/k/v, zeros, ones
    draft = (3 * H * H + (q + 2 * kv) * 2 * H + q * H + 3 * I * H + shape.draft_vocab * H + 3 * H)
    return 2 * (target + draft) + 8 * shape.draft_vocab

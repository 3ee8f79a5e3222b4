"""Which attention backends the verify graph serves, and how (policy; no SGLang imports).

Two kinds of verify attention inside ``VerifyCudaGraphRunner``'s graphs:

* ``chain`` (``--attention-backend triton``): the target's backend becomes
  ``ChainVerifyTritonBackend``, whose TARGET_VERIFY runs the project's split-KV chain kernel
  (``sglang_verify_graph.kernel``). Triton's own verify is an extend kernel with no KV split, so
  this is where the speed-up comes from.
* ``native`` (``fa3``; ``flashmla`` and ``flashinfer`` on MLA targets): the backend's own
  TARGET_VERIFY is already decode-class for a topk=1 chain (FA3's ``flash_attn_with_kvcache`` and
  FlashMLA take ``num_draft_tokens`` queries per request over a split-KV paged cache; SGLang's
  ``flashinfer`` factory gives MLA models ``FlashInferMLAAttnBackend``, a split-KV MLA decode),
  so the runner keeps it and adds what it owns: bucket policy, padded rows neutralised, every
  fallback counted with its reason, the self-test (flashmla and flashinfer are GPU-tested, fa3
  is wired and CPU-tested only; ``docs/testing.md``). FlashInfer for MHA
  targets (``FlashInferAttnBackend``: a prefill kernel with a tree mask) is not served.

``flashmla`` serves MLA only. An MHA EAGLE-3 draft (``LlamaForCausalLMEagle3``) inherits the
target's backend unless ``--speculative-draft-attention-backend`` says otherwise, and SGLang
0.5.16 then fails at draft backend init (``'ModelConfig' object has no attribute
'kv_lora_rank'``): :func:`check_draft_backend` stops the launch first. (``flashinfer`` builds
the MHA backend for an MHA draft, so that failure does not happen there.)
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional, Tuple

from sglang_verify_graph.errors import VerifyGraphConfigError

CHAIN_BACKENDS: Tuple[str, ...] = ("triton",)
"""Backends whose TARGET_VERIFY the plugin replaces with the split-KV chain kernel."""

NATIVE_BACKENDS: Tuple[str, ...] = ("fa3", "flashmla", "flashinfer")
"""Backends whose own (decode-class) TARGET_VERIFY the plugin's graph replays."""

MLA_ONLY_BACKENDS: Tuple[str, ...] = ("flashmla",)
"""Backends that serve MLA models only (an MHA draft cannot run on them)."""

MLA_TARGET_ONLY: Tuple[str, ...] = ("flashmla", "flashinfer")
"""Native backends the verify graph serves for MLA targets only."""

NATIVE_BACKEND_CLASSES = {
    "fa3": ("FlashAttentionBackend",),
    "flashmla": ("FlashMLABackend",),
    "flashinfer": ("FlashInferMLAAttnBackend",),
}
"""SGLang 0.5.16 class names of each native backend (``layers/attention/*``); a target whose
backend object is anything else (e.g. a hybrid wrapper) is refused at capture."""

SUPPORTED = CHAIN_BACKENDS + NATIVE_BACKENDS
_NAMES = ", ".join(SUPPORTED)


def verify_attention_kind(backend: str) -> str:
    """``"chain"`` for :data:`CHAIN_BACKENDS`, ``"native"`` for :data:`NATIVE_BACKENDS`.
    Raises KeyError for any other backend name."""
    if backend in CHAIN_BACKENDS:
        return "chain"
    if backend in NATIVE_BACKENDS:
        return "native"
    raise KeyError(backend)


def check_overrides(server_args: Any) -> None:
    """Raises VerifyGraphConfigError when ``--prefill-attention-backend`` or
    ``--decode-attention-backend`` names a backend the verify graph does not serve."""
    for flag, field in (
        ("--prefill-attention-backend", "prefill_attention_backend"),
        ("--decode-attention-backend", "decode_attention_backend"),
    ):
        override = getattr(server_args, field, None)
        if override and override not in SUPPORTED:
            raise VerifyGraphConfigError(
                f"supports the {_NAMES} attention backends for target verify", flag, override,
                f"pass {flag} triton or remove it")


def check_attention(server_args: Any) -> Tuple[str, str]:
    """The resolved verify backend of ``server_args`` and its kind (``"chain"``/``"native"``).

    Prefill and decode must resolve to the same supported backend (a hybrid backend could route
    TARGET_VERIFY through either phase's backend).

    Raises:
        VerifyGraphConfigError: an unsupported override or base backend, or prefill != decode.
    """
    base = getattr(server_args, "attention_backend", None)
    check_overrides(server_args)
    prefill = getattr(server_args, "prefill_attention_backend", None) or base
    decode = getattr(server_args, "decode_attention_backend", None) or base
    if prefill not in SUPPORTED or decode not in SUPPORTED:
        raise VerifyGraphConfigError(
            f"supports the {_NAMES} attention backends for target verify",
            "--attention-backend", base, "pass --attention-backend triton")
    if prefill != decode:
        given = ("--prefill-attention-backend", prefill, decode) if getattr(
            server_args, "prefill_attention_backend", None) else ("--decode-attention-backend", decode, prefill)
        raise VerifyGraphConfigError(
            f"needs one attention backend for prefill and decode (the other phase uses "
            f"{given[2]}; with two, target verify could run on either)", given[0], given[1],
            f"pass only --attention-backend {decode}")
    return decode, verify_attention_kind(decode)


def _local_config(path: Optional[str]) -> Optional[dict]:
    if not path or not os.path.isfile(os.path.join(path, "config.json")):
        return None
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    return cfg.get("text_config", cfg) if isinstance(cfg, dict) else None


def checkpoint_is_mla(path: Optional[str]) -> Optional[bool]:
    """Whether the checkpoint (target or draft) at ``path`` (a local folder) uses MLA
    attention (its config, or its ``text_config``, has ``kv_lora_rank``: DeepSeek-V3, Kimi-K2.5,
    ``Eagle3DeepseekV2ForCausalLM``); ``None`` when the path is not a local folder with a
    config.json (a hub id: not checked here)."""
    cfg = _local_config(path)
    if cfg is None:
        return None
    return cfg.get("kv_lora_rank") is not None


def check_target(server_args: Any, backend: str) -> None:
    """Raises VerifyGraphConfigError when ``backend`` is in :data:`MLA_TARGET_ONLY` and the target
    (``--model-path``, when a local folder) is not an MLA model."""
    if backend not in MLA_TARGET_ONLY:
        return
    if checkpoint_is_mla(getattr(server_args, "model_path", None)) is not False:
        return
    raise VerifyGraphConfigError(
        f"serves {backend} verify only for MLA targets (DeepSeek-V3 / Kimi-K2.5 class); this "
        "target has no MLA", "--attention-backend", backend,
        "pass --attention-backend triton (or fa3)")


def check_draft_backend(server_args: Any, backend: str) -> None:
    """Refuse an MHA draft on an MLA-only target backend.

    Raises:
        VerifyGraphConfigError: ``backend`` is in :data:`MLA_ONLY_BACKENDS`, the draft is a local
            folder without MLA, and ``--speculative-draft-attention-backend`` is not set (or is
            itself MLA-only).
    """
    if backend not in MLA_ONLY_BACKENDS:
        return
    draft_backend = getattr(server_args, "speculative_draft_attention_backend", None)
    if draft_backend and draft_backend not in MLA_ONLY_BACKENDS:
        return
    if checkpoint_is_mla(getattr(server_args, "speculative_draft_model_path", None)) is not False:
        return
    raise VerifyGraphConfigError(
        f"the EAGLE-3 draft is an MHA model and cannot run on {backend}, which serves MLA only "
        "(SGLang would fail at draft backend init)", "--speculative-draft-attention-backend",
        draft_backend, "pass --speculative-draft-attention-backend triton (or fa3)")

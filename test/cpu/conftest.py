"""Shared fixtures of the CPU test tier (no GPU, no server)."""

import json
import os
from types import SimpleNamespace

import pytest

from sglang_verify_graph import config as vg_config

_OUR_ENV = (vg_config.ENV_ENABLE, vg_config.ENV_NUM_KV_SPLITS, vg_config.ENV_LOG_EVERY,
            vg_config.ENV_SELFTEST, vg_config.ENV_PROFILE_EVERY, vg_config.ENV_SELFTEST_NAN,
            vg_config.ENV_SYNC_CHECK, "SGLANG_VERIFY_GRAPH_TEST_FAULT", "SGLANG_VERIFY_GRAPH_DRAFT_EXTEND")


@pytest.fixture(autouse=True)
def _clean_plugin_env(monkeypatch):
    """No test sees the caller's SGLANG_*VERIFY* variables; changes are undone."""
    for name in _OUR_ENV:
        monkeypatch.setenv(name, "")  # records the original state (also "unset") for undo
        monkeypatch.delenv(name)


def resolved_args(**overrides):
    """A duck-typed, *resolved* sglang 0.5.16 ServerArgs for a good EAGLE-3 topk=1 setup.

    Attribute names are those of ``sglang.srt.server_args.ServerArgs``
    (test_real_server_args.py checks them against the real class).
    """
    fields = dict(
        model_path="/models/target",
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path="/models/draft",
        speculative_eagle_topk=1,
        speculative_num_steps=3,
        speculative_num_draft_tokens=4,
        speculative_adaptive=False,
        speculative_attention_mode="prefill",
        attention_backend="triton",
        prefill_attention_backend=None,
        decode_attention_backend=None,
        cuda_graph_config=SimpleNamespace(
            decode=SimpleNamespace(backend="full", max_bs=32, bs=[1, 2, 4, 8]),
            prefill=SimpleNamespace(backend="breakable", max_bs=2048, bs=None),
        ),
        cuda_graph_backend_decode=None,
        disable_decode_cuda_graph=False,
        disable_cuda_graph=False,
        disable_cuda_graph_padding=False,
        enable_dp_attention=False,
        pp_size=1,
        enable_two_batch_overlap=False,
        page_size=1,
        max_running_requests=48,
        tp_size=1,
    )
    fields.update(overrides)
    return SimpleNamespace(**fields)


_TINY = dict(
    model_type="llama", hidden_size=64, intermediate_size=128, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=256, max_position_embeddings=512, rms_norm_eps=1e-5,
    torch_dtype="float16", bos_token_id=1, eos_token_id=2, rope_theta=10000.0, head_dim=16,
)


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory):
    """(target, draft) folders holding only a config.json: a 2-layer Llama and an EAGLE-3 head.

    Enough for ``ServerArgs.__post_init__`` (it reads the HF config, never weights).
    """
    root = tmp_path_factory.mktemp("tiny_models")
    target, draft = root / "target", root / "draft"
    target.mkdir()
    draft.mkdir()
    (target / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, **_TINY}))
    (draft / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
         "draft_vocab_size": 256, **_TINY}))
    return str(target), str(draft)


@pytest.fixture
def restore_environ():
    """Undo any os.environ change (ServerArgs.__post_init__ exports SGLANG_* variables)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def make_args(monkeypatch):
    """Factory fixture: ``make_args(**overrides)`` -> :func:`resolved_args` namespace, with the
    flag on (``SGLANG_ENABLE_VERIFY_CUDA_GRAPH=1``, as the command-line hook sets it before
    SGLang builds the server args; a test turns it off with ``monkeypatch.delenv``)."""
    monkeypatch.setenv(vg_config.ENV_ENABLE, "1")
    return resolved_args


@pytest.fixture
def real_args(tiny_model_dirs, restore_environ):
    """``real_args(**overrides)`` -> a resolved ServerArgs for EAGLE3 topk 1, triton, on CPU."""
    from sglang.srt.server_args import ServerArgs

    from sglang_verify_graph.compat.sglang_adapter import RESOLVE_ONCE, resolved

    target, draft = tiny_model_dirs

    def make(**overrides):
        kwargs = dict(
            model_path=target, device="cpu", skip_tokenizer_init=True,
            speculative_algorithm="EAGLE3", speculative_draft_model_path=draft,
            speculative_num_steps=3, speculative_eagle_topk=1,
            speculative_num_draft_tokens=4, attention_backend="triton",
        )
        kwargs.update(overrides)
        server_args = ServerArgs(**kwargs)
        if RESOLVE_ONCE:  # 0.5.19 on: resolve_once() resolves, and the fields keep the raw input
            server_args.resolve_once()
        return resolved(server_args)

    return make


@pytest.fixture
def gpu_job_dry(tmp_path):
    """Factory fixture: ``gpu_job_dry(unset=(...), timeout=600, **env)`` runs ``scripts/gpu_job.sh``
    with ``DRY_RUN=1`` under ``BASE=tmp_path`` (no bundle, no GPU: the suite's stages collect
    tests or dry-run the benches; ``SUITE=...`` picks them) and returns ``(CompletedProcess,
    summary.txt text or "")``. ``unset``: variables removed from the inherited environment
    (default: ``PARALLEL``, ``SUITE``, ``STAGES``)."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def run(unset=("PARALLEL", "SUITE", "STAGES"), timeout=600, **extra):
        env = dict(os.environ, DRY_RUN="1", BASE=str(tmp_path),
                   PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
        for k in unset:
            env.pop(k, None)
        env.update(extra)
        p = subprocess.run(["bash", os.path.join(root, "scripts", "gpu_job.sh")], env=env, cwd=root,
                           capture_output=True, text=True, timeout=timeout)
        summary = tmp_path / "gpujob" / "summary.txt"
        return p, summary.read_text() if summary.exists() else ""

    return run

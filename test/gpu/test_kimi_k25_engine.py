"""GPU tier: the Kimi-K2.5 architecture name (``KimiK25ForConditionalGeneration``, a DeepseekV3 text
model behind a vision tower) under the verify graph, through ``sglang.Engine``.

Why the Engine and not ``python -m sglang.launch_server``: for a multimodal architecture SGLang
0.5.16's tokenizer manager loads the checkpoint's HF processor even with
``--skip-tokenizer-init`` (``managers/tokenizer_manager.py``), Kimi-K2.5's processor is remote
code, and the CLI can only switch ``enable_multimodal`` on; ``Engine(enable_multimodal=False)``
serves the text model alone, which is what verify exercises.

In a fresh interpreter (env ``SGLANG_ENABLE_VERIFY_CUDA_GRAPH=1`` + ``SGLANG_VERIFY_GRAPH_SELFTEST=1``):
dummy-weight ``kimi-k25-small`` (``python -m bench.models.dummy_models``) + its Llama-style EAGLE-3 draft,
triton, buckets 1/2/4/8; 8 concurrent greedy requests of different lengths. Checks: our runner
served every verify step (replays == verify steps, no fallback), the self-test compared every
replay with the eager forward (logits and aux hidden states rel. err < 1e-2), padded buckets ran.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.server]

MODELS = os.environ.get("VERIFY_GRAPH_MODELS", "/tmp/models")
MODEL = os.environ.get("VERIFY_GRAPH_K25_MODEL", "kimi-k25-small")

_DRIVER = textwrap.dedent("""
    import json, random, sys
    from sglang.srt.entrypoints.engine import Engine
    target = sys.argv[1]
    shared = json.loads(sys.argv[2])  # server_utils.shared_gpu_kwargs() (PARALLEL=1 in gpu_job.sh)
    eng = Engine(model_path=target, speculative_draft_model_path=target + "-eagle3",
                 speculative_algorithm="EAGLE3", speculative_eagle_topk=1,
                 speculative_num_steps=2, speculative_num_draft_tokens=3,
                 load_format="dummy", attention_backend="triton", enable_multimodal=False,
                 skip_tokenizer_init=True, cuda_graph_bs_decode=[1, 2, 4, 8],
                 max_running_requests=8, cuda_graph_backend_prefill="disabled",
                 disable_radix_cache=True, context_length=4096,
                 sampling_backend="pytorch", random_seed=0,
                 **{"mem_fraction_static": 0.6, **shared})
    try:
        rng = random.Random(7)
        vocab = 32000
        prompts = [[rng.randrange(100, vocab - 10) for _ in range(rng.randrange(16, 300))]
                   for _ in range(8)]
        params = [{"max_new_tokens": 16 + 12 * i, "temperature": 0.0, "ignore_eos": True}
                  for i in range(8)]
        outs = eng.generate(input_ids=prompts, sampling_params=params)
        lens = [len(o["output_ids"]) for o in outs]
        state = eng.get_server_info()["internal_states"][0].get("verify_cuda_graph")
        print("RESULT " + json.dumps({"lens": lens, "state": state}))
    finally:
        eng.shutdown()
""")


def test_kimi_k25_wrapper_verify_graph_equals_eager():
    target = os.path.join(MODELS, MODEL)
    if not os.path.isfile(os.path.join(target, "config.json")):
        pytest.skip(f"{target} missing (python -m bench.models.dummy_models)")
    env = dict(os.environ, SGLANG_ENABLE_VERIFY_CUDA_GRAPH="1", SGLANG_VERIFY_GRAPH_SELFTEST="1")
    from bench.lib.server import shared_gpu_kwargs

    proc = subprocess.run([sys.executable, "-c", _DRIVER, target, json.dumps(shared_gpu_kwargs())],
                          env=env, capture_output=True,
                          text=True, timeout=900)
    log_dir = os.environ.get("E2E_LOG_DIR", "/tmp/e2e_logs")
    os.makedirs(log_dir, exist_ok=True)
    with open(os.path.join(log_dir, f"engine_{MODEL}.log"), "w") as f:
        f.write(proc.stdout + "\n" + proc.stderr)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["lens"] == [16 + 12 * i for i in range(8)], result["lens"]
    s = result["state"]
    assert s and s["runner"] == "VerifyCudaGraphRunner", s
    assert s["fallback_total"] == 0 and s["replays"] == s["verify_steps"] > 0, s
    st = s["selftest"]
    assert st["checks"] == s["replays"] and st["nonfinite_rows"] == 0, st
    assert st["logits_max_rel_err"] < 1e-2 and st["hidden_max_rel_err"] < 1e-2, st
    assert st["argmax_mismatch"] <= 0.005 * st["rows"], st
    assert s["padded_rows"] > 0, "no padded replay happened"

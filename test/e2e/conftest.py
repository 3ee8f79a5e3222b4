"""Fixtures shared by the server tests."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.environ.get("E2E_MODELS_DIR", "/tmp/models")


@pytest.fixture(scope="module")
def pair():
    """``(target_dir, draft_dir, maps)`` of the constructed pair of ``bench.models.accept_pair``
    (real weights; written under ``E2E_MODELS_DIR`` when missing); ``maps`` holds ``g``, ``d1``,
    ``G`` (lists of token ids) as in ``pair_maps.json``."""
    target = os.path.join(MODELS, "llama-pair")
    if not os.path.isfile(os.path.join(target, "model.safetensors")):
        subprocess.run([sys.executable, "-m", "bench", "models", "pair", MODELS], check=True, cwd=ROOT)
    with open(os.path.join(target, "pair_maps.json")) as f:
        maps = json.load(f)
    return target, target + "-eagle3", maps



@pytest.fixture(scope="module", autouse=True)
def _module_results(request):
    """At the end of a test module that defines ``RESULTS`` (dict) and ``RESULTS_FILE`` (name),
    write the results as JSON under ``E2E_LOG_DIR`` (the GPU job returns them)."""
    yield
    results = getattr(request.module, "RESULTS", None)
    name = getattr(request.module, "RESULTS_FILE", None)
    if results is None or not name:
        return
    log_dir = os.environ.get("E2E_LOG_DIR", "/tmp/e2e_logs")
    os.makedirs(log_dir, exist_ok=True)
    with open(os.path.join(log_dir, name), "w") as f:
        json.dump(results, f, indent=1, default=str)

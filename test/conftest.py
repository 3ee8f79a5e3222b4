"""Test tiers: CPU (default, CI), `gpu` (needs CUDA: run on the H200 via scripts/gpu_job.sh),
`server` (starts a real SGLang server on a GPU), `multigpu` (needs >= 2 GPUs: 8-GPU runner)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
# the lab package (``bench``) lives at the repository root, outside the wheel
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cuda_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


SGLANG_API_MODULES = (
    "test_sglang_versions", "test_real_server_args", "test_refusal_reasons", "test_serve_help",
    "test_refusal_without_gpu", "test_hook_installation", "test_plugin_wiring", "test_cli_hooks",
    "test_launch_refusals", "test_runner_choice",
)
"""The CPU tests that read what moves between SGLang releases (hook targets, server-args
resolution, the graph runner's and the backends' surfaces): marked ``sglang_api``, the subset that
``scripts/run_cpu_tests.sh`` runs on every supported release between the first and the last."""


def pytest_collection_modifyitems(config, items):
    n = _cuda_count()
    for item in items:
        if getattr(getattr(item, "module", None), "__name__", "").rsplit(".", 1)[-1] in SGLANG_API_MODULES:
            item.add_marker(pytest.mark.sglang_api)
        if ("gpu" in item.keywords or "server" in item.keywords) and n == 0:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "multigpu" in item.keywords and n < 2:
            item.add_marker(pytest.mark.skip(reason="needs >= 2 GPUs (8-GPU runner)"))

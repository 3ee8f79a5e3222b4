"""Test tiers: CPU (default, CI), `gpu` (needs CUDA: run on the H200 via scripts/gpu_job.sh),
`server` (starts a real SGLang server on a GPU), `multigpu` (needs >= 2 GPUs: 8-GPU runner)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


def _cuda_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def pytest_collection_modifyitems(config, items):
    n = _cuda_count()
    for item in items:
        if ("gpu" in item.keywords or "server" in item.keywords) and n == 0:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "multigpu" in item.keywords and n < 2:
            item.add_marker(pytest.mark.skip(reason="needs >= 2 GPUs (8-GPU runner)"))

"""The chain kernel's launcher refuses shapes it would compute wrongly (ValueError) instead of
leaving NaN or garbage in the output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]


def _clean_env():
    return {k: v for k, v in os.environ.items()
            if k not in ("SGLANG_ENABLE_VERIFY_CUDA_GRAPH", "SGLANG_PLUGINS")
            and not k.startswith("SGLANG_VERIFY_GRAPH_")}


_KERNEL_PROBE = textwrap.dedent("""
    import json, sys
    import torch
    from sglang_verify_graph.kernel import ChainVerifyShape, chain_verify_attention_fwd, workspace_numel
    case = sys.argv[1]
    g = torch.Generator().manual_seed(0)
    ndt, d, bs = 2, 16, 1
    h, kvh = (6, 4) if case == "heads" else (4, 2)
    k = torch.randn(64, kvh, d, generator=g)
    r2t = torch.arange(1, 33, dtype=torch.int32).view(1, 32)
    rpi = torch.zeros(bs, dtype=torch.int64); sl = torch.tensor([10])
    if case == "stride":
        q = torch.randn(bs * ndt, d, h, generator=g).transpose(1, 2)  # q.stride(-1) != 1
    else:
        q = torch.randn(bs * ndt, h, d, generator=g)
    shape = ChainVerifyShape(h, kvh, d, d, ndt)
    n_out, n_lse = workspace_numel(shape, bs, 1)
    o = torch.full((bs * ndt, h, d), float("nan"))
    try:
        chain_verify_attention_fwd(q, k, k, o, r2t, rpi, sl, shape, 1, d ** -0.5,
                                   torch.empty(n_out), torch.empty(n_lse))
    except ValueError as e:
        print("RESULT", json.dumps({{"raised": str(e)}})); raise SystemExit(0)
    # float64 reference: draft j of the request sees keys r2t[0, :10 + j + 1]
    ref = torch.empty(bs * ndt, h, d, dtype=torch.float64)
    for j in range(ndt):
        locs = r2t[0, : 10 + j + 1].long()
        for hh in range(h):
            kk = k[locs, min(hh // max(h // kvh, 1), kvh - 1)].double()
            p = torch.softmax(kk @ q[j, hh].double() * d ** -0.5, 0)
            ref[j, hh] = p @ kk
    err = ((o.double() - ref).norm() / ref.norm()).item()
    print("RESULT", json.dumps({{"nan": bool(torch.isnan(o).any()), "err": err}}))
""")


@pytest.mark.parametrize("case", ["heads", "stride"])
def test_kernel_launcher_rejects_shapes_it_cannot_compute(case):
    """Heads 6 / KV heads 4: group = 1, stage 1 never writes heads 4 and 5 and stage 2 merges
    uninitialised scratch for them (NaN or garbage in ``o``).
    q with stride(-1) != 1: the kernel adds ``offs_d`` unscaled, reading the wrong elements.
    Either must raise ValueError instead of returning garbage."""
    code = _KERNEL_PROBE.format()
    env = dict(_clean_env(), TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", code, case], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    if "raised" in result:
        return
    assert not result["nan"] and result["err"] < 1e-4, result

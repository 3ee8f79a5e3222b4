"""The launch-setting search for our kernel (``python -m bench kernel --tune``): KV-split policy
(programs per SM, split cap) x stage-1 launch settings, each candidate checked against the
kernel's own choice on the same inputs."""

from __future__ import annotations

import json
import math

import torch
import triton

from bench.kernel.inputs import SHAPES, bench, decode_ms, make_inputs
from sglang_verify_graph.kernel import (ChainVerifyShape, chain_verify_attention_fwd, choose_num_kv_splits,
                                        launch_config, launch_with_config, workspace_numel)

TUNE_GRID = dict(pps=(2, 4, 8), max_splits=(256,), BLOCK_N=(16, 32, 64), num_warps=(4, 8),
                 num_stages=(1, 2))
POLICY = {}  # the kernel's own choices (empty: no override)


def tune_candidates() -> list[dict]:
    """Every combination of :data:`TUNE_GRID` (one dict per candidate)."""
    out = [dict()]
    for k, vals in TUNE_GRID.items():
        out = [dict(c, **{k: v}) for c in out for v in vals]
    return out


def tune_splits(shape, bs: int, num_sms: int, programs_per_sm: int, max_splits: int) -> int:
    """KV splits of a tuning candidate: enough (bs x KV heads x row blocks) programs per split
    for ``programs_per_sm`` programs on each of ``num_sms`` SMs, rounded up to a power of two,
    at most ``max_splits``."""
    base = max(1, bs * shape.num_kv_heads * shape.row_blocks)
    return max(1, min(max_splits, triton.next_power_of_2(max(1, math.ceil(programs_per_sm * num_sms / base)))))


def cfg_name(c: dict) -> str:
    if not c:
        return "policy"
    return ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in c.items())


def time_config(s, inputs, ndt, cfg, sms, device="cuda", rep=100):
    """(ms, splits, output) of ours with the tuning config ``cfg``; (None, splits, error) when it
    does not build or launch on this device."""
    k_buf, v_buf, r2t, rpi, seq, q = inputs
    bs, h, dv = rpi.shape[0], s["h"], s["dv"]
    shape = ChainVerifyShape(h, s["kvh"], s["dk"], dv, ndt, s["rope"])
    cfg = dict(cfg)
    pps, cap = cfg.pop("pps", None), cfg.pop("max_splits", None)
    if pps:
        ns = tune_splits(shape, bs, sms, pps, cap or 256)
    else:
        ns = choose_num_kv_splits(shape, bs, sms)
    n_out, n_lse = workspace_numel(shape, bs, ns)
    ao, al = torch.empty(n_out, device=device), torch.empty(n_lse, device=device)
    o = torch.empty(bs * ndt, h, dv, device=device, dtype=torch.bfloat16)
    if cfg or pps:  # a candidate: the bench's own launch settings over the kernel's defaults
        cfg1, cfg2 = launch_config(shape)
        cfg1.update(cfg)
        f = lambda: launch_with_config(q, k_buf, v_buf, o, r2t, rpi, seq, shape, ns, s["dk"] ** -0.5,  # noqa: E731
                                       ao, al, cfg1, cfg2)
    else:
        f = lambda: chain_verify_attention_fwd(q, k_buf, v_buf, o, r2t, rpi, seq, shape, ns,  # noqa: E731
                                               s["dk"] ** -0.5, ao, al)
    try:
        f()
        torch.cuda.synchronize()
        return bench(f, rep), ns, o
    except Exception as e:  # OutOfResources etc.: reported, not hidden
        return None, ns, f"{type(e).__name__}: {e}"[:160]


def run_tune(a):
    """The tuning search (see the module docstring); returns the JSON record."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    focus = [tuple(int(x) for x in f.split(":")) for f in a.focus]  # ctx:bs:ndt
    rec = {"grid": {k: list(v) for k, v in TUNE_GRID.items()}, "focus": focus, "phase_a": [], "phase_b": []}
    for name in a.shapes:
        s = SHAPES[name]
        cands = tune_candidates()
        scores = {cfg_name(c): [] for c in cands}
        for ctx, bs, ndt in focus:
            inp = make_inputs(s, ctx, bs, ndt)
            t_pol, ns_pol, o_pol = time_config(s, inp, ndt, POLICY, sms)
            for c in cands:
                t, ns, o = time_config(s, inp, ndt, c, sms, rep=40)
                row = dict(shape=name, ctx=ctx, bs=bs, ndt=ndt, cfg=cfg_name(c), ms=t, splits=ns,
                           policy_ms=t_pol, policy_splits=ns_pol)
                if t is None:
                    row["error"] = o
                else:
                    row["max_abs_vs_policy"] = (o.float() - o_pol.float()).abs().max().item()
                    scores[cfg_name(c)].append(t / t_pol)
                rec["phase_a"].append(row)
                print("TUNE_A " + json.dumps(row), flush=True)
        full = {k: v for k, v in scores.items() if len(v) == len(focus)}
        gm = {k: math.exp(sum(map(math.log, v)) / len(v)) for k, v in full.items()}
        ranked = sorted(gm, key=gm.get)
        top = ranked[: a.top]
        for i in range(len(focus)):  # and the best at each focus point
            best = min(full, key=lambda k: full[k][i])
            if best not in top:
                top.append(best)
        print(f"TUNE ranking {name}: " + "; ".join(f"{k} {gm[k]:.3f}" for k in ranked[:10]), flush=True)
        by_name = {cfg_name(c): c for c in cands}
        for ctx in a.contexts:
            for bs in a.bs:
                for ndt in a.ndt:
                    inp = make_inputs(s, ctx, bs, ndt)
                    row = dict(shape=name, ctx=ctx, bs=bs, ndt=ndt, decode_ms=decode_ms(s, inp, ndt))
                    t_pol, row["policy_splits"], o_pol = time_config(s, inp, ndt, POLICY, sms)
                    row["policy_ms"] = t_pol
                    for k in top:
                        t, ns, o = time_config(s, inp, ndt, by_name[k], sms)
                        row[k] = dict(ms=t, splits=ns, **({"error": o} if t is None else
                                      {"max_abs_vs_policy": (o.float() - o_pol.float()).abs().max().item()}))
                    rec["phase_b"].append(row)
                    print("TUNE_B " + json.dumps(row), flush=True)
        rec.setdefault("ranking", {})[name] = [(k, gm[k]) for k in ranked]
        rec.setdefault("top", {})[name] = top
    return rec


def print_tune(rec):
    print("\ntuning: ms per layer (CUDA-graph replay median), ratio = config / policy")
    for name, top in rec["top"].items():
        print(f"{name}: " + " | ".join(f"[{i}] {k}" for i, k in enumerate(top)))
        print(f"{'ctx':>6s} {'bs':>3s} {'ndt':>3s} {'decode':>8s} {'policy':>8s} {'pol/dec':>7s} "
              + " ".join(f"{'[' + str(i) + ']':>7s}" for i in range(len(top))) + "  best/dec")
        for r in rec["phase_b"]:
            if r["shape"] != name:
                continue
            ts = [r[k]["ms"] for k in top]
            best = min([r["policy_ms"]] + [t for t in ts if t])
            print(f"{r['ctx']:6d} {r['bs']:3d} {r['ndt']:3d} {r['decode_ms']:8.4f} {r['policy_ms']:8.4f} "
                  f"{r['policy_ms'] / r['decode_ms']:7.3f} "
                  + " ".join(f"{t / r['policy_ms']:7.3f}" if t else "      -" for t in ts)
                  + f"  {best / r['decode_ms']:7.3f}")

"""Attention-op benchmark of one verify layer, head to head: our chain kernel against the kernels
SGLang has for the same topk-1 verify step, each replayed from a CUDA graph (median of
``bench.lib.timing.graph_ms``: ms per call = one layer), each checked against one float32
reference on the same inputs.

Kernels (``--kernels``; same KV pool, page table and q for all; each called directly, whatever
its production gate says):
  decode     ``decode_attention_fwd``, 1 token per request (a plain decode step; timing only)
  extend     ``extend_attention_fwd`` with the FULL tree mask, as the graphed TARGET_VERIFY runs it
             on CUDA (prefix via flat kv_indices, drafts from k/v_extend); installed SGLang
  splitkv    ``verify_splitkv_fwd`` (gated to gfx95 in production; its own ``can_handle``
             declines MLA from 0.5.23 on)
  shared_kv  ``verify_shared_kv_fwd`` (``verify_mla.py``, sglang#33981; gated to gfx95 and
             Kimi-K3 / Qwen3.5 in production; not in 0.5.16)
  ours       ``chain_verify_attention_fwd`` (split-KV over the page table, chain-causal)
  splitkv_installed  the installed release's ``verify_splitkv_fwd`` beside a ``--upstream-src``
             one (not run on MLA shapes: before 0.5.23 it neither masks head dims nor declines
             576/512)
splitkv and shared_kv come from ``--upstream-src`` (a 0.5.23 ``sglang`` folder or the tarball
``scripts/pack_bundle.sh`` writes; see ``bench.upstream_kernels``) when given, else from the
installed SGLang; the results record each one's source (origin, version, path, sha256). A
kernel that raises, declines the problem (returns False) or fails the accuracy check is
reported in its row, never left out.

Accuracy: every verify kernel's output [T, H, Dv] against :func:`chain_reference` (float32,
draft row j of a request sees its prefix and drafts 0..j), per draft row (one token, all heads):
max abs error, and pass iff it is <= ``ATOL + RTOL * max |ref|`` of that row (bf16 output:
``RTOL`` = 2^-6, ``ATOL`` = 1e-3). The draft keys are raised (:func:`boost_drafts`) so that
their mean score is ln(keys): the drafts then carry softmax mass comparable to the whole prefix
and a row that sees one draft too many or too few fails the check (with plain random keys at
16k keys it would differ by about 1e-4).

Shapes: Llama-3.1-8B at TP 1 (32 q heads, 8 KV heads, 128) and one Kimi-K2.5 TP-8 shard in
absorbed MLA (8 q heads, 1 latent head, Dk 576 = 512 + rope 64, Dv 512); each point's requests
all have ``ctx`` prefix keys.

  python -m bench kernel [--contexts 1024 16384] [--bs 1 8 32] [--ndt 2 3 4] [--out f.json]
      [--upstream-src DIR|TARBALL] [--kernels extend splitkv shared_kv ours] [--reps 100]
      [--budget-s 420]   # stop starting new points after this many seconds (the rest: "skipped")
      [--block-rows 16 32]   # also time ours with BLOCK_R forced (rows ours_r16 / ours_r32)
  TRITON_INTERPRET=1 python -m bench kernel --device cpu --contexts 64 --bs 2 --ndt 3
      # CPU: every kernel run once under the Triton interpreter (float32 inputs) and checked;
      # no timing
  python -m bench kernel --tune --shapes kimi_tp8_mla --contexts 1024 4096 16384 \
      --bs 1 4 8 16 32 --ndt 3 4 --out tune.json
      # launch-setting search for ours: every candidate of TUNE_GRID at the --focus points, then the
      # best --top of them and the policy at every point; same inputs, outputs checked against the
      # policy's (max abs difference), decode's time beside each point
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
import triton

from bench.lib.timing import graph_ms
from sglang_verify_graph.kernel import (ChainVerifyShape, chain_verify_attention_fwd, choose_num_kv_splits,
                                        launch_config, launch_with_config, workspace_numel)
from sglang_verify_graph.kernel.chain_verify_attention import BLOCK_R_CHOICES

SHAPES = {
    "llama8b_tp1": dict(h=32, kvh=8, dk=128, dv=128, rope=0),
    "kimi_tp8_mla": dict(h=8, kvh=1, dk=576, dv=512, rope=64),
}
KERNELS = ("decode", "extend", "splitkv", "shared_kv", "ours", "splitkv_installed")
DEFAULT_KERNELS = ("decode", "extend", "splitkv", "shared_kv", "ours")
UPSTREAM = {"splitkv": "splitkv", "shared_kv": "shared_kv"}  # bench kernel -> bench.upstream_kernels name
RTOL = 2.0 ** -6  # per draft row: max |out - ref| <= ATOL + RTOL * max |ref| (bf16 output)
ATOL = 1e-3
CPU_SMS = 132  # the split policies' SM count off a GPU (an H200's)


def bench(fn, rep: int = 100) -> float:
    """Median GPU ms per call of ``fn`` replayed from a CUDA graph (``rep`` timed replays)."""
    return graph_ms(fn, replays=rep)


def boost_drafts(s: dict, inputs: tuple, ndt: int) -> None:
    """Add to each draft key (req_to_token columns ctx .. ctx+ndt-1 of every request) ``c * u``:
    ``u`` the unit direction of the sum of the request's query rows of that KV head (all draft
    rows, all heads of its group), ``c`` such that the mean score ``sm_scale * q . (c u)`` over
    those rows is ln(ctx + ndt). In place on ``k_buf`` (MLA: V is K's first Dv columns, so the
    draft values move too). Every kernel and the reference read the same modified pool."""
    k_buf, v_buf, r2t, rpi, seq, q = inputs
    bs, h, kvh, dk = rpi.shape[0], s["h"], s["kvh"], s["dk"]
    ctx = int(seq[0])
    g = h // kvh
    ssum = q.float().view(bs, ndt, kvh, g, dk).sum(dim=(1, 3))  # [bs, kvh, dk]
    norm = ssum.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    mean_dot = norm / (ndt * g)  # mean of q_r . u over the group's rows
    c = math.log(ctx + ndt) / (dk ** -0.5 * mean_dot)
    add = (c * ssum / norm)[:, None].expand(bs, ndt, kvh, dk)
    locs = r2t[rpi, ctx:ctx + ndt].long()  # [bs, ndt]
    k_buf[locs] = (k_buf[locs].float() + add).to(k_buf.dtype)


def chain_reference(q, k_buf, v_buf, r2t, rpi, seq, ndt: int, sm_scale: float, shift: int = 0) -> torch.Tensor:
    """float32 attention of the topk-1 verify chain: [T, H, Dv] for q [T = bs*ndt, H, Dk]; draft
    row j of request i attends to the keys ``req_to_token[rpi[i], : seq[i] + j + 1 + shift]``
    (its prefix and drafts 0..j; ``shift`` != 0 only to show the check catches a wrong mask),
    K/V [S, KVH, Dk/Dv] of any float dtype, read in float32."""
    t, h, dk = q.shape
    kvh, dv = k_buf.shape[1], v_buf.shape[2]
    g = h // kvh
    out = torch.empty(t, h, dv, dtype=torch.float32, device=q.device)
    for i in range(rpi.shape[0]):
        n = int(seq[i]) + ndt
        locs = r2t[int(rpi[i]), :n].long()
        kk, vv = k_buf[locs].float(), v_buf[locs].float()  # [n, kvh, d]
        qi = q[i * ndt:(i + 1) * ndt].float().view(ndt, kvh, g, dk)
        sc = torch.einsum("jkgd,nkd->jkgn", qi, kk) * sm_scale
        lim = (int(seq[i]) + 1 + shift + torch.arange(ndt, device=q.device)).clamp(max=n)  # visible keys per row
        vis = torch.arange(n, device=q.device)[None, :] < lim[:, None]  # [ndt, n]
        sc = sc.masked_fill(~vis[:, None, None, :], float("-inf"))
        o = torch.einsum("jkgn,nkd->jkgd", torch.softmax(sc, dim=-1), vv)
        out[i * ndt:(i + 1) * ndt] = o.reshape(ndt, h, dv)
    return out


def check_rows(out: torch.Tensor, ref: torch.Tensor, ndt: int) -> dict:
    """Per draft row (one token: all heads x Dv) of ``out`` against ``ref`` ([T, H, Dv]): max abs
    error, pass iff <= ATOL + RTOL * max |ref| of the row. Returns ``max_abs``, ``max_abs_by_draft``
    (ndt values: the worst request at each draft position), ``ref_max_abs``, ``worst_row``
    ([request, draft]), ``rows``, ``rows_failed``, ``nan_rows``, ``pass``, ``rtol``, ``atol``."""
    o = out.float()
    err = (o - ref).abs().flatten(1).amax(dim=1)  # [T]
    scale = ref.abs().flatten(1).amax(dim=1)
    nan = torch.isnan(o).flatten(1).any(dim=1)
    err = torch.where(nan, torch.full_like(err, float("inf")), err)
    bad = err > ATOL + RTOL * scale
    by_draft = err.view(-1, ndt).amax(dim=0)
    w = int(err.argmax())
    return dict(max_abs=float(err.max()), max_abs_by_draft=[float(x) for x in by_draft],
                ref_max_abs=float(scale.max()), worst_row=[w // ndt, w % ndt], rows=int(err.numel()),
                rows_failed=int(bad.sum()), nan_rows=int(nan.sum()), **{"pass": not bool(bad.any())},
                rtol=RTOL, atol=ATOL)


def upstream_layout(r2t, k_buf, v_buf, bs: int, ctx: int, ndt: int, device):
    """The TARGET_VERIFY inputs of SGLang's extend-shaped kernels for the same batch: draft K/V
    [T, KVH, D] gathered from the pool, kv_indptr [bs+1] int32 and flat kv_indices [bs*ctx] int64
    of the prefixes, qo_indptr [bs+1] int32, the FULL chain mask (uint8, ndt x (ctx + ndt) per
    request) and its mask_indptr [bs+1] int64. Built once, outside every timed call."""
    draft_locs = r2t[:, ctx:ctx + ndt].reshape(-1).long()
    k_ext, v_ext = k_buf[draft_locs].contiguous(), v_buf[draft_locs].contiguous()
    kv_indptr = torch.arange(0, (bs + 1) * ctx, ctx, device=device, dtype=torch.int32)
    kv_indices = r2t[:, :ctx].reshape(-1).long().contiguous()
    qo_indptr = torch.arange(0, (bs + 1) * ndt, ndt, device=device, dtype=torch.int32)
    mask_len = ndt * (ctx + ndt)
    mask_indptr = torch.arange(0, (bs + 1) * mask_len, mask_len, device=device, dtype=torch.int64)
    tri = torch.ones(ndt, ctx + ndt, dtype=torch.bool, device=device)
    tri[:, ctx:] = torch.tril(torch.ones(ndt, ndt, dtype=torch.bool, device=device))
    custom_mask = tri.reshape(-1).repeat(bs).to(torch.uint8)
    return k_ext, v_ext, kv_indptr, kv_indices, qo_indptr, custom_mask, mask_indptr


def launch_facts(name: str, s: dict, bs: int, ndt: int, ctx: int, mod=None, ours_shape=None,
                 ours_splits=None, device="cuda") -> dict:
    """The stage-1 launch of kernel ``name`` for this point, read from the kernel module's own
    functions and tables (``mod``: the upstream module the bench called): ``grid``, ``programs``,
    ``kv_splits`` (per request), ``prefix_reads`` (stage-1 programs that load each prefix KV
    block of one KV head: the q heads or head/row blocks sharing it), ``index`` (how it finds
    the KV slots), ``partials`` (dtype of the split partials)."""
    h, kvh, dk, dv = s["h"], s["kvh"], s["dk"], s["dv"]
    group = h // kvh
    if name == "extend":
        from sglang.kernels.ops.attention import extend_attention as ea

        block_m = ea._get_block_sizes_for_extend_attention(dk, dv)[3]
        mb = triton.cdiv(ndt, block_m)
        return dict(grid=[bs, h, mb], programs=bs * h * mb, kv_splits=1, prefix_reads=group * mb,
                    index="kv_indices int64 (flat, built before the call)", partials="none")
    if name in ("splitkv", "splitkv_installed"):
        n = mod.choose_n_splits(ctx)
        return dict(grid=[bs, h, n], programs=bs * h * n, kv_splits=n, prefix_reads=group,
                    index="kv_indices int64 (flat, built before the call)", partials="float32")
    if name == "shared_kv":
        block_h = mod.block_config(dk)[0]
        if group < h and group % block_h:
            block_h = group
        nhb = triton.cdiv(h, block_h)
        n = max(1, min(mod.MAX_N_SPLITS, mod.TARGET_PROGRAMS // max(1, bs * nhb)))
        return dict(grid=[bs, nhb, n], programs=bs * nhb * n, kv_splits=n,
                    kv_splits_active=max(1, min(n, ctx // mod.block_config(dk)[1])),
                    prefix_reads=triton.cdiv(group, block_h), block_h=block_h,
                    index="kv_indices int64 (flat, built before the call)", partials="bfloat16")
    if name.startswith("ours"):
        rb = ours_shape.row_blocks
        return dict(grid=[bs, kvh * rb, ours_splits], programs=bs * kvh * rb * ours_splits,
                    kv_splits=ours_splits, prefix_reads=rb, block_r=ours_shape.block_r,
                    index="req_to_token int32 (read in the kernel)", partials="float32")
    return {}


def run_point(name, s, ctx, bs, ndt, kernels=DEFAULT_KERNELS, upstream=None, block_rows=(), device="cuda",
              rep=100, num_sms=None):
    """One point: the same inputs for every kernel of ``kernels``; returns the row
    ``{shape, ctx, bs, ndt, kernels: {name: {ms, status, error, acc, launch, source}}}``.
    ``status``: ``ok``, ``inaccurate`` (ran, failed :func:`check_rows`; still timed),
    ``declined`` (returned False), ``error`` (raised), ``not_run`` (with ``error`` saying why).
    ``upstream``: ``{name: bench.upstream_kernels.UpstreamKernel}``; ``ms`` None off a GPU."""
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    h, kvh, dk, dv, rope = s["h"], s["kvh"], s["dk"], s["dv"], s["rope"]
    on_gpu = device != "cpu"
    dt = torch.bfloat16 if on_gpu else torch.float32  # the interpreter's bf16 dot is unusable
    inputs = make_inputs(s, ctx, bs, ndt, device, dtype=dt)
    boost_drafts(s, inputs, ndt)
    k_buf, v_buf, r2t, rpi, seq, q = inputs
    t = bs * ndt
    scale = dk ** -0.5
    ref = chain_reference(q, k_buf, v_buf, r2t, rpi, seq, ndt, scale)
    k_ext, v_ext, kv_indptr, kv_indices, qo_indptr, custom_mask, mask_indptr = upstream_layout(
        r2t, k_buf, v_buf, bs, ctx, ndt, device)
    sms = num_sms or (torch.cuda.get_device_properties(0).multi_processor_count if on_gpu else CPU_SMS)
    upstream = upstream or {}
    out = {}

    def run(kname, call, o, check=True, source=None, launch=None):
        r = out[kname] = dict(ms=None, status=None, error=None, acc=None, launch=launch or {}, source=source)
        try:
            ran = call()
            if on_gpu:
                torch.cuda.synchronize()
        except Exception as e:  # reported, not hidden
            r.update(status="error", error=f"{type(e).__name__}: {e}"[:300])
            return
        if ran is False:
            r.update(status="declined", error="returned False: its can_handle declined this problem")
            return
        if check:
            r["acc"] = check_rows(o, ref, ndt)
        r["status"] = "ok" if not check or r["acc"]["pass"] else "inaccurate"
        if on_gpu:
            try:
                r["ms"] = bench(call, rep)
            except Exception as e:  # noqa: BLE001
                r.update(status="error", error=f"timing: {type(e).__name__}: {e}"[:300])

    for kname in kernels:
        if kname == "decode":
            if on_gpu:
                out["decode"] = dict(ms=decode_ms(s, inputs, ndt, device, rep), status="ok", error=None,
                                     acc=None, launch={}, source="installed (timing only: one token per request)")
            else:
                out["decode"] = dict(ms=None, status="not_run", error="timing only: not run off a GPU",
                                     acc=None, launch={}, source=None)
        elif kname == "extend":
            o = torch.empty(t, h, dv, device=device, dtype=dt)
            run("extend", lambda o=o: extend_attention_fwd(q, k_ext, v_ext, o, k_buf, v_buf, qo_indptr, kv_indptr,
                                                           kv_indices, custom_mask, True, mask_indptr, ndt,
                                                           1.0, 1.0, scale),
                o, source="installed", launch=launch_facts("extend", s, bs, ndt, ctx))
        elif kname in ("splitkv", "shared_kv", "splitkv_installed"):
            k = upstream.get(kname)
            src = k.record() if k is not None else None
            if k is None or k.fn is None:
                out[kname] = dict(ms=None, status="error", acc=None, launch={}, source=src,
                                  error=(k.error if k is not None else "not loaded"))
                continue
            if kname == "splitkv_installed" and dk != dv:
                out[kname] = dict(ms=None, status="not_run", acc=None, launch={}, source=src,
                                  error="not run on MLA: this release's verify_splitkv neither masks head dims "
                                        "nor declines Dk != Dv (0.5.23 declines it: it faults there)")
                continue
            o = torch.empty(t, h, dv, device=device, dtype=dt)
            fn = k.fn
            run(kname, lambda o=o, fn=fn: fn(q, k_ext, v_ext, o, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices,
                                             custom_mask, True, mask_indptr, ndt, 1.0, 1.0, scale, max_bs=bs),
                o, source=src, launch=launch_facts(kname, s, bs, ndt, ctx, mod=k.mod))
        elif kname == "ours":
            for b in (0, *block_rows):
                shape = ChainVerifyShape(h, kvh, dk, dv, ndt, rope, b)
                ns = choose_num_kv_splits(shape, bs, sms)
                n_out, n_lse = workspace_numel(shape, bs, ns)
                ao, al = torch.empty(n_out, device=device), torch.empty(n_lse, device=device)
                o = torch.empty(t, h, dv, device=device, dtype=dt)
                run("ours" if not b else f"ours_r{b}",
                    lambda o=o, shape=shape, ns=ns, ao=ao, al=al: chain_verify_attention_fwd(
                        q, k_buf, v_buf, o, r2t, rpi, seq, shape, ns, scale, ao, al),
                    o, source="sglang_verify_graph (this checkout)",
                    launch=launch_facts("ours", s, bs, ndt, ctx, ours_shape=shape, ours_splits=ns))
        else:
            raise ValueError(f"unknown kernel {kname!r}")
    return dict(shape=name, ctx=ctx, bs=bs, ndt=ndt, kernels=out)


def ratios(row: dict) -> dict:
    """``{kernel: ours ms / kernel ms}`` for every other kernel of the row that was timed (ours
    and it both accurate or not: the row's statuses say)."""
    ks = row["kernels"]
    ours = ks.get("ours", {}).get("ms")
    return {k: ours / v["ms"] for k, v in ks.items() if k != "ours" and ours and v.get("ms")}


def summary_lines(rows: list[dict]) -> list[str]:
    """Per shape and kernel: ours / kernel over the points where both ran accurately (geometric
    mean, range, points where ours is faster), and the points where either was not accurate or
    did not run."""
    lines = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        rs = [r for r in rows if r["shape"] == shape]
        for k in dict.fromkeys(k for r in rs for k in r["kernels"]):
            if k == "ours":
                continue
            good, other = [], []
            for r in rs:
                a, b = r["kernels"].get("ours", {}), r["kernels"].get(k, {})
                if a.get("status") == "ok" and b.get("status") == "ok" and a.get("ms") and b.get("ms"):
                    good.append((r, a["ms"] / b["ms"]))
                else:
                    other.append(f"{r['ctx']}/{r['bs']}/{r['ndt']}:{k}={b.get('status')},ours={a.get('status')}")
            if good:
                v = [x for _, x in good]
                gm = math.exp(sum(map(math.log, v)) / len(v))
                lo, hi = min(good, key=lambda p: p[1]), max(good, key=lambda p: p[1])
                ahead = sum(x < 1 for x in v)
                lines.append(f"SUMMARY {shape} ours/{k}: geomean {gm:.3f} over {len(v)} points, "
                             f"{lo[1]:.3f} (ctx {lo[0]['ctx']} bs {lo[0]['bs']} ndt {lo[0]['ndt']}) .. "
                             f"{hi[1]:.3f} (ctx {hi[0]['ctx']} bs {hi[0]['bs']} ndt {hi[0]['ndt']}); "
                             f"ours faster at {ahead}/{len(v)}")
            if other:
                lines.append(f"SUMMARY {shape} ours/{k}: not compared at {len(other)} points "
                             f"(ctx/bs/ndt:status): {' '.join(other[:6])}{' ...' if len(other) > 6 else ''}")
    return lines


def structure_lines(rows: list[dict]) -> list[str]:
    """Per shape and draft length, each kernel's stage-1 launch at the smallest and largest bs of
    the rows (programs, KV splits, prefix reads per KV block, index source, partials dtype)."""
    lines = []
    seen = set()
    for r in rows:
        key = (r["shape"], r["ndt"], r["ctx"])
        bss = sorted({x["bs"] for x in rows if (x["shape"], x["ndt"], x["ctx"]) == key})
        if key in seen or r["ctx"] != max(x["ctx"] for x in rows if x["shape"] == r["shape"]):
            continue
        seen.add(key)
        for bs in (bss[0], bss[-1]) if len(bss) > 1 else bss[:1]:
            rr = next(x for x in rows if (x["shape"], x["ndt"], x["ctx"], x["bs"]) == (*key, bs))
            parts = []
            for k, v in rr["kernels"].items():
                f = v.get("launch") or {}
                if f:
                    parts.append(f"{k} {f['programs']} progs x{f['kv_splits']} splits reads/KV-block "
                                 f"{f['prefix_reads']} {f['index'].split(' ')[0]} {f['partials']}")
            lines.append(f"LAUNCH {r['shape']} ndt={r['ndt']} ctx={r['ctx']} bs={bs}: " + "; ".join(parts))
    return lines


# The tuning search: KV-split policy (programs per SM, split cap) x stage-1 launch settings.
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


def make_inputs(s, ctx, bs, ndt, device="cuda", dtype=torch.bfloat16):
    """One point's KV pool, page table and q (seeded by ctx + bs): (k_buf [S, KVH, Dk],
    v_buf [S, KVH, Dv], req_to_token [bs, ctx + ndt] int32 (random distinct slots >= 1),
    req_pool_indices [bs] int64, seq_lens [bs] int64 (= ctx), q [bs * ndt, H, Dk]), floats in
    ``dtype``; for MLA (``rope``) v_buf is a view of k_buf's first dv columns."""
    torch.manual_seed(ctx + bs)
    h, kvh, dk, dv, rope = s["h"], s["kvh"], s["dk"], s["dv"], s["rope"]
    dt = dtype
    slots = bs * (ctx + ndt) + 1
    k_buf = torch.randn(slots, kvh, dk, device=device, dtype=dt)
    v_buf = k_buf[..., :dv] if rope else torch.randn(slots, kvh, dv, device=device, dtype=dt)
    perm = torch.randperm(slots - 1, device=device) + 1
    r2t = perm.view(-1)[: bs * (ctx + ndt)].view(bs, ctx + ndt).to(torch.int32).contiguous()
    rpi = torch.arange(bs, device=device, dtype=torch.int64)
    seq = torch.full((bs,), ctx, device=device, dtype=torch.int64)
    q = torch.randn(bs * ndt, h, dk, device=device, dtype=dt)
    return k_buf, v_buf, r2t, rpi, seq, q


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


def decode_ms(s, inputs, ndt, device="cuda", rep=100):
    """ms per call of SGLang's ``decode_attention_fwd`` on the first token of each request (ctx + 1
    keys), as a plain decode step runs it."""
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
    from sglang.srt.layers.attention.triton_backend import _mla_decode_kv_splits_cap

    k_buf, v_buf, r2t, rpi, seq, q = inputs
    bs, h, dk, dv, rope = rpi.shape[0], s["h"], s["dk"], s["dv"], s["rope"]
    ctx = int(seq[0])
    max_splits = _mla_decode_kv_splits_cap(8, 132, 32768) if rope else 8
    d_indptr = torch.arange(0, (bs + 1) * (ctx + 1), ctx + 1, device=device, dtype=torch.int32)
    d_indices = r2t[:, :ctx + 1].reshape(-1).long().contiguous()
    qd = q.view(bs, ndt, h, dk)[:, 0].contiguous()
    od = torch.empty(bs, h, dv, device=device, dtype=q.dtype)
    logits = torch.empty(bs, h, max_splits, dv, device=device, dtype=torch.float32)
    lse = torch.empty(bs, h, max_splits, device=device, dtype=torch.float32)
    nsp = torch.full((bs,), max_splits, device=device, dtype=torch.int32)
    f = lambda: decode_attention_fwd(qd, k_buf, v_buf, od, d_indptr, d_indices, logits, lse, nsp, max_splits,
                                     dk ** -0.5, 1.0, 1.0, has_mla=bool(rope))
    f()
    return bench(f, rep)


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


def print_table(rows: list[dict], kernels) -> None:
    """The per-point table: ms per kernel (its status instead when it has no time), ours / each,
    and the kernels that were not accurate or did not run."""
    shown = [k for k in dict.fromkeys(k for r in rows for k in r["kernels"])]
    others = [k for k in shown if k != "ours"]
    print(f"{'shape':12s} {'ctx':>6s} {'bs':>3s} {'ndt':>3s} " + " ".join(f"{k[:10]:>10s}" for k in shown)
          + " " + " ".join(f"{'o/' + k[:8]:>10s}" for k in others) + "  not ok")
    for r in rows:
        ks, rat = r["kernels"], ratios(r)
        cells = []
        for k in shown:
            v = ks.get(k)
            cells.append(f"{'-':>10s}" if v is None else f"{v['ms']:10.4f}" if v.get("ms") else f"{v['status'][:10]:>10s}")
        bad = [f"{k}:{v['status']}" for k, v in ks.items() if v["status"] != "ok"]
        print(f"{r['shape'][:12]:12s} {r['ctx']:6d} {r['bs']:3d} {r['ndt']:3d} " + " ".join(cells) + " "
              + " ".join(f"{rat[k]:10.3f}" if k in rat else f"{'-':>10s}" for k in others)
              + "  " + (" ".join(bad) or "-"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench kernel", description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 8192, 16384])
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--ndt", type=int, nargs="+", default=[3])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    ap.add_argument("--kernels", nargs="+", default=list(DEFAULT_KERNELS),
                    help=f"which columns, of {', '.join(KERNELS)}")
    ap.add_argument("--upstream-src", default=os.environ.get("BENCH_UPSTREAM_SRC") or None,
                    help="SGLang source for splitkv / shared_kv: a folder holding sglang/ (or it), or a "
                         "tarball of one (env BENCH_UPSTREAM_SRC); default: the installed SGLang")
    ap.add_argument("--block-rows", type=int, nargs="*", default=[],
                    help="also time ours with ChainVerifyShape.block_rows forced to each of these (16, 32)")
    ap.add_argument("--reps", type=int, default=100, help="timed graph replays per kernel and point")
    ap.add_argument("--budget-s", type=float, default=0,
                    help="start no new point after this many seconds (0: no limit); the rest are listed as skipped")
    ap.add_argument("--num-sms", type=int, default=None,
                    help=f"SM count for ours' split choice (default: the GPU's; {CPU_SMS} with --device cpu)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: every kernel once under TRITON_INTERPRET=1 (float32), checked, not timed")
    ap.add_argument("--out", default=None)
    ap.add_argument("--dry-run", action="store_true", help="print the points and kernel sources and exit (no GPU)")
    ap.add_argument("--tune", action="store_true", help="the launch-setting search instead of the columns")
    ap.add_argument("--focus", nargs="+", default=["16384:16:4", "16384:8:3", "16384:1:3", "1024:16:4"],
                    help="ctx:bs:ndt points where --tune tries every candidate")
    ap.add_argument("--top", type=int, default=3, help="--tune: candidates carried to every point")
    a = ap.parse_args(argv)
    bad = [b for b in a.block_rows if b not in BLOCK_R_CHOICES]
    if bad:
        ap.error(f"--block-rows {bad}: the kernel takes {BLOCK_R_CHOICES}")
    bad = [k for k in a.kernels if k not in KERNELS]
    if bad:
        ap.error(f"--kernels {bad}: known kernels are {', '.join(KERNELS)}")
    bad = [n for n in a.shapes if n not in SHAPES]
    if bad:
        ap.error(f"--shapes {bad}: known shapes are {', '.join(SHAPES)}")
    bad = [f"{k} {v}" for k, vs in (("--contexts", a.contexts), ("--bs", a.bs), ("--ndt", a.ndt),
                                    ("--reps", [a.reps]), ("--num-sms", [a.num_sms or 1])) for v in vs if v < 1]
    if bad:
        ap.error(f"{bad[0]}: must be >= 1")
    if a.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        ap.error("--device cpu runs the kernels under the Triton interpreter: set TRITON_INTERPRET=1")
    if a.device == "cpu" and a.tune:
        ap.error("--tune times kernels: it needs --device cuda")
    if a.tune and a.dry_run:
        for name in a.shapes:
            n = len(tune_candidates())
            print(f"KERNEL dry-run tune {name}: {n} candidates x focus {a.focus}; top {a.top} + policy at "
                  f"contexts={a.contexts} bs={a.bs} ndt={a.ndt}")
        return 0
    if a.tune:
        rec = run_tune(a)
        rec["device"] = torch.cuda.get_device_name(0)
        print_tune(rec)
        if a.out:
            json.dump(rec, open(a.out, "w"), indent=1)
        return 0
    from bench import upstream_kernels as uk

    want = [k for k in a.kernels if k in ("splitkv", "shared_kv")]
    try:
        upstream = uk.load_kernels(want, a.upstream_src) if want else {}
    except uk.UpstreamLoadError as e:
        ap.error(str(e))
    if "splitkv_installed" in a.kernels:
        upstream["splitkv_installed"] = uk.load_kernels(["splitkv"])["splitkv"]
        upstream["splitkv_installed"].name = "splitkv_installed"
    prov = uk.describe(upstream)
    for ln in prov:
        print(ln, flush=True)
    if a.dry_run:
        for name in a.shapes:
            for ndt in a.ndt:
                s = SHAPES[name]
                pol = ChainVerifyShape(s["h"], s["kvh"], s["dk"], s["dv"], ndt, s["rope"]).block_r
                print(f"KERNEL dry-run {name} ndt={ndt} policy block_r={pol} contexts={a.contexts} "
                      f"bs={a.bs} forced={a.block_rows} kernels={a.kernels}")
        return 0
    on_gpu = a.device == "cuda"
    dev = torch.cuda.get_device_name(0) if on_gpu else "cpu (Triton interpreter, float32, not timed)"
    import sglang

    meta = dict(device=dev, torch=torch.__version__, triton=triton.__version__,
                sglang_installed=getattr(sglang, "__version__", "-"), upstream_src=a.upstream_src,
                upstream={k: v.record() for k, v in upstream.items()}, kernels=a.kernels, reps=a.reps,
                num_sms=a.num_sms,
                tolerance=dict(rtol=RTOL, atol=ATOL, per="draft row (one token, all heads x Dv)"),
                inputs="random normal q/K/V; draft keys raised so their mean score is ln(keys) (boost_drafts)",
                timing="CUDA-graph replay median, ms per call (one layer); kv_indices / masks built outside "
                       "the timed call" if on_gpu else None,
                argv=list(argv) if argv is not None else None)
    points = [(n, c, b, d) for n in a.shapes for c in a.contexts for b in a.bs for d in a.ndt]
    rows, skipped = [], []
    t0 = time.monotonic()

    def dump():
        if a.out:
            with open(a.out, "w") as fh:
                json.dump(dict(meta, rows=rows, skipped=skipped, summary=summary_lines(rows),
                               elapsed_s=time.monotonic() - t0), fh, indent=1)

    for name, ctx, bs, ndt in points:
        if a.budget_s and time.monotonic() - t0 > a.budget_s:
            skipped.append(dict(shape=name, ctx=ctx, bs=bs, ndt=ndt, reason=f"--budget-s {a.budget_s:g} reached"))
            continue
        tp = time.monotonic()
        r = run_point(name, SHAPES[name], ctx, bs, ndt, a.kernels, upstream, a.block_rows, a.device, a.reps,
                      a.num_sms)
        r["wall_s"] = round(time.monotonic() - tp, 2)  # the point's whole time: inputs, reference, calls, timing
        rows.append(r)
        print("KERNEL " + json.dumps(r), flush=True)
        dump()
    print(f"\n{dev}, torch {torch.__version__}, triton {triton.__version__}, sglang {meta['sglang_installed']}; "
          + ("ms per layer, CUDA-graph replay median" if on_gpu else "accuracy only"))
    for ln in prov:
        print(ln[:300])
    print_table(rows, a.kernels)
    if skipped:
        print(f"SKIPPED {len(skipped)} points (--budget-s {a.budget_s:g}): "
              + " ".join(f"{p['shape']}/{p['ctx']}/{p['bs']}/{p['ndt']}" for p in skipped[:20]))
    for ln in structure_lines(rows) + summary_lines(rows):
        print(ln)
    dump()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Tables of a ``python -m bench kernel`` result file (its ``--out`` JSON) for ``python -m bench
report``: which kernel ran, from which source, how fast against ours, and how accurate. No torch
import: it reads the file only."""

from __future__ import annotations

import math
import shlex

LABEL = {"decode": "`decode_attention_fwd` (1 token)", "extend": "`extend_attention_fwd` (CUDA path today)",
         "splitkv": "`verify_splitkv_fwd`", "shared_kv": "`verify_shared_kv_fwd`", "ours": "chain kernel (ours)"}
SHAPE = {"llama8b_tp1": "Llama-3.1-8B, TP 1 (32 q / 8 KV heads, 128)",
         "kimi_tp8_mla": "Kimi-K2.5 TP-8 shard, MLA (8 heads, 576 / 512)"}
VERIFY = ("extend", "splitkv", "shared_kv")  # the upstream kernels that serve a verify step
SUMMARY_HEAD = ["shape", "against", "ours / it (geomean)", "range", "ours faster", "not compared", "its rows off"]
POINT_HEAD = ["shape", "ctx", "bs", "decode", "extend", "splitkv", "shared_kv", "ours", "ours / best upstream verify"]


def note(raw: dict) -> str:
    """One paragraph: device, versions, where each upstream kernel came from, timing and the
    accuracy rule of the file."""
    src = "; ".join(f"{k} from the {u['version']} {u['origin']} ({u['module']}.py)" for k, u in raw["upstream"].items())
    tol = raw["tolerance"]
    return (f"{raw['device']}, torch {raw['torch']}, triton {raw['triton']}, installed SGLang "
            f"{raw['sglang_installed']} (decode, extend); {src}; each kernel called directly, whatever its "
            f"production gate says; ours with its own KV-split choice. Timing: {raw['timing']}; "
            f"{raw['reps']} replays. Every "
            f"verify kernel's output is checked per draft row against a float32 reference (pass iff max abs "
            f"error <= {tol['atol']:g} + {tol['rtol']:g} x max |ref| of the row); inputs: {raw['inputs']}.")


def _ok_ms(k: dict) -> float | None:
    return k["ms"] if k.get("status") == "ok" and k.get("ms") else None


def summary_rows(raw: dict) -> list[list[str]]:
    """Per shape and other kernel: ours / it over the points where both ran and passed (geometric
    mean, range, points where ours is faster), the points not compared by its status, and its
    draft rows that failed the accuracy check."""
    out = []
    for shape in dict.fromkeys(r["shape"] for r in raw["rows"]):
        rows = [r for r in raw["rows"] if r["shape"] == shape]
        for k in [k for k in raw["kernels"] if k != "ours"]:
            pairs, other = [], {}
            for r in rows:
                a, b = _ok_ms(r["kernels"]["ours"]), _ok_ms(r["kernels"].get(k, {}))
                if a and b:
                    pairs.append(a / b)
                else:
                    st = r["kernels"].get(k, {}).get("status", "absent")
                    other[st] = other.get(st, 0) + 1
            acc = [r["kernels"][k]["acc"] for r in rows if (r["kernels"].get(k) or {}).get("acc")]
            off = f"{sum(a['rows_failed'] for a in acc)} / {sum(a['rows'] for a in acc)}" if acc else "-"
            geo = f"{math.exp(sum(map(math.log, pairs)) / len(pairs)):.3f}" if pairs else "-"
            span = f"{min(pairs):.3f}-{max(pairs):.3f}" if pairs else "-"
            out.append([SHAPE.get(shape, shape), LABEL.get(k, k), geo, span,
                        f"{sum(p < 1 for p in pairs)} / {len(pairs)}",
                        ", ".join(f"{n} {st}" for st, n in other.items()) or "-", off])
    return out


def point_rows(raw: dict, ndt: int, bs: tuple = (1, 8, 32)) -> list[list[str]]:
    """ms per kernel at ``ndt`` draft tokens and the batch sizes ``bs`` (a kernel's status where it
    has no accurate time), and ours / the fastest accurate upstream verify kernel."""
    out = []
    for r in raw["rows"]:
        if r["ndt"] != ndt or r["bs"] not in bs:
            continue
        ks = r["kernels"]
        cells = [f"{ks[k]['ms']:.4f}" if _ok_ms(ks.get(k, {})) else (ks.get(k) or {}).get("status", "-")
                 for k in ("decode", *VERIFY, "ours")]
        best = min((_ok_ms(ks[k]) for k in VERIFY if k in ks and _ok_ms(ks[k])), default=None)
        ours = _ok_ms(ks["ours"])
        out.append([SHAPE.get(r["shape"], r["shape"]).split(",")[0], str(r["ctx"]), str(r["bs"])] + cells
                   + [f"{ours / best:.3f}" if ours and best else "-"])
    return out


def command(raw: dict) -> str:
    """The GPU-job line that reruns the file's grid (its ``argv`` without ``--out``)."""
    argv, words = raw["argv"], []
    skip = False
    for w in argv:
        if skip or w == "--out":
            skip = not skip
            continue
        words.append(w)
    value = shlex.join(words).replace('"', '\\"')
    return f'SUITE=kbench KBENCH_TMO=480 KBENCH_ARGS="{value}" bash scripts/gpu_job.sh'

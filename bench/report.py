"""Render the results reference from the raw result files: ``python -m bench report``.

Inputs: ``docs/runs/manifest.json`` (a list of tables, each naming its raw JSON files in
``docs/runs/``, as written by ``python -m bench verify``, ``speedup``, ``capture``, ``demo`` and
the e2e tier) and those files. Outputs, all rendered from them and nothing else (no
clock, no environment): ``docs/results.md``, and the block between ``<!-- results:begin -->`` and
``<!-- results:end -->`` in ``README.md`` and ``docs/upstream_pr.md``, the kernel head to head in
the PR text (``<!-- kernel-h2h:begin -->``), the mutation table of ``docs/testing.md`` (``bench.mutation_table``).

``main(argv) -> int``: 0 after writing; with ``--check`` nothing is written, and 1 with one line
on stderr when a committed file differs from what would be rendered (2 for a missing marker,
manifest entry or raw file). Ratios are computed here from the stored milliseconds and tokens/s
(``a / b`` rounded half-even by ``format``), not read from the files' rounded ratio fields.
"""

import argparse
import json
import os
import re
import shlex
import sys
from typing import Dict, List, Optional, Sequence

from bench import mutation_table
from bench.lib.markers import splice

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFEST = os.path.join("docs", "runs", "manifest.json")
RESULTS = os.path.join("docs", "results.md")
BLOCKS = ("README.md", os.path.join("docs", "upstream_pr.md"))
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
CTX = {1024: "1k", 4096: "4k", 8192: "8k", 16384: "16k"}
# runner-local arguments the GPU job supplies itself; dropped when a file's command is shown
LOCAL = {"--out", "--md", "--log-dir", "--models-dir", "--mode-timeout", "--pair-dir"}
SUITE = {"verify": ("bench", "BENCH_ARGS"), "speedup": ("speedup", "SPEEDUP_ARGS"), "kv_splits": ("speedup", "SPEEDUP_ARGS"),
         "capture": ("capture", "CAPTURE_ARGS")}


class ReportError(Exception):
    """A manifest entry, raw file or marker the renderer needs is missing or malformed."""


def _load(root: str, name: str) -> dict:
    path = os.path.join(root, "docs", "runs", name)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ReportError(f"docs/runs/{name}: {e}") from e


def _r(x: Optional[float], places: int) -> str:
    return "-" if x is None else f"{x:.{places}f}"


def _ratio(a: Optional[float], b: Optional[float], places: int = 2) -> str:
    return "-" if a is None or not b else f"{a / b:.{places}f}"


def _span(values: List[float], places: int = 2) -> str:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return "-"
    lo, hi = f"{vals[0]:.{places}f}", f"{vals[-1]:.{places}f}"
    return lo if lo == hi else f"{lo}-{hi}"


def _table(head: Sequence[str], rows: List[Sequence[str]]) -> List[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def gpu_job_command(command: str, kind: str, env: str = "") -> str:
    """The ``SUITE=... bash scripts/gpu_job.sh`` line that reruns a raw file's own command
    (``meta.command``: a bench script and its arguments, the runner-local ones dropped); ``env``:
    settings placed after ``SUITE=`` (e.g. longer time limits)."""
    words = shlex.split(command)
    script = next(i for i, w in enumerate(words) if w.endswith(".py"))
    args, it = [], iter(words[script + 1:])
    for w in it:
        if w in LOCAL:
            next(it, None)
        else:
            args.append(w)
    suite, var = SUITE[kind]
    head = f"SUITE={suite} {env} ".replace("  ", " ")
    if not args:
        return f"{head}bash scripts/gpu_job.sh"
    value = shlex.join(args).replace('"', '\\"')
    return f'{head}{var}="{value}" bash scripts/gpu_job.sh'


def _replays(raw: dict, mode: str = "ours") -> str:
    """``replays / verify_steps, N fallbacks`` from a bench file's ``meta.mode_status`` (``mode``
    may name one num_steps, e.g. ``ours@3``; merged files join several statuses with ``+``)."""
    rep = steps = fb = 0
    found = False
    for m, status in raw["meta"]["mode_status"].items():
        if m == mode or (m.split("@")[0] == mode and "@" not in mode):
            for got in re.findall(r"replays=(\d+) verify_steps=(\d+) fallbacks=(\d+)", status):
                found = True
                rep, steps, fb = rep + int(got[0]), steps + int(got[1]), fb + int(got[2])
    if not found:
        return "ours' replay counters not recorded (its points read from its log)"
    return f"ours replayed {rep} / {steps} verify steps, {fb} fallbacks"


def _versions(raw: dict) -> str:
    v, hw = raw["meta"]["versions"], raw["meta"]["hardware"].split(",")[0]
    return f"{hw}, sglang {v['sglang']}, torch {v['torch']}, triton {v['triton']}"


# ----------------------------------------------------------------------------- the tables
def render_demo(spec: dict, root: str) -> List[str]:
    d = _load(root, spec["files"][0])
    rows = [[t["mode"], _r(t["step_ms_c1"], 2), _r(t["step_per_plain"], 2), _r(t["verify_ms_c1"], 2),
             _r(t["verify_per_plain_step"], 2), _r(t["tok_s_c1"], 1), _r(t["tok_s_c8"], 1)] for t in d["table"]]
    vcg = d["modes"]["ours"]["verify_cuda_graph"][-1]
    outs = {m: d["modes"][m]["output_ids_c1"] for m in d["modes"]}
    same = "identical" if len({json.dumps(o) for o in outs.values()}) == 1 else "NOT identical"
    return [f"{d['model']}, context {d['context']}, {d['new_tokens']} tokens, num_steps {d['num_steps']}, "
            f"medians of {d['repeats']} rounds; step ms from the client at concurrency 1, verify ms from the "
            f"per-phase profile. Ours replayed {vcg['replays']} / {vcg['verify_steps']} verify steps; greedy "
            f"output {same} across the three servers. Dummy weights accept nothing: a cost, not a speed-up.", ""
            ] + _table(["mode", "step ms (c=1)", "step / plain", "verify ms (device)", "verify / plain step",
                        "tok/s c=1", f"tok/s c={d['concurrency']}"], rows)


def _speed_cells(row: dict) -> List[str]:
    sp = row["speedup"]
    return [f"**{sp['ours_over_plain']:.2f}**", f"{sp['upstream_over_plain']:.2f}", f"{sp['ours_over_upstream']:.2f}"]


def render_speedup(spec: dict, root: str) -> List[str]:
    d = _load(root, spec["files"][0])
    rows = [[CTX[r["context"]], str(r["bs"]), _r(r["ours"]["decode_accept_length"], 2),
             _r(r["plain"]["decode_server_tok_s"], 0), _r(r["upstream"]["decode_server_tok_s"], 0),
             _r(r["ours"]["decode_server_tok_s"], 0)] + _speed_cells(r) for r in d["rows"]]
    gaps = [a["gap_pct"] for a in d["advisor"]]
    worst = max(gaps, key=abs)
    after = d["modes"]["ours"]["plugin_after"]
    matched = {m: sum(p["outputs_match"] for p in d["modes"][m]["phases"]) for m in ("upstream", "ours")}
    asked = {m: sum(p["bs"] for p in d["modes"][m]["phases"]) for m in ("upstream", "ours")}
    return [f"A constructed (not dummy) Llama-3.1-8B-shape target and EAGLE-3 draft whose agreement is set per "
            f"request class, num_steps {d['meta']['flags'].split('steps=')[1].split()[0]}, triton, greedy; three "
            f"engines in one run (plain / upstream EAGLE-3 / ours). Decode tokens/s per server; every ratio "
            f"against the plain engine of the same run. Accept = SGLang's decode accept length.", "",
            f"Checks in the run: requests matching the pair's greedy output, upstream {matched['upstream']} / "
            f"{asked['upstream']}, ours {matched['ours']} / {asked['ours']}; ours {after['replays']} / "
            f"{after['verify_steps']} verify steps replayed, {after['fallback_total']} fallbacks. "
            f"`python -m sglang_verify_graph.advisor`, fed each point's phase times and accept length, "
            f"predicts all {len(gaps)} speed-ups within {abs(worst):.1f}%.", ""
            ] + _table(["ctx", "bs", "accept", "plain tok/s", "upstream tok/s", "ours tok/s", "ours / plain",
                        "upstream / plain", "ours / upstream"], rows)


def render_kv_splits(spec: dict, root: str) -> List[str]:
    pair, tuned = (_load(root, f) for f in spec["files"])
    p8 = {(p["context"], p["bs"]): p for p in pair["modes"]["plain"]["phases"]}
    p32 = {(p["context"], p["bs"]): p for p in tuned["modes"]["plain"]["phases"]}
    cls = {r["cls"] for r in tuned["rows"]}
    ours = {(r["context"], r["bs"]): r for r in pair["rows"] if r["cls"] in cls}
    rows = []
    for r in tuned["rows"]:
        k = (r["context"], r["bs"])
        dec = [p[k]["roles"]["target_decode"]["gpu_ms"] for p in (p8, p32)]
        tok = ours[k]["ours"]["decode_server_tok_s"]
        rows.append([CTX[k[0]], str(k[1]), f"{dec[0]:.2f} / {dec[1]:.2f}",
                     f"{ours[k]['plain']['decode_server_tok_s']:.0f} / {r['plain']['decode_server_tok_s']:.0f}",
                     f"{_ratio(tok, ours[k]['plain']['decode_server_tok_s'])} / "
                     f"**{_ratio(tok, r['plain']['decode_server_tok_s'])}**"])
    acc = sorted({round(ours[k]["ours"]["decode_accept_length"], 2) for k in ours})
    return [f"SGLang's triton decode splits each request's KV into at most `--triton-attention-num-kv-splits` "
            f"parts (default 8). The same plain engine with 32 splits, against ours of the table above at "
            f"accept {_span(acc)} (ours and upstream ran with the default):", ""
            ] + _table(["ctx", "bs", "plain decode ms, 8 / 32 splits", "plain tok/s, 8 / 32 splits",
                        "ours / plain, 8 / 32 splits"], rows)


def _verify_rows(spec: dict, root: str) -> tuple:
    """The manifest entry's rows with both speculative modes measured, keyed (ctx, bs); a later
    file's row replaces an earlier one's."""
    by, raws = {}, []
    for name in spec["files"]:
        raw = _load(root, name)
        raws.append(raw)
        for r in raw["rows"]:
            if r.get("ours_verify_ms") and r.get("upstream_verify_ms") and (
                    "num_steps" not in spec or r["num_steps"] == spec["num_steps"]):
                by[(r["context"], r["bs"])] = r
    return [by[k] for k in sorted(by)], raws


def verify_summary(rows: List[dict]) -> Dict[str, str]:
    """Ranges over a verify table's rows: ours and upstream verify / decode, ours / upstream."""
    return {"ours": _span([r["ours_verify_ms"] / r["decode_ms"] for r in rows]),
            "upstream": _span([r["upstream_verify_ms"] / r["decode_ms"] for r in rows]),
            "ratio": _span([r["ours_verify_ms"] / r["upstream_verify_ms"] for r in rows], 3)}


def render_verify(spec: dict, root: str) -> List[str]:
    rows, raws = _verify_rows(spec, root)
    steps = rows[0]["num_steps"]
    de = "ours_draft_extend_ms" in rows[0]
    head = ["ctx", "bs", "decode ms", "upstream verify / decode", "ours verify / decode",
            "upstream cycle / decode", "ours cycle / decode", "ours / upstream verify"]
    head += ["draft extend ms, upstream / ours"] if de else []
    cells = []
    for r in rows:
        c = [CTX[r["context"]], str(r["bs"]), _r(r["decode_ms"], 3), _ratio(r["upstream_verify_ms"], r["decode_ms"]),
             f"**{_ratio(r['ours_verify_ms'], r['decode_ms'])}**", _ratio(r["upstream_cycle_ms"], r["decode_ms"]),
             _ratio(r["ours_cycle_ms"], r["decode_ms"]), _ratio(r["ours_verify_ms"], r["upstream_verify_ms"], 3)]
        if de:
            c.append(f"{r['upstream_draft_extend_ms']:.3f} / {r['ours_draft_extend_ms']:.3f}")
        cells.append(c)
    s = verify_summary(rows)
    mode = f"ours@{spec['num_steps']}" if "num_steps" in spec else "ours"
    merged = " (points merged from several GPU calls, `--merge`)" if any("merged_from" in r["meta"] for r in raws) else ""
    return [f"num_steps {steps} ({steps + 1} draft tokens), {_versions(raws[0])}; "
            f"{'; '.join(_replays(r, mode) for r in raws)}{merged}. Ours verify / decode {s['ours']}, upstream "
            f"{s['upstream']}, ours / upstream {s['ratio']}.", ""] + _table(head, cells)


def render_e2e(spec: dict, root: str) -> List[str]:
    rows = []
    for name, label in zip(spec["files"], spec["labels"]):
        e = _load(root, name)
        par = e["parity"]
        after = e["ours_after_parity"]
        rows.append([label, " / ".join(f"{par[k]['identical']}" for k in ("ours_vs_upstream", "ours_vs_plain",
                                                                          "upstream_vs_plain")),
                     f"{after['replays']} / {after['verify_steps']}", str(after["fallback_total"]),
                     f"{after['draft_extend']['replays']} / {after['draft_extend']['eager']}"])
    return ["The e2e tier on `python -m sglang.launch_server`: greedy parity over 16 prompts, counters at "
            "concurrency 1, 2, 4, 8, num_steps 3.", ""] + _table(
        ["MoE path", "identical outputs: ours-upstream / ours-plain / upstream-plain", "verify steps replayed",
         "fallbacks", "draft extend: replays / eager"], rows)


def render_capture(spec: dict, root: str) -> List[str]:
    rows, cmds = [], []
    for name in spec["files"]:
        c = _load(root, name)
        m, s = c["summary"]["modes"], c["summary"]
        rows.append([c["meta"]["model"], str(m["ours"]["n"]),
                     f"{m['ours']['median_s']:.2f} ({m['ours']['min_s']:.2f}-{m['ours']['max_s']:.2f})",
                     f"{m['upstream']['median_s']:.2f} ({m['upstream']['min_s']:.2f}-{m['upstream']['max_s']:.2f})",
                     f"**{s['ours_per_upstream']['time']:.3f}**",
                     f"{m['ours']['median_gib']:.3f} / {m['upstream']['median_gib']:.3f}"])
        cmds.append(gpu_job_command(c["meta"]["command"], "capture", spec.get("env", {}).get(name, "")))
    return (["Alternating engine starts per mode, warm kernel cache; seconds and GiB from each engine's "
             "capture log line (a negative GiB: SGLang's free-memory drop read below zero).", ""]
            + _table(["target", "starts per mode", "ours s: median (min-max)", "upstream s: median (min-max)",
                      "ours / upstream time", "graph GiB, ours / upstream"], rows)
            + ["", "Reproduce with " + "; ".join(f"`{c}`" for c in cmds) + "."])


def render_coverage(spec: dict, root: str) -> List[str]:
    """The prefix pair's fault coverage (``python -m bench models coverage`` files) and their commands."""
    from bench.models.accept_pair import coverage

    files = [_load(root, name) for name in spec["files"]]
    return ([coverage.TABLE_NOTE, ""] + _table(coverage.TABLE_HEAD, coverage.table_rows(files))
            + ["", "Reproduce with " + "; ".join(f"`{c['command']}`" for c in files) + "."])


def render_kbench(spec: dict, root: str, points: bool = False) -> List[str]:
    """The verify-attention kernels head to head (``python -m bench kernel`` files): per shape and
    kernel ours / it; with ``points``, ms per layer at ``spec['ndt']`` draft tokens; the command."""
    from bench.kernel import table

    out: List[str] = []
    for raw in [_load(root, name) for name in spec["files"]]:
        out += [table.note(raw), ""] + _table(table.SUMMARY_HEAD, table.summary_rows(raw)) + [""]
        out += ([f"ms per layer at {spec['ndt']} draft tokens:", ""]
                + _table(table.POINT_HEAD, table.point_rows(raw, spec["ndt"])) + [""]) if points else []
        out.append(f"Reproduce with `{table.command(raw)}`.")
    return out


RENDER = {"demo": render_demo, "speedup": render_speedup, "kv_splits": render_kv_splits,
          "verify": render_verify, "e2e": render_e2e, "capture": render_capture,
          "coverage": render_coverage, "kbench": render_kbench}


# ----------------------------------------------------------------------------- the documents
METHOD = """\
How these are measured (the code is the reference: `bench/verify/`, `bench/speedup/`,
`bench/capture.py`, `bench/lib/verify_probe.py`):

* **Verify cost** (`python -m bench verify`): a fresh `sglang.Engine` per mode in its own subprocess:
  `plain` (no speculation), `upstream` (EAGLE-3, top-k 1: SGLang's own verify graph) and `ours`
  (the same with `--enable-verify-cuda-graph`). CUDA events around every graph replay in the
  scheduler process; each figure is the **median GPU ms per replay** of the whole batch. decode =
  the plain engine's decode step; cycle = draft decode + verify + draft extend. Dummy weights accept
  nothing, so `verify / decode` is the cost of a verify step in decode steps, not a speed-up.
  Every ratio divides by the plain engine of the same run.
* **Speed-up** (`python -m bench speedup`): a constructed target and draft whose agreement is set per
  request, so SGLang's accept length is known; decode tokens/s = (N - 1) tokens over the time of an
  N-token request minus a 1-token one, medians of 3.
* **Capture** (`python -m bench capture`): engine starts alternating between modes.
* **Fault coverage** (`python -m bench models coverage`, on a CPU): the prefix-reading pair's
  simulator counts the single KV-read faults that change an output token.

Each table names the one command that reproduces it on a GPU machine (`docs/gpu_testing.md`) and
its raw file in `docs/runs/`. This file is rendered by `python -m bench report` from
`docs/runs/manifest.json`; do not edit it by hand. Past runs and superseded settings:
`docs/history.md`."""


def render_results(manifest: dict, root: str) -> str:
    out = ["# Results", "", METHOD]
    for spec in manifest["tables"]:
        kind = spec["kind"]
        if kind not in RENDER:
            raise ReportError(f"{MANIFEST}: table {spec.get('id')!r} has unknown kind {kind!r}")
        out += ["", f"## {spec['title']}", ""] + RENDER[kind](spec, root)
        if kind not in ("capture", "coverage", "kbench"):
            cmd = spec.get("command") or gpu_job_command(_load(root, spec["files"][-1])["meta"]["command"], kind)
            out += ["", f"Reproduce with `{cmd}`."]
        out += ["Raw: " + ", ".join(f"`docs/runs/{f}`" for f in spec["files"]) + "."]
    return "\n".join(out) + "\n"


def _spec(manifest: dict, kind: str) -> List[dict]:
    return [s for s in manifest["tables"] if s["kind"] == kind]


def render_block(manifest: dict, root: str, pr: bool) -> str:
    """The README's (``pr`` False) or the PR text's (``pr`` True) result block."""
    spec = _spec(manifest, "speedup")[0]
    d = _load(root, spec["files"][0])
    cls = min({r["cls"] for r in d["rows"]}, key=lambda c: abs(d["meta"]["classes"][c]["target_accept_length"] - 2))
    rows = [[_r(r["ours"]["decode_accept_length"], 2), CTX[r["context"]], str(r["bs"])] + _speed_cells(r)
            for r in d["rows"] if r["cls"] == cls]
    out = [f"Measured speed-up (decode tokens/s against plain decoding in the same run; {_versions(d)}; "
           f"Llama-3.1-8B-shape target and draft constructed for the accept length shown; "
           "[`docs/results.md`](RESULTS)):", ""]
    out += _table(["accept length", "ctx", "bs", "ours / plain", "upstream EAGLE-3 / plain", "ours / upstream"], rows)
    verify = []
    for v in _spec(manifest, "verify"):
        vrows, _ = _verify_rows(v, root)
        s = verify_summary(vrows)
        ctxs = sorted({r["context"] for r in vrows})
        bss = sorted({r["bs"] for r in vrows})
        verify.append([v["title"], f"{CTX[ctxs[0]]}-{CTX[ctxs[-1]]}, bs {bss[0]}-{bss[-1]}, "
                       f"{vrows[0]['num_steps'] + 1} draft tokens", f"**{s['ours']}**", s["upstream"], s["ratio"]])
    out += ["", "Verify cost in decode steps (dummy weights, median GPU time per graph replay):", ""]
    out += _table(["target, backend", "points", "ours verify / decode", "upstream verify / decode",
                   "ours / upstream"], verify)
    link = "results.md" if pr else "docs/results.md"
    return "\n".join(out).replace("(RESULTS)", f"({link})") + "\n"


def render_all(root: str) -> Dict[str, str]:
    """Every rendered file's full new text, keyed by its path relative to ``root``."""
    try:
        with open(os.path.join(root, MANIFEST)) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise ReportError(f"{MANIFEST}: {e}") from e
    out = {RESULTS: render_results(manifest, root)}
    for path in BLOCKS:
        with open(os.path.join(root, path)) as f:
            out[path] = splice(f.read(), render_block(manifest, root, pr=path != "README.md"), path, BEGIN, END)
    h2h = "\n".join(render_kbench(_spec(manifest, "kbench")[0], root, points=True)) + "\n"
    out[BLOCKS[1]] = splice(out[BLOCKS[1]], h2h, BLOCKS[1], "<!-- kernel-h2h:begin -->", "<!-- kernel-h2h:end -->")
    out.update(mutation_table.render_doc(root))
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench report", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a committed file is stale")
    ap.add_argument("--root", default=ROOT, help="the repository root (default: this checkout)")
    a = ap.parse_args(argv)
    try:
        new = render_all(a.root)
    except (ReportError, OSError, ValueError, KeyError, IndexError, TypeError) as e:
        print(f"error: bench report: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    stale = []
    for path, text in new.items():
        full = os.path.join(a.root, path)
        old = open(full).read() if os.path.exists(full) else None
        if old != text:
            stale.append(path)
            if not a.check:
                with open(full, "w") as f:
                    f.write(text)
    if a.check and stale:
        print(f"stale: {', '.join(stale)} differ from the raw results; run: python -m bench report", file=sys.stderr)
        return 1
    if not a.check:
        print(f"bench report: {len(stale)} of {len(new)} files rewritten", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

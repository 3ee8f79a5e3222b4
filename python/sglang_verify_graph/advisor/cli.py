"""Speculative-decoding advisor: is EAGLE-3 (top-k 1) worth it at these timings?

``python -m sglang_verify_graph.advisor --decode-ms 12 --verify-ms 25.6 --num-steps 2 \\
    --draft-ms 1.0 --draft-extend-ms 0.3 --accept-length 2.0``

Pure Python (no torch, no sglang). All times are GPU milliseconds per step at ONE batch size
and context length; throughputs are tokens/s per sequence. Walkthrough: ``docs/advisor.md``.

Two accept-length meanings (keep them apart)
    ``accepted_drafts`` in 0..k: draft tokens the target accepted in one cycle.
    ``accept_length`` = accepted_drafts + 1 in 1..k+1: tokens emitted per cycle, counting the
    bonus token the target always produces. This is SGLang's definition
    (``sglang/srt/speculative/eagle_utils.py``: ``return predict, num_correct_drafts + 1, ...``;
    ``avg_spec_accept_length`` / ``spec_accept_length`` = tokens per verify).

Model (k = ``num_steps``; top-k 1, so ``num_draft_tokens`` = k + 1 tokens are verified)
    cycle_ms(k)    = draft_ms(k) + verify_ms(k) + draft_extend_ms + other_ms
    draft_ms(k)    = measured at k, else draft_ms_per_step * k (without it, the per-step ms is
                     the median of draft_ms / k over the measured draft phases)
    verify_ms(k)   = measured at k, else the least-squares line a + b * (k + 1) through >= 2
                     measured points (tokens verified per request = k + 1)
    E[accept_length](k) = 1 + sum_{i=1..k} prod_{j<=i} p_j, with p_j the probability that draft
                     j is accepted given drafts 1..j-1 were (per-position acceptance rates).
                     Constant p gives (1 - p^(k+1)) / (1 - p) (Leviathan et al. 2023, eq. 1).
                     From mean accept_lengths, the sweep uses the measured one at each k
                     (log) and elsewhere a constant p fitted at ``--num-steps``.
    spec tok/s     = 1000 * accept_length / cycle_ms;  plain tok/s = 1000 / decode_ms
    speedup        = accept_length * decode_ms / cycle_ms
    break-even     accept_length* = cycle_ms / decode_ms (accepted_drafts* = that - 1);
                   at accept_length 1 the speedup is decode_ms / cycle_ms: < 1 whenever the
                   cycle costs more than one decode step.
    best num_steps = argmax_k speedup(k) over k = 1..K (K: ``--max-steps``, default the largest
                   measured k; with explicit rates at most their count).

Assumptions and limits
    * acceptance does not depend on batch size or k beyond the per-position rates; greedy
      (temperature 0) acceptance unless the rates come from a sampled run;
    * decode and verify were measured at the same batch size and context length (both grow
      with context; the ratio is what matters);
    * scheduler, sampling and host overheads are ignored unless given as ``--other-ms``;
      draft-extend and other ms do not depend on k;
    * SGLang 0.5.16 runs k - 1 draft forwards per cycle (the first draft token comes from the
      draft-extend pass); scaling the draft phase by k over-counts it slightly (conservative).

TP all-reduce prediction (``--interconnect PRESET``; model, presets and their sources:
``sglang_verify_graph.advisor.interconnect``)
    reads the verify as compute-only (ours, measured on one GPU at a TP shard's widths) and adds
    a TP-n deployment's collectives: verify(TP) = (verify / decode) * (decode_ms - comm(decode))
    + comm(verify), the all-reduces and logits all-gather over bs x 1 vs bs x (k + 1) tokens;
    printed beside the compute-only figures, marked ``prediction (model: PRESET)``.

Profile log (``--from-log FILE``; format and parser: ``sglang_verify_graph.advisor.inputs``)
    ``verify_graph_profile num_steps=2 decode_ms=12.0 verify_ms=25.6 draft_ms=1.0
    draft_extend_ms=0.3 accept_length=1.93`` (key=value, one record per line, any prefix);
    medians per ``num_steps``; without ``--num-steps`` the one with most lines. Flags override.
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, Optional, Sequence

from sglang_verify_graph.advisor import interconnect
from sglang_verify_graph.advisor.inputs import (LOG_TAG, AdvisorError, ProfileSummary, ms_value,
                                                num_steps_value, parse_profile_log, rate_value,
                                                steps_points)
from sglang_verify_graph.advisor.model import (Inputs, Row, best_num_steps,
                                               break_even_accept_length,
                                               constant_rate_for_accept_length, evaluate,
                                               expected_accept_length, fit_verify_line, speedup)

__all__ = ["AdvisorError", "Inputs", "LOG_TAG", "ProfileSummary", "Row", "best_num_steps",
           "break_even_accept_length", "constant_rate_for_accept_length", "evaluate",
           "expected_accept_length", "fit_verify_line", "format_report", "main",
           "parse_profile_log", "speedup"]


# ----------------------------------------------------------------------------- report

def _fmt_rate_note(length: float, k: int) -> str:
    if 1.0 <= length <= k + 1:
        return f" (constant per-position rate {constant_rate_for_accept_length(length, k):.3f})"
    return ""


def format_report(inp: Inputs, measured_spec_tok_s: Optional[float] = None) -> str:
    """The compact text report (see ``docs/advisor.md`` for examples)."""
    k = inp.num_steps
    row = evaluate(inp, k)
    draft = inp.draft_ms(k)
    plain = 1000.0 / inp.decode_ms
    drafts = row.accept_length - 1
    lines = [
        f"num_steps {k}: {k + 1} tokens verified per cycle; per sequence, greedy, "
        f"ms at one batch size and context",
        f"cycle          {row.cycle_ms:.3f} ms = draft {draft:.3f} + verify {row.verify_ms:.3f} "
        f"({row.verify_source}, {100 * row.verify_ms / row.cycle_ms:.1f}% of cycle) + "
        f"draft-extend {inp.draft_extend_ms:.3f} + other {inp.other_ms:.3f}",
        f"plain decode   {inp.decode_ms:.3f} ms/token = {plain:.2f} tok/s",
        f"accept_length  {row.accept_length:.3f} tokens/cycle = accepted_drafts {drafts:.3f} "
        f"of {k}" + (" (from per-position rates)" if inp.rates is not None else ""),
        f"speculative    {row.accept_length:.3f} tokens / {row.cycle_ms:.3f} ms = "
        f"{row.spec_tok_s:.2f} tok/s",
        f"speedup        {row.speedup:.3f}x ("
        + ("speculation wins)" if row.speedup > 1 else "speculation loses)"
           if row.speedup < 1 else "break-even)"),
    ]
    be = row.break_even
    if be <= 1.0:
        lines.append(f"break-even     accept_length {be:.3f} <= 1: speculation wins at any "
                     f"acceptance (cycle < decode)")
    elif be > k + 1:
        lines.append(f"break-even     accept_length {be:.3f} > num_steps + 1 = {k + 1}: "
                     f"unreachable (all drafts accepted gives {(k + 1) / be:.3f}x)")
    else:
        lines.append(f"break-even     accept_length {be:.3f} = accepted_drafts {be - 1:.3f} "
                     f"of {k}{_fmt_rate_note(be, k)}")
    if measured_spec_tok_s is not None:
        implied = measured_spec_tok_s * row.cycle_ms / 1000.0
        note = "" if 1.0 <= implied <= k + 1 else " (outside [1, num_steps + 1]: cycle off?)"
        lines.append(f"measured       {measured_spec_tok_s:.2f} tok/s at this cycle implies "
                     f"accept_length {implied:.3f} = accepted_drafts {implied - 1:.3f}{note}")
    best, rows = best_num_steps(inp)
    if best is None:
        lines.append("best num_steps not evaluated: needs verify ms at >= 2 num_steps")
        return "\n".join(lines)
    how = ("per-position rates" if inp.rates is not None else
           f"given at num_steps {sorted(set(inp.accept_points) | {k})}, elsewhere a constant "
           f"per-position rate fitted at num_steps {k}")
    lines.append(f"best num_steps {best.num_steps}: {best.speedup:.3f}x, "
                 f"{best.spec_tok_s:.2f} tok/s (acceptance: {how})")
    lines.append("  num_steps  verify_ms  source        cycle_ms  accept_length  tok/s    "
                 "speedup  break_even")
    for r in rows:
        lines.append(f"  {r.num_steps:9d}  {r.verify_ms:9.3f}  {r.verify_source:12s}  "
                     f"{r.cycle_ms:8.3f}  {r.accept_length:13.3f}  {r.spec_tok_s:7.2f}  "
                     f"{r.speedup:6.3f}x  {r.break_even:10.3f}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- CLI

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m sglang_verify_graph.advisor",
        description="Expected EAGLE-3 (top-k 1) speedup over plain decode, break-even accept "
                    "length and best num_steps from per-phase GPU ms (model and assumptions: "
                    "module docstring, docs/advisor.md).")
    ap.add_argument("--from-log", metavar="FILE",
                    help="profile log with 'verify_graph_profile key=value ...' lines")
    ap.add_argument("--decode-ms", type=ms_value, help="plain 1-token decode step, ms")
    ap.add_argument("--num-steps", type=num_steps_value,
                    help="speculative num_steps k (k + 1 tokens verified)")
    ap.add_argument("--verify-ms", type=ms_value, help="target verify at --num-steps, ms")
    ap.add_argument("--verify-ms-per-steps", type=steps_points, metavar="K:MS,...",
                    help="verify ms measured at several num_steps, e.g. 2:25.6,5:28.7")
    draft = ap.add_mutually_exclusive_group()
    draft.add_argument("--draft-ms", type=ms_value, help="whole draft phase at --num-steps, ms")
    draft.add_argument("--draft-ms-per-step", type=ms_value, help="draft ms per step (x num_steps)")
    ap.add_argument("--draft-extend-ms", type=ms_value, help="draft re-extend after verify, ms")
    ap.add_argument("--other-ms", type=ms_value, help="other per-cycle ms (scheduler, sampling)")
    acc = ap.add_mutually_exclusive_group()
    acc.add_argument("--accept-length", type=float,
                     help="mean tokens emitted per cycle, SGLang's accept_length (>= 1)")
    acc.add_argument("--accepted-drafts", type=float,
                     help="mean draft tokens accepted per cycle (= accept_length - 1)")
    acc.add_argument("--acceptance-rates", type=rate_value, nargs="+", metavar="P",
                     help="per-position conditional acceptance rates p_1 .. p_n")
    ap.add_argument("--max-steps", type=num_steps_value, help="largest num_steps in the sweep")
    ap.add_argument("--measured-spec-tok-s", type=float, metavar="TOK_S",
                    help="observed speculative tok/s per sequence: print the implied "
                         "accept_length at the modelled cycle")
    interconnect.add_arguments(ap)
    return ap


def inputs_from_args(args: argparse.Namespace) -> Inputs:
    """Merge the profile log (if any) with the flags; flags win. Raises AdvisorError/OSError."""
    log = None
    if args.from_log:
        with open(args.from_log, encoding="utf-8") as fh:
            log = parse_profile_log(fh)
    k = args.num_steps or (log.main_steps() if log else None)
    if k is None and args.acceptance_rates:
        k = len(args.acceptance_rates)
    if k is None:
        raise AdvisorError("num_steps unknown: give --num-steps (or num_steps= in the log)")

    def pick(flag_value, key):
        if flag_value is not None:
            return flag_value
        return log.value(key, k) if log else None

    verify = dict(log.points("verify_ms")) if log else {}
    if log and k not in verify and log.common.get("verify_ms") is not None:
        verify[k] = log.common["verify_ms"]
    verify.update(args.verify_ms_per_steps or {})
    if args.verify_ms is not None:
        verify[k] = args.verify_ms
    per_step = args.draft_ms_per_step
    drafts: Dict[int, float] = {}
    if per_step is None:  # an explicit per-step cost replaces the log's draft times
        drafts = dict(log.points("draft_ms")) if log else {}
        if log and k not in drafts and log.common.get("draft_ms") is not None:
            drafts[k] = log.common["draft_ms"]
        if args.draft_ms is not None:
            drafts[k] = args.draft_ms
        if not drafts and log:
            per_step = log.value("draft_ms_per_step", k)
    decode = pick(args.decode_ms, "decode_ms")
    if decode is None:
        raise AdvisorError("no decode time: give --decode-ms (or decode_ms= in the log)")
    rates = args.acceptance_rates
    length = args.accept_length
    if args.accepted_drafts is not None:
        if not 0.0 <= args.accepted_drafts <= k:
            raise AdvisorError(f"accepted_drafts {args.accepted_drafts} must be in [0, "
                               f"num_steps = {k}] (draft tokens accepted per cycle)")
        length = args.accepted_drafts + 1.0
    if rates is None and length is None and log:
        length = log.value("accept_length", k)
        if length is None and log.value("accepted_drafts", k) is not None:
            length = log.value("accepted_drafts", k) + 1.0
    if rates is None and length is None:
        raise AdvisorError("no acceptance: give --accept-length, --accepted-drafts or "
                           "--acceptance-rates")
    accept_points: Dict[int, float] = {}
    if rates is None and log:
        accept_points = {j: v + 1.0 for j, v in log.points("accepted_drafts").items()}
        accept_points.update(log.points("accept_length"))
    inp = Inputs(decode_ms=decode, num_steps=k, verify_points=verify, draft_points=drafts,
                 draft_ms_per_step=per_step, draft_extend_ms=pick(args.draft_extend_ms,
                 "draft_extend_ms") or 0.0, other_ms=pick(args.other_ms, "other_ms") or 0.0,
                 accept_length=None if rates else length, rates=rates,
                 accept_points=accept_points, max_steps=args.max_steps)
    inp.validate()
    return inp


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI entry point; invalid input exits 2 with an argparse error, never a traceback."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        inp = inputs_from_args(args)
        if args.measured_spec_tok_s is not None and not args.measured_spec_tok_s > 0:
            raise AdvisorError("--measured-spec-tok-s must be > 0")
        report = format_report(inp, args.measured_spec_tok_s)
        tp = interconnect.from_args(args)
        if tp is not None:
            ic, shape, batch_size, label = tp
            pred = interconnect.predict(inp, ic, shape, batch_size)
            report += "\n" + "\n".join(interconnect.format_prediction(pred, inp, ic, shape,
                                                                        label))
    except (ValueError, OSError) as exc:  # AdvisorError is a ValueError
        parser.error(str(exc))
    print(report)
    return 0


"""Tensor-parallel all-reduce term of the advisor's field prediction. Pure Python.

A verify measured on one GPU at a TP shard's widths (ours: verify / decode = ``ratio``) has no
all-reduce in it. In a TP-n deployment every step also all-reduces the residual stream, over
(batch size x tokens per request x hidden x dtype bytes): a decode step over 1 token per
request, a verify over k + 1. This module prices that traffic and moves it out of the ratio:

    verify_ms(TP)  = ratio * (decode_ms - comm_ms(decode)) + comm_ms(verify)
    ratio          = verify_ms / decode_ms of the compute-only prediction
    comm_ms(step)  = calls_ar * all_reduce_ms(T * hidden * b)
                     + gathers * all_gather_ms(T * vocab * b)      (b: dtype bytes)
    T              = batch_size * tokens per request (1 for decode, k + 1 for verify)

Collective times (ring algorithm; NCCL tests' definitions, ``doc/PERFORMANCE.md`` of
NVIDIA/nccl-tests: algbw = S / t and busbw = algbw * 2(n-1)/n for all-reduce, busbw = algbw *
(n-1)/n for all-gather, S the buffer size, for all-gather the gathered total):

    all_reduce_ms(S) = latency + 2(n-1)/n * S / busbw
    all_gather_ms(S) = latency + (n-1)/n * S / busbw

Calls per step (``ModelShape``; DeepSeek-V3 / Kimi-K2.5 as SGLang 0.5.16 runs it at TP n
without DP attention): 2 all-reduces per layer (after ``o_proj``, after the MoE or dense MLP),
1 more for the vocab-parallel embedding, and 1 all-gather of the bf16 logits (vocab columns
split n ways) for every token that is sampled or verified. SGLang's custom all-reduce is used
only on 2 GPUs or full NVLink (``CustomAllreduce.should_custom_ar``), so 8 PCIe GPUs run NCCL.

Presets (``PRESETS``; each number's source)
    ``pcie5_x16_8gpu``: 8 GPUs on PCIe Gen5 x16 without NVLink (RTX PRO 6000 Blackwell class).
        busbw 41.1 GB/s: NCCL ``all_reduce_perf`` on 8 RTX PRO 6000 Blackwell behind three PCIe
        switches (NCCL_MIN_NCHANNELS=8, 8 MB-2 GB sweep), the best of the 8-GPU figures
        (37.6-41.1 GB/s on three hosts; 22.2 GB/s with default settings at 32 MB on a dual-CPU
        host), in voipmonitor/rtx6kpro ``hardware/pcie-bandwidth.md`` (community measurements).
        Latency 24.1 us: NCCL all-reduce of 256 B-64 KB took 24.1-24.6 us on the PCIe-switch
        host of the same page (its small-message table; the GPU count is not stated there).
        NVIDIA/nccl#1639 reports 28 GB/s peak busbw for 8 RTX 5090 (same GB202 chip) on PCIe 5.
    ``nvlink_h100_8gpu``: 8 H100 SXM on NVLink 4 / NVSwitch.
        busbw 370 GB/s: NCCL_ALGO=RING all-reduce busbw 365-370 GB/s on 8 H100 SXM at 2-4 GB
        (NVIDIA/nccl#1455) and the NCCL maintainers' "~370 GB/s" ring figure
        (NVIDIA/nccl-tests#212; NVLink SHARP reaches ~480 GB/s busbw at large sizes, which a
        ring model does not describe). Latency 15.0 us: an assumption, no public measurement
        found; it is NCCL's own tuning model for a ring / LL all-reduce (``src/graph/tuning.cc``:
        baseLat 6.6 us + 2(n-1) x 0.6 us per NVLink step, n = 8). The same model gives 20.6 us
        over PCIe (1.0 us per step) against the 24.1 us measured above. SGLang's custom
        all-reduce, which serves small messages on such hosts, is faster than this.

Limits: one latency and one bandwidth per call (NCCL switches protocols with size, so between
~64 KB and a few MB real calls are faster than this line: an upper bound there); no overlap of
communication with compute; draft and draft-extend times are taken as given (measured in the
deployment, they already hold their own collectives).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Dict, List, Optional

from sglang_verify_graph.advisor.inputs import AdvisorError, int_at_least
from sglang_verify_graph.advisor.model import Inputs, evaluate


@dataclass(frozen=True)
class Interconnect:
    """A TP group's collectives: ``ranks`` n, NCCL bus bandwidth ``bus_gbps`` in GB/s (1e9
    bytes/s), per-call ``latency_us`` in microseconds, ``source`` a one-line provenance."""

    name: str
    ranks: int
    bus_gbps: float
    latency_us: float
    source: str = ""

    def validate(self) -> None:
        """Raises AdvisorError unless ranks >= 2, bus_gbps > 0 and latency_us >= 0 (finite)."""
        if self.ranks < 2:
            raise AdvisorError(f"TP size {self.ranks} must be >= 2 (one rank has no all-reduce)")
        if not (self.bus_gbps > 0 and math.isfinite(self.bus_gbps)):
            raise AdvisorError(f"bus bandwidth {self.bus_gbps} GB/s must be a finite number > 0")
        if not (self.latency_us >= 0 and math.isfinite(self.latency_us)):
            raise AdvisorError(f"all-reduce latency {self.latency_us} us must be finite, >= 0")


PRESETS: Dict[str, Interconnect] = {
    "pcie5_x16_8gpu": Interconnect(
        "pcie5_x16_8gpu", 8, 41.1, 24.1,
        "8x RTX PRO 6000 Blackwell, PCIe Gen5 x16, NCCL all_reduce_perf (voipmonitor/rtx6kpro)"),
    "nvlink_h100_8gpu": Interconnect(
        "nvlink_h100_8gpu", 8, 370.0, 15.0,
        "8x H100 SXM ring busbw (NVIDIA/nccl#1455); latency from NCCL's tuning model"),
}


@dataclass(frozen=True)
class ModelShape:
    """Collectives per forward step; defaults: Kimi-K2.5 / DeepSeek-V3 (61 layers, hidden
    7168, vocab 163840, bf16 activations and logits)."""

    layers: int = 61
    hidden_size: int = 7168
    vocab_size: int = 163840
    all_reduces_per_layer: int = 2       # after o_proj, after the MoE / dense MLP
    extra_all_reduces: int = 1           # the vocab-parallel embedding
    logits_gathers: int = 1              # all-gather of the vocab-split logits
    dtype_bytes: int = 2                 # bf16

    @property
    def all_reduces(self) -> int:
        return self.all_reduces_per_layer * self.layers + self.extra_all_reduces

    def validate(self) -> None:
        """Raises AdvisorError on a size < 1 or a negative call count."""
        for name in ("layers", "hidden_size", "vocab_size", "dtype_bytes"):
            if getattr(self, name) < 1:
                raise AdvisorError(f"{name} {getattr(self, name)} must be >= 1")
        for name in ("all_reduces_per_layer", "extra_all_reduces", "logits_gathers"):
            if getattr(self, name) < 0:
                raise AdvisorError(f"{name} {getattr(self, name)} must be >= 0")


def all_reduce_ms(nbytes: float, ic: Interconnect) -> float:
    """One ring all-reduce of ``nbytes`` bytes per rank, ms: latency + 2(n-1)/n * S / busbw."""
    n = ic.ranks
    return ic.latency_us / 1e3 + 2.0 * (n - 1) / n * nbytes / (ic.bus_gbps * 1e6)


def all_gather_ms(total_bytes: float, ic: Interconnect) -> float:
    """One ring all-gather whose gathered output is ``total_bytes`` bytes, ms:
    latency + (n-1)/n * S / busbw."""
    n = ic.ranks
    return ic.latency_us / 1e3 + (n - 1.0) / n * total_bytes / (ic.bus_gbps * 1e6)


def step_comm_ms(tokens: int, ic: Interconnect, shape: ModelShape = ModelShape()) -> float:
    """Collective time of one forward step over ``tokens`` tokens (batch size x tokens per
    request), ms. Raises AdvisorError if tokens < 1."""
    if tokens < 1:
        raise AdvisorError(f"tokens per step {tokens} must be >= 1")
    ar = all_reduce_ms(tokens * shape.hidden_size * shape.dtype_bytes, ic)
    ag = all_gather_ms(tokens * shape.vocab_size * shape.dtype_bytes, ic)
    return shape.all_reduces * ar + shape.logits_gathers * ag


@dataclass
class TPPrediction:
    """The compute-only and the TP-aware figures at ``num_steps`` (ms, tokens/s per sequence)."""

    num_steps: int
    batch_size: int
    ratio: float                 # compute-only verify / decode
    decode_comm_ms: float
    verify_comm_ms: float
    verify_ms: float             # TP-aware
    cycle_ms: float
    spec_tok_s: float
    speedup: float
    break_even: float
    compute_verify_ms: float     # compute-only (the input verify)
    compute_cycle_ms: float
    compute_spec_tok_s: float
    compute_speedup: float


def predict(inp: Inputs, ic: Interconnect, shape: ModelShape = ModelShape(),
            batch_size: int = 1) -> TPPrediction:
    """TP-aware verify, cycle and tok/s at ``inp.num_steps``, reading ``inp``'s verify as
    compute-only. Raises AdvisorError on invalid parameters or when the modelled collectives
    of a decode step take as long as ``inp.decode_ms`` or longer."""
    ic.validate()
    shape.validate()
    if batch_size < 1:
        raise AdvisorError(f"batch size {batch_size} must be >= 1")
    k = inp.num_steps
    row = evaluate(inp, k)
    decode_comm = step_comm_ms(batch_size, ic, shape)
    verify_comm = step_comm_ms(batch_size * (k + 1), ic, shape)
    if not decode_comm < inp.decode_ms:
        raise AdvisorError(
            f"the modelled collectives of one decode step take {decode_comm:.3f} ms, not less "
            f"than the decode step's {inp.decode_ms:g} ms: lower --ar-latency-us or raise "
            f"--bus-gbps")
    ratio = row.verify_ms / inp.decode_ms
    verify = ratio * (inp.decode_ms - decode_comm) + verify_comm
    cycle = row.cycle_ms - row.verify_ms + verify
    return TPPrediction(
        k, batch_size, ratio, decode_comm, verify_comm, verify, cycle,
        1000.0 * row.accept_length / cycle, row.accept_length * inp.decode_ms / cycle,
        cycle / inp.decode_ms, row.verify_ms, row.cycle_ms, row.spec_tok_s, row.speedup)


def format_prediction(pred: TPPrediction, inp: Inputs, ic: Interconnect,
                      shape: ModelShape = ModelShape(), label: Optional[str] = None) -> List[str]:
    """The report lines of ``pred``, each TP-aware figure marked ``prediction (model: X)``."""
    tag = f"prediction (model: {label or ic.name})"
    k, bs = pred.num_steps, pred.batch_size
    length = inp.accept_length_at(k)
    return [
        f"interconnect   {tag}: TP {ic.ranks}, bus {ic.bus_gbps:g} GB/s, {ic.latency_us:g} "
        f"us/call, bs {bs}; per step {shape.all_reduces} all-reduces "
        f"({shape.all_reduces_per_layer} x {shape.layers} layers + {shape.extra_all_reduces}) "
        f"of tokens x {shape.hidden_size} x {shape.dtype_bytes} B, {shape.logits_gathers} "
        f"logits all-gather of tokens x {shape.vocab_size} x {shape.dtype_bytes} B",
        f"all-reduce     decode {bs} x 1 token {pred.decode_comm_ms:.3f} ms, verify {bs} x "
        f"{k + 1} tokens {pred.verify_comm_ms:.3f} ms (ring: latency + 2(n-1)/n x bytes / "
        f"bus bandwidth)",
        f"tp verify      {tag} {pred.verify_ms:.3f} ms = {pred.ratio:.3f} x "
        f"({inp.decode_ms:.3f} - {pred.decode_comm_ms:.3f}) + {pred.verify_comm_ms:.3f}; "
        f"compute-only {pred.compute_verify_ms:.3f} ms = {pred.ratio:.3f} x {inp.decode_ms:.3f}",
        f"tp speculative {tag} {length:.3f} tokens / {pred.cycle_ms:.3f} ms = "
        f"{pred.spec_tok_s:.2f} tok/s, speedup {pred.speedup:.3f}x, break-even accept_length "
        f"{pred.break_even:.3f}; compute-only {pred.compute_spec_tok_s:.2f} tok/s, "
        f"{pred.compute_speedup:.3f}x",
    ]


# ----------------------------------------------------------------------------- flags

def tp_value(text: str) -> int:
    """--tp: an integer >= 2; else raises argparse.ArgumentTypeError."""
    return int_at_least(text, "TP size ", 2, " (e.g. --tp 8)")


def positive_int_value(text: str) -> int:
    """An integer >= 1 (batch size, layers, widths); else raises argparse.ArgumentTypeError."""
    return int_at_least(text, "", 1)


def bus_gbps_value(text: str) -> float:
    """--bus-gbps: a finite number > 0 (GB/s); else raises argparse.ArgumentTypeError."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(
            f"bus bandwidth {text!r} must be a finite number of GB/s > 0 (e.g. --bus-gbps 41.1)")
    return value


def latency_us_value(text: str) -> float:
    """--ar-latency-us: a finite number >= 0 (microseconds); else raises
    argparse.ArgumentTypeError."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(
            f"latency {text!r} must be a finite number of us >= 0 (e.g. --ar-latency-us 24.1)")
    return value


OVERRIDE_FLAGS = {"tp": "--tp", "bus_gbps": "--bus-gbps", "ar_latency_us": "--ar-latency-us",
                  "batch_size": "--batch-size", "num_layers": "--num-layers",
                  "hidden_size": "--hidden-size", "vocab_size": "--vocab-size"}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The TP prediction's flags (``--interconnect PRESET`` and its overrides)."""
    g = ap.add_argument_group(
        "TP all-reduce prediction",
        "read the verify as compute-only (no all-reduce) and add a TP-n deployment's collectives")
    g.add_argument("--interconnect", choices=sorted(PRESETS), metavar="PRESET",
                   help="print a TP-aware prediction with this interconnect model: "
                        + ", ".join(sorted(PRESETS)))
    g.add_argument("--tp", type=tp_value, help="TP size n (default: the preset's)")
    g.add_argument("--bus-gbps", type=bus_gbps_value, metavar="GB_S",
                   help="NCCL all-reduce bus bandwidth, GB/s (default: the preset's)")
    g.add_argument("--ar-latency-us", type=latency_us_value, metavar="US",
                   help="per-call collective latency, us (default: the preset's)")
    g.add_argument("--batch-size", type=positive_int_value, metavar="BS",
                   help="requests per step (default 1)")
    g.add_argument("--num-layers", type=positive_int_value, metavar="L",
                   help="transformer layers (default 61, Kimi-K2.5)")
    g.add_argument("--hidden-size", type=positive_int_value, metavar="H",
                   help="hidden size (default 7168)")
    g.add_argument("--vocab-size", type=positive_int_value, metavar="V",
                   help="vocabulary (default 163840)")


def from_args(args: argparse.Namespace):
    """(Interconnect, ModelShape, batch size, label) from the flags, or None without
    ``--interconnect``. Raises AdvisorError for an override given without ``--interconnect``."""
    given = [flag for dest, flag in OVERRIDE_FLAGS.items() if getattr(args, dest) is not None]
    if args.interconnect is None:
        if given:
            raise AdvisorError(f"{given[0]} needs --interconnect PRESET (the model it adjusts; "
                               f"presets: {', '.join(sorted(PRESETS))})")
        return None
    base = PRESETS[args.interconnect]
    ic = Interconnect(base.name, args.tp or base.ranks,
                      base.bus_gbps if args.bus_gbps is None else args.bus_gbps,
                      base.latency_us if args.ar_latency_us is None else args.ar_latency_us,
                      base.source)
    d = ModelShape()
    shape = ModelShape(layers=args.num_layers or d.layers,
                       hidden_size=args.hidden_size or d.hidden_size,
                       vocab_size=args.vocab_size or d.vocab_size)
    overridden = [f for f in given if f != "--batch-size"]
    label = base.name + (f" with {', '.join(overridden)}" if overridden else "")
    return ic, shape, args.batch_size or 1, label

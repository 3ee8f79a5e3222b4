"""Server tier: serving situations that could corrupt KV, on the prefix-reading pair, every output
token checked against the simulator.

Failure mode guarded: a KV slot that holds the wrong key when a verify step reads it, because a
serving path freed, reused, evicted, moved or wrote it wrongly: an abort landing mid-flight, a
radix hit or an eviction, a retraction (forced, or by pool pressure) and its re-prefill, a prompt
prefilled in chunks while others decode, a page edge (page size 64), a 1-2k token output, a batch
mixing greedy, sampled and logprob requests, the non-overlap scheduler, a batch above the largest
captured bucket (graph and eager verify steps mixed), ten minutes of mixed traffic. The plain pair
(``test_reliability_e2e.py``) never reads its attention output and the attention pair reads only
its own key and BOS, so neither sees a wrong slot in the middle of a prefix.

The pair (``python -m bench models pair DIR --prefix``, span 1024; written under
``E2E_MODELS_DIR/serving_scenarios`` when ``E2E_MODELS_DIR`` has no complete span-1024 build) reads,
from the row at position ``n``, the keys at ``n - K`` for 16 offsets ``K`` in 1..span in its last
layer, ``n - 1`` in layers 1-2, and BOS: with a prompt of >= span + 2 tokens it emits ``g(t)``
only while every one of those keys is the one written at that position
(``bench/models/accept_pair/prefix.py``). ``prefix_sim.PrefixModel`` predicts every output and the
accepted drafts of every verify cycle. Servers: triton attention, EAGLE-3 topk 1, 3 steps (4 draft
tokens), radix cache on; ``ours`` = with ``--enable-verify-cuda-graph``, ``upstream`` = the same
arguments without it. Greedy outputs must equal the prediction token for token; where no request
was retracted or aborted, the per-request accepted-draft histogram (``spec_correct_drafts_histogram``)
and ``spec_verify_ct`` must too. Every test ends idle: the server alive, ``/flush_cache`` 200,
``/v1/loads`` ``num_used_tokens`` 0, no SGLang leak report in its log (the scheduler's idle check,
strict by default in 0.5.16: ``memory leak detected`` raises there), and for ours the verify
counters (``bench.lib.server.plugin_state``).

* ``test_kv_accounting_with_mid_flight_aborts[ours-p1|p64]``: ``SCENARIO_KV_REQUESTS`` (1000)
  requests at concurrency 16, page-edge prompt lengths, shared heads (radix hits), 15% aborted:
  two thirds streamed and aborted (``/abort_request``) after a drawn number of tokens (so in
  flight), a third on a timer (may land in the queue or miss); an aborted response carries
  SGLang's ``finish_reason`` ``{"type": "abort"}`` and an output that is a prefix of the
  prediction; SGLang's busy-time pool check on (``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY=1``,
  ``SGLANG_CHECK_KV_PAGE_INVARIANTS=1``); every verify step replayed.
* ``test_radix_hits_and_eviction[mode-p1|p64]``: 7 heads of >= span + 2 tokens in a pool of
  ``SCENARIO_RADIX_POOL`` (6144) tokens (``--max-total-tokens``; the heads alone exceed it), two
  rounds: per head one request, then 4 at once. SGLang's ``cached_tokens``: the 4 hit (>= half the
  head), a head's first request of round 1 misses, and some of round 2 miss again (evicted).
* ``test_forced_retraction[mode-p1|p64]``: ``SGLANG_TEST_RETRACT=1`` (0.5.16's scheduler retracts
  >= 1 decoding request every ``SGLANG_TEST_RETRACT_INTERVAL`` = 3 forwards); the log's
  ``Testing retraction. #retracted_reqs: N`` and ``meta_info["num_retractions"]`` > 0. No logprob
  requests here (0.5.16 sometimes returns one output logprob fewer after a retraction).
* ``test_retraction_under_pool_pressure[mode-p1|p64]``: 8 requests of ~1.1k prompt + 1-1.4k output
  tokens in a pool of ``SCENARIO_RETRACT_POOL`` (6144): the log's ``KV cache pool is full.
  Retract requests.`` and ``num_retractions`` > 0.
* ``test_chunked_prefill_beside_decoding[mode-p1|p64]``: ``--chunked-prefill-size``
  ``SCENARIO_CHUNK`` (256); 8 requests decode while 8 prompts of 1.1-2.4k tokens (>= 4 chunks)
  prefill; the log shows a full chunk (``Prefill batch ... #new-token: 256``) with
  ``#running-req`` > 0 and no prefill batch above the chunk.
* ``test_long_outputs[mode-p1|p64]``: 8 requests of ``SCENARIO_LONG_TOKENS`` (1024..2048) new
  tokens.
* ``test_greedy_sampled_logprob_one_batch[mode-p1]``: 24 requests at once (buckets up to 24):
  greedy, sampled (temperature 4: some output leaves the greedy chain; ids valid, length exact)
  and greedy with ``return_logprob`` (one ``output_token_logprobs`` entry per output token, its
  id the output id).
* ``test_without_overlap_schedule[mode-p1|p64]``: ``--disable-overlap-schedule``, 16 requests at
  concurrency 8, shared heads.
* ``test_more_requests_than_the_largest_bucket[mode-p1]``: ``--cuda-graph-max-bs-decode``
  ``SCENARIO_BUCKET_MAX_BS`` (4), ``SCENARIO_BUCKET_CONCURRENCY`` (16) requests at once with
  spread lengths: ours counts both graph replays and eager verify steps, every fallback
  ``batch_size_above_max_captured``, replays + fallbacks = verify steps.
* ``test_soak[ours-p64]``: ``SOAK_S`` (600) seconds at concurrency ``SOAK_CONCURRENCY`` (32), page
  ``SOAK_PAGE`` (64): prompts of span + 2 .. span + 1500 tokens, 30% on shared heads, outputs
  1-512; every output exact; every verify step replayed.

The requests of each scenario come from the ``plan_*`` functions below; ``test/bench/
test_serving_scenarios_plan.py`` checks on CPU that they meet each scenario's preconditions (the
span, reading every prefix position, a wrong prefix slot changing the output, chunks, pool sizes,
bucket overflow) and that the server arguments parse with SGLang's own parser.

Env: ``SCENARIO_MODES`` (default ``"ours upstream"``; ``SCENARIO_KV_MODES``: ``"ours"``),
``SCENARIO_KV_REQUESTS``, ``SCENARIO_RADIX_POOL``, ``SCENARIO_RETRACT_POOL``, ``SCENARIO_CHUNK``,
``SCENARIO_LONG_TOKENS`` (``"LO HI"``), ``SCENARIO_BUCKET_MAX_BS``, ``SCENARIO_BUCKET_CONCURRENCY``,
``SOAK_S``, ``SOAK_CONCURRENCY``, ``SOAK_PAGE``, ``E2E_MODELS_DIR`` (default /tmp/models),
``E2E_LOG_DIR`` (server logs, scenarios_results.json).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import json
import os
import random
import re
import subprocess
import sys
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.models import accept_pair as ap  # noqa: E402
from bench.models.accept_pair import prefix as px  # noqa: E402
from bench.models.accept_pair import prefix_sim as ps  # noqa: E402

pytestmark = [pytest.mark.server]

LOG_DIR = os.environ.get("E2E_LOG_DIR", "/tmp/e2e_logs")
MODELS = os.environ.get("E2E_MODELS_DIR", "/tmp/models")
OWN_MODELS = "serving_scenarios"  # E2E_MODELS_DIR/<this>: this module's own build of the pair
RESULTS = {}
RESULTS_FILE = "scenarios_results.json"  # written by conftest._module_results
STEPS = 3
SPAN = px.DEFAULT_SPAN
CONTEXT = 8192  # longest sequence: span + 2 + 1.4k prompt + 2k output
SAMPLED_TEMPERATURE = 4.0
PAGE_EDGE = 64
ALL_MODES = ("ours", "upstream")
LEAK_MARKERS = ("memory leak detected", "Mem Leak Detected", "KV double free", "use-after-free",
                "Traceback")


def _env_int(name: str, default: int, lo: int = 1, multiple: int = 1) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = lo - 1
    if value < lo or value % multiple:
        want = f"an integer >= {lo}" + (f", a multiple of {multiple}" if multiple > 1 else "")
        raise ValueError(f"{name}={raw!r}: want {want} (default {default})")
    return value


def _env_words(name: str, default: str, allowed) -> list:
    raw = os.environ.get(name, default)
    words = raw.split()
    if not words or any(w not in allowed for w in words):
        raise ValueError(f"{name}={raw!r}: want words from {' '.join(allowed)} (default {default!r})")
    return words


def _env_range(name: str, default: tuple) -> tuple:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        lo, hi = (int(x) for x in raw.split())
    except ValueError:
        lo, hi = 0, -1
    if not 1 <= lo <= hi:
        raise ValueError(f"{name}={raw!r}: want two integers LO HI with 1 <= LO <= HI "
                         f"(default {default[0]} {default[1]})")
    return lo, hi


MODES = _env_words("SCENARIO_MODES", "ours upstream", ALL_MODES)
KV_MODES = _env_words("SCENARIO_KV_MODES", "ours", ALL_MODES)
KV_REQUESTS = _env_int("SCENARIO_KV_REQUESTS", 1000, 100)
RADIX_POOL = _env_int("SCENARIO_RADIX_POOL", 6144, 4096)
RETRACT_POOL = _env_int("SCENARIO_RETRACT_POOL", 6144, 4096)
CHUNK = _env_int("SCENARIO_CHUNK", 256, 64, multiple=PAGE_EDGE)
LONG_TOKENS = _env_range("SCENARIO_LONG_TOKENS", (1024, 2048))
BUCKET_MAX = _env_int("SCENARIO_BUCKET_MAX_BS", 4)
BUCKET_CONCURRENCY = _env_int("SCENARIO_BUCKET_CONCURRENCY", 16, 2)
SOAK_S = _env_int("SOAK_S", 600)
SOAK_CONCURRENCY = _env_int("SOAK_CONCURRENCY", 32)
SOAK_PAGE = _env_int("SOAK_PAGE", 64)
if BUCKET_CONCURRENCY <= BUCKET_MAX:
    raise ValueError(f"SCENARIO_BUCKET_CONCURRENCY={BUCKET_CONCURRENCY}: want more than "
                     f"SCENARIO_BUCKET_MAX_BS={BUCKET_MAX} (the scenario needs batches above the bucket)")


# ------------------------------------------------------------------------------ requests (CPU-checked)
@dataclasses.dataclass
class Req:
    """One request: ``ids`` (BOS first), ``n`` new tokens, ``kind`` greedy / sampled / logprob;
    ``abort`` ``stream`` (aborted once ``abort_after`` tokens arrived) or ``timer`` (aborted
    ``abort_delay`` s after sending); ``head``: the length of the shared head it starts with."""

    rid: str
    ids: list
    n: int
    kind: str = "greedy"
    abort: str = ""
    abort_after: int = 0
    abort_delay: float = 0.0
    head: int = 0


def min_prompt(span: int = SPAN) -> int:
    """The prefix pair's shortest prompt: BOS + span + 1 ids (every output row finds each offset)."""
    return span + 2


def _ids(rng: random.Random, n: int) -> list:
    return [rng.randrange(10, ap.VOCAB - 10) for _ in range(n)]


def _prompt(rng: random.Random, length: int, head: list | None = None) -> list:
    """``length`` ids: ``head`` (or BOS) then random ids."""
    base = list(head) if head else [ap.BOS]
    return base + _ids(rng, length - len(base))


def _heads(rng: random.Random, count: int, lo: int, hi: int) -> list:
    return [_prompt(rng, rng.randrange(lo, hi + 1)) for _ in range(count)]


def page_edge_lengths(span: int = SPAN, page: int = PAGE_EDGE) -> list:
    """Prompt lengths around the first two page edges at or above :func:`min_prompt`."""
    k = -(-min_prompt(span) // page)
    if k * page - 1 < min_prompt(span):
        k += 1
    return [e + d for e in (k * page, (k + 1) * page) for d in (-1, 0, 1)]


def plan_kv(span: int = SPAN, page: int = 1, count: int = KV_REQUESTS) -> list:
    """Scenario 1: page-edge lengths first, then 60% on 4 shared heads; 15% aborted (2/3 streamed
    with ``abort_after`` in 1..n/2 of n = 300..600, 1/3 on a 0-0.3 s timer)."""
    rng = random.Random(f"kv-{page}")
    m = min_prompt(span)
    heads = _heads(rng, 4, span - 200, span + 200)
    edges = page_edge_lengths(span)
    out = []
    for i in range(count):
        rid = f"kv{page}-{i:06d}"
        head = heads[i % 4] if i >= len(edges) and rng.random() < 0.6 else None
        if i < len(edges):
            length = edges[i]
        else:
            base = len(head) if head else 1
            length = base + rng.randrange(max(1, m - base), max(1, m - base) + 300)
        ids = _prompt(rng, length, head)
        r = rng.random()
        if r < 0.10:
            n = rng.randrange(300, 601)
            out.append(Req(rid, ids, n, abort="stream", abort_after=rng.randrange(1, n // 2),
                           head=len(head or ())))
        elif r < 0.15:
            out.append(Req(rid, ids, rng.randrange(100, 401), abort="timer",
                           abort_delay=rng.uniform(0.0, 0.3), head=len(head or ())))
        else:
            out.append(Req(rid, ids, rng.randrange(1, 121), head=len(head or ())))
    return out


@dataclasses.dataclass
class Phase:
    """Requests sent at once: the ``first`` request of a head's visit or its ``hits``."""

    round: int
    head: int
    kind: str
    reqs: list


def plan_radix(span: int = SPAN, page: int = 1, heads: int = 7, rounds: int = 2, batch: int = 4) -> list:
    """Scenario 2: per round and head, one request (``first``), then ``batch`` at once (``hits``);
    prompts = head (>= span + 2) + 8..64 ids; outputs 16..48 / 64..160."""
    rng = random.Random(f"radix-{page}")
    m = min_prompt(span)
    hs = _heads(rng, heads, m, m + 150)
    phases, i = [], 0
    for rnd in range(rounds):
        for h, head in enumerate(hs):
            for kind, count, lo, hi in (("first", 1, 16, 48), ("hits", batch, 64, 160)):
                reqs = []
                for _ in range(count):
                    ids = _prompt(rng, len(head) + rng.randrange(8, 65), head)
                    reqs.append(Req(f"rx{page}-{i:06d}", ids, rng.randrange(lo, hi + 1), head=len(head)))
                    i += 1
                phases.append(Phase(rnd, h, kind, reqs))
    return phases


def plan_forced_retraction(span: int = SPAN, page: int = 1) -> list:
    """Scenario 3a: 8 requests, prompts span + 2 .. + 300, outputs 200..400."""
    rng = random.Random(f"forced-{page}")
    m = min_prompt(span)
    return [Req(f"fr{page}-{i:06d}", _prompt(rng, rng.randrange(m, m + 301)), rng.randrange(200, 401))
            for i in range(8)]


def plan_pool_pressure(span: int = SPAN, page: int = 1) -> list:
    """Scenario 3b: 8 requests, prompts span + 2 .. + 200, outputs 1000..1400."""
    rng = random.Random(f"pool-{page}")
    m = min_prompt(span)
    return [Req(f"pp{page}-{i:06d}", _prompt(rng, rng.randrange(m, m + 201)), rng.randrange(1000, 1401))
            for i in range(8)]


def plan_chunked(span: int = SPAN, page: int = 1) -> tuple:
    """Scenario 4: ``(decoders, long)``: 8 decoders (prompts span + 2 .. + 100, outputs 500..800)
    and 8 prompts of 1100..2400 ids (outputs 64..200), sent once the decoders run."""
    rng = random.Random(f"chunked-{page}")
    m = min_prompt(span)
    dec = [Req(f"cd{page}-{i:06d}", _prompt(rng, rng.randrange(m, m + 101)), rng.randrange(500, 801))
           for i in range(8)]
    long = [Req(f"cl{page}-{i:06d}", _prompt(rng, rng.randrange(max(m, 1100), 2401)), rng.randrange(64, 201))
            for i in range(8)]
    return dec, long


def plan_long(span: int = SPAN, page: int = 1, tokens: tuple = LONG_TOKENS) -> list:
    """Scenario 5: 8 requests, prompts span + 2 .. + 200, outputs ``tokens`` (lo, hi)."""
    rng = random.Random(f"long-{page}")
    m = min_prompt(span)
    return [Req(f"lo{page}-{i:06d}", _prompt(rng, rng.randrange(m, m + 201)), rng.randrange(tokens[0], tokens[1] + 1))
            for i in range(8)]


def plan_mixed(span: int = SPAN, page: int = 1) -> list:
    """Scenario 6: 24 requests, greedy / sampled / logprob in turn, prompts span + 2 .. + 400,
    outputs 96..192."""
    rng = random.Random(f"mixed-{page}")
    m = min_prompt(span)
    kinds = ("greedy", "sampled", "logprob")
    return [Req(f"mx{page}-{i:06d}", _prompt(rng, rng.randrange(m, m + 401)), rng.randrange(96, 193),
                kind=kinds[i % 3]) for i in range(24)]


def plan_overlap(span: int = SPAN, page: int = 1) -> list:
    """Scenario 7: 16 requests, half on 2 shared heads, prompts span + 2 .. + 800, outputs 32..400."""
    rng = random.Random(f"overlap-{page}")
    m = min_prompt(span)
    heads = _heads(rng, 2, m, m + 200)
    out = []
    for i in range(16):
        head = heads[i % 2] if i % 4 < 2 else None
        base = len(head) if head else 1
        ids = _prompt(rng, max(m, base + 8) + rng.randrange(0, 601), head)
        out.append(Req(f"ov{page}-{i:06d}", ids, rng.randrange(32, 401), head=len(head or ())))
    return out


def plan_bucket(span: int = SPAN, page: int = 1, concurrency: int = BUCKET_CONCURRENCY) -> list:
    """Scenario 8: ``concurrency`` requests at once, outputs 48, 88, ... (40 apart) in a shuffled
    order, prompts span + 2 .. + 300: the longest outlast the others."""
    rng = random.Random(f"bucket-{page}")
    m = min_prompt(span)
    ns = [48 + 40 * i for i in range(concurrency)]
    rng.shuffle(ns)
    return [Req(f"bk{page}-{i:06d}", _prompt(rng, rng.randrange(m, m + 301)), n) for i, n in enumerate(ns)]


def soak_requests(span: int = SPAN, page: int = SOAK_PAGE):
    """Scenario 9: an endless stream: prompts span + 2 + (0..100 | 100..600 | 600..1500), 30% on
    4 shared heads; outputs 1..16 | 16..128 | 128..512."""
    rng = random.Random(f"soak-{page}")
    m = min_prompt(span)
    heads = _heads(rng, 4, m, m + 400)
    i = 0
    while True:
        extra = rng.choice(((0, 100), (100, 600), (600, 1500)))
        length = m + rng.randrange(*extra)
        head = heads[i % 4] if rng.random() < 0.3 else None
        if head is not None:
            length = max(length, len(head) + 8)
        lo, hi = rng.choice(((1, 16), (16, 128), (128, 512)))
        yield Req(f"sk{page}-{i:07d}", _prompt(rng, length, head), rng.randrange(lo, hi + 1),
                  head=len(head or ()))
        i += 1


# ------------------------------------------------------------------------------ server settings
@dataclasses.dataclass(frozen=True)
class Setting:
    """One scenario's server: ``extra`` flags, ``pool`` (``--max-total-tokens``), ``env`` pairs."""

    extra: tuple = ()
    pool: int | None = None
    env: tuple = ()


def _bucket(n: int) -> tuple:
    """Decode (and our verify) graphs up to ``n`` requests, and at most ``n`` running: every
    verify step fits a captured bucket."""
    return ("--cuda-graph-max-bs-decode", str(n), "--max-running-requests", str(n))


BUSY_CHECK = (("SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY", "1"), ("SGLANG_CHECK_KV_PAGE_INVARIANTS", "1"))
SETTINGS = {
    "kv": Setting(_bucket(24), env=BUSY_CHECK),  # 16 clients; an aborted request may ride one step more
    "radix": Setting(_bucket(8), pool=RADIX_POOL, env=BUSY_CHECK),
    "forced_retraction": Setting(_bucket(8), env=(("SGLANG_TEST_RETRACT", "1"),)),
    "pool_pressure": Setting(_bucket(8), pool=RETRACT_POOL),
    "chunked": Setting(_bucket(16) + ("--chunked-prefill-size", str(CHUNK))),
    "long": Setting(_bucket(8)),
    "mixed": Setting(_bucket(24)),
    "overlap": Setting(_bucket(8) + ("--disable-overlap-schedule",)),
    "bucket": Setting(("--cuda-graph-max-bs-decode", str(BUCKET_MAX),
                       "--max-running-requests", str(BUCKET_CONCURRENCY))),
    "soak": Setting(_bucket(SOAK_CONCURRENCY)),
}
BASE_ARGS = ["--attention-backend", "triton", "--sampling-backend", "pytorch",
             "--cuda-graph-backend-prefill", "disabled", "--skip-tokenizer-init", "--grammar-backend", "none",
             "--mem-fraction-static", "0.4", "--context-length", str(CONTEXT), "--random-seed", "0"]
"""``bench.lib.server.ACCEPT_PAIR_ARGS`` with the radix cache on and the context for 1-2k outputs."""
SERVER_ENV_DROP = ("SGLANG_ENABLE_VERIFY_CUDA_GRAPH", "SGLANG_VERIFY_GRAPH_TEST_FAULT", "SGLANG_TEST_RETRACT",
                   "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY", "SGLANG_CHECK_KV_PAGE_INVARIANTS")


def server_args(mode: str, page: int, setting: Setting, draft: str) -> list:
    """The server flags of one scenario (``mode`` ours: with ``--enable-verify-cuda-graph``)."""
    args = BASE_ARGS + ["--page-size", str(page), "--speculative-algorithm", "EAGLE3",
                        "--speculative-draft-model-path", draft, "--speculative-eagle-topk", "1",
                        "--speculative-num-steps", str(STEPS), "--speculative-num-draft-tokens", str(STEPS + 1),
                        *setting.extra]
    if setting.pool:
        args += ["--max-total-tokens", str(setting.pool)]
    if mode == "ours":
        args.append("--enable-verify-cuda-graph")
    return args


# ------------------------------------------------------------------------------ SGLang's log lines
RETRACT_RE = {
    "forced": re.compile(r"Testing retraction\. #retracted_reqs: (\d+)"),
    "pool": re.compile(r"KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+)"),
}
"""0.5.16 ``Scheduler.update_running_batch``: ``logger.warning(msg_prefix + msg_details)``."""
PREFILL_RE = re.compile(r"Prefill batch[^,]*, #new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+), "
                        r".*?#running-req: (\d+)")
"""0.5.16 ``SchedulerMetricsReporter.report_prefill_stats`` (INFO, every prefill batch)."""


def retractions_in_log(text: str, kind: str) -> list:
    """``#retracted_reqs`` of every retraction line of ``kind`` (``forced`` / ``pool``)."""
    return [int(x) for x in RETRACT_RE[kind].findall(text)]


def prefill_batches(text: str) -> list:
    """``(new_seqs, new_tokens, cached_tokens, running_reqs)`` of every ``Prefill batch`` line."""
    return [tuple(int(x) for x in m) for m in PREFILL_RE.findall(text)]


# ------------------------------------------------------------------------------ prediction
class Predictor:
    """The prefix pair's greedy EAGLE-3 outputs and accepted drafts: ``prefix_sim.simulate_prefix``
    with one :class:`~bench.models.accept_pair.prefix_sim.PrefixModel` kept (its readout cache)."""

    def __init__(self, maps: dict, span: int):
        self.maps = maps
        self.row_predict = ps.PrefixModel(maps, span).predict(None, STEPS + 1)

    def __call__(self, ids: list, n: int) -> dict:
        return ap.simulate(self.maps, ids, n, STEPS, predict=self.row_predict)


def _first_difference(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def check_results(results: list, reqs: list, predict, vocab: int, histograms: bool = True) -> list:
    """``(rid, problem)`` for every result that is not what the simulator predicts: greedy and
    logprob outputs equal to the prediction with finish ``length`` (an aborted request: finish
    ``abort`` and a prefix of it, or the whole of it); logprob requests one entry per token with
    its id; sampled requests ``n`` valid ids; with ``histograms``, the accepted-draft histogram
    and verify count of every request that was neither retracted nor aborted."""
    problems = []
    for res, req in zip(results, reqs):
        if res["status"] != 200:
            problems.append((req.rid, f"HTTP {res['status']}: {res.get('error', '')[:160]}"))
            continue
        got, meta = res["output_ids"], res["meta"]
        finish = (meta.get("finish_reason") or {}).get("type")
        if req.kind == "sampled":
            if len(got) != req.n or finish != "length" or any(not 0 <= t < vocab for t in got):
                problems.append((req.rid, f"sampled: {len(got)} of {req.n} ids, finish {finish}"))
            continue
        sim = predict(req.ids, req.n)
        want = sim["output_ids"]
        if req.abort and finish == "abort":
            if got != want[:len(got)]:
                problems.append((req.rid, f"aborted output leaves the prediction at token "
                                          f"{_first_difference(got, want)}"))
            continue
        if finish != "length":
            problems.append((req.rid, f"finish_reason {meta.get('finish_reason')}"))
            continue
        if got != want:
            problems.append((req.rid, f"output differs from the prediction at token {_first_difference(got, want)} "
                                      f"of {req.n} (got {len(got)})"))
            continue
        if req.kind == "logprob":
            lps = meta.get("output_token_logprobs") or []
            if len(lps) != len(got) or [x[1] for x in lps] != got:
                problems.append((req.rid, f"{len(lps)} output logprobs for {len(got)} tokens"))
        if histograms and not req.abort and not meta.get("num_retractions"):
            hist = ap.trim_histogram(meta.get("spec_correct_drafts_histogram") or [])
            if hist != ap.accepted_histogram(sim["accepted"]) or meta.get("spec_verify_ct") != len(sim["accepted"]):
                problems.append((req.rid, f"histogram {hist} / {meta.get('spec_verify_ct')} verify steps, "
                                          f"predicted {ap.accepted_histogram(sim['accepted'])} / {len(sim['accepted'])}"))
    return problems


# ------------------------------------------------------------------------------ the pair and the server
@dataclasses.dataclass(frozen=True)
class Pair:
    target: str
    draft: str
    maps: dict
    span: int
    vocab: int


def _complete_build(root: str) -> bool:
    """A span-SPAN prefix pair fully written under ``root`` (the draft's maps are written last)."""
    target = os.path.join(root, px.PREFIX_NAME)
    if not os.path.isfile(os.path.join(target + "-eagle3", "pair_maps.json")):
        return False
    with open(os.path.join(target, "pair_maps.json")) as f:
        maps = json.load(f)
    return bool(maps.get("prefix")) and maps.get("span") == SPAN


@pytest.fixture(scope="module")
def prefix_pair():
    """The prefix pair at span ``SPAN``: ``E2E_MODELS_DIR``'s when complete, else this module's
    own under ``E2E_MODELS_DIR/serving_scenarios`` (built once under a lock: stages at once)."""
    import fcntl

    own = os.path.join(MODELS, OWN_MODELS)
    root = next((r for r in (MODELS, own) if _complete_build(r)), None)
    if root is None:
        os.makedirs(MODELS, exist_ok=True)
        with open(os.path.join(MODELS, ".serving_scenarios.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not _complete_build(own):
                env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
                subprocess.run([sys.executable, "-m", "bench", "models", "pair", own, "--prefix", "--span",
                                str(SPAN)], check=True, cwd=ROOT, env=env)
        root = own
    target = os.path.join(root, px.PREFIX_NAME)
    with open(os.path.join(target, "pair_maps.json")) as f:
        maps = json.load(f)
    with open(os.path.join(target, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    return Pair(target, target + "-eagle3", maps, SPAN, vocab)


class _Server:
    """One stock server of a scenario (``mode`` ours / upstream); its log under ``E2E_LOG_DIR``."""

    def __init__(self, pair: Pair, name: str, mode: str, page: int, setting: Setting):
        from bench.lib.server import SHARED_GPU_ENV, free_port, launch_server

        os.makedirs(LOG_DIR, exist_ok=True)
        self.base = f"http://127.0.0.1:{free_port()}"
        self.log = os.path.join(LOG_DIR, f"server_scenarios_{name}.log")
        env = {k: v for k, v in os.environ.items() if k not in SERVER_ENV_DROP}
        env.update(setting.env)
        args = server_args(mode, page, setting, pair.draft)
        shared = os.environ.get(SHARED_GPU_ENV)
        try:  # shared-GPU mode appends its own --max-total-tokens last: no larger than this pool
            if setting.pool and shared and int(shared) > setting.pool:
                os.environ[SHARED_GPU_ENV] = str(setting.pool)
            self.proc = launch_server(pair.target, self.base, args, env=env, log_path=self.log)
        finally:
            if shared is not None:
                os.environ[SHARED_GPU_ENV] = shared

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        from bench.lib.server import stop_server

        stop_server(self.proc)

    # -- requests
    @staticmethod
    def body(req: Req) -> dict:
        sp = {"max_new_tokens": req.n, "ignore_eos": True,
              "temperature": SAMPLED_TEMPERATURE if req.kind == "sampled" else 0.0}
        body = {"rid": req.rid, "input_ids": req.ids, "sampling_params": sp}
        if req.kind == "logprob":
            body["return_logprob"] = True
        return body

    def abort(self, rid: str) -> None:
        import requests

        requests.post(f"{self.base}/abort_request", json={"rid": rid}, timeout=30)

    def send(self, req: Req) -> dict:
        """``{"status", "output_ids", "meta", "error"}`` of one request (never raises)."""
        import requests

        try:
            if req.abort == "stream":
                return self._stream_and_abort(req)
            if req.abort == "timer":
                threading.Timer(req.abort_delay, self.abort, (req.rid,)).start()
            r = requests.post(f"{self.base}/generate", json=self.body(req), timeout=900)
            if r.status_code != 200:
                return {"status": r.status_code, "output_ids": [], "meta": {}, "error": r.text[:300]}
            out = r.json()
            return {"status": 200, "output_ids": out.get("output_ids") or [], "meta": out.get("meta_info") or {}}
        except Exception as ex:  # a dead server: reported with the request
            return {"status": None, "output_ids": [], "meta": {}, "error": repr(ex)}

    def _stream_and_abort(self, req: Req) -> dict:
        """Stream ``req`` (cumulative ``output_ids`` per chunk, 0.5.16's default) and abort it once
        ``abort_after`` tokens arrived; the last chunk is the result."""
        import requests

        last, sent = None, False
        with requests.post(f"{self.base}/generate", json=dict(self.body(req), stream=True), stream=True,
                           timeout=900) as r:
            if r.status_code != 200:
                return {"status": r.status_code, "output_ids": [], "meta": {}, "error": r.text[:300]}
            for line in r.iter_lines():
                if not line.startswith(b"data: "):
                    continue
                if line[6:].strip() == b"[DONE]":
                    break
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return {"status": chunk["error"].get("code"), "output_ids": [], "meta": {},
                            "error": chunk["error"].get("message", "")}
                last = chunk
                if not sent and len(chunk.get("output_ids") or []) >= req.abort_after:
                    self.abort(req.rid)
                    sent = True
        if last is None:
            return {"status": None, "output_ids": [], "meta": {}, "error": "stream ended without a chunk"}
        return {"status": 200, "output_ids": list(last.get("output_ids") or []), "meta": last.get("meta_info") or {},
                "abort_sent": sent}

    def run(self, reqs: list, concurrency: int) -> list:
        with cf.ThreadPoolExecutor(max(1, concurrency)) as pool:
            return list(pool.map(self.send, reqs))

    # -- state
    def loads(self) -> list:
        import requests

        return requests.get(f"{self.base}/v1/loads", timeout=30).json()["loads"]

    def pool_tokens(self) -> int:
        return min(int(x["max_total_num_tokens"]) for x in self.loads())

    def wait_idle(self, timeout: float = 180) -> None:
        t0 = time.time()
        while time.time() - t0 < timeout:
            loads = self.loads()
            if sum(int(x["num_running_reqs"]) + int(x["num_waiting_reqs"]) for x in loads) == 0:
                return
            time.sleep(1)
        raise AssertionError(f"server not idle after {timeout}s: {loads}")

    def wait_running(self, count: int, timeout: float = 120) -> int:
        t0 = time.time()
        running = 0
        while time.time() - t0 < timeout:
            running = sum(int(x["num_running_reqs"]) for x in self.loads())
            if running >= count:
                break
            time.sleep(0.2)
        return running

    def state(self):
        from bench.lib.server import plugin_state

        return plugin_state(self.base)

    def log_text(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()

    def accounting(self) -> dict:
        """Idle: alive, ``/flush_cache`` status, ``num_used_tokens`` after it (polled up to 15 s
        until 0), the leak markers found in the log."""
        import requests

        self.wait_idle()
        time.sleep(3)  # the scheduler's idle leak check runs (on_idle)
        acc = {"alive": self.proc.poll() is None, "flush": None, "used_after_flush": None}
        if acc["alive"]:
            acc["flush"] = requests.post(f"{self.base}/flush_cache", timeout=60).status_code
            for _ in range(15):
                acc["used_after_flush"] = sum(int(x["num_used_tokens"]) for x in self.loads())
                if acc["used_after_flush"] == 0:
                    break
                time.sleep(1)
        log = self.log_text()
        acc["leaks"] = [m for m in LEAK_MARKERS if m in log]
        return acc


def assert_accounting(acc: dict, log: str) -> None:
    assert acc["alive"], f"server died; log: {log}"
    assert acc["flush"] == 200, f"/flush_cache answered {acc['flush']} when idle; log: {log}"
    assert acc["used_after_flush"] == 0, f"{acc['used_after_flush']} KV tokens used after /flush_cache"
    assert not acc["leaks"], f"server log reports {acc['leaks']}: {log}"


def assert_counters(mode: str, st, all_replayed: bool = True) -> None:
    if mode != "ours":
        assert st is None, f"upstream server reports verify-graph counters: {st}"
        return
    assert st and st["runner"] == "VerifyCudaGraphRunner" and st["num_draft_tokens"] == STEPS + 1, st
    assert st["replays"] + st["fallback_total"] == st["verify_steps"] > 0, st
    if all_replayed:
        assert st["fallback_total"] == 0 and st["replays"] == st["verify_steps"], st


def assert_exact(problems: list, count: int, name: str) -> None:
    assert not problems, f"{name}: {len(problems)} of {count} requests not as predicted: {problems[:6]}"


def _params(modes, pages) -> list:
    return [pytest.param(m, p, id=f"{m}-p{p}") for m in modes for p in pages]


def _record(name: str, **kw) -> None:
    RESULTS[name] = kw


# ------------------------------------------------------------------------------ 1. KV accounting + aborts
@pytest.mark.parametrize("mode,page", _params(KV_MODES, (1, 64)))
def test_kv_accounting_with_mid_flight_aborts(prefix_pair, mode, page):
    reqs = plan_kv(prefix_pair.span, page)
    predict = Predictor(prefix_pair.maps, prefix_pair.span)
    name = f"kv_{mode}_p{page}"
    with _Server(prefix_pair, name, mode, page, SETTINGS["kv"]) as s:
        used_before = sum(int(x["num_used_tokens"]) for x in s.loads())
        results = s.run(reqs, 16)
        acc = s.accounting()
        st = s.state()
    problems = check_results(results, reqs, predict, prefix_pair.vocab, histograms=False)
    streamed = [(q, r) for q, r in zip(reqs, results) if q.abort == "stream"]
    mid = [q.rid for q, r in streamed if (r["meta"].get("finish_reason") or {}).get("type") == "abort"
           and q.abort_after <= len(r["output_ids"]) < q.n]
    aborted = [q.rid for q, r in zip(reqs, results) if (r["meta"].get("finish_reason") or {}).get("type") == "abort"]
    _record(name, requests=len(reqs), problems=problems[:20], used_before=used_before, accounting=acc, plugin=st,
            streamed_aborts=len(streamed), aborted_mid_flight=len(mid), aborted=len(aborted))
    assert_exact(problems, len(reqs), name)
    assert streamed and len(mid) >= 0.75 * len(streamed), (
        f"only {len(mid)} of {len(streamed)} streamed aborts ended mid-flight with finish type abort")
    assert used_before == 0, used_before
    assert_accounting(acc, s.log)
    assert_counters(mode, st)


# ------------------------------------------------------------------------------ 2. radix hits + eviction
@pytest.mark.parametrize("mode,page", _params(MODES, (1, 64)))
def test_radix_hits_and_eviction(prefix_pair, mode, page):
    phases = plan_radix(prefix_pair.span, page)
    predict = Predictor(prefix_pair.maps, prefix_pair.span)
    name = f"radix_{mode}_p{page}"
    with _Server(prefix_pair, name, mode, page, SETTINGS["radix"]) as s:
        pool = s.pool_tokens()
        results = [s.run(ph.reqs, len(ph.reqs)) for ph in phases]
        acc = s.accounting()
        st = s.state()
    reqs = [q for ph in phases for q in ph.reqs]
    flat = [r for rs in results for r in rs]
    problems = check_results(flat, reqs, predict, prefix_pair.vocab)
    cached = [[int(r["meta"].get("cached_tokens", -1)) for r in rs] for rs in results]
    missed_hits = [(ph.round, ph.head, c) for ph, cs in zip(phases, cached) if ph.kind == "hits"
                   for q, c in zip(ph.reqs, cs) if c < q.head // 2]
    first_r1 = [(ph.head, cs[0]) for ph, cs in zip(phases, cached) if ph.kind == "first" and ph.round == 0]
    evicted = [(ph.head, cs[0]) for ph, cs in zip(phases, cached) if ph.kind == "first" and ph.round > 0
               and cs[0] < ph.reqs[0].head // 2]
    _record(name, pool=pool, problems=problems[:20], cached=cached, accounting=acc, plugin=st)
    assert_exact(problems, len(reqs), name)
    assert pool <= RADIX_POOL, f"KV pool of {pool} tokens: --max-total-tokens {RADIX_POOL} not applied"
    assert not missed_hits, f"requests sent after their head's first request missed the radix cache: {missed_hits}"
    heads = {ph.head: ph.reqs[0].head for ph in phases}
    assert all(c < heads[h] // 2 for h, c in first_r1), f"round 1 first requests hit a cache still empty: {first_r1}"
    assert evicted, f"no head was evicted between rounds (pool {pool}): first requests of round 2 cached " \
                    f"{[cs[0] for ph, cs in zip(phases, cached) if ph.kind == 'first' and ph.round > 0]}"
    assert_accounting(acc, s.log)
    assert_counters(mode, st)


# ------------------------------------------------------------------------------ 3. retraction
@pytest.mark.parametrize("mode,page", _params(MODES, (1, 64)))
def test_forced_retraction(prefix_pair, mode, page):
    reqs = plan_forced_retraction(prefix_pair.span, page)
    predict = Predictor(prefix_pair.maps, prefix_pair.span)
    name = f"forced_retraction_{mode}_p{page}"
    with _Server(prefix_pair, name, mode, page, SETTINGS["forced_retraction"]) as s:
        results = s.run(reqs, len(reqs))
        acc = s.accounting()
        st = s.state()
        log = s.log_text()
    problems = check_results(results, reqs, predict, prefix_pair.vocab)
    lines = retractions_in_log(log, "forced")
    per_req = [int(r["meta"].get("num_retractions") or 0) for r in results]
    _record(name, problems=problems, retract_lines=len(lines), retracted=sum(lines), num_retractions=per_req,
            accounting=acc, plugin=st)
    assert_exact(problems, len(reqs), name)
    assert sum(lines) > 0, f"no 'Testing retraction. #retracted_reqs: N' line with N > 0 in {s.log}"
    assert sum(per_req) > 0, f"no request reports num_retractions > 0: {per_req}"
    assert_accounting(acc, s.log)
    assert_counters(mode, st)


@pytest.mark.parametrize("mode,page", _params(MODES, (1, 64)))
def test_retraction_under_pool_pressure(prefix_pair, mode, page):
    reqs = plan_pool_pressure(prefix_pair.span, page)
    predict = Predictor(prefix_pair.maps, prefix_pair.span)
    name = f"pool_pressure_{mode}_p{page}"
    with _Server(prefix_pair, name, mode, page, SETTINGS["pool_pressure"]) as s:
        pool = s.pool_tokens()
        results = s.run(reqs, len(reqs))
        acc = s.accounting()
        st = s.state()
        log = s.log_text()
    problems = check_results(results, reqs, predict, prefix_pair.vocab)
    lines = retractions_in_log(log, "pool")
    per_req = [int(r["meta"].get("num_retractions") or 0) for r in results]
    _record(name, pool=pool, problems=problems, retract_lines=len(lines), retracted=sum(lines),
            num_retractions=per_req, accounting=acc, plugin=st)
    assert_exact(problems, len(reqs), name)
    assert pool <= RETRACT_POOL, f"KV pool of {pool} tokens: --max-total-tokens {RETRACT_POOL} not applied"
    assert sum(lines) > 0, f"no 'KV cache pool is full. Retract requests.' line in {s.log}"
    assert sum(per_req) > 0, f"no request reports num_retractions > 0: {per_req}"
    assert_accounting(acc, s.log)
    assert_counters(mode, st)


# ------------------------------------------------------------------------------ 4. chunked prefill
@pytest.mark.parametrize("mode,page", _params(MODES, (1, 64)))
def test_chunked_prefill_beside_decoding(prefix_pair, mode, page):
    dec, long = plan_chunked(prefix_pair.span, page)
    predict = Predictor(prefix_pair.maps, prefix_pair.span)
    name = f"chunked_{mode}_p{page}"
    with _Server(prefix_pair, name, mode, page, SETTINGS["chunked"]) as s:
        with cf.ThreadPoolExecutor(len(dec) + len(long)) as pool:
            futs = [pool.submit(s.send, q) for q in dec]
            running = s.wait_running(len(dec) // 2)
            for q in long:
                futs.append(pool.submit(s.send, q))
                time.sleep(0.2)
            results = [f.result() for f in futs]
        acc = s.accounting()
        st = s.state()
        log = s.log_text()
    reqs = dec + long
    problems = check_results(results, reqs, predict, prefix_pair.vocab)
    batches = prefill_batches(log)
    beside = [b for b in batches if b[1] == CHUNK and b[3] > 0]
    _record(name, problems=problems, running_when_long_sent=running, prefill_batches=len(batches),
            full_chunks_beside_decode=len(beside), accounting=acc, plugin=st)
    assert_exact(problems, len(reqs), name)
    assert batches, f"no 'Prefill batch' line in {s.log}"
    assert max(b[1] for b in batches) <= CHUNK, f"a prefill batch above the chunk of {CHUNK}: " \
                                                f"{max(b[1] for b in batches)} tokens"
    assert beside, f"no full {CHUNK}-token chunk prefilled while requests decoded (#running-req > 0)"
    assert_accounting(acc, s.log)
    assert_counters(mode, st)


# ------------------------------------------------------------------------------ 5. long outputs
@pytest.mark.parametrize("mode,page", _params(MODES, (1, 64)))
def test_long_outputs(prefix_pair, mode, page):
    reqs = plan_long(prefix_pair.span, page)
    predict = Predictor(prefix_pair.maps, prefix_pair.span)
    name = f"long_{mode}_p{page}"
    with _Server(prefix_pair, name, mode, page, SETTINGS["long"]) as s:
        results = s.run(reqs, len(reqs))
        acc = s.accounting()
        st = s.state()
    problems = check_results(results, reqs, predict, prefix_pair.vocab)
    _record(name, problems=problems, tokens=[len(r["output_ids"]) for r in results], accounting=acc, plugin=st)
    assert_exact(problems, len(reqs), name)
    assert_accounting(acc, s.log)
    assert_counters(mode, st)


# ------------------------------------------------------------------------------ 6. greedy + sampled + logprob
@pytest.mark.parametrize("mode,page", _params(MODES, (1,)))
def test_greedy_sampled_logprob_one_batch(prefix_pair, mode, page):
    reqs = plan_mixed(prefix_pair.span, page)
    predict = Predictor(prefix_pair.maps, prefix_pair.span)
    name = f"mixed_{mode}_p{page}"
    with _Server(prefix_pair, name, mode, page, SETTINGS["mixed"]) as s:
        results = s.run(reqs, len(reqs))  # one batch
        acc = s.accounting()
        st = s.state()
    problems = check_results(results, reqs, predict, prefix_pair.vocab, histograms=False)
    left = [q.rid for q, r in zip(reqs, results) if q.kind == "sampled"
            and r["output_ids"] != predict(q.ids, q.n)["output_ids"]]
    _record(name, problems=problems, sampled_off_greedy=left, accounting=acc, plugin=st)
    assert_exact(problems, len(reqs), name)
    assert left, f"no sampled request (temperature {SAMPLED_TEMPERATURE}) left the greedy chain: the batch " \
                 "did not mix sampling"
    assert_accounting(acc, s.log)
    assert_counters(mode, st)


# ------------------------------------------------------------------------------ 7. no overlap scheduler
@pytest.mark.parametrize("mode,page", _params(MODES, (1, 64)))
def test_without_overlap_schedule(prefix_pair, mode, page):
    reqs = plan_overlap(prefix_pair.span, page)
    predict = Predictor(prefix_pair.maps, prefix_pair.span)
    name = f"no_overlap_{mode}_p{page}"
    with _Server(prefix_pair, name, mode, page, SETTINGS["overlap"]) as s:
        results = s.run(reqs, 8)
        acc = s.accounting()
        st = s.state()
    problems = check_results(results, reqs, predict, prefix_pair.vocab)
    _record(name, problems=problems, cached=[r["meta"].get("cached_tokens") for r in results],
            accounting=acc, plugin=st)
    assert_exact(problems, len(reqs), name)
    assert_accounting(acc, s.log)
    assert_counters(mode, st)


# ------------------------------------------------------------------------------ 8. above the largest bucket
@pytest.mark.parametrize("mode,page", _params(MODES, (1,)))
def test_more_requests_than_the_largest_bucket(prefix_pair, mode, page):
    reqs = plan_bucket(prefix_pair.span, page)
    predict = Predictor(prefix_pair.maps, prefix_pair.span)
    name = f"bucket_{mode}_p{page}"
    with _Server(prefix_pair, name, mode, page, SETTINGS["bucket"]) as s:
        results = s.run(reqs, len(reqs))
        acc = s.accounting()
        st = s.state()
    problems = check_results(results, reqs, predict, prefix_pair.vocab)
    _record(name, problems=problems, accounting=acc, plugin=st)
    assert_exact(problems, len(reqs), name)
    assert_accounting(acc, s.log)
    assert_counters(mode, st, all_replayed=False)
    if mode == "ours":
        from sglang_verify_graph.counters import REASON_BS_ABOVE_MAX

        assert max(st["capture_bs"]) <= BUCKET_MAX < len(reqs), st["capture_bs"]
        assert st["replays"] > 0, f"no verify step replayed our graph: {st}"
        assert st["fallbacks"].get(REASON_BS_ABOVE_MAX, 0) > 0, f"no eager verify step above the bucket: {st}"
        assert set(st["fallbacks"]) == {REASON_BS_ABOVE_MAX}, st["fallbacks"]


# ------------------------------------------------------------------------------ 9. soak
@pytest.mark.parametrize("mode,page", _params(("ours",), (SOAK_PAGE,)))
def test_soak(prefix_pair, mode, page):
    gen = soak_requests(prefix_pair.span, page)
    predict = Predictor(prefix_pair.maps, prefix_pair.span)
    lock = threading.Lock()
    done, problems = [], []
    name = f"soak_{mode}_p{page}"
    with _Server(prefix_pair, name, mode, page, SETTINGS["soak"]) as s:
        deadline = time.time() + SOAK_S

        def worker():
            while time.time() < deadline:
                with lock:
                    req = next(gen)
                res = s.send(req)
                bad = check_results([res], [req], predict, prefix_pair.vocab)
                with lock:
                    done.append((req.rid, len(req.ids), req.n, len(res["output_ids"])))
                    problems.extend(bad)
                if res["status"] is None:  # server gone: stop this worker
                    return

        t0 = time.time()
        threads = [threading.Thread(target=worker) for _ in range(SOAK_CONCURRENCY)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.time() - t0
        acc = s.accounting()
        st = s.state()
    _record(name, seconds=round(seconds, 1), requests=len(done), tokens=sum(d[3] for d in done),
            problems=problems[:20], accounting=acc, plugin=st)
    assert_exact(problems, len(done), name)
    assert len(done) >= SOAK_CONCURRENCY, f"only {len(done)} requests in {seconds:.0f} s"
    assert_accounting(acc, s.log)
    assert_counters(mode, st)

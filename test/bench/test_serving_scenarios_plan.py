"""CPU tier: the requests and servers of the serving-scenario tests
(``test/e2e/test_serving_scenarios_e2e.py``), checked against the prefix pair's simulator and
SGLang 0.5.16's own parser and sources before a GPU runs them.

Failure mode guarded: a scenario set up so that it cannot see what it guards, and would pass on the
GPU whatever the server does to the KV: a prompt shorter than the pair's span + 2 (output rows then
fail offset checks already, so a wrong slot may change nothing), outputs too short to read the
prefix KV, a wrong prefix slot that the simulator says leaves the outputs alone, a pool that holds
every radix head (no eviction) or every request (no retraction) or that makes SGLang clip
``max_new_tokens``, a "chunked" prompt within a few chunks or decoders done before the chunks
run, a bucket scenario whose batches never exceed (or never fit) the bucket, a server flag SGLang
does not parse, a log line or response field the tests read that SGLang does not write, or a
pytest stage whose ``-k`` selects no test or one test twice.
"""

import importlib.util
import inspect
import itertools
import json
import os
import random
import re
import subprocess
import sys

import pytest

from bench.models import accept_pair as ap
from bench.models.accept_pair import prefix as px
from bench.models.accept_pair import prefix_sim as ps
from bench.suites import stages as suite_stages

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
E2E = "test/e2e/test_serving_scenarios_e2e.py"


def _load_e2e():
    spec = importlib.util.spec_from_file_location("serving_scenarios_e2e", os.path.join(ROOT, E2E))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their module
    spec.loader.exec_module(mod)
    return mod


sc = _load_e2e()
SPAN = sc.SPAN
MAPS = ap.pair_maps(0.7, 0, attention=True)  # write_prefix_pair's defaults (checked below)
PREDICT = sc.Predictor(MAPS, SPAN)
MODEL = ps.PrefixModel(MAPS, SPAN)
OFFSETS = sorted(MODEL.offsets())


def _scenarios() -> dict:
    out = {}
    for page in (1, 64):
        out[f"kv_p{page}"] = sc.plan_kv(SPAN, page)[:160]  # the first 160 of 1000 (simulation time)
        out[f"radix_p{page}"] = [q for ph in sc.plan_radix(SPAN, page) for q in ph.reqs]
        out[f"forced_retraction_p{page}"] = sc.plan_forced_retraction(SPAN, page)
        out[f"pool_pressure_p{page}"] = sc.plan_pool_pressure(SPAN, page)
        out[f"chunked_p{page}"] = sum(sc.plan_chunked(SPAN, page), [])
        out[f"long_p{page}"] = sc.plan_long(SPAN, page)
        out[f"overlap_p{page}"] = sc.plan_overlap(SPAN, page)
    out["mixed_p1"] = [q for q in sc.plan_mixed(SPAN, 1) if q.kind != "sampled"]
    out["bucket_p1"] = sc.plan_bucket(SPAN, 1)
    out["soak"] = list(itertools.islice(sc.soak_requests(SPAN, sc.SOAK_PAGE), 200))
    return out


SCENARIOS = _scenarios()
MIN_READ_SHARE = {"kv": 0.4, "radix": 0.6, "overlap": 0.75, "soak": 0.4}
"""Share of a scenario's requests whose output rows read every one of their last ``span`` prompt
positions (the rest: short outputs on purpose, e.g. page-edge and radix first requests); 0.9 for
the others."""
_SIMS = {}


def _sim(q):
    key = (tuple(q.ids), q.n)
    if key not in _SIMS:
        _SIMS[key] = PREDICT(q.ids, q.n)
    return _SIMS[key]


def reads_whole_span(length: int, n: int, span: int = SPAN) -> bool:
    """Whether the rows that decide the ``n`` output tokens of a ``length``-token prompt (positions
    ``length - 1 ..``) read, through the pair's offsets, every prompt position of the last span."""
    read = {r - k for r in range(length - 1, length - 1 + n) for k in OFFSETS}
    return set(range(max(1, length - span), length)) <= read


def _faulted_outputs(q, fault, n):
    def predict(prefix, chain):
        seq = list(prefix) + list(chain)
        return [MODEL.row(seq, len(prefix) + j, len(seq), fault) for j in range(len(chain))]
    return ap.simulate(MAPS, q.ids, n, sc.STEPS, predict=predict)["output_ids"]


def _sglang_source(rel: str) -> str:
    root = importlib.util.find_spec("sglang").submodule_search_locations[0]
    with open(os.path.join(root, rel)) as f:
        return f.read()


def _clipped_max_new_tokens(length: int, n: int, pool: int, page: int, context: int = sc.CONTEXT) -> int:
    """SGLang 0.5.16's cap on ``max_new_tokens`` (``Scheduler`` request intake; ``max_req_len =
    min(context - 1, pool - 1)`` from ``TpModelWorker``)."""
    paged = -(-length // page) * page
    max_req_len = min(context - 1, pool - 1)
    return max(0, min(n, max_req_len - length - 1, pool - paged - page - 1))


# ------------------------------------------------------------------------------ the pair
def test_the_served_pair_is_the_simulated_one():
    """The build the e2e fixture makes (``bench models pair --prefix``) uses these maps and span,
    and the tests' predictor is ``prefix_sim.simulate_prefix``."""
    defaults = {k: p.default for k, p in inspect.signature(px.write_prefix_pair).parameters.items()}
    assert (defaults["span"], defaults["agree"], defaults["seed"]) == (SPAN, 0.7, 0)
    q = SCENARIOS["forced_retraction_p1"][0]
    assert PREDICT(q.ids, q.n) == ps.simulate_prefix(MAPS, SPAN, q.ids, q.n, sc.STEPS)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_prompts_meet_the_span_and_predict_the_clean_chain(name):
    """BOS first, >= span + 2 ids, regular ids after BOS, unique fixed-width rids; the prediction
    is ``n`` tokens and the plain g-chain (every offset check passes, so every read key counts)."""
    reqs = SCENARIOS[name]
    assert len({q.rid for q in reqs}) == len(reqs) and len({len(q.rid) for q in reqs}) == 1, name
    for q in reqs:
        assert q.ids[0] == ap.BOS and len(q.ids) >= SPAN + 2, (q.rid, len(q.ids))
        assert all(ap.SPECIAL <= t < ap.VOCAB for t in q.ids[1:]), q.rid
        assert len(q.ids) + q.n < sc.CONTEXT, q.rid
        sim = _sim(q)
        assert len(sim["output_ids"]) == q.n, q.rid
        assert sim["output_ids"] == ap.simulate(MAPS, q.ids, q.n, sc.STEPS)["output_ids"], q.rid


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_outputs_read_the_prefix_and_a_wrong_slot_changes_them(name):
    """Enough requests read every position of their last span; for two of them, the slot of the
    middle of that span swapped with its neighbour's in every verify step changes the output."""
    reqs = SCENARIOS[name]
    full = [q for q in reqs if reads_whole_span(len(q.ids), q.n)]
    share = MIN_READ_SHARE.get(name.split("_p")[0], 0.9)
    assert len(full) >= share * len(reqs), f"{name}: {len(full)} of {len(reqs)} read their whole span"
    for q in full[:2]:
        p = len(q.ids) - SPAN // 2
        n = min(q.n, 200)
        clean = _sim(q)["output_ids"][:n]
        assert _faulted_outputs(q, ps.PrefixFault(page=(p, p + 1)), n) != clean, (name, q.rid, p)


# ------------------------------------------------------------------------------ per scenario
@pytest.mark.parametrize("page", [1, 64])
def test_kv_plan_has_page_edges_heads_and_aborts_in_flight(page):
    reqs = sc.plan_kv(SPAN, page)
    assert len(reqs) == sc.KV_REQUESTS
    edges = [len(q.ids) for q in reqs[:6]]
    assert edges == sc.page_edge_lengths(SPAN) and all(e % 64 in (63, 0, 1) for e in edges), edges
    assert sum(q.head > 0 for q in reqs) >= 0.3 * len(reqs)
    streamed = [q for q in reqs if q.abort == "stream"]
    timed = [q for q in reqs if q.abort == "timer"]
    assert 0.07 * len(reqs) <= len(streamed) and 0.02 * len(reqs) <= len(timed)
    assert len(streamed) + len(timed) <= 0.2 * len(reqs)
    # a streamed abort fires after abort_after tokens with at least half the output still to come
    assert all(1 <= q.abort_after < q.n // 2 and q.n >= 300 for q in streamed)
    for q in reqs:  # SGLang aborts every rid that starts with the given one
        assert not any(o.rid != q.rid and o.rid.startswith(q.rid) for o in reqs[:50]), q.rid


@pytest.mark.parametrize("page", [1, 64])
def test_radix_pool_evicts_heads_and_fits_every_request(page):
    phases = sc.plan_radix(SPAN, page)
    pool = sc.SETTINGS["radix"].pool
    heads = {ph.head: ph.reqs[0].ids[:ph.reqs[0].head] for ph in phases}
    assert sum(len(h) for h in heads.values()) > pool, "the heads fit the pool: nothing to evict"
    assert {ph.round for ph in phases} == {0, 1} and all(len(h) >= SPAN + 2 for h in heads.values())
    for ph in phases:
        assert all(q.ids[:q.head] == heads[ph.head] for q in ph.reqs)
        demand = len(heads[ph.head]) + sum(len(q.ids) - q.head + q.n + page for q in ph.reqs)
        assert demand < pool, (ph.round, ph.head, demand)
        for q in ph.reqs:
            assert _clipped_max_new_tokens(len(q.ids), q.n, pool, page) == q.n, q.rid
    assert all(len(ph.reqs) >= 2 for ph in phases if ph.kind == "hits")


@pytest.mark.parametrize("page", [1, 64])
def test_pool_pressure_outgrows_the_pool_and_fits_each_request(page):
    """SGLang admits requests while ``prompt + ratio * max_new_tokens`` fits (initial ratio
    ``SGLANG_INIT_NEW_TOKEN_RATIO``); those admitted at once must outgrow the pool as they
    decode, and each must fit alone (else SGLang clips it or aborts the last one)."""
    reqs = sc.plan_pool_pressure(SPAN, page)
    pool = sc.SETTINGS["pool_pressure"].pool
    ratio = float(re.search(r"SGLANG_INIT_NEW_TOKEN_RATIO = EnvFloat\(([\d.]+)\)",
                            _sglang_source("srt/environ.py")).group(1))
    admitted, budget = [], 0.0
    for q in reqs:
        need = -(-len(q.ids) // page) * page + ratio * q.n
        if budget + need > pool:
            break
        admitted.append(q)
        budget += need
    assert len(admitted) >= 2, "one request at a time: no retraction possible"
    assert sum(len(q.ids) + q.n for q in admitted) > pool, "the admitted requests fit the pool when done"
    for q in reqs:
        assert _clipped_max_new_tokens(len(q.ids), q.n, pool, page) == q.n, q.rid


@pytest.mark.parametrize("page", [1, 64])
def test_chunked_prompts_span_several_chunks_while_others_decode(page):
    dec, long = sc.plan_chunked(SPAN, page)
    assert sc.CHUNK % page == 0  # SGLang: chunked_prefill_size divisible by page_size
    assert all(len(q.ids) >= 4 * sc.CHUNK for q in long), [len(q.ids) for q in long]
    chunks = sum(-(-len(q.ids) // sc.CHUNK) for q in dec + long)
    steps = min(len(_sim(q)["accepted"]) for q in dec)
    assert steps >= chunks, f"decoders run {steps} verify steps, the prompts need {chunks} prefill chunks"
    assert len(dec) + len(long) <= int(sc.SETTINGS["chunked"].extra[1])  # one bucket


@pytest.mark.parametrize("page", [1, 64])
def test_long_outputs_are_one_to_two_thousand_tokens(page):
    lo, hi = sc.LONG_TOKENS
    reqs = sc.plan_long(SPAN, page)
    assert all(lo <= q.n <= hi for q in reqs) and max(q.n for q in reqs) - min(q.n for q in reqs) > 0
    assert (lo, hi) != (1024, 2048) or min(q.n for q in reqs) >= 1000


def test_mixed_batch_has_each_kind_in_one_bucket():
    reqs = sc.plan_mixed(SPAN, 1)
    kinds = [q.kind for q in reqs]
    assert {k: kinds.count(k) for k in set(kinds)} == {"greedy": 8, "sampled": 8, "logprob": 8}
    assert len(reqs) <= int(sc.SETTINGS["mixed"].extra[1])


def test_bucket_batches_exceed_then_fit_the_largest_bucket():
    """All requests start together: while more than the bucket run, verify is eager; the longest
    ``bucket`` requests outlast the rest by >= 10 verify steps (graph replays)."""
    reqs = sc.plan_bucket(SPAN, 1)
    assert len(reqs) > sc.BUCKET_MAX
    steps = sorted((len(_sim(q)["accepted"]) for q in reqs), reverse=True)
    assert steps[-1] >= 10, steps
    assert steps[0] - steps[sc.BUCKET_MAX] >= 10, steps


def test_soak_stream_mixes_lengths_heads_and_outputs():
    reqs = SCENARIOS["soak"]
    lengths = [len(q.ids) for q in reqs]
    assert min(lengths) < SPAN + 2 + 100 and max(lengths) > SPAN + 2 + 1000
    assert 0.15 * len(reqs) <= sum(q.head > 0 for q in reqs) <= 0.45 * len(reqs)
    assert min(q.n for q in reqs) <= 16 and max(q.n for q in reqs) >= 400
    assert sc.SOAK_S >= 1 and sc.SOAK_CONCURRENCY <= int(sc.SETTINGS["soak"].extra[1])


# ------------------------------------------------------------------------------ SGLang's side
@pytest.mark.parametrize("name", list(sc.SETTINGS))
def test_server_flags_parse_with_sglangs_parser(name):
    """Each scenario's upstream command line through SGLang's own CLI parser: the fields it sets;
    ours is the same plus ``--enable-verify-cuda-graph``."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    setting = sc.SETTINGS[name]
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    for page in (1, 64):
        up = sc.server_args("upstream", page, setting, "/draft")
        assert sc.server_args("ours", page, setting, "/draft") == up + ["--enable-verify-cuda-graph"]
        ns = parser.parse_args(["--model-path", "/target", *up])
        assert ns.page_size == page and ns.context_length == sc.CONTEXT and not ns.disable_radix_cache
        assert ns.speculative_algorithm == "EAGLE3" and ns.speculative_num_steps == sc.STEPS
        assert ns.max_total_tokens == setting.pool
        flags = dict(zip(setting.extra, setting.extra[1:]))
        assert ns.cuda_graph_max_bs_decode == int(flags["--cuda-graph-max-bs-decode"])
        assert ns.max_running_requests == int(flags["--max-running-requests"])
        assert ns.chunked_prefill_size == (sc.CHUNK if name == "chunked" else None)
        assert ns.disable_overlap_schedule == (name == "overlap")


def test_log_lines_fields_and_settings_the_tests_read_are_sglangs():
    sched = _sglang_source("srt/managers/scheduler.py")
    for frag in ('"KV cache pool is full. Retract requests. "', '"Testing retraction. "',
                 'f"#retracted_reqs: {len(retracted_reqs)}', "TEST_RETRACT and self.forward_ct % TEST_RETRACT_INTERVAL"):
        assert frag in sched, frag
    reporter = _sglang_source("srt/managers/scheduler_components/metrics_reporter.py")
    for frag in ('f"Prefill batch{iter_msg}, "', 'f"#new-seq: {', 'f"#new-token: {prefill_stats.log_input_tokens}',
                 'f"#cached-token: {', 'f"#running-req: {prefill_stats.num_running_reqs.total}'):
        assert frag in reporter, frag
    environ = _sglang_source("srt/environ.py")
    for frag in ("SGLANG_TEST_RETRACT = EnvBool(", "SGLANG_TEST_RETRACT_INTERVAL = EnvInt(3)",
                 "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE = EnvBool(True)",
                 "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY = EnvInt(", "SGLANG_CHECK_KV_PAGE_INVARIANTS = EnvBool("):
        assert frag in environ, frag
    assert "memory leak detected" in _sglang_source("srt/managers/scheduler_components/invariant_checker.py")
    tm = _sglang_source("srt/managers/tokenizer_manager.py")
    assert '"num_retractions"' in tm and '"cached_tokens"' in tm and "spec_correct_drafts_histogram" in tm
    assert '"type": "abort"' in _sglang_source("srt/managers/schedule_batch.py")
    snap = _sglang_source("srt/managers/load_snapshot.py")
    # a dict key (0.5.16) or a dataclass field (0.5.23) of the /v1/loads payload
    assert all(re.search(rf'"{k}"|^\s+{k}: int', snap, re.M) for k in (
        "num_used_tokens", "max_total_num_tokens", "num_running_reqs", "num_waiting_reqs"))
    # the tests' parsers on lines in those formats
    line = ("[2026-01-01 00:00:00] Prefill batch, #new-seq: 1, #new-token: 256, #cached-token: 64, #token: 900, "
            "token usage: 0.01, #running-req: 7, #queue-req: 3, #pending-token: 0, cuda graph: False")
    assert sc.prefill_batches(line + "\n" + line.replace("batch,", "batch [12],")) == [(1, 256, 64, 7)] * 2
    assert sc.retractions_in_log("Testing retraction. #retracted_reqs: 2, #new_tokens_gained: 40", "forced") == [2]
    assert sc.retractions_in_log("KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_tokens_gained: "
                                 "900, #new_token_ratio: 0.7000 -> 0.4000", "pool") == [3]


# ------------------------------------------------------------------------------ the stages
def _stages():
    return [s for s in vars(suite_stages).values()
            if isinstance(s, suite_stages.Stage) and E2E in s.cmd]


def test_each_test_runs_in_exactly_one_stage():
    """The stages' ``-k`` expressions (pytest's own matcher on the collected test names) select
    every test of the file once."""
    from _pytest.mark.expression import Expression

    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "server", E2E,
                        "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    ids = [ln.split("::", 1)[1] for ln in p.stdout.splitlines() if ln.startswith(E2E + "::")]
    assert ids, p.stdout[-2000:] + p.stderr[-2000:]
    stages = _stages()
    assert stages
    seen = {i: [] for i in ids}
    for s in stages:
        k = s.cmd[s.cmd.index("-k") + 1]
        expr = Expression.compile(k)
        hit = [i for i in ids if expr.evaluate(lambda word, i=i: word.lower() in i.lower())]
        assert hit, f"stage {s.name}: -k {k!r} selects no test"
        for i in hit:
            seen[i].append(s.name)
    assert all(len(v) == 1 for v in seen.values()), {i: v for i, v in seen.items() if len(v) != 1}


# ------------------------------------------------------------------------------ the tests' own client and checks
class _StubServer:
    """A stand-in for SGLang's HTTP surface the tests use: ``/generate`` (the prediction, or with
    ``wrong`` one token changed; streamed as cumulative ``output_ids`` chunks that stop with
    finish ``abort`` once ``/abort_request`` named the rid), ``/v1/loads``, ``/flush_cache``."""

    def __init__(self, wrong: bool = False):
        import http.server
        import threading
        import time

        aborted = self.aborted = set()

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _json(self, obj, code=200):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._json({"loads": [{"num_used_tokens": 0, "num_running_reqs": 0, "num_waiting_reqs": 0,
                                       "max_total_num_tokens": 6144}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path == "/abort_request":
                    aborted.add(body["rid"])
                    return self._json({})
                if self.path == "/flush_cache":
                    return self._json({})
                n = body["sampling_params"]["max_new_tokens"]
                sim = PREDICT(body["input_ids"], n)
                out = list(sim["output_ids"])
                if wrong:
                    out[n // 2] = ap.BOS
                meta = {"finish_reason": {"type": "length", "length": n}, "num_retractions": 0, "cached_tokens": 0,
                        "spec_verify_ct": len(sim["accepted"]),
                        "spec_correct_drafts_histogram": ap.accepted_histogram(sim["accepted"]) + [0]}
                if not body.get("stream"):
                    return self._json({"output_ids": out, "meta_info": meta})
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for k in range(1, n + 1):
                    if body["rid"] in aborted:
                        meta = dict(meta, finish_reason={"type": "abort", "message": "Aborted"})
                        k -= 1
                    chunk = {"output_ids": out[:k], "meta_info": meta}
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    self.wfile.flush()
                    if meta["finish_reason"]["type"] == "abort":
                        break
                    time.sleep(0.002)
                self.wfile.write(b"data: [DONE]\n\n")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def client(self, log_path):
        s = object.__new__(sc._Server)
        s.base, s.log = self.base, str(log_path)
        s.proc = type("Alive", (), {"poll": staticmethod(lambda: None)})()
        open(s.log, "w").close()
        return s


def _client_plan():
    rng = random.Random(5)
    m = sc.min_prompt(SPAN)
    ids = lambda: sc._prompt(rng, m + rng.randrange(50))  # noqa: E731
    return [sc.Req("t-000001", ids(), 80), sc.Req("t-000002", ids(), 40, kind="logprob"),
            sc.Req("t-000003", ids(), 300, abort="stream", abort_after=12),
            sc.Req("t-000004", ids(), 60, abort="timer", abort_delay=0.0)]


def test_client_aborts_a_stream_in_flight_and_the_checks_pass_the_prediction(tmp_path):
    stub = _StubServer()
    try:
        s = stub.client(tmp_path / "server.log")
        reqs = [q for q in _client_plan() if q.kind != "logprob"]
        results = s.run(reqs, len(reqs))
        acc = s.accounting()
    finally:
        stub.httpd.shutdown()
    assert sc.check_results(results, reqs, PREDICT, ap.VOCAB) == []
    streamed = results[1]
    assert streamed["abort_sent"] and streamed["meta"]["finish_reason"]["type"] == "abort"
    assert reqs[1].abort_after <= len(streamed["output_ids"]) < reqs[1].n
    assert "t-000003" in stub.aborted
    assert acc == {"alive": True, "flush": 200, "used_after_flush": 0, "leaks": []}


def test_checks_flag_each_wrong_answer(tmp_path):
    stub = _StubServer(wrong=True)
    try:
        s = stub.client(tmp_path / "server.log")
        reqs = _client_plan()[:1]
        wrong = s.run(reqs, 1)
    finally:
        stub.httpd.shutdown()
    assert "differs from the prediction" in sc.check_results(wrong, reqs, PREDICT, ap.VOCAB)[0][1]
    q = _client_plan()[0]
    sim = PREDICT(q.ids, q.n)
    good = {"status": 200, "output_ids": sim["output_ids"], "meta": {
        "finish_reason": {"type": "length"}, "spec_verify_ct": len(sim["accepted"]),
        "spec_correct_drafts_histogram": ap.accepted_histogram(sim["accepted"])}}
    assert sc.check_results([good], [q], PREDICT, ap.VOCAB) == []
    cases = {
        "histogram": dict(good, meta=dict(good["meta"], spec_correct_drafts_histogram=[q.n])),
        "finish_reason": dict(good, meta=dict(good["meta"], finish_reason={"type": "abort"})),
        "HTTP 500": dict(good, status=500),
    }
    for what, res in cases.items():
        assert what in sc.check_results([res], [q], PREDICT, ap.VOCAB)[0][1], what
    # a retracted request restarts its cycles: its histogram is not compared
    retracted = dict(cases["histogram"], meta=dict(cases["histogram"]["meta"], num_retractions=1))
    assert sc.check_results([retracted], [q], PREDICT, ap.VOCAB) == []
    ab = sc.Req(q.rid, q.ids, q.n, abort="stream", abort_after=3)
    cut = dict(good, output_ids=sim["output_ids"][:9], meta={"finish_reason": {"type": "abort"}})
    assert sc.check_results([cut], [ab], PREDICT, ap.VOCAB) == []
    off = dict(cut, output_ids=sim["output_ids"][:8] + [ap.BOS])
    assert "aborted output leaves the prediction" in sc.check_results([off], [ab], PREDICT, ap.VOCAB)[0][1]
    lp = sc.Req(q.rid, q.ids, q.n, kind="logprob")
    short = dict(good, meta=dict(good["meta"], output_token_logprobs=[[-0.1, t, None] for t in sim["output_ids"][1:]]))
    assert "output logprobs" in sc.check_results([short], [lp], PREDICT, ap.VOCAB)[0][1]
    full = dict(good, meta=dict(good["meta"], output_token_logprobs=[[-0.1, t, None] for t in sim["output_ids"]]))
    assert sc.check_results([full], [lp], PREDICT, ap.VOCAB) == []
    sampled = sc.Req(q.rid, q.ids, q.n, kind="sampled")
    assert sc.check_results([dict(good, output_ids=[ap.VOCAB] * q.n)], [sampled], PREDICT, ap.VOCAB)
    assert sc.check_results([dict(good, output_ids=[5] * q.n)], [sampled], PREDICT, ap.VOCAB) == []

"""CPU tier: ``bench/speedup.py`` and ``bench/speedup_report.py``.

Failure modes guarded (the GPU run that would find them is one ~8-minute call): a flag error that
is a traceback, or that names no flag; an engine that loads dummy weights instead of the pair's,
or runs without speculation, or ours without the plugin; tokens/s or accept lengths computed from
the wrong counts (prefill left in, the mean instead of the batch's verify steps); speed-ups over
the wrong baseline; an advisor prediction that is not the advisor's (formula copied, an input
dropped); a gap over 10% reported without the wall / GPU ratios that explain it; outputs or
verify counts that differ from the pair's prediction going unreported; a default grid that does
not fit the 8-minute budget. The child and parent run here end to end against a stand-in Engine
that answers as SGLang's does (``meta_info``, ``get_server_info``, the probe's keys).
"""

import contextlib
import io
import json
import os
import signal
import statistics
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.lib import engine
from bench.models import accept_pair as ap
from bench.speedup import cli as speedup_cli
from bench.speedup import estimate, pair
from bench.speedup import report as sr
from bench.speedup import run as speedup_run


# ------------------------------------------------------------------------------ synthetic phases
def _phase(ctx, b, cls, tn, t1, n=129, vct=None, roles=None, acc=None, agree=0.55):
    return {"context": ctx, "bs": b, "cls": cls, "agree": agree, "target_accept_length": 2.0,
            "t1_s": t1, "tn_s": tn, "completion_tokens": [n] * b, "spec_verify_ct": [vct] * b,
            "spec_accept_length": [acc] * b, "roles": {k: {"gpu_ms": v} for k, v in (roles or {}).items()}}


PLAIN = _phase(1024, 4, 0, tn=0.7, t1=0.06, roles={"target_decode": 5.0})
UP = _phase(1024, 4, 0, tn=0.7, t1=0.06, vct=64, acc=129 / 64,
            roles={"target_verify": 7.0, "draft_decode": 0.5, "draft_extend": 0.5})
OURS = _phase(1024, 4, 0, tn=0.38, t1=0.06, vct=64, acc=129 / 64,
              roles={"target_verify": 4.5, "draft_decode": 0.5, "draft_extend": 0.5})


def test_point_metrics_counts_decode_tokens_over_the_decode_time():
    m = sr.point_metrics(OURS)
    # 128 decode tokens per request in 0.38 - 0.06 s; 4 requests; 129 tokens over the whole 0.38 s
    assert m["decode_request_tok_s"] == round(128 / 0.32, 2) and m["decode_server_tok_s"] == round(4 * 128 / 0.32, 2)
    assert m["request_tok_s"] == round(129 / 0.38, 2) and m["server_tok_s"] == round(4 * 129 / 0.38, 2)
    assert m["verify_steps"] == 64 and m["decode_accept_length"] == 2.0 and m["accept_length"] == round(129 / 64, 4)
    assert m["cycle_ms"] == 5.5 and m["step_wall_ms"] == 5.0  # 320 ms / 64 cycles
    p = sr.point_metrics(PLAIN)
    assert p["verify_steps"] is None and p["step_wall_ms"] == 5.0  # 640 ms / 128 steps
    # the batch's verify steps are its slowest request's
    ph = dict(OURS, spec_verify_ct=[60, 64, 62, 64])
    assert sr.point_metrics(ph)["verify_steps"] == 64
    assert sr.point_metrics(dict(OURS, tn_s=None))["decode_server_tok_s"] is None


def test_rows_divide_by_plain_at_the_same_point_whatever_the_class():
    modes = {"plain": {"phases": [PLAIN]}, "upstream": {"phases": [UP, dict(UP, cls=1)]},
             "ours": {"phases": [OURS, dict(OURS, cls=1)]}}
    rows = sr.build_rows(modes)
    assert [(r["context"], r["bs"], r["cls"]) for r in rows] == [(1024, 4, 0), (1024, 4, 1)]
    for r in rows:
        s = r["speedup"]
        assert s["ours_over_plain"] == 2.0 and s["upstream_over_plain"] == 1.0 and s["ours_over_upstream"] == 2.0
        assert s["ours_over_plain_e2e"] == round(0.7 / 0.38, 3)
        assert r["plain"]["target_decode_ms"] == 5.0
    assert sr.build_rows({"plain": {"phases": [PLAIN]}})[0]["speedup"]["ours_over_plain"] is None


def test_advisor_rows_are_the_advisors_model_and_name_the_gap():
    rows = sr.build_rows({"plain": {"phases": [PLAIN]}, "upstream": {"phases": [UP]}, "ours": {"phases": [OURS]}})
    adv = {a["mode"]: a for a in sr.advisor_rows(rows, 3)}
    # speedup = accept_length * decode_ms / (draft + verify + draft extend)
    assert adv["ours"]["predicted"] == round(2.0 * 5.0 / 5.5, 3) and adv["ours"]["measured"] == 2.0
    assert adv["ours"]["gap_pct"] == round(100 * ((2.0 * 5.0 / 5.5) / 2.0 - 1), 1)
    assert adv["upstream"]["predicted"] == round(2.0 * 5.0 / 8.0, 3)
    assert adv["ours"]["plain_wall_per_gpu"] == 1.0 and adv["ours"]["wall_per_gpu"] == round(5.0 / 5.5, 3)
    # ours' -9.1% is within 10%; upstream's +25% is listed with what explains it
    assert sr.big_gaps(list(adv.values())) == [
        "ctx=1024 bs=4 agree=0.55 upstream: advisor 1.250 vs measured 1.000 (+25.0%); wall / GPU plain 1.000, "
        "upstream 1.250"]
    missing = sr.advisor_rows(sr.build_rows({"ours": {"phases": [OURS]}}), 3)
    assert missing[0]["predicted"] is None and missing[0]["missing"] == ["decode_ms"]


def test_an_input_the_advisor_refuses_is_reported_not_raised():
    """128 decode tokens in 20 verify steps (6.4 per cycle at num_steps 3): the advisor refuses the
    accept length; the row says why, the others keep their prediction, and the run's report and
    RESULT lines (written after every mode) are still made."""
    odd = dict(OURS, cls=1, spec_verify_ct=[20] * 4)
    modes = {"plain": {"phases": [PLAIN]}, "ours": {"phases": [OURS, odd]}}
    adv = sr.advisor_rows(sr.build_rows(modes), 3)
    assert [a["cls"] for a in adv] == [0, 1]
    assert adv[0]["predicted"] == round(2.0 * 5.0 / 5.5, 3) and "advisor_error" not in adv[0]
    assert adv[1]["predicted"] is None and adv[1]["gap_pct"] is None
    assert "accept_length 6.4 must be in [1, num_steps + 1 = 4]" in adv[1]["advisor_error"]
    a = speedup_cli.parse_args([])
    rep = speedup_run.report(a, modes, {})
    assert rep["advisor_errors"] == ["ctx=1024 bs=4 class=1 ours: " + adv[1]["advisor_error"]]
    meta = {"mode_status": {"ours": "ok"}, "hardware": "test", "versions": {}, "flags": "", "command": ""}
    assert "RESULT advisor refused: " + rep["advisor_errors"][0] in speedup_run.result_lines(rep, meta)
    assert "| 1024 | 4 | 0.55 | ours | 5.000 |" in rep["table_md"]


def test_the_prediction_comes_from_sglang_verify_graph_advisor(monkeypatch):
    from sglang_verify_graph import advisor

    assert sr.advisor_prediction(5.0, 4.5, 0.5, 0.5, 2.0, 3) == pytest.approx(10 / 5.5)
    seen = {}

    def fake_evaluate(inp, k):
        seen.update(inp=inp, k=k)
        return types.SimpleNamespace(speedup=7.0)

    monkeypatch.setattr(advisor, "evaluate", fake_evaluate)
    assert sr.advisor_prediction(5.0, 4.5, 0.5, 0.6, 2.0, 3) == 7.0
    inp = seen["inp"]
    assert (inp.decode_ms, inp.verify_points, inp.draft_points, inp.draft_extend_ms, inp.accept_length,
            seen["k"]) == (5.0, {3: 4.5}, {3: 0.5}, 0.6, 2.0, 3)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="accept_length 5"):
        sr.advisor_prediction(5.0, 4.5, 0.5, 0.5, 5.0, 3)


def test_check_outputs_names_each_mismatch():
    good = dict(OURS, outputs_match=4, predicted_verify_ct=64)
    assert sr.check_outputs({"ours": {"phases": [good]}, "plain": {"phases": [dict(PLAIN, outputs_match=4,
                                                                                    predicted_verify_ct=64)]}}) == []
    bad = sr.check_outputs({"ours": {"phases": [dict(good, outputs_match=3),
                                                dict(good, spec_verify_ct=[64, 65, 64, 64])]}})
    assert bad == ["ours ctx=1024 bs=4 class=0: 1 of 4 outputs differ from the prediction",
                   "ours ctx=1024 bs=4 class=0: verify steps [64, 65], predicted 64"]


def test_tables_hold_the_numbers():
    rows = sr.build_rows({"plain": {"phases": [PLAIN]}, "upstream": {"phases": [UP]}, "ours": {"phases": [OURS]}})
    t = sr.speedup_table(rows)
    assert t.splitlines()[2] == ("| 1024 | 4 | 0.55 | 2.02 / 2.02 | 200.0 / 800 | 200.0 / 800 | 400.0 / 1600 "
                                 "| **2.00** | 1.00 | 2.00 |")
    a = sr.advisor_table(sr.advisor_rows(rows, 3))
    assert "| 1024 | 4 | 0.55 | ours | 5.000 | 5.500 (0.500 + 4.500 + 0.500) | 2.000 | 1.818 | 2.000 | -9.1% |" in a


# ------------------------------------------------------------------------------ flags, plan, estimate
def _run_main(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = speedup_cli.main(argv)
        except SystemExit as ex:
            rc = ex.code
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("argv, fragment", [
    (["--modes", "plain,eagle"], "--modes plain,eagle: want each of plain, upstream, ours at most once"),
    (["--contexts", "1024,0"], "argument --contexts: '1024,0': want a comma list of integers >= 16"),
    (["--new-tokens", "1"], "argument --new-tokens: '1': want an integer >= 2"),
    (["--engine-extra", "[1]"], "--engine-extra '[1]': want a JSON object"),
    (["--mem", "1.5"], "--mem 1.5: want a fraction in (0, 1)"),
    (["--classes", "0,7", "--dry-run"], "--classes 0,7: the pair has classes 0-3 (0: agree 0.36"),
    (["--mode-timeout", "-5"], "--mode-timeout -5.0: want seconds > 0"),
    (["--contexts", "1024,131000"], "--contexts 131000: with --new-tokens 128 the requests need 131204 positions"),
    (["--new-tokens", "131000"], "--contexts 8192: with --new-tokens 131000 the requests need 139268 positions"),
])
def test_bad_flag_is_one_line_naming_it(tmp_path, argv, fragment):
    rc, out, err = _run_main(argv + ["--pair-dir", str(tmp_path)])
    assert rc == 2 and fragment in err.strip().splitlines()[-1], err
    assert not list(tmp_path.iterdir())


def test_plan_runs_plain_once_per_point_and_every_class_for_speculation():
    a = speedup_cli.parse_args(["--contexts", "8192,1024", "--batch-sizes", "16,1", "--classes", "2,0"])
    got = dict(estimate.plan(a))
    assert got["plain"] == [(1024, 2, 1), (1024, 2, 16), (8192, 2, 1), (8192, 2, 16)]
    assert got["ours"][:4] == [(1024, 2, 1), (1024, 2, 16), (1024, 0, 1), (1024, 0, 16)] and len(got["ours"]) == 8
    assert got["upstream"] == got["ours"]


def test_default_grid_fits_the_budget_with_three_engines():
    a = speedup_cli.parse_args([])
    pair.check_classes(a, pair.default_maps())
    assert (a.contexts, a.batch_sizes, a.classes, a.modes) == ([1024, 8192], [1, 4, 16], [0, 1, 2, 3],
                                                              ["plain", "upstream", "ours"])
    est = estimate.estimate_s(a, pair.default_maps(), build=True)
    assert a.repeats == 3  # medians of three timed runs per point
    # the H200 run took 438 s (warm cache); under the stage's 540 s with a cold kernel cache (~60 s)
    assert est["total"] <= 470 and est["engines"] == 3 * estimate.START_S and est["build"] == estimate.BUILD_S
    assert estimate.estimate_s(a, pair.default_maps(), build=False)["build"] == 0
    # upstream's verify grows with context and batch, ours' like a decode step
    assert estimate.cycle_ms("upstream", 8192, 16) > 4 * estimate.cycle_ms("plain", 8192, 16)
    assert estimate.cycle_ms("ours", 8192, 16) < 1.5 * estimate.cycle_ms("plain", 8192, 16)


# ------------------------------------------------------------------------------ the pair on disk
@pytest.fixture()
def pair_dir(tmp_path):
    """Config-only pair folders with the default build's pair_maps.json and a placeholder weight
    file (so nothing is built)."""
    pytest.importorskip("tokenizers")
    mm, tcfg, dcfg = ap.shape_configs(ap.LLAMA8B)
    maps = ap.make_class_maps(ap.VOCAB, ap.AGREE_LLAMA8B, 0)
    for c, t in zip(maps["classes"], ap.ACCEPT_TARGETS):
        c["target_accept_length"] = t
    import dataclasses

    for name, cfg in ((pair.PAIR, tcfg), (pair.PAIR + "-eagle3", dcfg)):
        d = mm.write_model(str(tmp_path), name, cfg)
        with open(os.path.join(d, "pair_maps.json"), "w") as f:
            json.dump(dict(maps, shape=dataclasses.asdict(ap.LLAMA8B), agree=list(ap.AGREE_LLAMA8B), seed=0,
                           attention=True), f)
        open(os.path.join(d, pair.WEIGHTS), "wb").close()
    return str(tmp_path)


def test_a_pair_from_another_build_is_built_again(pair_dir):
    assert pair.pair_ready(pair_dir)
    path = os.path.join(pair_dir, pair.PAIR, "pair_maps.json")
    maps = json.load(open(path))
    json.dump(dict(maps, agree=[0.5, 0.6, 0.7, 0.8]), open(path, "w"))
    assert not pair.pair_ready(pair_dir)
    json.dump(maps, open(path, "w"))
    os.remove(os.path.join(pair_dir, pair.PAIR + "-eagle3", pair.WEIGHTS))
    assert not pair.pair_ready(pair_dir)


def test_engine_kwargs_load_the_pair_with_speculation_as_asked(pair_dir):
    a = speedup_cli.parse_args(["--pair-dir", pair_dir])
    kw = {m: speedup_run.engine_kwargs(a, m) for m in speedup_run.MODES}
    for m, k in kw.items():
        assert k["model_path"] == os.path.join(pair_dir, pair.PAIR) and k["load_format"] == "auto", m
        assert k["attention_backend"] == "triton" and not k["disable_radix_cache"] and k["context_length"] >= 8192 + 128
    assert "speculative_algorithm" not in kw["plain"]
    for m in ("upstream", "ours"):
        k = kw[m]
        assert (k["speculative_algorithm"], k["speculative_eagle_topk"], k["speculative_num_steps"],
                k["speculative_num_draft_tokens"]) == ("EAGLE3", 1, 3, 4)
        assert k["speculative_draft_model_path"] == os.path.join(pair_dir, pair.PAIR + "-eagle3")
    assert kw["ours"] == kw["upstream"]  # ours differs by the environment variable only
    a = speedup_cli.parse_args(["--pair-dir", pair_dir, "--engine-extra", '{"load_format": "dummy"}'])
    assert speedup_run.engine_kwargs(a, "ours")["load_format"] == "dummy"


def test_a_child_result_cut_short_is_a_failed_mode(tmp_path):
    """A child killed while writing its JSON: the parent reads it as a failed mode (then keeps
    the points of the child's log) instead of stopping the run with a traceback."""
    jf = tmp_path / "bench_ours.json"
    jf.write_text('{"mode": "ours", "ok": true, "phases": [{"context": 10')
    assert engine.read_child(str(jf), "ours") == {"mode": "ours", "ok": False}
    assert engine.read_child(str(tmp_path / "none.json"), "plain") == {"mode": "plain", "ok": False}
    jf.write_text('{"mode": "ours", "ok": true, "phases": []}')
    assert engine.read_child(str(jf), "ours")["ok"] is True


def test_dry_run_builds_nothing_and_prints_each_engine(tmp_path):
    pytest.importorskip("tokenizers")
    rc, out, err = _run_main(["--dry-run", "--pair-dir", str(tmp_path)])
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == "BENCH plan: plain: 6 points; upstream: 24 points; ours: 24 points"
    assert lines[1].startswith("ESTIMATE ~")
    assert [ln.split(":")[0] for ln in lines if ln.startswith("DRYRUN ") and "{" in ln] == [
        "DRYRUN plain", "DRYRUN upstream", "DRYRUN ours"]
    assert all(json.loads(ln.split(": ", 1)[1])["model_path"] == os.path.join(str(tmp_path), pair.PAIR)
               for ln in lines if ln.startswith("DRYRUN ") and "{" in ln)
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------------------ child and parent end to end
class FakeEngine:
    """Answers as SGLang 0.5.16's Engine does for the pair: greedy outputs of the g-chain, the
    verify steps the maps give, the probe's per-replay lists and the plugin's counters."""

    maps = None
    made = []

    def __init__(self, **kw):
        self.kw = kw
        self.spec = "speculative_algorithm" in kw
        self.ours = os.environ.get("SGLANG_ENABLE_VERIFY_CUDA_GRAPH") == "1"
        self.steps = kw.get("speculative_num_steps")
        self.probe, self.verify_steps = {}, 0
        self.calls = []  # (max_new_tokens, prompts) per generate
        FakeEngine.made.append(self)

    def generate(self, input_ids, sampling_params):
        n = sampling_params["max_new_tokens"]
        assert sampling_params["temperature"] == 0.0 and sampling_params["ignore_eos"]
        vocab = self.maps["shape"]["vocab"]  # the construction's ids: BOS, then ids in [3, vocab)
        assert all(ids[0] == ap.BOS and all(ap.SPECIAL <= t < vocab for t in ids[1:]) for ids in input_ids)
        self.calls.append((n, input_ids))
        out = []
        bsz = len(input_ids)
        for ids in input_ids:
            sim = ap.simulate(self.maps, [ids[-1]], n, self.steps or 1)
            meta = {"completion_tokens": n, "e2e_latency": 0.01}
            if self.spec and sim["accepted"]:
                meta.update(spec_verify_ct=len(sim["accepted"]), spec_accept_length=n / len(sim["accepted"]),
                            spec_correct_drafts_histogram=ap.accepted_histogram(sim["accepted"]) + [0])
            out.append({"output_ids": sim["output_ids"], "meta_info": meta})
        cycles = len(ap.simulate(self.maps, [input_ids[0][-1]], n, self.steps)["accepted"]) if self.spec else n - 1
        key = lambda cls, w, mode: f"{cls}|{w}|{mode}|{bsz}|{bsz}"  # noqa: E731
        add = lambda k, ms, c: self.probe.setdefault(k, {"gpu_ms": [], "host_ms": []})["gpu_ms"].extend([ms] * c)  # noqa: E731
        if self.spec and os.environ.get("SGLANG_VERIFY_GRAPH_PROFILE_EVERY") and n > 1:  # the scheduler's line
            print(f"[2026-12-03 13:00:00 TP0] verify_graph_profile rank=0 cycles={cycles} tokens={n * bsz} bs={bsz} "
                  f"num_steps={self.steps} cycle_ms=6 draft_ms=0.5 verify_ms={4.5 if self.ours else 7.0} "
                  f"draft_extend_ms=0.5 other_ms=0.2 accept_length={(n - 1) / cycles:.4f} replay_pct=100.0",
                  flush=True)
        if self.spec:
            add(key("VerifyCudaGraphRunner" if self.ours else "DecodeCudaGraphRunner", "target", "TARGET_VERIFY"),
                4.5 if self.ours else 7.0, cycles)
            add(key("EAGLEDraftCudaGraphRunner", "draft", "DECODE"), 0.5, cycles)
            add(key("EAGLEDraftExtendCudaGraphRunner", "draft", "DRAFT_EXTEND"), 0.5, cycles)
            self.verify_steps += cycles
        else:
            add(key("DecodeCudaGraphRunner", "target", "DECODE"), 5.0, cycles)
        return out

    def get_server_info(self):
        probe, self.probe = self.probe, {}
        plugin = ({"runner": "VerifyCudaGraphRunner", "replays": self.verify_steps, "verify_steps": self.verify_steps,
                   "fallback_total": 0, "fallbacks": {}} if self.ours else None)
        return {"internal_states": [{"bench_probe": probe, "verify_cuda_graph": plugin}]}

    def shutdown(self):
        pass


@pytest.fixture()
def fake_engine(monkeypatch, pair_dir):
    FakeEngine.maps = pair.load_maps(pair_dir)
    FakeEngine.made = []
    mod = types.ModuleType("sglang.srt.entrypoints.engine")
    mod.Engine = FakeEngine
    monkeypatch.setitem(sys.modules, "sglang.srt.entrypoints.engine", mod)
    for var in ("BENCH_VERIFY_PROBE", "SGLANG_ENABLE_VERIFY_CUDA_GRAPH", "SGLANG_VERIFY_GRAPH_PROFILE_EVERY"):
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    return pair_dir


@pytest.fixture()
def run_parent(monkeypatch):
    """``run_parent(argv)``: the parent as ``main(argv)`` with ``sys.argv`` set, each mode's child
    run in this process (its stdout and stderr into the mode's log) and SIGTERM restored after;
    returns ``(rc, stdout, stderr)``."""

    def run_logged(cmd, log, timeout, child):
        with open(log, "w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
            assert cmd[1:4] == ["-m", "bench", "speedup"], cmd
            return speedup_cli.main(cmd[4:])

    monkeypatch.setattr(engine, "run_logged", run_logged)
    monkeypatch.setattr(engine, "hardware", lambda: "test")

    def run(argv):
        old = signal.getsignal(signal.SIGTERM)
        monkeypatch.setattr(sys, "argv", ["bench_speedup.py"] + argv)
        try:
            return _run_main(argv)
        finally:
            signal.signal(signal.SIGTERM, old)
    return run


def test_child_measures_each_point_with_sglangs_counts(fake_engine, tmp_path):
    out = tmp_path / "child.json"
    argv = ["--pair-dir", fake_engine, "--contexts", "64", "--batch-sizes", "1,2", "--classes", "1,3",
            "--child", "ours", "--child-out", str(out)]
    rc, stdout, err = _run_main(argv)
    assert rc == 0, stdout[-2000:] + err[-2000:]
    res = json.loads(out.read_text())
    assert res["ok"] and [(p["cls"], p["bs"]) for p in res["phases"]] == [(1, 1), (1, 2), (3, 1), (3, 2)]
    eng = FakeEngine.made[-1]
    assert eng.ours and eng.kw["load_format"] == "auto"
    maps = FakeEngine.maps
    for p in res["phases"]:
        want = ap.simulate(maps, [maps["classes"][p["cls"]]["last_token"]], 128, 3)
        assert p["outputs_match"] == p["bs"] and p["predicted_verify_ct"] == len(want["accepted"])
        assert p["spec_verify_ct"] == [len(want["accepted"])] * p["bs"]
        assert p["predicted_accept_length"] == round(ap.sglang_accept_length(want), 4)
        assert p["histogram"] == [ap.accepted_histogram(want["accepted"])] == [p["predicted_histogram"]]
        assert p["roles"]["target_verify"]["gpu_ms"] == 4.5
        assert p["roles"]["target_verify"]["classes"] == ["VerifyCudaGraphRunner"]
        # the probe drained after the warm-up: the replays of the 1-token and the timed runs only
        assert p["roles"]["target_verify"]["n"] == 3 * len(want["accepted"])
        assert p["t1_s"] == statistics.median(p["t1_runs_s"]) and len(p["t1_runs_s"]) == 3
        assert p["tn_s"] == statistics.median(p["tn_runs_s"]) and len(p["tn_runs_s"]) == 3
        assert p["tn_s"] >= 0 and p["t1_s"] >= 0 and p["agree"] == maps["classes"][p["cls"]]["agree"]
    assert abs(res["phases"][0]["predicted_accept_length"] - 2.0) <= 0.15
    assert stdout.count("BENCH phase ") == 4
    # per point: the warm-up, then three times the 1-token and the timed generation of the same prompts
    calls = eng.calls
    assert [c[0] for c in calls] == [4, 1, 128, 1, 128, 1, 128] * 4
    assert all(len({tuple(map(tuple, c[1])) for c in calls[i:i + 7]}) == 1 for i in range(0, 28, 7))
    assert [len(calls[i][1]) for i in range(0, 28, 7)] == [1, 2, 1, 2]


def test_parent_runs_every_mode_and_writes_rows_advisor_and_tables(fake_engine, tmp_path, monkeypatch, run_parent):
    """The whole run with each mode's child in this process: JSON rows with the speed-ups, the
    advisor rows, the markdown file, RESULT lines, exit 0; a mismatched output makes it exit 1."""
    assert pair.pair_ready(fake_engine)  # nothing is built here
    out, md = tmp_path / "res.json", tmp_path / "table.md"
    argv = ["--pair-dir", fake_engine, "--contexts", "64,96", "--batch-sizes", "1,2", "--classes", "0,3",
            "--out", str(out), "--md", str(md), "--log-dir", str(tmp_path / "logs")]
    rc, stdout, err = run_parent(argv)
    assert rc == 0, stdout[-3000:] + err[-3000:]
    res = json.loads(out.read_text())
    assert set(res["modes"]) == {"plain", "upstream", "ours"} and all(m["ok"] for m in res["modes"].values())
    assert len(res["modes"]["plain"]["phases"]) == 4 and len(res["modes"]["ours"]["phases"]) == 8
    assert len(res["rows"]) == 8 and len(res["advisor"]) == 16 and res["output_checks"] == []
    for r in res["rows"]:
        assert r["plain"]["target_decode_ms"] == 5.0 and r["ours"]["cycle_ms"] == 5.5
        assert r["ours"]["decode_accept_length"] == round(127 / r["ours"]["verify_steps"], 4)
    for a in res["advisor"]:
        cyc = 5.5 if a["mode"] == "ours" else 8.0
        assert a["predicted"] == round(a["accept_length"] * 5.0 / cyc, 3)
    assert "| ours / plain |" in md.read_text() and "| advisor |" in md.read_text()
    assert "RESULT check: every output and verify count as predicted" in stdout
    assert stdout.splitlines()[0].startswith("ESTIMATE ~")
    assert any(ln.startswith("RESULT mode ours: ok") and "replays=" in ln for ln in stdout.splitlines())

    real = FakeEngine.generate

    def wrong(self, input_ids, sampling_params):  # ours emits a different token
        outs = real(self, input_ids, sampling_params)
        if self.ours and sampling_params["max_new_tokens"] > 4:
            outs[0]["output_ids"] = outs[0]["output_ids"][:-1] + [0]
        return outs

    monkeypatch.setattr(FakeEngine, "generate", wrong)
    rc, stdout, err = run_parent(argv + ["--modes", "ours"])
    assert rc == 1 and "RESULT check FAILED: ours ctx=64 bs=1 class=0: 1 of 1 outputs differ" in stdout


# ------------------------------------------------------------------------------ the profile-log check
LOG = """BENCH engine_kwargs {}
[t] verify_graph_profile rank=0 cycles=8 bs=4 num_steps=3 verify_ms=9.0 draft_ms=1 draft_extend_ms=1 accept_length=2
BENCH point {"context": 1024, "bs": 1, "cls": 0}
[t] Decode batch, #running-req: 1
[t] verify_graph_profile rank=0 cycles=8 tokens=16 bs=1 num_steps=3 cycle_ms=6 draft_ms=0.5 verify_ms=4.5 draft_extend_ms=0.5 other_ms=0.5 accept_length=2.0
[t] verify_graph_profile rank=0 cycles=8 tokens=16 bs=1 num_steps=3 cycle_ms=6 draft_ms=0.5 verify_ms=4.7 draft_extend_ms=0.5 other_ms=0.3 accept_length=2.2
BENCH phase {}
BENCH point {"context": 1024, "bs": 4, "cls": 0}
[t] verify_graph_profile rank=0 cycles=8 tokens=16 bs=1 num_steps=3 verify_ms=99 draft_ms=1 draft_extend_ms=1 accept_length=1
[t] verify_graph_profile rank=0 cycles=8 tokens=64 bs=4 num_steps=3 cycle_ms=7 draft_ms=0.6 verify_ms=5.0 draft_extend_ms=0.6 other_ms=0.8 accept_length=1.5
"""


def test_profile_segments_split_at_each_point_and_keep_its_batch_size(tmp_path):
    p = tmp_path / "bench_ours.log"
    p.write_text(LOG)
    seg = sr.profile_segments(str(p))
    assert list(seg) == [(1024, 1, 0), (1024, 4, 0)]
    assert [("verify_ms=4.5" in x, "verify_ms=4.7" in x) for x in seg[(1024, 1, 0)]] == [(True, False), (False, True)]
    # the previous point's late window (bs=1) and lines before the first point are not this point's
    assert len(seg[(1024, 4, 0)]) == 1 and "verify_ms=5.0" in seg[(1024, 4, 0)][0]
    assert sr.profile_segments(str(tmp_path / "missing.log")) == {}


def test_log_prediction_is_the_advisor_cli_on_the_same_file(tmp_path, capsys):
    from sglang_verify_graph import advisor

    p = tmp_path / "seg.log"
    (tmp_path / "all.log").write_text(LOG)
    lines = sr.profile_segments(str(tmp_path / "all.log"))[(1024, 1, 0)]
    p.write_text("\n".join(lines) + "\n")
    got = sr.log_prediction(str(p), 5.0)
    assert advisor.main(["--from-log", str(p), "--decode-ms", "5.0"]) == 0
    cli = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("speedup")][0]
    assert cli.split()[1] == f"{got['predicted']:.3f}x"
    # the log's medians: verify 4.6, other 0.4, accept 2.1; cycle 0.5 + 4.6 + 0.5 + 0.4 = 6.0 ms
    assert got["verify_ms"] == pytest.approx(4.6) and got["other_ms"] == pytest.approx(0.4)
    assert got["accept_length"] == pytest.approx(2.1) and got["num_steps"] == 3
    assert got["predicted"] == pytest.approx(2.1 * 5.0 / 6.0)


def test_parent_with_profile_every_feeds_the_advisor_each_points_log(fake_engine, tmp_path, run_parent):
    out, md, logs = tmp_path / "res.json", tmp_path / "table.md", tmp_path / "logs"
    argv = ["--pair-dir", fake_engine, "--contexts", "64", "--batch-sizes", "1,2", "--classes", "1",
            "--out", str(out), "--md", str(md), "--log-dir", str(logs), "--profile-every", "8"]
    rc, stdout, err = run_parent(argv)
    assert rc == 0, stdout[-3000:] + err[-3000:]
    res = json.loads(out.read_text())
    assert [e.kw.get("speculative_algorithm") is not None for e in FakeEngine.made] == [False, True, True]
    assert len(res["advisor"]) == 4
    for a in res["advisor"]:
        fl = a["from_log"]
        assert "error" not in fl, fl
        # 3 timed generations per point log a line each (the warm-up's too): the log's medians
        assert a["log_lines"] == 4 and fl["verify_ms"] == (4.5 if a["mode"] == "ours" else 7.0)
        cyc = 0.5 + fl["verify_ms"] + 0.5 + 0.2
        assert fl["predicted"] == pytest.approx(fl["accept_length"] * 5.0 / cyc, rel=1e-3)
        # measured: the stand-in's wall times (noise here); the gap is the advisor's against it
        # (the gap has 1 decimal of a percent, the stored prediction 4 decimals)
        if a["measured"]:
            m = a["measured"]
            assert abs((1 + a["gap_from_log_pct"] / 100) * m - fl["predicted"]) <= 0.0005 * m + 1e-4
        else:
            assert a["gap_from_log_pct"] is None
        assert (logs / f"profile_{a['mode']}_64_{a['bs']}_1.log").exists()
    text = md.read_text()
    assert "advisor from log" in text and text.count("| 64 |") == 2 + 4 + 4
    # without the flag no engine profiles and no row has a log prediction
    FakeEngine.made = []
    rc, stdout, err = run_parent([x for x in argv if x not in ("--profile-every", "8")])
    res = json.loads(out.read_text())
    assert rc == 0 and all("from_log" not in a for a in res["advisor"]) and "advisor from log" not in md.read_text()

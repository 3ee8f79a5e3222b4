"""CPU tests of the speculative-decoding advisor (sglang_verify_graph.advisor).

Every expected number below is computed by hand in the comment next to it (ms, tokens/cycle).
"""

import subprocess
import sys

import pytest

from sglang_verify_graph import advisor as adv
from sglang_verify_graph.advisor.inputs import AdvisorError, parse_profile_log

FIELD = ["--decode-ms", "12", "--verify-ms", "25.6", "--num-steps", "2", "--draft-ms", "1.0",
         "--draft-extend-ms", "0.3"]  # cycle = 1.0 + 25.6 + 0.3 = 26.9 ms


def inputs(**kw):
    base = dict(decode_ms=12.0, num_steps=2, verify_points={2: 25.6}, draft_points={2: 1.0},
                draft_extend_ms=0.3, accept_length=2.0)
    base.update(kw)
    inp = adv.Inputs(**base)
    inp.validate()
    return inp


def run_cli(argv, capsys):
    """(exit code, stdout, stderr) of adv.main(argv)."""
    try:
        code = adv.main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


# ----------------------------------------------------------------------------- math

@pytest.mark.parametrize("decode, cycle, expected", [
    (12.0, 26.9, 0.446097),   # 12 / 26.9: the field report, nothing accepted
    (5.014, 5.870, 0.854174),  # a Llama-8B-shape decode at 1k bs 1 and our cycle there
    (1.0, 1.001, 0.999001),   # a cycle 0.1% dearer than decode still loses
])
def test_accept_length_one_loses_when_cycle_exceeds_decode(decode, cycle, expected):
    s = adv.speedup(1.0, cycle, decode)
    assert s == pytest.approx(expected, rel=1e-5)
    assert s < 1.0


def test_accept_length_one_through_the_model_is_decode_over_cycle():
    row = adv.evaluate(inputs(accept_length=1.0), 2)
    assert row.cycle_ms == pytest.approx(26.9)
    assert row.speedup == pytest.approx(0.446097, rel=1e-5)  # 12 / 26.9
    assert row.spec_tok_s == pytest.approx(37.1747, rel=1e-5)  # 1000 / 26.9


def test_break_even_is_cycle_over_decode():
    assert adv.break_even_accept_length(26.9, 12.0) == pytest.approx(2.241667, rel=1e-6)
    # at the break-even accept_length the speedup is exactly 1
    assert adv.speedup(2.241667, 26.9, 12.0) == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("verify, break_even", [(25.6, 2.25), (28.7, 2.508333)])
def test_field_report_break_even(verify, break_even):
    # 12 ms decode, ~1.4 ms draft work (0.55 ms/step x 2 + 0.3 ms extend): (verify + 1.4) / 12
    inp = inputs(verify_points={2: verify}, draft_points={}, draft_ms_per_step=0.55)
    row = adv.evaluate(inp, 2)
    assert row.cycle_ms == pytest.approx(verify + 1.4)
    assert row.break_even == pytest.approx(break_even, rel=1e-6)


def test_field_report_two_accepted_tokens_still_lose():
    row = adv.evaluate(inputs(accept_length=2.0), 2)
    assert row.speedup == pytest.approx(0.892193, rel=1e-5)  # 2 * 12 / 26.9
    assert row.spec_tok_s == pytest.approx(74.3494, rel=1e-5)  # 2000 / 26.9


@pytest.mark.parametrize("rates, k, expected", [
    ([0.7, 0.5, 0.3], None, 2.155),  # 1 + 0.7 + 0.35 + 0.105
    ([0.7, 0.5, 0.3], 2, 2.05),      # 1 + 0.7 + 0.35
    ([0.5, 0.5, 0.5], None, 1.875),  # (1 - 0.5^4) / (1 - 0.5)
    ([1.0, 1.0], None, 3.0),         # everything accepted: k + 1
    ([0.0, 1.0], None, 1.0),         # first draft rejected: the rest never count
])
def test_expected_accept_length_from_rates(rates, k, expected):
    assert adv.expected_accept_length(rates, k) == pytest.approx(expected)


@pytest.mark.parametrize("length, k, p", [(1.875, 3, 0.5), (1.0, 2, 0.0), (3.0, 2, 1.0),
                                          (2.0, 1, 1.0), (1.75, 2, 0.5)])
def test_constant_rate_inverts_accept_length(length, k, p):
    assert adv.constant_rate_for_accept_length(length, k) == pytest.approx(p, abs=1e-9)


@pytest.mark.parametrize("bad", [[0.5, 1.2], [-0.1, 0.5]])
def test_rates_outside_unit_interval_rejected(bad):
    with pytest.raises(AdvisorError, match="outside"):
        adv.expected_accept_length(bad)


def test_verify_line_fit_and_sources():
    inp = inputs(verify_points={2: 25.6, 5: 28.7})
    a, b = adv.fit_verify_line(inp.verify_points)
    assert (a, b) == (pytest.approx(22.5), pytest.approx(1.033333, rel=1e-6))  # 3.1 ms / 3 tok
    assert inp.verify_ms(3) == (pytest.approx(26.633333, rel=1e-6), "fit")  # 22.5 + 4b
    assert inp.verify_ms(1) == (pytest.approx(24.566667, rel=1e-6), "extrapolated")  # 22.5 + 2b
    assert inp.verify_ms(5) == (28.7, "measured")


def test_best_num_steps_on_a_constructed_case():
    # decode 10 ms, verify 10/11/12/13 ms at k = 1..4, draft 1 ms per step, no extend.
    # rates 0.9 0.9 0.2 0.9 -> accept_length 1.9, 2.71, 2.872, 3.0178; cycle 11, 13, 15, 17
    # speedup = L * 10 / cycle = 1.7273, 2.0846, 1.9147, 1.7752 -> best k = 2
    inp = inputs(decode_ms=10.0, num_steps=4, verify_points={1: 10, 2: 11, 3: 12, 4: 13},
                 draft_points={}, draft_ms_per_step=1.0, draft_extend_ms=0.0,
                 accept_length=None, rates=[0.9, 0.9, 0.2, 0.9])
    best, rows = adv.best_num_steps(inp)
    assert [r.num_steps for r in rows] == [1, 2, 3, 4]
    assert [r.speedup for r in rows] == pytest.approx([1.727273, 2.084615, 1.914667, 1.775176],
                                                      rel=1e-5)
    assert best.num_steps == 2


def test_sweep_from_mean_accept_length_uses_constant_rate():
    # accept_length 1.75 at k = 2 -> p = 0.5 -> k = 1: 1.5, k = 3: 1.875
    inp = inputs(verify_points={1: 20.0, 2: 25.6, 3: 27.0}, accept_length=1.75)
    _, rows = adv.best_num_steps(inp)
    assert [r.accept_length for r in rows] == pytest.approx([1.5, 1.75, 1.875])


def test_sweep_prefers_measured_accept_length_per_k():
    # measured 2.5 at k = 3 wins over the constant-rate guess (p = 0.5 -> 1.875)
    inp = inputs(verify_points={1: 20.0, 2: 25.6, 3: 27.0}, accept_length=1.75,
                 accept_points={3: 2.5})
    assert [r.accept_length for r in adv.best_num_steps(inp)[1]] == pytest.approx([1.5, 1.75, 2.5])
    with pytest.raises(AdvisorError, match="accept_length 4.5 must be in"):
        inputs(accept_points={3: 4.5})


def test_draft_phase_scales_linearly_in_k_from_the_measured_one():
    inp = inputs(verify_points={2: 25.6, 5: 28.7})  # draft 1.0 ms measured at k = 2
    assert inp.draft_ms(5) == pytest.approx(2.5)
    assert inp.cycle_ms(5) == pytest.approx(2.5 + 28.7 + 0.3)


@pytest.mark.parametrize("kw, match", [
    (dict(accept_length=0.93), r"accept_length 0.93 must be in \[1, num_steps \+ 1 = 3\]"),
    (dict(accept_length=3.5), r"accept_length 3.5"),
    (dict(accept_length=None, rates=[0.5]), "1 acceptance rates given but num_steps is 2"),
    (dict(decode_ms=0.0), "decode ms 0.0 must be > 0"),
    (dict(draft_extend_ms=-0.3), "draft-extend ms -0.3 must be >= 0"),
    (dict(verify_points={3: 25.6}), "verify ms measured at num_steps"),
])
def test_invalid_inputs_raise(kw, match):
    with pytest.raises(AdvisorError, match=match):
        inputs(**kw)


# ----------------------------------------------------------------------------- CLI

def test_cli_field_report(capsys):
    code, out, err = run_cli(FIELD + ["--accept-length", "2.0"], capsys)
    assert code == 0 and err == ""
    assert "plain decode   12.000 ms/token = 83.33 tok/s" in out
    assert "speculative    2.000 tokens / 26.900 ms = 74.35 tok/s" in out
    assert "speedup        0.892x (speculation loses)" in out
    assert "break-even     accept_length 2.242 = accepted_drafts 1.242 of 2" in out
    assert "best num_steps not evaluated" in out


def test_cli_accepted_drafts_is_accept_length_minus_one(capsys):
    _, out_a, _ = run_cli(FIELD + ["--accept-length", "1.93"], capsys)
    _, out_d, _ = run_cli(FIELD + ["--accepted-drafts", "0.93"], capsys)
    assert out_a == out_d
    assert "accept_length  1.930 tokens/cycle = accepted_drafts 0.930 of 2" in out_d


def test_cli_measured_tok_s_implies_accept_length(capsys):
    code, out, _ = run_cli(FIELD + ["--accept-length", "2", "--measured-spec-tok-s", "60"],
                           capsys)
    assert code == 0
    assert "implies accept_length 1.614 = accepted_drafts 0.614" in out  # 60 * 26.9 / 1000


def test_cli_sweep_and_best(capsys):
    code, out, _ = run_cli(["--decode-ms", "10", "--verify-ms-per-steps", "1:10,2:11,3:12,4:13",
                            "--draft-ms-per-step", "1", "--acceptance-rates", "0.9", "0.9",
                            "0.2", "0.9"], capsys)
    assert code == 0
    assert "num_steps 4: 5 tokens verified" in out  # num_steps defaults to the rate count
    assert "best num_steps 2: 2.085x, 208.46 tok/s" in out  # 2.71 tok / 13 ms


def test_cli_break_even_unreachable_and_always_wins(capsys):
    _, out, _ = run_cli(["--decode-ms", "5", "--verify-ms", "20", "--num-steps", "2",
                         "--accept-length", "3"], capsys)
    assert "break-even     accept_length 4.000 > num_steps + 1 = 3: unreachable" in out
    # a Llama-8B-shape point at 8k bs 1, ours: cycle 0.5615 + 5.2643 + 1.0506 = 6.8764 ms
    _, out, _ = run_cli(["--decode-ms", "7.7727", "--verify-ms", "5.2643", "--num-steps", "2",
                         "--draft-ms", "0.5615", "--draft-extend-ms", "1.0506",
                         "--accept-length", "1"], capsys)
    assert "speedup        1.130x (speculation wins)" in out  # 7.7727 / 6.8764
    assert "break-even     accept_length 0.885 <= 1" in out


@pytest.mark.parametrize("extra, message", [
    (["--accept-length", "0.93"], "accept_length 0.93 must be in [1, num_steps + 1 = 3]"),
    (["--accept-length", "3.01"], "accept_length 3.01 must be in"),
    (["--accepted-drafts", "2.5"], "accepted_drafts 2.5 must be in [0, num_steps = 2]"),
    (["--accepted-drafts", "-0.1"], "accepted_drafts -0.1 must be in"),
    (["--acceptance-rates", "0.7", "1.2"], "acceptance rate '1.2' must be in [0, 1]"),
    (["--acceptance-rates", "0.7"], "1 acceptance rates given but num_steps is 2"),
    (["--accept-length", "2", "--other-ms", "-1"], "time '-1' must be a finite number of ms"),
    (["--accept-length", "nan"], "accept_length nan must be in"),
    (["--accept-length", "2", "--measured-spec-tok-s", "0"], "must be > 0"),
    ([], "no acceptance"),
    (["--accept-length", "2", "--num-steps", "0"], "num_steps '0' must be >= 1"),
    (["--accept-length", "2", "--decode-ms", "nan"], "time 'nan' must be a finite number"),
    (["--accept-length", "2", "--draft-extend-ms", "abc"], "time 'abc' is not a number"),
    (["--accept-length", "2", "--verify-ms-per-steps", "2=25"], "is not NUM_STEPS:MS"),
])
def test_cli_invalid_inputs_exit_2(extra, message, capsys):
    code, out, err = run_cli(FIELD + extra, capsys)
    assert code == 2 and out == ""
    assert "error:" in err and message in err
    assert "Traceback" not in err


def test_cli_missing_decode_and_num_steps_exit_2(capsys):
    code, _, err = run_cli(["--verify-ms", "25", "--num-steps", "2", "--accept-length", "2"],
                           capsys)
    assert code == 2 and "no decode time" in err
    code, _, err = run_cli(["--decode-ms", "12", "--verify-ms", "25", "--accept-length", "2"],
                           capsys)
    assert code == 2 and "num_steps unknown" in err


def test_module_entry_point_exit_codes():
    base = [sys.executable, "-m", "sglang_verify_graph.advisor"] + FIELD
    ok = subprocess.run(base + ["--accept-length", "2"], capture_output=True, text=True)
    assert ok.returncode == 0 and "speedup        0.892x" in ok.stdout
    bad = subprocess.run(base + ["--accept-length", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "accept_length 0.0 must be in" in bad.stderr


# ----------------------------------------------------------------------------- profile log

LOG = """\
2026-12-01 10:00:00 INFO verify_graph_profile decode_ms=12.2 bs=1 ctx=1024
2026-12-01 10:00:01 INFO verify_graph_profile decode_ms=11.8
unrelated line decode_ms=99
verify_graph_profile num_steps=2 verify_ms=25.6 draft_ms=1.0 draft_extend_ms=0.3 accept_length=2.0
verify_graph_profile num_steps=2 verify_ms=26.6 draft_ms=1.2 draft_extend_ms=0.3 accept_length=1.8
verify_graph_profile num_steps=2 verify_ms=24.0 draft_ms=0.8 draft_extend_ms=0.3 accept_length=2.2
verify_graph_profile num_steps=5 verify_ms=28.7 draft_ms=2.5 accepted_drafts=1.5
"""


def test_parse_profile_log_medians_and_groups():
    s = parse_profile_log(LOG.splitlines())
    assert s.lines == 6  # the "unrelated" line has no tag
    assert s.common == {"decode_ms": pytest.approx(12.0)}  # median of 12.2, 11.8
    assert s.by_steps[2] == {"verify_ms": 25.6, "draft_ms": 1.0, "draft_extend_ms": 0.3,
                             "accept_length": 2.0}
    assert s.points("verify_ms") == {2: 25.6, 5: 28.7}
    assert s.main_steps() == 2  # 3 lines vs 1
    assert s.value("decode_ms", 5) == pytest.approx(12.0)  # from the common group
    assert s.value("accepted_drafts", 5) == 1.5


@pytest.mark.parametrize("line, match", [
    ("verify_graph_profile verify_ms", "'verify_ms' is not key=value"),
    ("verify_graph_profile verify_ms=fast", "verify_ms=fast is not a number"),
    ("verify_graph_profile num_steps=2.5", "num_steps=2.5 is not an integer"),
    ("verify_graph_profile num_steps=0 verify_ms=1", "num_steps=0 must be >= 1"),
    ("verify_graph_profile verify_ms=-3", "verify_ms=-3 must be finite, >= 0"),
    ("verify_graph_profile verify_ms=nan", "verify_ms=nan must be finite"),
    ("decode_ms=12 verify_ms=25", "no 'verify_graph_profile' lines"),
])
def test_parse_profile_log_errors(line, match):
    with pytest.raises(AdvisorError, match=match):
        parse_profile_log([line])


def test_cli_from_log(tmp_path, capsys):
    log = tmp_path / "profile.log"
    log.write_text(LOG)
    code, out, err = run_cli(["--from-log", str(log)], capsys)
    assert code == 0, err
    # k = 2: decode 12.0, verify 25.6, draft 1.0, extend 0.3 -> cycle 26.9, L = 2.0
    assert "speedup        0.892x" in out
    # sweep k = 1..5: verify line through (2, 25.6), (5, 28.7); draft 0.5 ms/step
    # k = 5 row: draft 2.5 + verify 28.7 + extend 0.3 (the k = 2 value) = 31.5 ms; measured
    # accept_length 1 + 1.5 = 2.5 (not the constant-rate guess) -> 79.37 tok/s, 0.952x
    assert "        5     28.700  measured        31.500          2.500    79.37   0.952x" in out
    assert "acceptance: given at num_steps [2, 5]" in out
    # a flag overrides the log: accept_length 3.0 -> 3 * 12 / 26.9 = 1.338
    code, out, _ = run_cli(["--from-log", str(log), "--accept-length", "3"], capsys)
    assert code == 0 and "speedup        1.338x (speculation wins)" in out
    # --num-steps 5 selects the k = 5 group: draft 2.5 + verify 28.7 + extend 0 (neither that
    # group nor the common group has draft_extend_ms) = 31.2 ms; accepted_drafts 1.5 ->
    # accept_length 2.5 -> 2.5 * 12 / 31.2 = 0.9615
    code, out, _ = run_cli(["--from-log", str(log), "--num-steps", "5"], capsys)
    assert code == 0
    assert "cycle          31.200 ms" in out and "speedup        0.962x" in out


def test_cli_from_log_errors_exit_2(tmp_path, capsys):
    code, _, err = run_cli(["--from-log", str(tmp_path / "missing.log")], capsys)
    assert code == 2 and "No such file" in err
    bad = tmp_path / "bad.log"
    bad.write_text("verify_graph_profile num_steps=2 verify_ms=oops\n")
    code, _, err = run_cli(["--from-log", str(bad)], capsys)
    assert code == 2 and "log line 1: verify_ms=oops is not a number" in err

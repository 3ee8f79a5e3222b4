"""CPU tests of the advisor's TP all-reduce prediction (sglang_verify_graph.advisor.interconnect).

Every expected number is computed by hand in the comment next to it (ms unless stated; 1 GB/s =
1e6 bytes per ms).
"""

import subprocess
import sys

import pytest

from sglang_verify_graph import advisor as adv
from sglang_verify_graph.advisor import interconnect as icm
from sglang_verify_graph.advisor.inputs import AdvisorError

# the field report with ours' worst verify ratio: verify 1.13 x 12 = 13.56 ms (compute-only)
FIELD_OURS = ["--decode-ms", "12", "--verify-ms", "13.56", "--num-steps", "2", "--draft-ms",
              "1.0", "--draft-extend-ms", "0.3", "--accepted-drafts", "0.93"]
TOY = icm.Interconnect("toy", 8, 40.0, 20.0)  # n 8, busbw 40 GB/s, 20 us per call


def run_cli(argv, capsys):
    try:
        code = adv.main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


# ----------------------------------------------------------------------------- formula

def test_all_reduce_and_all_gather_hand_computed():
    # one token of hidden 7168 in bf16: 14336 B; 2 * 7/8 * 14336 / 40e6 = 0.0006272 ms
    assert icm.all_reduce_ms(14336, TOY) == pytest.approx(0.020 + 0.0006272, rel=1e-12)
    # logits of one token, vocab 163840 bf16: 327680 B gathered; 7/8 * 327680 / 40e6 = 0.007168
    assert icm.all_gather_ms(327680, TOY) == pytest.approx(0.020 + 0.007168, rel=1e-12)
    # n = 2: 2 * 1/2 = 1 -> 0.020 + 14336 / 40e6 = 0.0203584
    two = icm.Interconnect("two", 2, 40.0, 20.0)
    assert icm.all_reduce_ms(14336, two) == pytest.approx(0.0203584, rel=1e-12)


def test_step_comm_hand_computed():
    # decode, 1 token: 123 all-reduces x 0.0206272 + 1 all-gather 0.027168 = 2.5643136
    assert icm.step_comm_ms(1, TOY) == pytest.approx(2.5643136, rel=1e-12)
    # verify, 3 tokens: all-reduce 0.020 + 1.75 * 43008 / 40e6 = 0.0218816, x 123 = 2.6914368;
    # all-gather 0.020 + 0.875 * 983040 / 40e6 = 0.041504; total 2.7329408
    assert icm.step_comm_ms(3, TOY) == pytest.approx(2.7329408, rel=1e-12)
    # no layers' worth of calls left but the embedding's and the gather: 0.0206272 + 0.027168
    bare = icm.ModelShape(all_reduces_per_layer=0)
    assert icm.step_comm_ms(1, TOY, bare) == pytest.approx(0.0477952, rel=1e-12)
    with pytest.raises(AdvisorError, match="tokens per step 0 must be >= 1"):
        icm.step_comm_ms(0, TOY)


def test_predict_hand_computed():
    inp = adv.Inputs(decode_ms=12.0, num_steps=2, verify_points={2: 13.56},
                     draft_points={2: 1.0}, draft_extend_ms=0.3, accept_length=1.93)
    inp.validate()
    p = icm.predict(inp, TOY)
    assert p.ratio == pytest.approx(1.13, rel=1e-12)  # 13.56 / 12
    # 1.13 * (12 - 2.5643136) + 2.7329408 = 10.662325632 + 2.7329408 = 13.395266432
    assert p.verify_ms == pytest.approx(13.395266432, rel=1e-12)
    assert p.cycle_ms == pytest.approx(14.695266432, rel=1e-12)  # + 1.0 + 0.3
    assert p.spec_tok_s == pytest.approx(1930 / 14.695266432, rel=1e-12)
    assert p.speedup == pytest.approx(1.93 * 12 / 14.695266432, rel=1e-12)
    assert p.break_even == pytest.approx(14.695266432 / 12, rel=1e-12)
    assert p.compute_verify_ms == 13.56 and p.compute_cycle_ms == pytest.approx(14.86)
    assert p.compute_spec_tok_s == pytest.approx(1930 / 14.86, rel=1e-12)
    # batch size 4: decode over 4 tokens, verify over 12
    p4 = icm.predict(inp, TOY, batch_size=4)
    assert p4.decode_comm_ms == pytest.approx(icm.step_comm_ms(4, TOY), rel=1e-12)
    assert p4.verify_comm_ms == pytest.approx(icm.step_comm_ms(12, TOY), rel=1e-12)


def test_predict_rejects_collectives_longer_than_decode():
    inp = adv.Inputs(decode_ms=2.0, num_steps=2, verify_points={2: 2.0}, accept_length=2.0)
    with pytest.raises(AdvisorError, match="collectives of one decode step take 2.564 ms"):
        icm.predict(inp, TOY)
    with pytest.raises(AdvisorError, match="TP size 1 must be >= 2"):
        icm.predict(inp, icm.Interconnect("one", 1, 40.0, 20.0))
    with pytest.raises(AdvisorError, match="bus bandwidth 0.0 GB/s"):
        icm.predict(inp, icm.Interconnect("zero", 8, 0.0, 20.0))


def test_presets_parameters():
    pcie = icm.PRESETS["pcie5_x16_8gpu"]
    assert (pcie.ranks, pcie.bus_gbps, pcie.latency_us) == (8, 41.1, 24.1)
    nvl = icm.PRESETS["nvlink_h100_8gpu"]
    assert (nvl.ranks, nvl.bus_gbps, nvl.latency_us) == (8, 370.0, 15.0)
    assert sorted(icm.PRESETS) == ["nvlink_h100_8gpu", "pcie5_x16_8gpu"]
    assert all(p.source for p in icm.PRESETS.values())
    shape = icm.ModelShape()  # Kimi-K2.5 / DeepSeek-V3
    assert (shape.layers, shape.hidden_size, shape.vocab_size, shape.dtype_bytes) == \
        (61, 7168, 163840, 2)
    assert shape.all_reduces == 123 and shape.logits_gathers == 1  # 2 x 61 + embedding


# ----------------------------------------------------------------------------- CLI

def test_cli_without_option_prints_no_prediction(capsys):
    code, out, err = run_cli(FIELD_OURS, capsys)
    assert code == 0 and err == ""
    assert "prediction (model:" not in out and "interconnect" not in out
    assert "speculative    1.930 tokens / 14.860 ms = 129.88 tok/s" in out


def test_cli_field_prediction_pcie(capsys):
    _, plain, _ = run_cli(FIELD_OURS, capsys)
    code, out, err = run_cli(FIELD_OURS + ["--interconnect", "pcie5_x16_8gpu"], capsys)
    assert code == 0 and err == ""
    assert out.startswith(plain.rstrip("\n") + "\n")  # the compute-only report, unchanged
    tag = "prediction (model: pcie5_x16_8gpu)"
    assert (f"interconnect   {tag}: TP 8, bus 41.1 GB/s, 24.1 us/call, bs 1; per step 123 "
            "all-reduces (2 x 61 layers + 1) of tokens x 7168 x 2 B, 1 logits all-gather of "
            "tokens x 163840 x 2 B") in out
    # decode: 123 x (24.1 + 1.75 * 14336 / 41100 = 24.7104) us + (24.1 + 0.875 * 327680 /
    # 41100 = 31.0763) us = 3070.46 us; verify: 123 x (24.1 + 1.75 * 43008 / 41100 = 25.9312)
    # + (24.1 + 0.875 * 983040 / 41100 = 45.0283) = 3234.57 us
    assert "all-reduce     decode 1 x 1 token 3.070 ms, verify 1 x 3 tokens 3.235 ms" in out
    # 1.13 x (12 - 3.07046) + 3.23457 = 13.32495
    assert (f"tp verify      {tag} 13.325 ms = 1.130 x (12.000 - 3.070) + 3.235; "
            "compute-only 13.560 ms = 1.130 x 12.000") in out
    # cycle 13.32495 + 1.3 = 14.62495: 1930 / 14.62495 = 131.97 tok/s, 1.93 * 12 / 14.62495 =
    # 1.584x, break-even 14.62495 / 12 = 1.219; compute-only 1930 / 14.86 = 129.88, 1.559x
    assert (f"tp speculative {tag} 1.930 tokens / 14.625 ms = 131.97 tok/s, speedup 1.584x, "
            "break-even accept_length 1.219; compute-only 129.88 tok/s, 1.559x") in out


def test_cli_overrides_change_the_model_and_label(capsys):
    code, out, _ = run_cli(FIELD_OURS + ["--interconnect", "pcie5_x16_8gpu", "--tp", "2",
                                         "--bus-gbps", "50", "--ar-latency-us", "10",
                                         "--num-layers", "1", "--batch-size", "2"], capsys)
    assert code == 0
    tag = "prediction (model: pcie5_x16_8gpu with --tp, --bus-gbps, --ar-latency-us, --num-layers)"
    assert f"interconnect   {tag}: TP 2, bus 50 GB/s, 10 us/call, bs 2; per step 3 " in out
    # n 2, 2 tokens: 3 all-reduces x (10 + 28672 / 50000 = 10.57344) us + all-gather (10 +
    # 0.5 * 655360 / 50000 = 16.5536) us = 48.27392 us
    assert "decode 2 x 1 token 0.048 ms" in out


@pytest.mark.parametrize("extra, message", [
    (["--interconnect", "pcie5"], "argument --interconnect: invalid choice: 'pcie5'"),
    (["--interconnect", "pcie5_x16_8gpu", "--bus-gbps", "0"],
     "argument --bus-gbps: bus bandwidth '0' must be a finite number of GB/s > 0 "
     "(e.g. --bus-gbps 41.1)"),
    (["--interconnect", "pcie5_x16_8gpu", "--bus-gbps", "fast"], "argument --bus-gbps: "),
    (["--interconnect", "pcie5_x16_8gpu", "--bus-gbps", "inf"], "argument --bus-gbps: "),
    (["--interconnect", "pcie5_x16_8gpu", "--ar-latency-us", "-1"],
     "argument --ar-latency-us: latency '-1' must be a finite number of us >= 0"),
    (["--interconnect", "pcie5_x16_8gpu", "--tp", "1"],
     "argument --tp: TP size '1' must be >= 2 (e.g. --tp 8)"),
    (["--interconnect", "pcie5_x16_8gpu", "--tp", "8.5"], "argument --tp: TP size '8.5' is not"),
    (["--interconnect", "pcie5_x16_8gpu", "--batch-size", "0"],
     "argument --batch-size: '0' must be >= 1"),
    (["--bus-gbps", "41.1"], "--bus-gbps needs --interconnect PRESET"),
    (["--tp", "8"], "--tp needs --interconnect PRESET"),
    (["--interconnect", "pcie5_x16_8gpu", "--ar-latency-us", "200"],
     "collectives of one decode step take 24.882 ms, not less than the decode step's 12 ms: "
     "lower --ar-latency-us or raise --bus-gbps"),
])
def test_cli_bad_interconnect_input_one_error_line(extra, message, capsys):
    code, out, err = run_cli(FIELD_OURS + extra, capsys)
    assert code == 2 and out == ""
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0]
    assert "Traceback" not in err


def test_module_entry_point_bad_bus_bandwidth_no_traceback():
    base = [sys.executable, "-m", "sglang_verify_graph.advisor"] + FIELD_OURS
    bad = subprocess.run(base + ["--interconnect", "pcie5_x16_8gpu", "--bus-gbps", "nan"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "error: argument --bus-gbps: bus bandwidth 'nan'" in bad.stderr

"""CPU tier: the pieces of ``python -m bench demo`` that run without a GPU.

Guards: the three server command lines (``--enable-verify-cuda-graph`` only on ours, everything
else shared; plain without speculation), the plugin's variables kept from the servers, the
step-time arithmetic, the profile lines picked by batch size, the table, the replay and parity
checks ending the run with exit 1 and one line, the start-up failure line (log path, exit code,
timeout), and ``--dry-run`` (no SGLang import, the plan and the three commands).
"""

import io
import json
import os
import subprocess
import sys

import pytest

from bench.demo import cli as demo
from bench.demo import report as demo_report
from bench.lib import server as demo_server

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [ROOT, os.path.join(ROOT, "python")] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
SPEC_FLAGS = ["--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "1",
              "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"]


def _args(*extra):
    return demo.parse_args(["--workdir", "/w", *extra])


def _flag_value(cmd, flag):
    return cmd[cmd.index(flag) + 1]


# ----------------------------------------------------------------------------- commands

def test_only_ours_has_the_flag_and_the_rest_is_shared():
    a = _args()
    cmds = {m: demo.server_command(m, a, 31000) for m in demo_report.RUN_ORDER}
    assert [m for m, c in cmds.items() if "--enable-verify-cuda-graph" in c] == ["ours"]
    assert cmds["ours"] == cmds["upstream"] + ["--enable-verify-cuda-graph"]
    for m, c in cmds.items():
        assert c[1:3] == ["-m", "sglang.launch_server"], m
        assert _flag_value(c, "--model-path") == "/w/models/llama-8b", m
        assert _flag_value(c, "--load-format") == "dummy", m
        assert _flag_value(c, "--attention-backend") == "triton", m
        assert _flag_value(c, "--port") == "31000", m
    for m in ("upstream", "ours"):
        c = cmds[m]
        for flag, value in zip(SPEC_FLAGS[::2], SPEC_FLAGS[1::2]):
            assert _flag_value(c, flag) == value, (m, flag)
        assert _flag_value(c, "--speculative-draft-model-path") == "/w/models/llama-8b-eagle3"
        assert _flag_value(c, "--verify-graph-profile-every") == "8"
    plain = cmds["plain"]
    assert not any(x.startswith("--speculative") or x == "--verify-graph-profile-every" for x in plain)
    # plain = upstream without its speculative part: the shared flags are the same list
    spec_start = cmds["upstream"].index("--speculative-algorithm")
    assert plain == cmds["upstream"][:spec_start]


def test_server_args_go_last_on_every_server_and_model_choice():
    a = _args("--server-args", "--mem-fraction-static 0.6", "--model", "kimi-small",
              "--context", "4096", "--concurrency", "16")
    for m in demo_report.RUN_ORDER:
        c = demo.server_command(m, a, 1)
        assert c[-2:] == ["--mem-fraction-static", "0.6"], m
        assert _flag_value(c, "--model-path") == "/w/models/kimi-small"
        assert _flag_value(c, "--cuda-graph-max-bs-decode") == "16"
        assert int(_flag_value(c, "--context-length")) >= 4096 + 64
    assert demo.context_length(1024, 64, 131072) == 1280
    assert demo.context_length(30000, 64, 32768) == 30208
    assert demo.context_length(32600, 64, 32768) == 32768  # capped at max_position_embeddings


def test_server_env_drops_the_plugin_variables():
    env, dropped = demo.server_env({"PATH": "/bin", "SGLANG_ENABLE_VERIFY_CUDA_GRAPH": "1",
                                    "SGLANG_VERIFY_GRAPH_PROFILE_EVERY": "5", "SGLANG_OTHER": "x"})
    assert env == {"PATH": "/bin", "SGLANG_OTHER": "x"}
    assert dropped == ["SGLANG_ENABLE_VERIFY_CUDA_GRAPH", "SGLANG_VERIFY_GRAPH_PROFILE_EVERY"]


@pytest.mark.parametrize("argv,flag", [
    (["--model", "kimi-k25-small"], "--model kimi-k25-small"),
    (["--model", "nope"], "--model nope"),
    (["--context", "0"], "--context"),
    (["--new-tokens", "1"], "--new-tokens"),
    (["--context", "200000"], "--context 200000"),
    (["--start-timeout", "0"], "--start-timeout"),
    (["--server-args", "'unclosed"], "--server-args"),
])
def test_bad_input_is_one_usage_line_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as ex:
        demo.parse_args(argv)
    assert ex.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
    assert len(err) == 1 and flag in err[0], err
    assert err[0].startswith("python -m bench demo: error: ")


# ----------------------------------------------------------------------------- arithmetic

def test_step_time_arithmetic():
    assert demo_report.decode_steps("plain", {"spec_verify_ct": 99}, 64) == 63
    assert demo_report.decode_steps("upstream", {"spec_verify_ct": 21}, 64) == 21
    assert demo_report.decode_steps("ours", {"spec_verify_ct": 0}, 64) is None
    assert demo_report.decode_steps("ours", {}, 64) is None
    assert demo_report.step_ms(0.050, 0.680, 63) == pytest.approx(10.0)
    assert demo_report.step_ms(0.05, 0.68, None) is None
    assert demo_report.ratio(3.0, 2.0) == 1.5 and demo_report.ratio(None, 2.0) is None and demo_report.ratio(1.0, 0) is None
    assert demo_report.median([None, 3.0, 1.0, 2.0]) == 2.0 and demo_report.median([None]) is None


def _profile_line(bs, verify, cycle, accept="1.000"):
    return (f"[2026-12-02 10:00:00 TP0] verify_graph_profile rank=0 cycles=8 tokens=8 bs={bs} "
            f"num_steps=3 cycle_ms={cycle} cycle_mean_ms={cycle} draft_ms=1.0 verify_ms={verify} "
            f"draft_extend_ms=0.5 other_ms=0.2 accept_length={accept} accepted_drafts=0.0 "
            f"tok_s=100.0 replay_pct=100.0 fallbacks=none\n")


def test_profile_picks_the_windows_at_one_batch_size():
    lines = [_profile_line("1.000", 4.0, 9.0), _profile_line("1.000", 6.0, 11.0),
             _profile_line("1.000", 5.0, 10.0), _profile_line("4.500", 50.0, 60.0),
             _profile_line("8.000", 7.5, 15.0), "an unrelated line bs=1.000 verify_ms=99\n"]
    p1 = demo_report.profile_at_batch(lines, 1)
    assert p1["verify_ms"] == 5.0 and p1["cycle_ms"] == 10.0 and p1["lines"] == 3
    assert p1["draft_ms"] == 1.0 and p1["accept_length"] == 1.0
    p8 = demo_report.profile_at_batch(lines, 8)
    assert p8["verify_ms"] == 7.5 and p8["lines"] == 1
    assert demo_report.profile_at_batch(lines, 2) is None


# ----------------------------------------------------------------------------- table

def _modes(ours_state=None, ours_ids=None):
    ids = [5, 6, 7, 8]
    state = ours_state if ours_state is not None else [
        {"runner": "VerifyCudaGraphRunner", "replays": 200, "verify_steps": 200,
         "fallback_total": 0, "fallbacks": {}, "capture_bs": [1, 2, 4, 8]}]
    return {
        "plain": {"step_ms_c1": 8.0, "tok_s_c1": 120.0, "tok_s_cN": 900.0, "accept_length": None,
                  "output_ids_c1": ids, "verify_cuda_graph": [None]},
        "upstream": {"step_ms_c1": 20.0, "verify_ms_c1": 12.0, "tok_s_c1": 48.0, "tok_s_cN": 300.0,
                     "accept_length": 1.0, "output_ids_c1": ids, "verify_cuda_graph": [None]},
        "ours": {"step_ms_c1": 12.0, "verify_ms_c1": 4.0, "tok_s_c1": 80.0, "tok_s_cN": 520.5,
                 "accept_length": 1.0, "output_ids_c1": ours_ids if ours_ids is not None else ids,
                 "verify_cuda_graph": state},
    }


def test_table_from_a_synthetic_result():
    rows = demo_report.build_rows(_modes(), 8)
    assert [r["mode"] for r in rows] == ["plain", "upstream", "ours"]
    ours = rows[2]
    assert ours["step_per_plain"] == 1.5 and ours["verify_per_plain_step"] == 0.5
    assert rows[1]["step_per_plain"] == 2.5 and rows[1]["verify_per_plain_step"] == 1.5
    text = demo_report.format_table(rows, 8).splitlines()
    assert [h.strip() for h in text[0].split("|")] == [
        "mode", "step ms (c=1)", "step / plain", "verify ms (device)", "verify / plain step",
        "accept len", "tok/s c=1", "tok/s c=8"]
    assert set(text[1]) <= {"-", "+"}
    cells = {ln.split("|")[0].strip(): [c.strip() for c in ln.split("|")] for ln in text[2:]}
    assert cells["plain"] == ["plain", "8.00", "1.00", "-", "-", "-", "120.0", "900.0"]
    assert cells["upstream"] == ["upstream", "20.00", "2.50", "12.00", "1.50", "1.00", "48.0", "300.0"]
    assert cells["ours"] == ["ours", "12.00", "1.50", "4.00", "0.50", "1.00", "80.0", "520.5"]
    assert len({len(ln) for ln in text}) == 1  # aligned


def test_verify_at_the_second_load_level_line():
    modes = _modes()
    modes["upstream"]["profile_cN"] = {"verify_ms": 9.793}
    modes["ours"]["profile_cN"] = None
    assert demo_report.verify_at_concurrency_line(modes, 8) == "verify ms (device) at c=8: upstream 9.79, ours -"


def test_counter_lines():
    lines = demo_report.counter_lines(_modes())
    assert lines[0].startswith("counters upstream: no verify_cuda_graph state")
    assert "replays=200 verify_steps=200 fallbacks=0" in lines[1] and "rank 0" in lines[1]


# ----------------------------------------------------------------------------- checks

def test_replay_check():
    ok = [{"replays": 10, "verify_steps": 10, "fallback_total": 0}]
    assert demo_report.replay_failure(ok) is None
    assert "no verify_cuda_graph state" in demo_report.replay_failure([None])
    assert "no verify_cuda_graph state" in demo_report.replay_failure([])
    assert "counted no verify step" in demo_report.replay_failure(
        [{"replays": 0, "verify_steps": 0, "fallback_total": 0}])
    line = demo_report.replay_failure([{"replays": 9, "verify_steps": 10, "fallback_total": 1,
                                 "fallbacks": {"bs_over_capture": 1}}])
    assert "replayed 9 of 10" in line and "bs_over_capture" in line
    assert "rank 1" in demo_report.replay_failure(ok + [{"replays": 3, "verify_steps": 4, "fallback_total": 1}])


def test_parity_check():
    assert demo_report.parity_failure({"plain": [1, 2, 3], "upstream": [1, 2, 3], "ours": [1, 2, 3]}) is None
    line = demo_report.parity_failure({"plain": [1, 2, 3], "upstream": [1, 2, 3], "ours": [1, 9, 3]})
    assert "ours differs from plain at output token 1" in line and "(9 vs 2" in line
    assert "at output token 2" in demo_report.parity_failure({"plain": [1, 2, 3], "ours": [1, 2]})
    assert "no concurrency-1 output from upstream" in demo_report.parity_failure(
        {"plain": [1], "upstream": None, "ours": [1]})


def _run_main(monkeypatch, tmp_path, modes, capsys):
    """``demo.main`` with the servers replaced by ``modes`` (synthetic results)."""
    calls = []

    def fake_run_mode(mode, a, env):
        calls.append(mode)
        assert "SGLANG_ENABLE_VERIFY_CUDA_GRAPH" not in env
        return demo.server_command(mode, a, 1), dict(modes[mode], startup_s=1.0)

    monkeypatch.setattr(demo, "run_mode", fake_run_mode)
    monkeypatch.setattr(demo, "_plugin_installed", lambda: True)
    monkeypatch.setattr(demo.dummy_models, "write_model", lambda out, name, cfg: None)
    monkeypatch.setenv("SGLANG_ENABLE_VERIFY_CUDA_GRAPH", "1")
    out = tmp_path / "r.json"
    rc = demo.main(["--workdir", str(tmp_path), "--out", str(out)])
    cap = capsys.readouterr()
    assert calls == ["upstream", "ours", "plain"]  # upstream first
    return rc, cap, json.loads(out.read_text())


def test_main_passes_and_writes_the_table(monkeypatch, tmp_path, capsys):
    rc, cap, report = _run_main(monkeypatch, tmp_path, _modes(), capsys)
    assert rc == 0, cap.err
    assert "mode     | step ms (c=1) |" in cap.out and "not a speed-up" in cap.out
    assert "counters ours rank 0: runner=VerifyCudaGraphRunner replays=200" in cap.out
    assert "verify ms (device) at c=8: upstream" in cap.out
    assert report["failures"] == [] and [r["mode"] for r in report["table"]] == list(demo_report.TABLE_ORDER)
    assert report["table"][2]["tok_s_c8"] == 520.5 and "not a speed-up" in report["note"]
    assert "--enable-verify-cuda-graph" in report["commands"]["ours"]
    assert "--enable-verify-cuda-graph" not in report["commands"]["upstream"]


@pytest.mark.parametrize("kind", ["fallback", "mismatch"])
def test_main_fails_with_one_line(monkeypatch, tmp_path, capsys, kind):
    modes = (_modes(ours_state=[{"replays": 5, "verify_steps": 6, "fallback_total": 1,
                                 "fallbacks": {"raw_bs_over_capture": 1}}]) if kind == "fallback"
             else _modes(ours_ids=[5, 6, 0, 8]))
    rc, cap, report = _run_main(monkeypatch, tmp_path, modes, capsys)
    assert rc == 1
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert ("replayed 5 of 6" if kind == "fallback" else "differs from plain at output token 2") in err[0]
    assert report["failures"] and report["table"]  # the table is still written


# ----------------------------------------------------------------------------- servers

def test_progress_prints_elapsed_and_the_last_log_line(tmp_path):
    log = tmp_path / "s.log"
    log.write_text("loading weights\nCapture cuda graph bs [1, 2, 4, 8]\n\n")
    buf = io.StringIO()
    p = demo_server.Progress("ours", str(log), every_s=5, stream=buf)
    for t in (0.0, 1.0, 4.9, 5.0, 7.0, 10.2):
        p.update(t)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 3, lines  # every 5 s off a terminal
    assert lines[1] == "  ours: starting,    5 s | Capture cuda graph bs [1, 2, 4, 8]"
    assert demo_server.last_log_line(str(tmp_path / "missing.log")) == ""
    log.write_text("Load weight begin\n/x.py:3: UserWarning: old\n  warnings.warn(\n")
    assert demo_server.last_log_line(str(log)) == "Load weight begin"  # a warning's echo is skipped
    log.write_text("")
    demo_server.Progress("plain", str(log), stream=buf).update(0.0)
    assert buf.getvalue().splitlines()[-1] == "  plain: starting,    0 s | (log empty so far)"


def test_start_failure_is_one_line_with_the_log(tmp_path):
    pytest.importorskip("requests")
    pytest.importorskip("psutil")
    log = tmp_path / "server_ours.log"
    cmd = [sys.executable, "-c", "import sys; print('RuntimeError: no GPU'); sys.exit(3)"]
    with pytest.raises(demo_server.ServerStartError) as ex:
        demo_server.start_server("ours", cmd, dict(os.environ), "http://127.0.0.1:9", str(log), 30)
    msg = str(ex.value)
    assert "\n" not in msg and "the ours server exited with 3" in msg and str(log) in msg
    assert "RuntimeError: no GPU" in msg


def test_start_timeout_stops_the_server(tmp_path):
    pytest.importorskip("requests")
    pytest.importorskip("psutil")
    log = tmp_path / "server_plain.log"
    pidfile = tmp_path / "pid"
    cmd = [sys.executable, "-c",
           f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(120)"]
    with pytest.raises(demo_server.ServerStartError) as ex:
        demo_server.start_server("plain", cmd, dict(os.environ), "http://127.0.0.1:9", str(log), 1.5,
                                 timeout_flag="--start-timeout")
    assert "not healthy after 2 s (--start-timeout)" in str(ex.value) and str(log) in str(ex.value)
    import psutil

    pid = int(pidfile.read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


# ----------------------------------------------------------------------------- dry run

def test_dry_run_prints_plan_and_commands_without_sglang(tmp_path):
    code = ("import sys, runpy; sys.argv = ['demo', '--dry-run', '--workdir', %r];\n"
            "try:\n    runpy.run_module('bench.demo.cli', run_name='__main__')\n"
            "except SystemExit as ex:\n"
            "    assert ex.code == 0, ex.code\n"
            "    bad = [m for m in sys.modules if m == 'sglang' or m.startswith(('sglang.', 'torch'))]\n"
            "    assert not bad, bad\n    print('NO_SGLANG_IMPORTED')\n") % str(tmp_path / "wd")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "NO_SGLANG_IMPORTED" in out
    cmds = {ln.split(":", 1)[0].strip(): ln.split(":", 1)[1].split()
            for ln in out.splitlines() if ln.startswith("  ") and "sglang.launch_server" in ln}
    assert list(cmds) == ["upstream", "ours", "plain"]
    assert cmds["ours"] == cmds["upstream"] + ["--enable-verify-cuda-graph"]
    assert "--speculative-algorithm" not in cmds["plain"]
    assert "1024 random token ids" in out and "64-token request" in out and "c=8" in out
    assert str(tmp_path / "wd" / "models" / "llama-8b") in out
    assert not (tmp_path / "wd").exists()  # a dry run writes nothing


def test_help_describes_the_demo():
    r = subprocess.run([sys.executable, "-m", "bench.demo.cli", "--help"],
                       capture_output=True, text=True, env=ENV, timeout=60)
    assert r.returncode == 0
    for word in ("--enable-verify-cuda-graph", "--dry-run", "--model", "--context", "--new-tokens",
                 "--workdir", "--out", "not a speed-up"):
        assert word in r.stdout, word

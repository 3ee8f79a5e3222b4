"""CPU tier: bench/verify.py keeps the points a killed mode finished (its ``BENCH phase``
log lines) and ``--merge`` rebuilds one table from earlier runs' JSON files and mode logs, refusing
inputs that cannot form one table with one line."""

import json
import os
import pathlib
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.lib import engine, results
from bench.verify import child as verify_child
from bench.verify import cli as verify_cli
from bench.verify import table as verify_table


def _phase(ctx, bs, decode=None, verify=None):
    roles = {}
    if decode is not None:
        roles["target_decode"] = {"gpu_ms": decode}
    if verify is not None:
        roles["target_verify"] = {"gpu_ms": verify, "classes": ["VerifyCudaGraphRunner"]}
    return {"context": ctx, "bs": bs, "e2e_ms_per_step": 1.0, "roles": roles}


def _log(path, phases, steps=3, startup=30.5):
    lines = ["[2026-12-02 09:43:05] server_args=...",
             "BENCH engine_kwargs " + json.dumps({"model_path": "/tmp/models/kimi-k25-shard",
                                                  "speculative_num_steps": steps}),
             f"BENCH startup {startup}s"]
    lines += ["BENCH phase " + json.dumps(p) for p in phases]
    lines.append("[2026-12-02 09:49:35] Prefill batch, #new-seq: 1, #new-token: 8192")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _result(path, modes, model="kimi-k25-shard", capture=None, **meta_extra):
    meta = {"model": model, "hardware": "H200", "versions": {"sglang": "0.5.16"}, "command": "bench",
            "date": "2026-12-02T09:42:30", "mode_status": {}, "capture": capture or {}, **meta_extra}
    path.write_text(json.dumps({"meta": meta, "rows": [], "modes": modes}))
    return str(path)


def test_phases_from_log(tmp_path):
    log = _log(tmp_path / "bench_ours.log", [_phase(1024, 1, verify=13.3), _phase(1024, 4, verify=16.4)])
    got = results.phases_from_log(log)
    assert [(p["context"], p["bs"]) for p in got["phases"]] == [(1024, 1), (1024, 4)]
    assert got["partial"] is True and got["startup_s"] == 30.5
    assert got["engine_kwargs"]["speculative_num_steps"] == 3
    (tmp_path / "empty.log").write_text("Traceback (most recent call last):\n")
    assert results.phases_from_log(str(tmp_path / "empty.log")) == {}
    assert results.phases_from_log(str(tmp_path / "missing.log")) == {}


def test_a_timed_out_mode_keeps_its_finished_points(tmp_path, monkeypatch, capsys):
    """The ``ours`` engine is killed at ``--mode-timeout`` after one of two points: its row keeps
    the measured verify (from the log), the status says so, the unfinished point stays empty."""

    def fake_run_logged(cmd, log, timeout, child):
        mode, jf = cmd[cmd.index("--child") + 1], cmd[cmd.index("--child-out") + 1]
        if mode == "ours":
            _log(pathlib.Path(log), [_phase(1024, 1, verify=13.287)])
            return "timeout"
        open(log, "w").close()
        phases = [_phase(1024, bs, decode=15.3 if mode == "plain" else None,
                         verify=26.71 if mode == "upstream" else None) for bs in (1, 4)]
        with open(jf, "w") as f:
            json.dump({"mode": mode, "ok": True, "startup_s": 1.0, "phases": phases}, f)
        return 0

    monkeypatch.setattr(engine, "run_logged", fake_run_logged)
    monkeypatch.setattr(verify_child, "model_paths", lambda a: (None, None))
    monkeypatch.setattr(engine, "hardware", lambda: "stand-in")
    monkeypatch.setattr(engine, "versions", lambda: {})
    out = tmp_path / "r.json"
    monkeypatch.setattr(sys, "argv", ["bench_verify.py", "--contexts", "1024", "--batch-sizes", "1,4",
                                      "--out", str(out), "--log-dir", str(tmp_path / "logs")])
    assert verify_cli.main() == 1  # a mode failed: the run still fails
    data = json.loads(out.read_text())
    r1, r4 = data["rows"]
    assert r1["ours_verify_ms"] == 13.287 and r1["ours_verify_per_decode"] == round(13.287 / 15.3, 3)
    assert r4["ours_verify_ms"] is None and r4["upstream_verify_ms"] == 26.71
    assert data["meta"]["mode_status"]["ours"].startswith("FAILED (rc=timeout")
    assert "1 finished points kept from its log" in data["meta"]["mode_status"]["ours"]


def test_merge_a_run_a_killed_modes_log_and_a_later_baseline(tmp_path, capsys):
    """The shard sweep's case: ours and upstream in one run (ours killed after its points), plain in
    a second invocation; the merged rows divide by the plain run's decode."""
    first = _result(tmp_path / "sweep.json", {
        "ours": {"mode": "ours", "ok": False, "error": "rc=timeout; "},
        "upstream": {"mode": "upstream", "ok": True, "startup_s": 49.0,
                     "engine_kwargs": {"speculative_num_steps": 3},
                     "phases": [_phase(1024, 1, verify=26.71), _phase(16384, 32, verify=304.5)]}})
    log = _log(tmp_path / "bench_ours.log", [_phase(1024, 1, verify=13.287)])
    plain = _result(tmp_path / "plain.json", {
        "plain": {"mode": "plain", "ok": True, "startup_s": 30.7, "phases": [_phase(1024, 1, decode=15.3)]}})
    out = tmp_path / "merged.json"
    assert verify_cli.main(["--merge", first, log, plain, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = {(r["context"], r["bs"]): r for r in data["rows"]}
    assert set(rows) == {(1024, 1), (1024, 32), (16384, 1), (16384, 32)}  # the union of the points
    assert rows[(1024, 1)]["ours_per_upstream_verify"] == round(13.287 / 26.71, 3)
    assert rows[(1024, 1)]["upstream_verify_per_decode"] == round(26.71 / 15.3, 3)
    assert rows[(16384, 32)]["upstream_verify_ms"] == 304.5 and rows[(16384, 32)]["decode_ms"] is None
    meta = data["meta"]
    assert [s["path"] for s in meta["merged_from"]] == ["sweep.json", "bench_ours.log", "plain.json"]
    assert meta["mode_status"]["ours"] == "FAILED (rc=timeout; ), 1 finished points kept from its log"
    assert "RESULT merged 3 inputs" in capsys.readouterr().out


def test_merge_joins_one_modes_points_from_several_runs(tmp_path):
    """plain at 16k bs 16 from a run that timed out before bs 32, bs 32 from a later run, ours from
    the first: one row per point, each plain decode from the run that measured it, both statuses."""
    first = _result(tmp_path / "a.json", capture={"plain": {"kind": "plain decode", "seconds": 44.75, "gib": 0.23}}, modes={
        "plain": {"mode": "plain", "ok": False, "partial": True, "error": "rc=timeout; ", "startup_s": 80.7,
                  "phases": [_phase(16384, 16, decode=31.6)]},
        "ours": {"mode": "ours", "ok": True, "startup_s": 39.6, "engine_kwargs": {"speculative_num_steps": 2},
                 "phases": [_phase(16384, 16, verify=31.3), _phase(16384, 32, verify=49.7)]}})
    later = _result(tmp_path / "b.json", capture={"plain": {"kind": "plain decode", "seconds": 2.43, "gib": 0.22}}, modes={
        "plain": {"mode": "plain", "ok": True, "startup_s": 30.1, "phases": [_phase(16384, 32, decode=52.4)]}})
    out = tmp_path / "m.json"
    assert verify_cli.main(["--merge", first, later, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = {(r["context"], r["bs"]): r for r in data["rows"]}
    assert rows[(16384, 16)]["decode_ms"] == 31.6 and rows[(16384, 32)]["decode_ms"] == 52.4
    assert rows[(16384, 32)]["ours_verify_per_decode"] == round(49.7 / 52.4, 3)
    status = data["meta"]["mode_status"]["plain"]
    assert status == "FAILED (rc=timeout; ), 1 finished points kept from its log + ok, startup 30.1s"
    assert data["modes"]["plain"]["ok"] is False
    got = [src["capture"]["plain"]["seconds"] for src in data["meta"]["merged_from"]]
    assert got == [44.75, 2.43]  # each input's own capture, not only the one meta["capture"] keeps


def test_a_log_line_cut_off_by_the_kill_is_skipped(tmp_path):
    log = _log(tmp_path / "bench_ours.log", [_phase(1024, 1, verify=13.3), _phase(1024, 4, verify=16.4)])
    text = pathlib.Path(log).read_text()
    cut = text.rindex("BENCH phase ") + 40  # the child killed while printing its last phase
    pathlib.Path(log).write_text(text[:cut] + "\nBENCH phase {\"bs\": 8}\nBENCH startup abcs\n")
    got = results.phases_from_log(log)
    assert [(p["context"], p["bs"]) for p in got["phases"]] == [(1024, 1)] and got["skipped_lines"] == 3


@pytest.mark.parametrize("order", ["json_first", "log_first"])
def test_a_failed_modes_reason_and_its_logs_points_in_either_order(tmp_path, order):
    failed = _result(tmp_path / "a.json", {"ours": {"mode": "ours", "ok": False, "error": "rc=timeout; "}})
    log = _log(tmp_path / "bench_ours.log", [_phase(1024, 1, verify=13.3)])
    inputs = [failed, log] if order == "json_first" else [log, failed]
    assert verify_cli.main(["--merge", *inputs, "--out", str(tmp_path / "m.json")]) == 0
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["meta"]["mode_status"]["ours"] == "FAILED (rc=timeout; ), 1 finished points kept from its log"
    assert data["rows"][0]["ours_verify_ms"] == 13.3


def test_a_failed_run_then_a_run_with_points_shows_both(tmp_path):
    failed = _result(tmp_path / "a.json", {"plain": {"mode": "plain", "ok": False, "error": "rc=timeout; "}})
    later = _result(tmp_path / "b.json", {"plain": {"mode": "plain", "ok": True, "startup_s": 30.1,
                                                    "phases": [_phase(1024, 1, decode=15.3)]}})
    assert verify_cli.main(["--merge", failed, later, "--out", str(tmp_path / "m.json")]) == 0
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["meta"]["mode_status"]["plain"] == "FAILED (rc=timeout; ) + ok, startup 30.1s"
    assert data["rows"][0]["decode_ms"] == 15.3


def test_profile_lines_and_an_inputs_own_merged_from_are_kept(tmp_path):
    prof = [{"cycles": "20", "num_steps_run": 2}]
    a = _result(tmp_path / "a.json", {"plain": {"mode": "plain", "ok": True, "startup_s": 1.0,
                                                "phases": [_phase(1024, 1, decode=1.0)]}},
                profile_lines=prof, merged_from=[{"path": "first.json"}])
    assert verify_cli.main(["--merge", a, "--out", str(tmp_path / "m.json")]) == 0
    meta = json.loads((tmp_path / "m.json").read_text())["meta"]
    assert meta["profile_lines"] == prof and meta["merged_from"][0]["merged_from"] == [{"path": "first.json"}]


def test_keyed_sweep_modes_keep_their_points_when_one_num_steps_failed(tmp_path):
    """A --steps 1,2 sweep whose num_steps 1 engines died before a point: the @2 columns stay."""
    ek = {"speculative_num_steps": 2}
    a = _result(tmp_path / "a.json", {
        "ours@1": {"mode": "ours", "ok": False, "error": "rc=1"},
        "ours@2": {"mode": "ours", "ok": True, "startup_s": 1.0, "engine_kwargs": ek,
                   "phases": [_phase(1024, 1, verify=2.5)]},
        "plain": {"mode": "plain", "ok": True, "startup_s": 1.0, "phases": [_phase(1024, 1, decode=2.0)]}})
    assert verify_cli.main(["--merge", a, "--out", str(tmp_path / "m.json")]) == 0
    rows = {r["num_steps"]: r for r in json.loads((tmp_path / "m.json").read_text())["rows"]}
    assert rows[2]["ours_verify_ms"] == 2.5 and rows[1]["ours_verify_ms"] is None


def test_merge_refuses_an_out_that_is_an_input(tmp_path, capsys):
    a = _result(tmp_path / "a.json", {"plain": {"mode": "plain", "ok": True, "startup_s": 1.0,
                                                "phases": [_phase(1024, 1, decode=1.0)]}})
    before = open(a).read()
    assert verify_cli.main(["--merge", a, "--out", a]) == 2
    assert "is one of the inputs" in capsys.readouterr().err and open(a).read() == before


@pytest.mark.parametrize("case, fix", [
    ("twice", "give each point once"),
    ("steps_joined", "merge one num_steps at a time"),
    ("models", "merge runs of one model"),
    ("steps", "merge one num_steps at a time"),
    ("other", "neither a .json --out file nor a bench_<mode>.log"),
    ("missing_log", "no such file"),
    ("unknown_mode", "is not a mode"),
    ("hardware", "different hardware"),
    ("backend", "different attention_backend"),
    ("log_model", "different models"),
    ("mixed_keys", "mix a --steps sweep's mode@k with plain names"),
    ("badjson", "not a python -m bench verify --out file"),
])
def test_merge_refuses_with_one_line(tmp_path, capsys, case, fix):
    up = {"mode": "upstream", "ok": True, "startup_s": 1.0, "engine_kwargs": {"speculative_num_steps": 3},
          "phases": [_phase(1024, 1, verify=2.0)]}
    a = _result(tmp_path / "a.json", {"upstream": up})
    if case == "twice":
        b = _result(tmp_path / "b.json", {"upstream": up})
    elif case == "steps_joined":  # the same mode, other points, another num_steps
        b = _result(tmp_path / "b.json", {"upstream": dict(up, engine_kwargs={"speculative_num_steps": 2},
                                                           phases=[_phase(4096, 1, verify=3.0)])})
    elif case == "models":
        b = _result(tmp_path / "b.json", {"plain": {"mode": "plain", "ok": True, "startup_s": 1.0,
                                                    "phases": [_phase(1024, 1, decode=1.0)]}}, model="llama-8b")
    elif case == "steps":
        b = _log(tmp_path / "bench_ours.log", [_phase(1024, 1, verify=1.0)], steps=2)
    elif case == "missing_log":
        b = str(tmp_path / "bench_plain.log")
    elif case == "unknown_mode":
        b = _log(tmp_path / "bench_plian.log", [_phase(1024, 4, decode=1.0)])
    elif case == "hardware":
        b = _result(tmp_path / "b.json", {"plain": {"mode": "plain", "ok": True, "startup_s": 1.0,
                                                    "phases": [_phase(1024, 1, decode=1.0)]}}, hardware="A100")
    elif case == "backend":
        b = _result(tmp_path / "b.json", {"ours": dict(up, mode="ours", engine_kwargs={
            "speculative_num_steps": 3, "attention_backend": "flashinfer"})})
        a = _result(tmp_path / "a.json", {"upstream": dict(up, engine_kwargs={
            "speculative_num_steps": 3, "attention_backend": "triton"})})
    elif case == "log_model":
        b = _log(tmp_path / "bench_ours.log", [_phase(1024, 4, verify=1.0)])
        pathlib.Path(b).write_text(pathlib.Path(b).read_text().replace("kimi-k25-shard", "llama-8b"))
    elif case == "mixed_keys":
        b = _result(tmp_path / "b.json", {"ours@2": dict(up, mode="ours", engine_kwargs={"speculative_num_steps": 2},
                                                         phases=[_phase(4096, 1, verify=3.0)])})
    elif case == "other":
        b = str(tmp_path / "notes.txt")
        open(b, "w").close()
    else:
        b = str(tmp_path / "b.json")
        open(b, "w").write("{")
    assert verify_cli.main(["--merge", a, b, "--out", str(tmp_path / "m.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m bench merge: --merge") and fix in err[0]
    assert not (tmp_path / "m.json").exists()


def test_e2e_per_step_has_no_figure_when_the_one_token_wall_is_longer():
    """A one-off in the 1-token wall (t1 2.7243 s against tn 0.7966 s over 47 steps) gives no
    figure rather than a negative one (-41.0 ms per step)."""
    assert verify_child.e2e_ms_per_step(0.7966, 2.7243, 47) is None
    assert verify_child.e2e_ms_per_step(0.8302, 0.167, 47) == round(1000 * (0.8302 - 0.167) / 47, 4)
    assert verify_child.e2e_ms_per_step(0.5, 0.1, 0) == 400.0  # no verify step counted: over one

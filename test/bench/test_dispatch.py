"""``python -m bench``: the one entry point of the lab. Guards: ``--help`` lists every command with
one line, each command's ``--help`` is its own parser's, ``merge`` runs the verify merge, an
unknown command exits 2, a command whose module is missing is one error line, and no lab module
adds to ``sys.path``."""

import os
import pathlib
import subprocess
import sys

import pytest

from bench import __main__ as dispatch

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
COMMANDS = ["verify", "merge", "speedup", "capture", "kernel", "parts", "demo", "models", "report"]


def _run(*args):
    return subprocess.run([sys.executable, "-m", "bench", *args], capture_output=True, text=True,
                          timeout=120, env=ENV, cwd=str(ROOT))


def test_help_lists_every_command_with_one_line():
    r = _run("--help")
    assert r.returncode == 0, r.stderr
    listed = [ln.split()[0] for ln in r.stdout.splitlines() if ln.startswith("  ")]
    assert listed == COMMANDS
    assert list(dispatch.COMMANDS) == COMMANDS


@pytest.mark.parametrize("cmd", ["verify", "merge", "speedup", "capture", "demo"])
def test_each_command_has_its_own_help(cmd):
    r = _run(cmd, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: python -m bench {cmd}"), r.stdout[:200]


def test_models_builders_help():
    r = _run("models", "--help")
    assert r.returncode == 0 and "dummy" in r.stdout and "pair" in r.stdout, r.stdout
    for b in ("dummy", "pair"):
        r = _run("models", b, "--help")
        assert r.returncode == 0 and r.stdout.startswith(f"usage: python -m bench models {b}"), r.stdout[:200]


def test_unknown_command_exits_2(capsys):
    assert dispatch.main(["nope"]) == 2
    assert "unknown command 'nope'" in capsys.readouterr().err
    assert dispatch.main([]) == 2


def test_missing_command_module_is_one_line(monkeypatch, capsys):
    monkeypatch.setitem(dispatch.COMMANDS, "report", ("bench.no_such_module", "x"))
    assert dispatch.main(["report"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bench.no_such_module" in err[0], err


def test_merge_command_is_the_verify_merge(tmp_path, capsys):
    a = tmp_path / "a.json"
    a.write_text("{")
    assert dispatch.main(["merge", str(a), "--out", str(tmp_path / "m.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m bench merge: --merge") and "not a" in err[0]


def test_no_lab_module_edits_sys_path():
    hits = [str(p.relative_to(ROOT)) for p in (ROOT / "bench").rglob("*.py") if "suites" not in p.parts
            and ("sys.path.insert" in p.read_text() or "sys.path.append" in p.read_text())]
    assert not hits, hits

"""``sglang serve --help`` lists the plugin's flags (SGLang prints that help before it loads
plugins; ``serve_help.py`` and the ``.pth`` file the package installs load them first)."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import distribution

import pytest

from sglang_verify_graph import serve_help

FLAGS = ("--enable-verify-cuda-graph", "--verify-graph-profile-every")


def _clean_env():
    return {k: v for k, v in os.environ.items()
            if k != "SGLANG_ENABLE_VERIFY_CUDA_GRAPH" and not k.startswith("SGLANG_VERIFY_GRAPH_")}


def _sglang_script() -> str:
    path = os.path.join(os.path.dirname(sys.executable), "sglang")
    if not os.path.exists(path):
        pytest.skip("no sglang console script next to this interpreter")
    return path


def test_the_pth_file_is_installed_with_the_package():
    files = [str(f) for f in distribution("sglang-verify-graph").files or ()]
    assert "sglang_verify_graph_serve_help.pth" in files, files


def test_sglang_serve_help_lists_the_plugin_flags():
    proc = subprocess.run([_sglang_script(), "serve", "--help"], env=_clean_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for flag in FLAGS:
        assert flag in proc.stdout, flag


def test_without_the_start_up_finder_the_help_lacks_them():
    """Control: the same command entered after interpreter start (so the .pth line saw another
    command line and added no finder) prints SGLang's help without the plugin's flags."""
    code = ("import sys; sys.argv = ['sglang', 'serve', '--help']; "
            "from sglang.cli.main import main; main()")
    proc = subprocess.run([sys.executable, "-c", code], env=_clean_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--model-path" in proc.stdout and FLAGS[0] not in proc.stdout


@pytest.mark.parametrize("argv,expected", [
    (["/venv/bin/sglang", "serve", "--help"], True),
    (["/venv/bin/sglang", "serve", "-h"], True),
    (["-m", "serve", "--model-path", "m", "--help"], True),
    (["/venv/bin/sglang", "serve", "--model-path", "m"], False),
    (["/venv/bin/sglang", "version"], False),
    (["-c"], False),
    ([], False),
])
def test_only_a_serve_help_command_line_adds_the_finder(argv, expected, monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delitem(sys.modules, serve_help.SERVE_MODULE, raising=False)
    assert serve_help.install(argv) is expected
    added = [f for f in sys.meta_path if isinstance(f, serve_help.ServeModuleFinder)]
    assert len(added) == int(expected)


def test_wrapped_serve_loads_plugins_before_the_original(monkeypatch):
    from sglang_verify_graph.compat import sglang_adapter

    calls = []
    module = type("M", (), {"serve": staticmethod(lambda args, extra: calls.append("serve"))})
    monkeypatch.setattr(sglang_adapter, "load_plugins", lambda: calls.append("plugins"))
    serve_help.wrap_serve(module)
    serve_help.wrap_serve(module)  # a second wrap keeps one wrapper
    module.serve(None, ["--help"])
    assert calls == ["plugins", "serve"]


def _without_option_help(text: str, options) -> str:
    """``text`` (an argparse help page) without its usage block and without the entries of
    ``options``: each entry's first line and its continuation lines (indented deeper than an
    option line)."""
    out, skipping, in_usage = [], False, False
    for line in text.splitlines():
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if line.startswith("usage:"):  # argparse's synopsis, up to the next blank line
            in_usage = True
        if in_usage:
            in_usage = bool(stripped)
            continue
        if indent == 2 and stripped.startswith("-"):  # an option line
            skipping = any(stripped.startswith(o) for o in options)
        elif not stripped or indent <= 2:
            skipping = False
        if not skipping:
            out.append(line)
    return "\n".join(out)


@pytest.mark.parametrize("command", [["-m", "sglang.launch_server", "--help"], ["serve", "--help"]],
                         ids=["launch_server", "sglang_serve"])
def test_without_the_flag_the_plugin_prints_nothing_but_its_help(command):
    """A launch that does not ask for the plugin gets nothing from it: the help page with the
    plugin loaded is SGLang's own page (the plugin excluded by ``SGLANG_PLUGINS``) plus the
    plugin's two options (the usage synopsis aside), and stderr is the same."""
    argv = ([sys.executable, *command] if command[0] == "-m" else [_sglang_script(), *command])
    runs = {}
    for name, extra in (("with", {}), ("without", {"SGLANG_PLUGINS": "no_such_plugin"})):
        proc = subprocess.run(argv, env={**_clean_env(), "PYTHONHASHSEED": "0", **extra}, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs[name] = proc
    assert all(f in runs["with"].stdout for f in FLAGS)
    assert not any(f in runs["without"].stdout for f in FLAGS)
    assert _without_option_help(runs["with"].stdout, FLAGS) == _without_option_help(runs["without"].stdout, ())
    assert runs["with"].stderr == runs["without"].stderr

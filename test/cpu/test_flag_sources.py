"""``--enable-verify-cuda-graph`` given with conflicting values by two sources.

Failure mode guarded: an operator's ``--config serve.yaml`` says ``enable-verify-cuda-graph:
false`` while the command line (or a wrapper script) adds the flag, or the environment says
``SGLANG_ENABLE_VERIFY_CUDA_GRAPH=0`` while the command line says the flag: SGLang's precedence
silently picks one, so the server runs in a mode nobody asked for on purpose. A string value
(``"true"``) in the YAML file reaches argparse as ``--enable-verify-cuda-graph true`` and dies
with a usage error that names no fix. Each must stop the launch with one line naming the
setting and the fix (exit 2, no traceback).

Unit tests drive ``cli.merge_config_hook`` around SGLang's real ``ConfigArgumentMerger``; the
subprocess tests go through SGLang's real plugin loading and ``prepare_server_args``.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from sglang_verify_graph import cli
from sglang_verify_graph.config import ENV_ENABLE, FLAG, VerifyGraphConfigError, read_env


def _merger_cls():
    try:  # sglang 0.5.16
        from sglang.srt.server_args_config_parser import ConfigArgumentMerger
    except ImportError:  # sglang 0.5.23
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger
    return ConfigArgumentMerger


@pytest.fixture
def merger():
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    cli.add_cli_args_hook(None, parser)
    return _merger_cls()(parser)


def _yaml(tmp_path, body):
    path = tmp_path / "serve.yaml"
    path.write_text("model-path: m\n" + body)
    return str(path)


def _merge(merger, argv):
    return cli.merge_config_hook(_merger_cls().merge_config_with_args, merger, argv)


def test_config_true_without_cli_flag_is_merged(merger, tmp_path):
    argv = ["--config", _yaml(tmp_path, "enable-verify-cuda-graph: true\n")]
    assert FLAG in _merge(merger, argv)


def test_config_true_and_cli_flag_agree(merger, tmp_path):
    argv = ["--config", _yaml(tmp_path, "enable-verify-cuda-graph: true\n"), FLAG]
    assert FLAG in _merge(merger, argv)


def test_config_false_alone_is_off(merger, tmp_path):
    argv = ["--config", _yaml(tmp_path, "enable-verify-cuda-graph: false\n")]
    assert FLAG not in _merge(merger, argv)


@pytest.mark.parametrize("given", [FLAG, "--enable-verify-cuda"])  # argparse abbreviations count
def test_config_false_and_cli_flag_conflict(merger, tmp_path, capsys, given):
    key = "enable-verify-cuda-graph"
    path = _yaml(tmp_path, f"{key}: false\n")
    with pytest.raises(SystemExit) as info:
        _merge(merger, ["--config", path, given])
    assert info.value.code == 2 and info.value.__suppress_context__
    err = capsys.readouterr().err
    assert err == (f"error: {FLAG}: is given on the command line but set to false in the config "
                   f"file ({key} in {path} = False). Fix: remove {FLAG} from the command line "
                   f"or set 'enable-verify-cuda-graph: true' in {path}.\n")


@pytest.mark.parametrize("value", ['"true"', "yes please", "1", "null"])
def test_config_non_boolean_value_is_refused(merger, tmp_path, capsys, value):
    path = _yaml(tmp_path, f"enable-verify-cuda-graph: {value}\n")
    with pytest.raises(SystemExit) as info:
        _merge(merger, ["--config", path])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {FLAG}: a config file must give the "
                                                   "flag as a YAML boolean")
    assert f"Fix: write 'enable-verify-cuda-graph: true' (or false) in {path}." in err


def test_config_underscore_key_is_refused(merger, tmp_path, capsys):
    path = _yaml(tmp_path, "enable_verify_cuda_graph: true\n")
    with pytest.raises(SystemExit):
        _merge(merger, ["--config", path])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "passes config-file keys through as written" in err
    assert f"Fix: write 'enable-verify-cuda-graph: true' (or false) in {path}." in err


def test_config_false_and_env_on_conflict(merger, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(ENV_ENABLE, "1")
    path = _yaml(tmp_path, "enable-verify-cuda-graph: false\n")
    with pytest.raises(SystemExit):
        _merge(merger, ["--config", path])
    err = capsys.readouterr().err
    assert f"is turned on by {ENV_ENABLE} but set to false in the config file" in err
    assert f"Fix: unset {ENV_ENABLE} or set 'enable-verify-cuda-graph: true' in {path}." in err


def test_cli_gives_flag_spellings():
    assert cli.cli_gives_flag(["--model-path", "m", FLAG])
    assert cli.cli_gives_flag(["--enable-verify-cuda"])
    assert cli.cli_gives_flag(["--enable-v"])  # no other SGLang 0.5.16 flag starts so
    assert not cli.cli_gives_flag(["--enable-", "--enable-metrics", "enable-verify-cuda-graph"])


def test_check_flag_sources_ignores_other_documents():
    cli.check_flag_sources([FLAG], ["not", "a", "mapping"])
    cli.check_flag_sources([FLAG], {"model-path": "m"})
    with pytest.raises(VerifyGraphConfigError):
        cli.check_flag_sources([FLAG], {"enable-verify-cuda-graph": False})


@pytest.mark.parametrize("raw,off", [("0", True), ("false", True), (" Off ", True), ("no", True),
                                     ("", False), ("1", False), ("on", False)])
def test_env_enable_set_off_is_read_in_read_env(raw, off):
    assert read_env({ENV_ENABLE: raw}).enable_set_off is off
    assert read_env({}).enable_set_off is False


# ---- through SGLang's plugin loading and prepare_server_args, in a fresh interpreter --------
_DRIVER = textwrap.dedent("""
    import os, sys
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang.srt.server_args import prepare_server_args
    sa = prepare_server_args(sys.argv[1:])
    if hasattr(sa, "resolve_once"):
        sa.resolve_once()
    from sglang_verify_graph.compat.sglang_adapter import resolved
    from sglang_verify_graph.config import build_config
    print("RESULT", build_config(resolved(sa)) is not None, os.environ.get("%s"))
""" % ENV_ENABLE)


def _launch(argv, env_value=None):
    env = {k: v for k, v in os.environ.items()
           if k not in (ENV_ENABLE, "SGLANG_PLUGINS") and not k.startswith("SGLANG_VERIFY_GRAPH_")}
    if env_value is not None:
        env[ENV_ENABLE] = env_value
    return subprocess.run([sys.executable, "-c", _DRIVER, *argv], env=env, capture_output=True,
                          text=True, timeout=300)


def _spec_yaml(tmp_path, tiny_model_dirs, extra=""):
    target, draft = tiny_model_dirs
    path = tmp_path / "serve.yaml"
    path.write_text(textwrap.dedent(f"""\
        model-path: {target}
        device: cpu
        skip-tokenizer-init: true
        speculative-algorithm: EAGLE3
        speculative-draft-model-path: {draft}
        speculative-num-steps: 3
        speculative-eagle-topk: 1
        speculative-num-draft-tokens: 4
        attention-backend: triton
    """) + extra)
    return str(path)


def _one_error_line(proc):
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "RESULT" not in proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


def test_launch_config_file_turns_the_flag_on(tmp_path, tiny_model_dirs):
    proc = _launch(["--config", _spec_yaml(tmp_path, tiny_model_dirs,
                                           "enable-verify-cuda-graph: true\n")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RESULT True 1" in proc.stdout


def test_launch_config_false_cli_true_stops(tmp_path, tiny_model_dirs):
    path = _spec_yaml(tmp_path, tiny_model_dirs, "enable-verify-cuda-graph: false\n")
    line = _one_error_line(_launch(["--config", path, FLAG]))
    assert "set to false in the config file" in line and f"remove {FLAG}" in line


def test_launch_config_string_value_stops(tmp_path, tiny_model_dirs):
    path = _spec_yaml(tmp_path, tiny_model_dirs, 'enable-verify-cuda-graph: "true"\n')
    line = _one_error_line(_launch(["--config", path]))
    assert "YAML boolean" in line and "'true'" in line


def test_launch_env_off_cli_true_stops(tmp_path, tiny_model_dirs):
    path = _spec_yaml(tmp_path, tiny_model_dirs)
    line = _one_error_line(_launch(["--config", path, FLAG], env_value="0"))
    assert line == (f"error: {FLAG}: is given on the command line (or config file) while the "
                    f"environment turns it off ({ENV_ENABLE} = 0). Fix: unset {ENV_ENABLE} or "
                    f"remove {FLAG}.")

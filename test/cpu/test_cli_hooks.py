"""cli.py hooks, called the way sglang's HookRegistry calls them, on a real 0.5.16 parser."""

import argparse
import os

import pytest

from sglang_verify_graph import cli
from sglang_verify_graph.compat.sglang_adapter import RESOLVE_ONCE
from sglang_verify_graph.config import (
    ENV_ENABLE,
    FLAG,
    VerifyGraphConfigError,
)


@pytest.fixture(scope="module")
def server_args_cls():
    from sglang.srt.server_args import ServerArgs

    return ServerArgs


@pytest.fixture
def real_parser(server_args_cls):
    parser = argparse.ArgumentParser(prog="sglang serve")
    server_args_cls.add_cli_args(parser)
    return parser


def _our_actions(parser):
    return [a for a in parser._actions if FLAG in a.option_strings]


def test_flag_absent_from_upstream_parser(real_parser):
    assert _our_actions(real_parser) == []


def test_add_cli_args_hook_adds_store_true_flag(real_parser):
    assert cli.add_cli_args_hook(None, real_parser) is None
    (action,) = _our_actions(real_parser)
    assert isinstance(action, argparse._StoreTrueAction)
    assert action.dest == cli.DEST == "enable_verify_cuda_graph"
    assert real_parser.parse_args(["--model-path", "m"]).enable_verify_cuda_graph is False
    args = real_parser.parse_args(["--model-path", "m", FLAG])
    assert args.enable_verify_cuda_graph is True


def test_add_cli_args_hook_is_idempotent(real_parser):
    cli.add_cli_args_hook(None, real_parser)
    cli.add_cli_args_hook(None, real_parser)  # argparse would raise on a duplicate option
    assert len(_our_actions(real_parser)) == 1


def test_help_text_names_requirements(real_parser):
    cli.add_cli_args_hook(None, real_parser)
    text = " ".join(real_parser.format_help().split())
    assert FLAG in text
    for needle in ("EAGLE3", "--speculative-eagle-topk 1", "--attention-backend triton",
                   ENV_ENABLE):
        assert needle in text, needle


def test_yaml_config_file_can_set_the_flag(real_parser, tmp_path):
    if RESOLVE_ONCE:  # 0.5.19 moved the merger
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger
    else:
        from sglang.srt.server_args_config_parser import ConfigArgumentMerger

    cli.add_cli_args_hook(None, real_parser)
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("model-path: m\nenable-verify-cuda-graph: true\n")
    argv = ConfigArgumentMerger(real_parser).merge_config_with_args(["--config", str(cfg)])
    assert real_parser.parse_args(argv).enable_verify_cuda_graph is True


class _Built:
    """Stands in for the ServerArgs built by the original from_cli_args."""


def test_from_cli_args_exports_env_before_building(server_args_cls, monkeypatch):
    seen = {}
    monkeypatch.setattr(cli, "_validate", lambda sa: None)

    def original(cls, args):
        seen["cls"], seen["env"] = cls, os.environ.get(ENV_ENABLE)
        return _Built()

    result = cli.from_cli_args_hook(original, server_args_cls,
                                    argparse.Namespace(enable_verify_cuda_graph=True))
    assert seen == {"cls": server_args_cls, "env": "1"}
    assert os.environ[ENV_ENABLE] == "1"
    assert isinstance(result, _Built)


def test_from_cli_args_leaves_everything_alone_when_not_requested(server_args_cls):
    result = cli.from_cli_args_hook(lambda cls, args: _Built(), server_args_cls,
                                    argparse.Namespace(enable_verify_cuda_graph=False))
    assert ENV_ENABLE not in os.environ
    assert isinstance(result, _Built)
    # A namespace from a parser without our flag is fine too.
    cli.from_cli_args_hook(lambda cls, args: _Built(), server_args_cls, argparse.Namespace())


def test_from_cli_args_prints_one_line_and_exits_2(server_args_cls, capsys):
    def original(cls, args):
        raise VerifyGraphConfigError("supports only top-k 1", "--speculative-eagle-topk", 4,
                                     "pass --speculative-eagle-topk 1")

    with pytest.raises(SystemExit) as info:
        cli.from_cli_args_hook(original, server_args_cls,
                               argparse.Namespace(enable_verify_cuda_graph=True))
    assert info.value.code == 2
    assert info.value.__cause__ is None and info.value.__suppress_context__
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (f"error: {FLAG}: supports only top-k 1 (--speculative-eagle-topk = 4). "
                   "Fix: pass --speculative-eagle-topk 1.\n")


@pytest.mark.skipif(RESOLVE_ONCE, reason="sglang 0.5.19+: from_cli_args returns an unresolved record; "
                    "validation runs in resolve_once (test_validate_hook_*_record_*)")
def test_from_cli_args_validates_even_without_the_validate_hook(server_args_cls, make_args,
                                                              capsys):
    bad = make_args(speculative_eagle_topk=2)
    with pytest.raises(SystemExit) as info:
        cli.from_cli_args_hook(lambda cls, args: bad, server_args_cls,
                               argparse.Namespace(enable_verify_cuda_graph=True))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--speculative-eagle-topk" in err


def test_from_cli_args_does_not_swallow_other_errors(server_args_cls):
    def original(cls, args):
        raise ValueError("upstream problem")

    with pytest.raises(ValueError, match="upstream problem"):
        cli.from_cli_args_hook(original, server_args_cls,
                               argparse.Namespace(enable_verify_cuda_graph=True))


def test_validate_hook_accepts_a_good_setup(make_args):
    assert cli.validate_hook(None, make_args()) is None


def test_validate_hook_judges_only_with_the_flag_on(make_args, monkeypatch):
    """The flag travels one way: the environment variable (set by the command-line hook or the
    user) is what turns validation on; nothing on the server-args object does."""
    args = make_args(attention_backend="torch_native")
    monkeypatch.delenv(ENV_ENABLE)
    assert cli.validate_hook(None, args) is None
    monkeypatch.setenv(ENV_ENABLE, "1")
    with pytest.raises(VerifyGraphConfigError):
        cli.validate_hook(None, args)


def test_validate_hook_raises_on_bad_settings(make_args):
    with pytest.raises(VerifyGraphConfigError) as info:
        cli.validate_hook(None, make_args(attention_backend="torch_native"))
    assert info.value.flag == "--attention-backend"


@pytest.mark.parametrize("path", ["dummy", "None", "DUMMY"])
def test_validate_hook_skips_unresolved_placeholders(make_args, monkeypatch, path):
    monkeypatch.setenv(ENV_ENABLE, "1")
    args = make_args(model_path=path, speculative_algorithm=None)
    assert cli.validate_hook(None, args) is None  # __post_init__ returned early: nothing to validate


# ---- sglang 0.5.19 on: validation in resolve_once ---------------------------------------------
only_resolve_once = pytest.mark.skipif(not RESOLVE_ONCE, reason="before 0.5.19 sglang validates in __post_init__")


@only_resolve_once
def test_from_cli_args_marks_record_instead_of_validating(server_args_cls, make_args):
    bad = make_args(speculative_eagle_topk=2)
    result = cli.from_cli_args_hook(lambda cls, args: bad, server_args_cls,
                                    argparse.Namespace(enable_verify_cuda_graph=True))
    assert result is bad  # no SystemExit: nothing validated yet, the record is unresolved
    assert getattr(bad, cli.ATTR_FROM_CLI) is True


@only_resolve_once
def test_from_cli_args_marks_every_record_but_judges_nothing_when_off(server_args_cls, make_args,
                                                                      monkeypatch):
    """0.5.19 on: every command-line record is marked, so a refusal found later (a malformed
    SGLANG_VERIFY_GRAPH_* variable, flag or not) ends in one line; with the flag off and a clean
    environment the validation hooks refuse nothing, whatever the other settings."""
    monkeypatch.delenv(ENV_ENABLE, raising=False)
    record = make_args(speculative_eagle_topk=4)
    cli.from_cli_args_hook(lambda cls, args: record, server_args_cls,
                           argparse.Namespace(enable_verify_cuda_graph=False))
    assert getattr(record, cli.ATTR_FROM_CLI) is True
    assert cli.check_given_hook(record) is None
    assert cli.validate_hook(None, record) is None


@only_resolve_once
def test_validate_hook_cli_record_prints_one_line_and_exits_2(make_args, capsys):
    bad = make_args(speculative_eagle_topk=2, **{cli.ATTR_FROM_CLI: True})
    with pytest.raises(SystemExit) as info:
        cli.validate_hook(None, bad)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {FLAG}: ") and "--speculative-eagle-topk" in err


@only_resolve_once
def test_validate_hook_engine_record_raises(make_args):
    with pytest.raises(VerifyGraphConfigError) as info:
        cli.validate_hook(None, make_args(speculative_eagle_topk=2))
    assert info.value.flag == "--speculative-eagle-topk"


@only_resolve_once
def test_validate_hook_accepts_a_good_engine_record(make_args):
    assert cli.validate_hook(None, make_args()) is None

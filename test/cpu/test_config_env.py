"""read_env / EnvSettings / is_enabled: the project's environment variables."""

import pytest

from sglang_verify_graph.config import (
    ENV_ENABLE,
    ENV_LOG_EVERY,
    ENV_NUM_KV_SPLITS,
    EnvSettings,
    VerifyGraphConfigError,
    build_config,
    is_enabled,
    read_env,
)


def test_defaults_on_empty_environment():
    assert read_env({}) == EnvSettings(enable=False, num_kv_splits=None, log_every=0)


def test_constant_names():
    assert ENV_ENABLE == "SGLANG_ENABLE_VERIFY_CUDA_GRAPH"
    assert ENV_NUM_KV_SPLITS == "SGLANG_VERIFY_GRAPH_NUM_KV_SPLITS"
    assert ENV_LOG_EVERY == "SGLANG_VERIFY_GRAPH_LOG_EVERY"


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "yes", "on", " 1 "])
def test_enable_true_values(raw):
    assert read_env({ENV_ENABLE: raw}).enable is True


@pytest.mark.parametrize("raw", ["", "0", "false", "False", "no", "off"])
def test_enable_false_values(raw):
    assert read_env({ENV_ENABLE: raw}).enable is False


def test_enable_garbage_is_an_error():
    with pytest.raises(VerifyGraphConfigError) as info:
        read_env({ENV_ENABLE: "maybe"})
    assert info.value.flag == ENV_ENABLE
    assert "'maybe'" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("raw,expected", [("8", 8), (" 4 ", 4), ("1", 1), ("", None)])
def test_num_kv_splits_parsed(raw, expected):
    assert read_env({ENV_NUM_KV_SPLITS: raw}).num_kv_splits == expected


@pytest.mark.parametrize("raw", ["0", "-2", "x", "1.5"])
def test_num_kv_splits_rejected(raw):
    with pytest.raises(VerifyGraphConfigError) as info:
        read_env({ENV_NUM_KV_SPLITS: raw})
    assert info.value.flag == ENV_NUM_KV_SPLITS
    assert ">= 1" in info.value.fix


@pytest.mark.parametrize("raw,expected", [("100", 100), ("0", 0), ("", 0)])
def test_log_every_parsed(raw, expected):
    assert read_env({ENV_LOG_EVERY: raw}).log_every == expected


@pytest.mark.parametrize("raw", ["-1", "often"])
def test_log_every_rejected(raw):
    with pytest.raises(VerifyGraphConfigError) as info:
        read_env({ENV_LOG_EVERY: raw})
    assert info.value.flag == ENV_LOG_EVERY


def test_read_env_reads_os_environ_at_call_time(monkeypatch):
    assert read_env().enable is False
    monkeypatch.setenv(ENV_ENABLE, "1")
    monkeypatch.setenv(ENV_NUM_KV_SPLITS, "16")
    monkeypatch.setenv(ENV_LOG_EVERY, "50")
    assert read_env() == EnvSettings(enable=True, num_kv_splits=16, log_every=50)


def test_env_settings_is_frozen():
    with pytest.raises(Exception):
        read_env({}).enable = True


def test_is_enabled_by_the_environment_only():
    assert is_enabled(EnvSettings()) is False
    assert is_enabled(EnvSettings(enable=True)) is True


def test_is_enabled_reads_environment_when_not_given(monkeypatch):
    assert is_enabled() is False
    monkeypatch.setenv(ENV_ENABLE, "1")
    assert is_enabled() is True
    monkeypatch.setenv(ENV_ENABLE, "garbage")
    with pytest.raises(VerifyGraphConfigError):
        is_enabled()


def test_env_values_reach_the_config(make_args):
    from sglang_verify_graph.env import ENV_TEST_FAULT

    cfg = build_config(make_args(), read_env({ENV_ENABLE: "1", ENV_NUM_KV_SPLITS: "8", ENV_LOG_EVERY: "25",
                                              ENV_TEST_FAULT: "drop_middle_split"}))
    assert (cfg.num_kv_splits, cfg.log_every, cfg.test_fault) == (8, 25, "drop_middle_split")
    assert build_config(make_args(), read_env({ENV_ENABLE: "1"})).test_fault is None


def test_build_config_reads_os_environ_by_default(monkeypatch, make_args):
    monkeypatch.setenv(ENV_NUM_KV_SPLITS, "4")
    assert build_config(make_args()).num_kv_splits == 4

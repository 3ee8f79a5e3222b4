"""Settings the chain kernel cannot serve that are known from the resolved server arguments stop the
launch with one line (``build_config``), not later in the scheduler after the model loaded."""

from __future__ import annotations


import pytest

from sglang_verify_graph.config import EnvSettings, VerifyGraphConfigError, build_config

ON = EnvSettings(enable=True)


def test_page_major_kv_layout_is_rejected_at_launch(real_args):
    """0.5.16 ``PageMajorMHATokenToKVPool`` hands out 4-D strided views
    ``(num_pages, page_size, heads, dim)`` (memory_pool.py) and the flag *requires* the Triton
    backend, so it passes every check. ``ChainVerifyTritonBackend.__init__`` then takes
    ``k_buf.shape[1]`` (page size) as ``num_kv_heads`` and the kernel addresses slot ``loc`` at
    ``loc * stride(0)`` (a page stride): wrong keys or an illegal memory access. The backend
    refuses 4-D views in the scheduler too; the launch refuses the flag first, in one line.
    SGLang 0.5.19 and later refuse the flag themselves without ``--enable-unified-memory``
    (which the flag refuses as a unified KV pool)."""
    try:
        server_args = real_args(enable_page_major_kv_layout=True, page_size=16)
    except AssertionError as e:  # SGLang's own refusal
        assert "--enable-page-major-kv-layout without --enable-unified-memory" in str(e)
        return
    assert server_args.enable_page_major_kv_layout  # SGLang accepts it with triton
    with pytest.raises(VerifyGraphConfigError, match="--enable-page-major-kv-layout"):
        build_config(server_args, ON)


@pytest.mark.parametrize("overrides", [dict(kv_cache_dtype="fp8_e4m3"),
                                       dict(enable_deterministic_inference=True)],
                         ids=["kv-fp8", "deterministic"])
def test_backend_only_conflicts_fail_at_launch(real_args, overrides):
    """Both settings are on the resolved ServerArgs, so the launch refuses them in one line
    naming the flag, instead of the scheduler failing after the model loaded."""
    flag = "--" + next(iter(overrides)).replace("_", "-")
    with pytest.raises(VerifyGraphConfigError, match=flag):
        build_config(real_args(**overrides), ON)

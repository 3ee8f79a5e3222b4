"""Debug instruments, off by default: the graph self-test and its NaN padding
(``debug.selftest``, ``SGLANG_VERIFY_GRAPH_SELFTEST`` / ``_SELFTEST_NAN``) and the host-sync check
(``debug.sync_check`` and its hooks in ``debug.hooks``, ``SGLANG_VERIFY_GRAPH_SYNC_CHECK``).

The core reaches them only through the probe factories below and the hook table
(``debug.hooks.sync_check_hooks``, registered only when its variable is set); with every variable
unset the probes do nothing and no debug hook is installed.
"""

from __future__ import annotations

from sglang_verify_graph.debug.probes import NO_DRAFT_EXTEND_PROBE, NO_PROBE, DraftExtendProbe, VerifyProbe  # noqa: F401


def make_verify_probe(runner, cfg) -> VerifyProbe:
    """The verify runner's probe: the graph self-test (with NaN padding when ``cfg.selftest_nan``)
    when ``cfg.selftest`` (a ``VerifyGraphConfig``), else :data:`NO_PROBE`."""
    if not cfg.selftest:
        return NO_PROBE
    from sglang_verify_graph.debug.selftest import GraphSelfTest

    return GraphSelfTest(runner, inject_nan=cfg.selftest_nan)


def make_draft_extend_probe(draft_extend_runner, cfg, counters) -> DraftExtendProbe:
    """A draft-extend graph runner's probe: the draft-extend self-test when ``cfg.selftest`` and
    counters are installed (``counters``: a ``VerifyCounters`` or ``None``), else
    :data:`NO_DRAFT_EXTEND_PROBE`."""
    if not cfg.selftest or counters is None:
        return NO_DRAFT_EXTEND_PROBE
    from sglang_verify_graph.debug.selftest import DraftExtendSelfTest

    return DraftExtendSelfTest(draft_extend_runner, counters.selftest)

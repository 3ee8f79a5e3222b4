"""The probe protocol: what the verify runner and the draft-extend replay call around each replay.
The bases here do nothing (:data:`NO_PROBE`, :data:`NO_DRAFT_EXTEND_PROBE`, the default); the
self-test (``debug.selftest``) overrides them. Pure Python: no torch, no SGLang."""

from __future__ import annotations


class VerifyProbe:
    """What the runner calls around each TARGET_VERIFY replay of a batch it fully loads (not on a
    pre-planned re-entry); every method of this base does nothing."""

    def before_load(self, runner, forward_batch) -> None:
        """Before ``load_batch`` fills the static input buffers."""

    def after_load(self, runner, forward_batch) -> None:
        """After ``load_batch`` (and the padded rows' neutralisation), before the replay."""

    def after_enqueue(self, runner) -> None:
        """Once the replay is enqueued (also when it raised)."""

    def after_replay(self, runner, forward_batch, graph_out) -> None:
        """After a successful replay, with its output (real rows only)."""


NO_PROBE = VerifyProbe()
"""The runner's probe unless a debug aid is requested."""


class DraftExtendProbe:
    """What ``execute_draft_extend`` calls around each replay of SGLang's draft-extend graph
    (``EAGLEDraftExtendCudaGraphRunner.execute``) when the chain kernel serves it; every method
    of this base does nothing."""

    def before_execute(self, runner, forward_batch) -> None:
        """Before ``execute`` loads the batch into the runner's static buffers."""

    def after_execute(self, runner, forward_batch, graph_out, select_index=None) -> None:
        """After ``execute`` returned (``graph_out``: real rows' logits and hidden states, every
        token's, or with ``select_index`` (SGLang 0.5.20 on) the selected token of each request)."""


NO_DRAFT_EXTEND_PROBE = DraftExtendProbe()

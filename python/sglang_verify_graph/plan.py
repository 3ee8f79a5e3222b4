"""The one decision per model runner: does its decode-graph runner become ours, and with which
verify attention, or stays upstream's, or must the start be refused?

:func:`verify_plan` decides once per model runner (the result is kept on the runner) from the
flag's config (``config.build_config`` on the resolved server args, itself read once per runner by
:func:`flag_config`) and whether the runner is an EAGLE topk=1 target. Every hook asks the plan;
none rebuilds the config. :func:`runner_kind` checks the plan against the attention backend the
runner actually got (SGLang may wrap it), and :func:`refuse_if_flag_lost` turns a mismatch into the
one-line refusal instead of silently serving upstream's runner with the flag on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sglang_verify_graph.backends import NATIVE_BACKEND_CLASSES
from sglang_verify_graph.compat import sglang_adapter as adapter
from sglang_verify_graph.config import VerifyGraphConfig, build_config
from sglang_verify_graph.errors import VerifyGraphConfigError

UPSTREAM = "upstream"
"""SGLang's own decode-graph runner (flag off, or not an EAGLE topk=1 target)."""
CHAIN = "chain"
"""Our runner with the chain kernel (``ChainVerifyTritonBackend``: triton attention)."""
NATIVE = "native"
"""Our runner around the backend's own verify kernel (``backends.py``: fa3, flashmla, flashinfer)."""

_PLAN_ATTR = "_verify_graph_plan"
_CONFIG_ATTR = "_verify_graph_config"
_UNSET = object()


@dataclass(frozen=True)
class VerifyPlan:
    """What the verify graph does for one model runner.

    Attributes:
        kind: :data:`UPSTREAM`, :data:`CHAIN` or :data:`NATIVE`.
        config: the flag's validated config (``None`` for :data:`UPSTREAM` when the flag is off;
            set for a draft runner with the flag on, whose draft extend reads it).
    """

    kind: str
    config: Optional[VerifyGraphConfig] = None

    @property
    def ours(self) -> bool:
        return self.kind != UPSTREAM


def flag_config(model_runner) -> Optional[VerifyGraphConfig]:
    """The flag's config for this model runner's server args, built once per runner (``None``
    when the flag is off). Raises VerifyGraphConfigError on a conflicting setting (not kept: every
    call of a refused runner raises again)."""
    cfg = getattr(model_runner, _CONFIG_ATTR, _UNSET)
    if cfg is _UNSET:
        cfg = build_config(adapter.resolved(model_runner.server_args))
        setattr(model_runner, _CONFIG_ATTR, cfg)
    return cfg


def verify_plan(model_runner) -> VerifyPlan:
    """The plan of ``model_runner`` (``None`` gets :data:`UPSTREAM`), decided at the first call and
    kept on the runner. Raises VerifyGraphConfigError as :func:`flag_config`."""
    if model_runner is None:
        return VerifyPlan(UPSTREAM)
    plan = getattr(model_runner, _PLAN_ATTR, None)
    if plan is None:
        cfg = flag_config(model_runner)
        target = cfg is not None and adapter.is_eagle_topk1_target(model_runner)
        plan = VerifyPlan(cfg.verify_attention if target else UPSTREAM, cfg)
        setattr(model_runner, _PLAN_ATTR, plan)
    return plan


def _backend_name(model_runner) -> str:
    return type(getattr(model_runner, "attn_backend", None)).__name__


def expected_backends(plan: VerifyPlan) -> tuple[str, ...]:
    """The attention-backend class names our runner serves under ``plan`` (empty for upstream)."""
    if plan.kind == CHAIN:
        return ("ChainVerifyTritonBackend",)
    if plan.kind == NATIVE:
        return NATIVE_BACKEND_CLASSES.get(plan.config.attention_backend, ())
    return ()


def runner_kind(model_runner) -> Optional[str]:
    """:data:`CHAIN` or :data:`NATIVE` when the plan gives this runner ours and its attention
    backend is one our runner serves under that plan; else ``None`` (upstream's runner, or a
    refusal: :func:`refuse_if_flag_lost`)."""
    plan = verify_plan(model_runner)
    if plan.ours and _backend_name(model_runner) in expected_backends(plan):
        return plan.kind
    return None


def refuse_if_flag_lost(model_runner) -> None:
    """Raise instead of silently capturing upstream's runner when the plan gives this runner ours
    but its attention backend is not (or no longer) one the verify graph serves, e.g. SGLang
    wrapped it for a hybrid linear-attention / sparse model. Raises VerifyGraphConfigError."""
    plan = verify_plan(model_runner)
    if not plan.ours or runner_kind(model_runner) is not None:
        return
    raise VerifyGraphConfigError(
        problem=f"with --attention-backend {plan.config.attention_backend} the verify graph serves "
                f"{' / '.join(expected_backends(plan))}, but this model got another attention backend "
                "(an attention wrapper, e.g. hybrid linear or sparse attention, or for "
                "flashinfer/flashmla a target without MLA)",
        flag="attention backend", value=_backend_name(model_runner),
        fix="pass --attention-backend triton, or remove --enable-verify-cuda-graph for this model")

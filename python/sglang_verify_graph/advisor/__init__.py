"""Speculative-decoding advisor: is EAGLE-3 (top-k 1) worth it at these timings?

``python -m sglang_verify_graph.advisor --help``. Pure Python (no torch, no sglang): the model
in :mod:`.model`, the inputs (flags, profile logs) in :mod:`.inputs`, the command line in
:mod:`.cli`.
"""

from sglang_verify_graph.advisor.cli import build_parser, format_report, inputs_from_args, main  # noqa: F401
from sglang_verify_graph.advisor.inputs import AdvisorError  # noqa: F401
from sglang_verify_graph.advisor.model import (  # noqa: F401
    Inputs,
    best_num_steps,
    break_even_accept_length,
    constant_rate_for_accept_length,
    evaluate,
    expected_accept_length,
    fit_verify_line,
    speedup,
)

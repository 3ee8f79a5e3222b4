"""The near-tie rule of the server tiers' greedy parity (``test/greedy_parity.py``, used by
``test/e2e/test_server_e2e.py`` and ``test/multigpu/test_tp_server.py``): identical answers pass;
a divergence is a near-tie only with a tolerance set and the smaller of the two servers' top-2
logprob gaps at the first differing position below it; strict (every divergence fails) by default
and wherever the answers carry no top logprobs."""

import pytest

from greedy_parity import TIE_TOL_ENV, compare, first_diff, tie_tolerance, top2


def _answer(ids, gaps=None):
    """A ``/generate`` answer with output ``ids`` and, when ``gaps`` is given, top-2 logprobs
    whose gap at position i is ``gaps[i]``."""
    meta = {}
    if gaps is not None:
        meta["output_top_logprobs"] = [[[-0.5, t, None], [-0.5 - g, t + 1, None]] for t, g in zip(ids, gaps)]
    return {"output_ids": list(ids), "meta_info": meta}


PROMPTS = [[5, 6, 7], [8, 9]]


def test_first_diff_and_top2():
    assert first_diff([1, 2, 3], [1, 2, 3]) is None
    assert first_diff([1, 2, 3], [1, 9, 3]) == 1
    assert first_diff([1, 2], [1, 2, 3]) == 2  # a prefix differs where it ends
    assert top2(_answer([4, 5], gaps=[1.0, 0.25]), 1) == [(-0.5, 5), (-0.75, 6)]
    assert top2(_answer([4, 5]), 1) is None


def test_identical_answers_pass_at_any_tolerance():
    outs = [_answer([1, 2, 3], [1, 1, 1]), _answer([4, 5], [1, 1])]
    for tol in (0.0, 0.5):
        assert compare("ours", outs, "plain", outs, PROMPTS, tol) == ([], [])


def test_divergence_is_a_tie_only_below_the_smaller_gap():
    ours = [_answer([1, 2, 3], [2.0, 0.01, 2.0]), _answer([4, 5], [2.0, 2.0])]
    # request 0 parts at position 1, where ours' gap is 0.01 and plain's 0.3; request 1 identical
    plain = [_answer([1, 7, 3], [2.0, 0.3, 2.0]), _answer([4, 5], [2.0, 2.0])]
    fails, ties = compare("ours", ours, "plain", plain, PROMPTS, 0.05)
    assert fails == [] and len(ties) == 1
    assert "request 0" in ties[0] and "position 1" in ties[0] and "min gap 0.01" in ties[0]
    # the tolerance must exceed the smaller gap (0.01), not just the larger
    fails, ties = compare("ours", ours, "plain", plain, PROMPTS, 0.01)
    assert len(fails) == 1 and ties == []
    # a gap above the tolerance at the first differing position fails
    wide = [_answer([1, 7, 3], [2.0, 0.3, 2.0]), _answer([4, 5], [2.0, 2.0])]
    assert len(compare("a", [_answer([1, 2, 3], [2.0, 0.3, 2.0])] + ours[1:], "b", wide, PROMPTS, 0.05)[0]) == 1


def test_strict_by_default_and_without_logprobs():
    ours = [_answer([1, 2, 3], [2.0, 0.001, 2.0])]
    plain = [_answer([1, 7, 3], [2.0, 0.001, 2.0])]
    assert tie_tolerance({}) == 0.0
    fails, ties = compare("ours", ours, "plain", plain, PROMPTS, tie_tolerance({}))
    assert len(fails) == 1 and ties == []
    # no top logprobs in the answers: no gap to judge, so the divergence fails at any tolerance
    fails, ties = compare("ours", [_answer([1, 2, 3])], "plain", [_answer([1, 7, 3])], PROMPTS, 10.0)
    assert len(fails) == 1 and "min gap None" in fails[0]


def test_tie_tolerance_reads_the_environment():
    assert tie_tolerance({TIE_TOL_ENV: "0.02"}) == 0.02
    assert tie_tolerance({TIE_TOL_ENV: ""}) == 0.0
    with pytest.raises(ValueError):
        tie_tolerance({TIE_TOL_ENV: "small"})

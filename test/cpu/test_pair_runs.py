"""CPU tier: ``test/pair_runs.check_simulated_runs``, the check the pairs' server tests hold their
runs to, fails on each way a run can leave the simulation (an output, a histogram, a verify count,
an accepted count ours never saw, plugin state off ours) and passes a run that matches."""

import copy

import pytest

from pair_runs import check_simulated_runs

STEPS = 2
SIMS = [{"output_ids": [5, 6, 7], "accepted": [0, 2]}, {"output_ids": [8, 9], "accepted": [1]}]
HISTS = [[1, 0, 1], [0, 1, 0]]


def _runs():
    spec = {"output_ids": [[5, 6, 7], [8, 9]], "histogram": copy.deepcopy(HISTS), "verify_ct": [2, 1]}
    return {"plain": {"output_ids": [[5, 6, 7], [8, 9]], "histogram": None, "verify_ct": None, "plugin": None},
            "upstream": dict(copy.deepcopy(spec), plugin=None),
            "ours": dict(copy.deepcopy(spec), plugin={"replays": 3})}


def test_a_run_that_matches_passes():
    check_simulated_runs(_runs(), SIMS, HISTS, STEPS, "page 1")


@pytest.mark.parametrize("break_it,match", [
    (lambda r: r["plain"]["output_ids"][1].append(3), "plain page 1: requests \\[1\\]"),
    (lambda r: r["ours"]["output_ids"].pop(), "ours page 1: requests \\[\\]"),
    (lambda r: r["upstream"]["histogram"][0].__setitem__(2, 0), "upstream page 1: histograms"),
    (lambda r: r["ours"]["verify_ct"].__setitem__(0, 3), "ours page 1: verify counts"),
    (lambda r: r["upstream"].__setitem__("plugin", {}), "plugin state off ours"),
])
def test_each_departure_fails(break_it, match):
    runs = _runs()
    break_it(runs)
    with pytest.raises(AssertionError, match=match):
        check_simulated_runs(runs, SIMS, HISTS, STEPS, "page 1")


def test_an_accepted_count_neither_predicted_nor_seen_fails():
    with pytest.raises(AssertionError, match="not every accepted count predicted"):
        check_simulated_runs(_runs(), SIMS, HISTS, STEPS + 1, "page 1")
    runs = _runs()
    hists = [[2, 0, 0], [0, 1, 0]]  # ours' own histograms never show 2 accepted
    runs["ours"]["histogram"] = hists
    runs["upstream"]["histogram"] = hists
    with pytest.raises(AssertionError, match="accepted counts seen by ours"):
        check_simulated_runs(runs, SIMS, hists, STEPS, "page 1")

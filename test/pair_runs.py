"""The constructed pairs' server runs held to their simulation (``test/e2e/test_accept_attention_e2e.py``,
``test/e2e/test_prefix_pair_e2e.py``).

A run is one server's answers to the pair's prompts: ``{"output_ids": [[int]] per request,
"histogram": [[int]] per request (accepted-draft counts 0..num_steps), "verify_ct": [int] per
request, "plugin": dict or None}``; a simulation row is ``{"output_ids": [int], "accepted": [int]
per verify step}``.
"""

from __future__ import annotations

from collections import Counter


def check_simulated_runs(runs: dict, sims: list, hists: list, steps: int, where: str) -> None:
    """Hold ``runs`` (mode -> run; ``ours`` among them) to the simulation ``sims`` and its
    histograms ``hists``: every mode's outputs equal the simulated ones; every speculative mode's
    (all but ``plain``) per-request histograms and verify counts equal the prediction; every
    accepted count 0..``steps`` occurs in the prediction and in ours' histograms; only ours reports
    plugin state. Raises AssertionError naming ``where``, the mode and the requests."""
    total = Counter(a for s in sims for a in s["accepted"])
    assert set(total) == set(range(steps + 1)), f"{where}: not every accepted count predicted: {total}"
    for mode, run in runs.items():
        bad = [i for i, (got, s) in enumerate(zip(run["output_ids"], sims)) if got != s["output_ids"]]
        assert not bad and len(run["output_ids"]) == len(sims), \
            f"{mode} {where}: requests {bad} differ from the simulation"
    for mode, run in runs.items():
        if mode != "plain":
            assert run["histogram"] == hists, f"{mode} {where}: histograms differ from the prediction"
            assert run["verify_ct"] == [len(s["accepted"]) for s in sims], f"{mode} {where}: verify counts"
    seen = Counter()
    for h in runs["ours"]["histogram"]:
        seen.update({k: n for k, n in enumerate(h) if n})
    assert set(seen) == set(range(steps + 1)), f"{where}: accepted counts seen by ours: {dict(seen)}"
    assert all(r["plugin"] is None for m, r in runs.items() if m != "ours"), f"{where}: plugin state off ours"

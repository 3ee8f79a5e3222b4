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


def serve_prompts(target: str, draft: str, mode: str, page: int, *, prompts: list, tokens: int, steps: int,
                  concurrency: int, common_args: list, env: dict, log_path: str) -> dict:
    """One stock server of ``target`` at ``page`` size (``mode``: ``plain`` without speculation,
    ``upstream`` EAGLE-3 with ``draft`` at topk 1 and ``steps`` steps, ``ours`` the same with
    ``--enable-verify-cuda-graph``), its log at ``log_path``, ``env`` its whole environment;
    ``prompts`` (input id lists) greedy with ``tokens`` new tokens each, ``concurrency`` at once.
    Returns the run (module docstring) with ``concurrency``; ``plugin`` is the plugin's counters
    (``bench.lib.server.plugin_state``: None off ours)."""
    import concurrent.futures as cf
    import os

    from bench.lib.server import free_port, generate, launch_server, plugin_state, stop_server
    from bench.models.accept_pair import trim_histogram

    args = common_args + ["--page-size", str(page)]
    if mode != "plain":
        args += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", draft,
                 "--speculative-eagle-topk", "1", "--speculative-num-steps", str(steps),
                 "--speculative-num-draft-tokens", str(steps + 1)]
    if mode == "ours":
        args.append("--enable-verify-cuda-graph")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    base = f"http://127.0.0.1:{free_port()}"
    proc = launch_server(target, base, args, env=env, log_path=log_path)
    try:
        body = lambda ids: {"input_ids": ids, "sampling_params": {  # noqa: E731
            "max_new_tokens": tokens, "temperature": 0.0, "ignore_eos": True}}
        with cf.ThreadPoolExecutor(concurrency) as pool:
            outs = list(pool.map(lambda ids: generate(base, body(ids)), prompts))
        state = plugin_state(base)
    finally:
        stop_server(proc)
    return {
        "concurrency": concurrency,
        "output_ids": [o["output_ids"] for o in outs],
        "verify_ct": [o["meta_info"].get("spec_verify_ct") for o in outs],
        "histogram": [trim_histogram(o["meta_info"].get("spec_correct_drafts_histogram") or []) for o in outs],
        "plugin": state,
    }

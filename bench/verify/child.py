"""One mode's engine child of ``python -m bench verify``: the models, the Engine's keyword
arguments, the prompts and the measured points (``BENCH phase`` lines and the result JSON)."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

from bench.lib import engine, verify_probe


def model_paths(a):
    d = os.path.abspath(a.models_dir)
    if not os.path.isfile(os.path.join(d, a.model, "config.json")):
        subprocess.run([sys.executable, "-m", "bench", "models", "dummy", d, "--only", a.model],
                       check=True, env=engine.child_env())
    return os.path.join(d, a.model), os.path.join(d, a.model + "-eagle3")


def bench_prompts(ctx: int, bs: int, vocab: int, shared: bool) -> list:
    """``bs`` prompts of ``ctx`` random token ids in ``[10, vocab - 1)``.

    ``shared`` (``--prefix-cache``): prompt ``i`` depends on ``(ctx, i)`` only, so a larger batch
    at the same context starts with the smaller batch's prompts (radix-cache hits); otherwise the
    batch is drawn from one seed per ``(ctx, bs)``."""
    if shared:
        return [_prompt(random.Random(1000003 * ctx + i), ctx, vocab) for i in range(bs)]
    rng = random.Random(1000 * ctx + bs)
    return [_prompt(rng, ctx, vocab) for _ in range(bs)]


def _prompt(rng, ctx: int, vocab: int) -> list:
    return [rng.randrange(10, vocab - 1) for _ in range(ctx)]


def target_config(a) -> dict:
    """The target's ``config.json``; a multimodal wrapper's text fields come from ``text_config``
    (with ``"wrapper": True``)."""
    with open(os.path.join(model_paths(a)[0], "config.json")) as f:
        cfg = json.load(f)
    return dict(cfg["text_config"], wrapper=True) if "text_config" in cfg else cfg


def engine_kwargs(a, mode: str) -> dict:
    """``bench.lib.engine.engine_kwargs`` of ``mode`` for this run's flags (dummy weights)."""
    target, draft = model_paths(a)
    return engine.engine_kwargs(
        mode, target, draft, target_config(a), max_context=max(a.contexts), new_tokens=a.new_tokens,
        warmup_tokens=a.warmup_tokens, steps=a.steps, max_bs=max(a.batch_sizes), cuda_graph_bs=a.cuda_graph_bs,
        attention_backend=a.attention_backend, draft_attention_backend=a.draft_attention_backend, mem=a.mem,
        prefix_cache=a.prefix_cache, log_level=a.log_level, moe_runner_backend=a.moe_runner_backend,
        engine_extra=a.engine_extra)


def e2e_ms_per_step(tn_s: float, t1_s: float, steps: int) -> float | None:
    """Wall ms per decode step, ``1000 * (tn_s - t1_s) / steps``: the N-token generation's wall
    (s) less the 1-token one's (s, the faster of two) over its verify (or decode) steps; ``None``
    when ``tn_s <= t1_s`` (the 1-token wall held a one-off: no figure rather than a negative one)."""
    if tn_s <= t1_s:
        return None
    return round(1000 * (tn_s - t1_s) / max(steps, 1), 4)


def run_child(a, res: dict) -> None:
    """Run one mode in one Engine; fills ``res`` as it goes (so a crash keeps the finished phases)."""
    kw = engine_kwargs(a, a.child)
    eng = engine.start_engine(kw, res, a.child, plugin=a.child in ("ours", "ours_profile"),
                       profile_every=a.profile_every if a.child == "ours_profile" else 0)
    vocab = target_config(a)["vocab_size"]
    sp = lambda n: {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}  # noqa: E731
    try:
        for ctx in ([] if a.capture_only else a.contexts):  # capture only: start, record, stop
            for bs in a.batch_sizes:
                prompts = bench_prompts(ctx, bs, vocab, a.prefix_cache)
                eng.generate(input_ids=prompts, sampling_params=sp(a.warmup_tokens))
                engine.engine_state(eng)
                t1s = []
                for _ in range(2):  # the first 1-token request of a point can carry one-off host work
                    t = time.perf_counter()
                    eng.generate(input_ids=prompts, sampling_params=sp(1))
                    t1s.append(time.perf_counter() - t)
                t1 = min(t1s)
                t = time.perf_counter()
                outs = eng.generate(input_ids=prompts, sampling_params=sp(a.new_tokens))
                tn = time.perf_counter() - t
                st = engine.engine_state(eng)
                outs = outs if isinstance(outs, list) else [outs]
                metas = [o["meta_info"] for o in outs]
                vct = [m.get("spec_verify_ct") or 0 for m in metas]
                steps = max(vct) if any(vct) else a.new_tokens - 1
                ph = {"context": ctx, "bs": bs, "t1_s": round(t1, 4), "tn_s": round(tn, 4), "steps": steps,
                      "e2e_ms_per_step": e2e_ms_per_step(tn, t1, steps),
                      "completion_tokens": [m.get("completion_tokens") for m in metas],
                      "accept_len": [m.get("spec_accept_length") for m in metas], "spec_verify_ct": vct}
                ph.update(verify_probe.summarize_probe(st["probe"], bs))
                res["phases"].append(ph)
                print("BENCH phase " + json.dumps(ph), flush=True)
        res["plugin_after"] = engine.engine_state(eng)["plugin"]
        res["ok"] = True
    finally:
        eng.shutdown()

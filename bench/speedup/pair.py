"""The attention pair ``python -m bench speedup`` measures: its folders, whether the default
build is there, building it (``python -m bench models pair DIR --shape llama8b --attention``),
its agreement classes."""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time

from bench.lib import engine
from bench.models import accept_pair

PAIR = accept_pair.LLAMA8B.folder(True)  # llama8b-pair-attn (+ -eagle3)
WEIGHTS = "pytorch_model.bin"


class FlagError(ValueError):
    """A bad flag value: the message is the one line to print (it names the flag)."""


class PairBuildError(RuntimeError):
    """``python -m bench models pair --shape llama8b`` failed: the message holds its last output."""


def pair_paths(pair_dir: str) -> tuple:
    """``(target_dir, draft_dir)`` of the attention pair under ``pair_dir``."""
    d = os.path.abspath(pair_dir)
    return os.path.join(d, PAIR), os.path.join(d, PAIR + "-eagle3")


def pair_ready(pair_dir: str) -> bool:
    """Both folders hold config.json and their weights, and pair_maps.json is the default
    build's (the llama8b shape, :data:`accept_pair.AGREE_LLAMA8B`, seed 0): a pair left by an
    older build is built again."""
    if not all(os.path.isfile(os.path.join(d, f)) for d in pair_paths(pair_dir)
               for f in ("config.json", "pair_maps.json", WEIGHTS)):
        return False
    try:
        maps = load_maps(pair_dir)
    except (OSError, ValueError):
        return False
    want = json.loads(json.dumps(dataclasses.asdict(accept_pair.LLAMA8B)))
    return (maps.get("agree") == list(accept_pair.AGREE_LLAMA8B) and maps.get("seed") == 0
            and maps.get("shape") == want and maps.get("attention") is True)


def ensure_pair(pair_dir: str, log) -> float:
    """Build the pair under ``pair_dir`` unless :func:`pair_ready`; returns the seconds spent (0.0
    when it was there). Raises PairBuildError with the builder's last lines when it fails."""
    if pair_ready(pair_dir):
        return 0.0
    t0 = time.time()
    cmd = [sys.executable, "-m", "bench", "models", "pair", pair_dir, "--shape", "llama8b", "--attention"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=engine.child_env())
    log(f"BENCH pair: {shlex.join(cmd)} rc={r.returncode} in {time.time() - t0:.1f}s: "
        + " | ".join((r.stdout + r.stderr).strip().splitlines()[-3:]))
    if r.returncode or not pair_ready(pair_dir):
        raise PairBuildError("python -m bench models pair --shape llama8b failed: " + (r.stdout + r.stderr).strip()[-600:])
    return round(time.time() - t0, 1)


def load_maps(pair_dir: str) -> dict:
    """The pair's ``pair_maps.json`` (maps, classes, shape)."""
    with open(os.path.join(pair_paths(pair_dir)[0], "pair_maps.json")) as f:
        return json.load(f)


def default_maps() -> dict:
    """The maps the default build writes (for ``--dry-run`` without a pair on disk)."""
    maps = accept_pair.make_class_maps(accept_pair.VOCAB, accept_pair.AGREE_LLAMA8B, 0)
    for c, t in zip(maps["classes"], accept_pair.ACCEPT_TARGETS):
        c["target_accept_length"] = t
    return maps


def check_classes(a, maps: dict) -> None:
    """``--classes`` against the pair's classes; raises FlagError naming the flag."""
    n = len(maps["classes"])
    if a.classes is None:
        a.classes = list(range(n))
    bad = [c for c in a.classes if not 0 <= c < n]
    if bad:
        have = ", ".join(f"{i}: agree {c['agree']}" for i, c in enumerate(maps["classes"]))
        raise FlagError(f"--classes {','.join(map(str, a.classes))}: the pair has classes 0-{n - 1} ({have})")

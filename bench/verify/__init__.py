"""``python -m bench verify``: per-step GPU time of the EAGLE-3 (top-k 1) target verify, ours vs
upstream vs plain decode (``cli``: flags and ``main``; ``parent``: one engine child per mode;
``child``: one engine's points; ``table``: rows and ``RESULT`` lines; ``merge``: one table from
earlier runs)."""

"""``python -m bench speedup``: measured EAGLE-3 speed-up with set accept lengths (``cli``: flags
and ``main``; ``run``: the engine children and the parent; ``pair``: the model pair; ``estimate``:
the run-time estimate; ``report``: rows, advisor check and tables)."""

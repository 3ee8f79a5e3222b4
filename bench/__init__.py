"""The lab: benchmarks, model builders, the demo and the results renderer (``python -m bench``).
May import the product (``sglang_verify_graph``); the product never imports it."""

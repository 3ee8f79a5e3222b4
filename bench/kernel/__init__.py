"""``python -m bench kernel``: one verify layer's attention, our chain kernel head to head with
SGLang's kernels for the same step (:mod:`bench.kernel.cli`)."""

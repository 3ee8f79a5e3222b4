"""Debug instruments, off by default: the graph self-test and NaN padding (``selftest``), the
host-sync check (``sync_check``). The core reaches them only through the probe factories."""

"""The lab's shared library: engine and server harnesses, the probe, timers, result formats."""

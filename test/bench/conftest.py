"""Fixtures of the lab's tests (``bench``): the CPU tier's, shared (no caller's plugin variables
leak into a test; the GPU job's dry run)."""

from cpu.conftest import _clean_plugin_env, gpu_job_dry  # noqa: F401

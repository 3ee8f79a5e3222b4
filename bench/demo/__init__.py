"""The demo: one command that serves a small model with and without the flag and prints a table."""

"""Model builders: dummy-weight model folders, the accept pair, the Kimi-K2.5 shard."""

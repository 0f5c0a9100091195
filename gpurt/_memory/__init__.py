"""The machinery behind gpurt.memory: the caching allocator and its backends, statistics,
configuration, history and summary."""

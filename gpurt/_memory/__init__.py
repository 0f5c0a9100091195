"""The machinery behind gpurt.memory.

protocol.py (what every allocator does) <- allocator.py (the caching allocator: segments.py,
expandable.py, blocks.py, streamuses.py, privatepools.py, over driver.py's DriverBackend or
pluggable.py's PluggableBackend), async_pool.py (cudaMallocAsync), pinned.py (pinned host
memory); config.py, stats.py, history.py, summary.py beside them.
"""

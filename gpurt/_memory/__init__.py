"""The machinery behind gpurt.memory.

protocol.py (what every allocator does) <- allocator.py (the caching allocator: segments.py,
blocks.py, streamuses.py, over driver.py's DriverBackend), async_pool.py (cudaMallocAsync),
pinned.py (pinned host memory); config.py, stats.py, history.py, summary.py beside them.
"""

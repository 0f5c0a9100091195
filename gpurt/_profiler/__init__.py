"""The machinery behind gpurt.profiler and gpurt.memviz: traces, memory timelines, the page."""

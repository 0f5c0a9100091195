"""The stream sanitizer's machinery (gpurt.sanitizer is its front): vector clocks of streams,
events and the host (clocks.py), the access history of allocations and the conflict check
(tracker.py), and the switch every recording site reads (hooks.py).

Plain Python over ints (stream keys, event keys, device addresses): no driver calls, so
all of it is tested on a CPU."""

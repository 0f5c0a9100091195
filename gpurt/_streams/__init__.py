"""The machinery behind gpurt.streams: owned stream/event handles with deferred release, the
before-destroy hooks, and the host-callback trampoline."""

"""Happens-before between streams: one vector clock per stream, per recorded event and for
the host, as torch's CSAN keeps them (torch/cuda/_sanitizer.py), with two differences:

- a host synchronisation raises only the host's clock; an access is ordered after an earlier
  one when its stream's clock *or the host's* covers it (the host issued the new work after
  it waited for the old), so a synchronize never walks every stream's clock;
- the legacy default stream's implicit barriers: work on it waits for all earlier work of the
  device's blocking streams, and work on a blocking stream waits for the legacy stream's.

Stream keys are ints: a stream's raw handle, except for the per-device default streams,
whose handles (0 and 1: legacy, 2: per-thread) mean a different stream on each device.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Clocks", "stream_key"]

Clock = dict[int, int]  # stream key -> the last sequence number known to be ordered before

_LEGACY_HANDLES = (0, 1)
_PER_THREAD_HANDLE = 2


def stream_key(handle: int, device: int) -> int:
    """The key of the stream with raw ``handle`` on ``device``: the handle itself, or a
    negative number per device for the default streams (0 and 1 both are the legacy one)."""
    if handle > _PER_THREAD_HANDLE:
        return handle
    return -2 * device - (2 if handle == _PER_THREAD_HANDLE else 1)


def _merge(into: Clock, other: Clock) -> None:
    for stream, seq in other.items():
        if into.get(stream, 0) < seq:
            into[stream] = seq


class Clocks:
    """The clocks, and the device and kind of every stream seen. ``blocking(key, handle)``
    tells whether a stream other than the default ones synchronises with the legacy stream
    (asked once per stream)."""

    def __init__(self, blocking: Any = None) -> None:
        self.seq = 0
        self.host: Clock = {}
        self.streams: dict[int, Clock] = {}
        self.events: dict[Any, Clock] = {}
        self.devices: dict[int, int] = {}  # stream key -> device
        self.blocking: dict[int, set[int]] = {}  # device -> keys of its blocking streams
        self._is_blocking = blocking

    def clock(self, key: int, device: int = 0, handle: int | None = None) -> Clock:
        """The clock of stream ``key``, made on first sight from what the host knows."""
        clock = self.streams.get(key)
        if clock is None:
            clock = self.streams[key] = dict(self.host)
            self.devices[key] = device
            if handle is None:
                handle = key
            if handle == _PER_THREAD_HANDLE or (
                    handle > _PER_THREAD_HANDLE and self._is_blocking is not None
                    and self._is_blocking(handle)):
                self.blocking.setdefault(device, set()).add(key)
        return clock

    def barriers(self, key: int) -> None:
        """The legacy default stream's implicit barriers before new work on stream ``key``
        (seen before through :meth:`clock`): work on the legacy stream waits for the
        device's blocking streams, work on a blocking stream for the legacy stream."""
        device = self.devices[key]
        legacy = -2 * device - 1
        clock = self.streams[key]
        if key == legacy:
            for other in self.blocking.get(device, ()):
                _merge(clock, self.streams[other])
        elif key in self.blocking.get(device, ()) and legacy in self.streams:
            _merge(clock, self.streams[legacy])

    def tick(self, key: int) -> int:
        """A new operation on stream ``key``: its sequence number."""
        self.seq += 1
        self.streams[key][key] = self.seq
        return self.seq

    def ordered(self, key: int, stream: int, seq: int) -> bool:
        """Whether operation ``seq`` of ``stream`` is ordered before new work on ``key``."""
        return (stream == key or self.streams[key].get(stream, 0) >= seq
                or self.host.get(stream, 0) >= seq)

    def record(self, event: Any, key: int) -> None:
        """Event ``event`` recorded on ``key``: it stands for what ``key`` has done so far."""
        self.events[event] = dict(self.streams[key])

    def wait(self, key: int, event: Any) -> None:
        """Stream ``key`` waits for ``event`` (never recorded: nothing to wait for)."""
        recorded = self.events.get(event)
        if recorded is not None:
            _merge(self.streams[key], recorded)

    def wait_stream(self, consumer: int, producer: int) -> None:
        """Stream ``consumer`` waits for everything queued on ``producer`` so far."""
        if consumer != producer:
            _merge(self.streams[consumer], self.streams[producer])

    def sync_stream(self, key: int) -> None:
        """The host waited for stream ``key``."""
        _merge(self.host, self.streams[key])

    def sync_event(self, event: Any) -> None:
        """The host waited for ``event``."""
        recorded = self.events.get(event)
        if recorded is not None:
            _merge(self.host, recorded)

    def sync_device(self, device: int) -> None:
        """The host waited for every stream of ``device``."""
        for key, clock in self.streams.items():
            if self.devices[key] == device:
                _merge(self.host, clock)

    def forget_event(self, event: Any) -> None:
        self.events.pop(event, None)

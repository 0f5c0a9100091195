"""NVTX ranges and marks with torch.cuda.nvtx's names: ``range_push``/``range_pop``,
``range_start``/``range_end``, ``mark`` and ``range`` (a context manager and decorator),
plus domains and colours.

Ranges reach Nsight Systems through the ``nvtx`` package (NVTX3). With no tool attached the
package hands out a dummy domain, and a range costs a depth-counter update and two checks.
Without the package at all, every call still works (depths stay right) and one warning says
why nothing reaches the tools. While ``gpurt.profiler.profile()`` is active it observes every
range here and times it on the device.

Depths follow torch: ``range_push`` returns the zero-based depth of the range it starts,
``range_pop`` the depth of the range it ends (-1 when nothing was pushed), per thread and
per domain.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
import warnings
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, Union

try:
    import nvtx as _nvtx  # type: ignore[import-untyped]  # (it ships no type information)
except ImportError:  # optional at run time: degrade to counting no-ops
    _nvtx = None

__all__ = [
    "Domain",
    "range_push",
    "range_pop",
    "range_start",
    "range_end",
    "mark",
    "range",
    "is_tool_attached",
]

ColorLike = str | int | None
DomainLike = Union["Domain", str, None]  # noqa: UP007 (a forward reference)
F = TypeVar("F", bound=Callable[..., Any])

# Named colours (0xRRGGBB); anything else is '#rrggbb' or an int.
COLORS: dict[str, int] = {
    "blue": 0x1F77B4,
    "orange": 0xFF7F0E,
    "green": 0x2CA02C,
    "red": 0xD62728,
    "purple": 0x9467BD,
    "brown": 0x8C564B,
    "pink": 0xE377C2,
    "gray": 0x7F7F7F,
    "grey": 0x7F7F7F,
    "olive": 0xBCBD22,
    "cyan": 0x17BECF,
    "yellow": 0xFFD700,
    "black": 0x000000,
    "white": 0xFFFFFF,
    "nvidia": 0x76B900,
}
_ATTRIBUTE_CACHE_LIMIT = 4096


class RangeObserver(Protocol):
    """What gpurt.profiler installs to see every range (domain is the domain's name)."""

    def on_push(self, domain: str | None, message: str) -> None: ...
    def on_pop(self, domain: str | None) -> None: ...
    def on_start(self, domain: str | None, message: str, range_id: int) -> None: ...
    def on_end(self, domain: str | None, range_id: int) -> None: ...
    def on_mark(self, domain: str | None, message: str) -> None: ...


_observer: RangeObserver | None = None


def _set_observer(observer: RangeObserver | None) -> RangeObserver | None:
    """Install the profiler's observer (None removes it); returns the previous one."""
    global _observer
    previous, _observer = _observer, observer
    return previous


def to_argb(color: ColorLike) -> int | None:
    """An NVTX ARGB colour for a name, '#rrggbb', 0xRRGGBB or 0xAARRGGBB (None stays None)."""
    if color is None:
        return None
    if isinstance(color, bool):
        raise TypeError(f"invalid colour {color!r}")
    if isinstance(color, int):
        rgb = color
    elif isinstance(color, str):
        text = color.strip().lower()
        if text in COLORS:
            rgb = COLORS[text]
        elif text.startswith("#") and len(text) == 7:
            try:
                rgb = int(text[1:], 16)
            except ValueError:
                raise ValueError(f"invalid colour {color!r}: expected '#rrggbb'") from None
        else:
            names = ", ".join(sorted(COLORS))
            raise ValueError(f"unknown colour {color!r}: use '#rrggbb', an int or one of {names}")
    else:
        raise TypeError(f"invalid colour {color!r}: expected a name, '#rrggbb' or an int")
    if not 0 <= rgb <= 0xFFFFFFFF:
        raise ValueError(f"colour {color!r} is out of range for 0xAARRGGBB")
    return rgb if rgb > 0xFFFFFF else 0xFF000000 | rgb


class _Depth(threading.local):
    """Per-thread range depth of one domain (threading.local runs __init__ per thread).
    The count sits in a one-item list: one thread-local lookup per call instead of two."""

    def __init__(self) -> None:
        self.box = [0]


_UNBOUND: Any = object()  # the native domain is looked up on first use, not at import
_bind_lock = threading.Lock()


def _renew_lock_after_fork() -> None:
    """A forked child gets a fresh lock (a parent thread may have held this one)."""
    global _bind_lock
    _bind_lock = threading.Lock()


os.register_at_fork(after_in_child=_renew_lock_after_fork)
_warned = False  # one warning per process when NVTX cannot be used
_range_ids = itertools.count(1)  # ids for range_start when no tool hands them out
_domains: dict[str | None, Domain] = {}


def _warn_once(why: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"gpurt.nvtx: {why}, so ranges are counted but not sent to profiling "
                      "tools (pip install nvtx)", RuntimeWarning, stacklevel=5)


def _native_domain(name: str | None) -> Any:
    """The ``nvtx`` package's domain when a tool is listening, else None."""
    if _nvtx is None:
        _warn_once("the 'nvtx' package is not installed")
        return None
    try:
        if not _nvtx.enabled():
            return None
        native = _nvtx.get_domain(name)
        return native if isinstance(native, _nvtx.Domain) else None
    except Exception as exc:  # an nvtx package too old or broken: count, do not fail
        _warn_once(f"the 'nvtx' package cannot be used ({exc.__class__.__name__}: {exc})")
        return None


class Domain:
    """An NVTX domain: ranges, marks and their depth counters under one name.

    ``Domain(None)`` is NVTX's default domain (what the module-level functions use).
    ``Domain("name")`` returns the same object for the same name."""

    __slots__ = ("name", "_depth", "_native", "_attributes")
    name: str | None
    _depth: _Depth
    _native: Any
    _attributes: dict[tuple[str, ColorLike], Any]

    def __new__(cls, name: str | None = None) -> Domain:
        if name is not None and not isinstance(name, str):
            raise TypeError(f"a domain name must be a str or None, got {type(name).__name__}")
        existing = _domains.get(name)
        if existing is not None:
            return existing
        with _bind_lock:
            existing = _domains.get(name)
            if existing is not None:
                return existing
            self = super().__new__(cls)
            self.name = name
            self._depth = _Depth()
            self._native = _UNBOUND
            self._attributes = {}
            _domains[name] = self
            return self

    def __repr__(self) -> str:
        return f"gpurt.nvtx.Domain({self.name!r})"

    def __reduce__(self) -> tuple[Any, tuple[str | None]]:
        return (Domain, (self.name,))

    # -- the calls ----------------------------------------------------------------------

    def range_push(self, msg: str, color: ColorLike = None) -> int:
        """Start a nested range on this thread (nvtxDomainRangePushEx); returns its depth."""
        box = self._depth.box
        level = box[0]
        box[0] = level + 1
        if self._native is not None:
            native = self._bound()
            if native is not None:
                native.push_range(self._event_attributes(native, msg, color))
        if _observer is not None:
            _observer.on_push(self.name, msg)
        return level

    def range_pop(self) -> int:
        """End this thread's innermost range (nvtxDomainRangePop); returns its depth, or -1
        when no range is open."""
        box = self._depth.box
        level = box[0] - 1
        if level < 0:
            return -1
        box[0] = level
        if self._native is not None:
            native = self._bound()
            if native is not None:
                native.pop_range()
        if _observer is not None:
            _observer.on_pop(self.name)
        return level

    def range_start(self, msg: str, color: ColorLike = None) -> int:
        """Start a range that may end on another thread (nvtxDomainRangeStartEx); returns
        the id to hand to :meth:`range_end`."""
        native = self._bound() if self._native is not None else None
        if native is not None:
            range_id = int(native.start_range(self._event_attributes(native, msg, color)))
        else:
            range_id = next(_range_ids)
        if _observer is not None:
            _observer.on_start(self.name, msg, range_id)
        return range_id

    def range_end(self, range_id: int) -> None:
        """End a range started with :meth:`range_start` (nvtxDomainRangeEnd)."""
        if self._native is not None:
            native = self._bound()
            if native is not None:
                native.end_range(range_id)
        if _observer is not None:
            _observer.on_end(self.name, range_id)

    def mark(self, msg: str, color: ColorLike = None) -> None:
        """An instantaneous event (nvtxDomainMarkEx)."""
        if self._native is not None:
            native = self._bound()
            if native is not None:
                native.mark(self._event_attributes(native, msg, color))
        if _observer is not None:
            _observer.on_mark(self.name, msg)

    def range(self, msg: str | None = None, *args: Any, color: ColorLike = None,
              **kwargs: Any) -> RangeContext:
        """A range as a context manager or decorator; ``msg.format(*args, **kwargs)`` names
        it (a decorator without a message uses the function's qualified name)."""
        if msg is not None and (args or kwargs):
            msg = msg.format(*args, **kwargs)
        if color is not None:
            to_argb(color)  # reject a bad colour here, not at the first push
        return RangeContext(self, msg, color)

    def depth(self) -> int:
        """How many ranges this thread has open in this domain."""
        return self._depth.box[0]

    # -- binding to the nvtx package ----------------------------------------------------

    def _bound(self) -> Any:
        native = self._native
        if native is _UNBOUND:
            with _bind_lock:
                if self._native is _UNBOUND:
                    self._native = _native_domain(self.name)
                native = self._native
        return native

    def _event_attributes(self, native: Any, msg: str, color: ColorLike) -> Any:
        key = (msg, color)
        attributes = self._attributes.get(key)
        if attributes is None:
            if len(self._attributes) >= _ATTRIBUTE_CACHE_LIMIT:
                self._attributes.clear()
            attributes = native.get_event_attributes(message=msg, color=to_argb(color))
            self._attributes[key] = attributes
        return attributes


class RangeContext:
    """What :func:`range` returns: enter/exit push and pop a range; calling it on a
    function wraps every call of that function in the range. Reentrant and reusable."""

    __slots__ = ("_domain", "_msg", "_color")

    def __init__(self, domain: Domain, msg: str | None, color: ColorLike) -> None:
        self._domain = domain
        self._msg = msg
        self._color = color

    def __enter__(self) -> RangeContext:
        self._domain.range_push("" if self._msg is None else self._msg, self._color)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._domain.range_pop()

    def __call__(self, func: F) -> F:
        domain, color = self._domain, self._color
        msg = self._msg if self._msg is not None else getattr(func, "__qualname__", repr(func))

        @functools.wraps(func)
        def ranged(*args: Any, **kwargs: Any) -> Any:
            domain.range_push(msg, color)
            try:
                return func(*args, **kwargs)
            finally:
                domain.range_pop()

        return ranged  # type: ignore[return-value]


_DEFAULT = Domain(None)


def _domain(domain: DomainLike) -> Domain:
    if domain is None:
        return _DEFAULT
    return domain if isinstance(domain, Domain) else Domain(domain)


def range_push(msg: str, *, color: ColorLike = None, domain: DomainLike = None) -> int:
    """Push a range onto this thread's stack (nvtxRangePushEx); returns its zero-based depth."""
    if domain is None:
        return _DEFAULT.range_push(msg, color)
    return _domain(domain).range_push(msg, color)


def range_pop(*, domain: DomainLike = None) -> int:
    """Pop this thread's innermost range (nvtxRangePop); returns the zero-based depth of the
    range that ended, or -1 when none was open."""
    if domain is None:
        return _DEFAULT.range_pop()
    return _domain(domain).range_pop()


def range_start(msg: str, *, color: ColorLike = None, domain: DomainLike = None) -> int:
    """Start a range that any thread may end (nvtxRangeStartEx); returns its id."""
    return _domain(domain).range_start(msg, color)


def range_end(range_id: int, *, domain: DomainLike = None) -> None:
    """End the range ``range_id`` from :func:`range_start` (nvtxRangeEnd)."""
    _domain(domain).range_end(range_id)


def mark(msg: str, *, color: ColorLike = None, domain: DomainLike = None) -> None:
    """Mark an instant (nvtxMarkEx)."""
    _domain(domain).mark(msg, color)


def range(msg: str | None = None, *args: Any, domain: DomainLike = None,
          color: ColorLike = None, **kwargs: Any) -> RangeContext:
    """Context manager / decorator: push ``msg.format(*args, **kwargs)`` on enter, pop on
    exit (torch.cuda.nvtx.range); ``domain=`` and ``color=`` are NVTX's, not format keys."""
    return _domain(domain).range(msg, *args, color=color, **kwargs)


def is_tool_attached(domain: DomainLike = None) -> bool:
    """True when a profiling tool (Nsight Systems ...) receives this domain's ranges."""
    return _domain(domain)._bound() is not None

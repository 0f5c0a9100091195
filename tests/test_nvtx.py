"""gpurt.nvtx: torch.cuda.nvtx's names and depths, domains, colours, threads, the observer
seam used by the profiler, and degrading without the nvtx package. All CPU: no tool is
attached here, so the real nvtx package hands out dummy domains; a fake native domain
checks what would reach a tool."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import uuid
import warnings

import pytest

import gpurt
from gpurt import nvtx


def fresh_domain() -> nvtx.Domain:
    return nvtx.Domain(f"test-{uuid.uuid4().hex}")


@pytest.fixture(autouse=True)
def balanced_default_domain():
    """Every test must leave the default domain's depth as it found it."""
    before = nvtx.Domain(None).depth()
    yield
    assert nvtx.Domain(None).depth() == before


def test_reachable_like_torch():
    assert gpurt.nvtx is nvtx
    assert gpurt.profiler.nvtx is nvtx
    for name in ("range_push", "range_pop", "range_start", "range_end", "mark", "range"):
        assert callable(getattr(gpurt.nvtx, name)), name


def test_push_pop_return_zero_based_depths():
    assert nvtx.range_push("a") == 0
    assert nvtx.range_push("b") == 1
    assert nvtx.range_push("c") == 2
    assert nvtx.range_pop() == 2
    assert nvtx.range_pop() == 1
    assert nvtx.range_pop() == 0


def test_pop_with_nothing_open_returns_minus_one_and_keeps_count():
    assert nvtx.range_pop() == -1
    assert nvtx.range_push("x") == 0  # the stray pop did not go negative
    assert nvtx.range_pop() == 0


def test_range_context_manager_formats_like_torch():
    seen = []

    class Observer:
        def on_push(self, domain, message):
            seen.append(("push", domain, message))

        def on_pop(self, domain):
            seen.append(("pop", domain))

    previous = nvtx._set_observer(Observer())  # type: ignore[arg-type]
    try:
        with nvtx.range("step {} of {total}", 3, total=10):
            assert nvtx.Domain(None).depth() == 1
    finally:
        nvtx._set_observer(previous)
    assert seen == [("push", None, "step 3 of 10"), ("pop", None)]


def test_range_pops_on_exception():
    with pytest.raises(KeyError):
        with nvtx.range("boom"):
            raise KeyError("x")
    assert nvtx.Domain(None).depth() == 0


def test_range_as_decorator_wraps_each_call_and_keeps_metadata():
    depths = []

    @nvtx.range("work {}", 1)
    def work(x: int) -> int:
        """Doc."""
        depths.append(nvtx.Domain(None).depth())
        return 2 * x

    assert work(4) == 8
    assert work(5) == 10
    assert depths == [1, 1]
    assert work.__name__ == "work" and work.__doc__ == "Doc."


def test_decorator_without_message_uses_qualified_name():
    messages = []

    class Observer:
        def on_push(self, domain, message):
            messages.append(message)

        def on_pop(self, domain):
            pass

    @nvtx.range()
    def helper():
        return 1

    previous = nvtx._set_observer(Observer())  # type: ignore[arg-type]
    try:
        helper()
    finally:
        nvtx._set_observer(previous)
    assert messages == [helper.__wrapped__.__qualname__]  # type: ignore[attr-defined]


def test_range_object_is_reentrant():
    r = nvtx.range("again")
    with r:
        with r:
            assert nvtx.Domain(None).depth() == 2
    assert nvtx.Domain(None).depth() == 0


def test_domains_are_singletons_with_their_own_depths():
    d = fresh_domain()
    assert nvtx.Domain(d.name) is d
    assert d.range_push("in d") == 0
    assert nvtx.range_push("default") == 0  # other domain, own count
    assert nvtx.range_push("via name", domain=d.name) == 1
    assert nvtx.range_pop(domain=d) == 1
    assert nvtx.range_pop() == 0
    assert d.range_pop() == 0
    with d.range("ctx {}", 1, color="green"):
        assert d.depth() == 1
    assert d.depth() == 0
    assert repr(d) == f"gpurt.nvtx.Domain({d.name!r})"


def test_domain_name_must_be_a_string():
    with pytest.raises(TypeError):
        nvtx.Domain(3)  # type: ignore[arg-type]


@pytest.mark.parametrize("color, argb", [
    ("green", 0xFF2CA02C), ("#102030", 0xFF102030), (0x112233, 0xFF112233),
    (0x80112233, 0x80112233), ("NVIDIA", 0xFF76B900), (None, None),
])
def test_colours(color, argb):
    assert nvtx.to_argb(color) == argb


@pytest.mark.parametrize("bad, error", [
    ("chartreuse-ish", ValueError), ("#12345", ValueError), ("#zzzzzz", ValueError),
    (-1, ValueError), (1 << 33, ValueError), (True, TypeError), (1.5, TypeError),
])
def test_bad_colours_are_rejected_when_the_range_is_made(bad, error):
    with pytest.raises(error):
        nvtx.range("x", color=bad)


def test_start_end_across_threads():
    ids = []
    ended = []

    class Observer:
        def on_start(self, domain, message, range_id):
            ended.append(("start", message, range_id, threading.get_ident()))

        def on_end(self, domain, range_id):
            ended.append(("end", range_id, threading.get_ident()))

    previous = nvtx._set_observer(Observer())  # type: ignore[arg-type]
    try:
        def starter():
            ids.append(nvtx.range_start("cross-thread"))

        t = threading.Thread(target=starter)
        t.start()
        t.join()
        nvtx.range_end(ids[0])  # ends on the main thread
    finally:
        nvtx._set_observer(previous)
    start, end = ended
    assert start[:3] == ("start", "cross-thread", ids[0])
    assert end[:2] == ("end", ids[0])
    assert start[3] != end[2]


def test_range_ids_are_unique_under_threads():
    ids: list[int] = []
    lock = threading.Lock()

    def many():
        local = [nvtx.range_start("r") for _ in range(500)]
        for i in local:
            nvtx.range_end(i)
        with lock:
            ids.extend(local)

    threads = [threading.Thread(target=many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 2000


def test_depth_is_per_thread():
    nvtx.range_push("main")
    seen = []

    def other():
        seen.append(nvtx.range_push("other"))
        seen.append(nvtx.range_pop())
        seen.append(nvtx.range_pop())

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == [0, 0, -1]
    assert nvtx.range_pop() == 0


def test_mark_reaches_the_observer():
    marks = []

    class Observer:
        def on_mark(self, domain, message):
            marks.append((domain, message))

    previous = nvtx._set_observer(Observer())  # type: ignore[arg-type]
    try:
        nvtx.mark("here")
        nvtx.mark("there", domain="d-marks", color="red")
    finally:
        nvtx._set_observer(previous)
    assert marks == [(None, "here"), ("d-marks", "there")]


def test_no_tool_attached_here():
    assert nvtx.is_tool_attached() is False


class FakeNative:
    """Stands in for an nvtx.Domain when a tool is listening."""

    def __init__(self):
        self.calls = []
        self.made = 0

    def get_event_attributes(self, message=None, color=None):
        self.made += 1
        return ("attrs", message, color)

    def push_range(self, attributes):
        self.calls.append(("push", attributes))

    def pop_range(self):
        self.calls.append(("pop",))

    def start_range(self, attributes):
        self.calls.append(("start", attributes))
        return 77

    def end_range(self, range_id):
        self.calls.append(("end", range_id))

    def mark(self, attributes):
        self.calls.append(("mark", attributes))


def test_calls_reach_a_listening_tool(monkeypatch):
    fake = FakeNative()
    d = fresh_domain()
    monkeypatch.setattr(nvtx, "_native_domain", lambda name: fake if name == d.name else None)
    assert d.range_push("a", "blue") == 0
    assert d.range_pop() == 0
    d.range_push("a", "blue")
    d.range_pop()
    assert d.range_start("s") == 77
    d.range_end(77)
    d.mark("m", 0x123456)
    assert nvtx.is_tool_attached(d)
    assert fake.calls == [
        ("push", ("attrs", "a", 0xFF1F77B4)), ("pop",),
        ("push", ("attrs", "a", 0xFF1F77B4)), ("pop",),
        ("start", ("attrs", "s", None)), ("end", 77),
        ("mark", ("attrs", "m", 0xFF123456)),
    ]
    assert fake.made == 3  # attributes are made once per (message, colour)


def test_attribute_cache_is_bounded(monkeypatch):
    fake = FakeNative()
    d = fresh_domain()
    monkeypatch.setattr(nvtx, "_native_domain", lambda name: fake)
    monkeypatch.setattr(nvtx, "_ATTRIBUTE_CACHE_LIMIT", 8)
    for i in range(50):
        d.range_push(f"step {i}")
        d.range_pop()
    assert len(d._attributes) <= 8
    assert d.depth() == 0


def test_without_the_nvtx_package_everything_still_works():
    code = textwrap.dedent("""
        import sys, warnings
        sys.modules["nvtx"] = None  # makes "import nvtx" fail
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import gpurt
            depths = [gpurt.nvtx.range_push("a"), gpurt.nvtx.range_push("b"),
                      gpurt.nvtx.range_pop(), gpurt.nvtx.range_pop(), gpurt.nvtx.range_pop()]
            with gpurt.nvtx.range("c {}", 1):
                pass
            gpurt.nvtx.mark("m")
            gpurt.nvtx.range_end(gpurt.nvtx.range_start("s"))
            gpurt.nvtx.Domain("other").range_push("x")
        ours = [w for w in caught if "nvtx" in str(w.message)]
        assert depths == [0, 1, 1, 0, -1], depths
        assert len(ours) == 1, [str(w.message) for w in ours]
        assert "pip install nvtx" in str(ours[0].message)
        assert not gpurt.nvtx.is_tool_attached()
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_a_broken_nvtx_package_degrades_with_one_warning(monkeypatch):
    class Broken:
        @staticmethod
        def enabled():
            raise AttributeError("no enabled() in this version")

    monkeypatch.setattr(nvtx, "_nvtx", Broken)
    monkeypatch.setattr(nvtx, "_warned", False)
    first, second = fresh_domain(), fresh_domain()
    with pytest.warns(RuntimeWarning, match="cannot be used"):
        assert first.range_push("a") == 0
    assert first.range_pop() == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would raise here
        assert second.range_push("b") == 0
        assert second.range_pop() == 0
    assert not nvtx.is_tool_attached(first)

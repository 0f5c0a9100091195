"""gpurt.memviz and its timeline model: stacking invariants on random traces (hypothesis),
the recorded fixture tests/data/memory_snapshot.json (made by tests/data/synthetic_snapshot.py),
the HTML page's embedded data and leak markers, the PNG, the command; on the GPU, memory
history of real allocations through gpurt.memory."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import struct
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpurt
from gpurt import memviz
from gpurt._profiler.memtimeline import build_timelines, callsite, format_bytes, load_snapshot

DATA = os.path.join(os.path.dirname(__file__), "data")
FIXTURE = os.path.join(DATA, "memory_snapshot.json")
MiB = 1 << 20


def synthetic():
    spec = importlib.util.spec_from_file_location("synthetic_snapshot",
                                                  os.path.join(DATA, "synthetic_snapshot.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def trace_event(action, addr, size, time_us, name="f", line=1):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": time_us,
            "frames": [{"filename": "/x/user.py", "line": line, "name": name}]}


# -- the model ----------------------------------------------------------------------------

def lower_edge(allocation, x):
    """The band's lower edge at x (linear between path points), None outside its life."""
    points = allocation.path
    if not points[0][0] <= x <= points[-1][0]:
        return None
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1 and x1 > x0:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def merged_span(timeline, x):
    for (x0, b0, t0), (x1, b1, t1) in zip(timeline.envelope, timeline.envelope[1:]):
        if x0 <= x <= x1 and x1 > x0:
            f = (x - x0) / (x1 - x0)
            return b0 + (b1 - b0) * f, t0 + (t1 - t0) * f
    return None


def check_no_overlap(timeline):
    for x in [i + f for i in range(timeline.steps + 1) for f in (0.2, 0.5, 0.8)]:
        spans = []
        for a in timeline.allocations:
            if a.drawn:
                y = lower_edge(a, x)
                if y is not None:
                    spans.append((y, y + a.size))
        merged = merged_span(timeline, x)
        if merged and merged[1] > merged[0]:
            spans.append(merged)
        spans.sort()
        for (_, top), (bottom, _) in zip(spans, spans[1:]):
            assert bottom >= top - 1e-6, f"bands overlap at x={x}"
        if spans:
            assert spans[-1][1] == pytest.approx(merged[1] if merged else spans[-1][1])


operations = st.lists(st.tuples(st.booleans(), st.integers(1, 64), st.integers(0, 10**6)),
                      min_size=1, max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops=operations, max_bands=st.integers(1, 12), completed=st.booleans())
def test_random_traces_stack_without_overlap_and_count_right(ops, max_bands, completed):
    live: list[tuple[int, int]] = []
    trace, next_addr, t = [], 0x1000, 0.0
    for is_alloc, size_units, pick in ops:
        t += 1.0
        if is_alloc or not live:
            live.append((next_addr, size_units * 512))
            trace.append(trace_event("alloc", next_addr, size_units * 512, t, line=size_units % 5))
            next_addr += 1 << 20
        else:
            addr, size = live.pop(pick % len(live))
            trace.append(trace_event("free_requested", addr, size, t))
            if completed:
                trace.append(trace_event("free_completed", addr, size, t + 0.5))
    (tl,) = build_timelines({"segments": [], "device_traces": [trace]}, max_bands=max_bands)
    allocs = sum(1 for e in trace if e["action"] == "alloc")
    assert len(tl.allocations) == allocs
    assert tl.steps == allocs + (len(trace) - allocs) // (2 if completed else 1)
    assert sum(a.drawn for a in tl.allocations) == min(max_bands, allocs)
    assert {a.address for a in tl.leak_suspects()} == {addr for addr, _ in live}
    assert tl.totals[-1] == sum(size for _, size in live)
    assert tl.envelope[-1][2] == tl.totals[-1]
    assert len(tl.times_us) == tl.steps + 2
    assert all(b >= a for a, b in zip(tl.times_us, tl.times_us[1:]))
    check_no_overlap(tl)


def test_fixture_timeline():
    (tl,) = build_timelines(FIXTURE)
    trace = json.load(open(FIXTURE))["device_traces"][0]
    allocs = [e for e in trace if e["action"] == "alloc"]
    assert tl.close_action == "free_completed"
    assert sum(1 for a in tl.allocations if not a.before_trace) == len(allocs)
    before = [a for a in tl.allocations if a.before_trace]
    assert [a.size for a in before] == [12 * MiB] * 3  # the weights, from the segments
    assert all(a.callsite.startswith("load_weights") for a in before)
    suspects = tl.leak_suspects()
    assert sorted({a.callsite for a in suspects}) == ["keep_history (train.py:88)",
                                                     "log_stats (train.py:95)"]
    assert len(suspects) == 6 and sum(a.size for a in suspects) == 3 * (2 * MiB + 128 * 1024)
    pending = [a for a in tl.allocations if a.free_requested and a.alive_at_end]
    assert [a.callsite for a in pending] == ["copy_to_host (train.py:150)"]
    reserved_end = sum(s["total_size"] for s in json.load(open(FIXTURE))["segments"])
    assert tl.reserved is not None and tl.reserved[-1][1] == reserved_end
    assert max(y for _, y in tl.reserved) > reserved_end  # the scratch segment came and went
    assert [m[2] for m in tl.markers] == ["oom", "empty_cache"]
    assert tl.peak[0] >= max(tl.totals) and tl.peak[0] > tl.totals[-1]
    check_no_overlap(tl)


def test_frees_of_unknown_blocks_start_before_the_trace():
    trace = [trace_event("free_requested", 0x10, 4096, 1.0),
             trace_event("alloc", 0x20, 512, 2.0)]
    (tl,) = build_timelines({"segments": [], "device_traces": [trace]})
    first, second = tl.allocations
    assert first.before_trace and first.start == 0 and first.end == 1
    assert not first.leak_suspect and second.leak_suspect
    assert tl.close_action == "free_requested"


def test_reserved_line_follows_expandable_segment_maps_and_unmaps():
    """Expandable segments grow by segment_map and shrink by segment_unmap (torch's actions)."""
    trace = [trace_event("segment_map", 0x1000, 20 * MiB, 1.0),
             trace_event("alloc", 0x1000, 12 * MiB, 2.0),
             trace_event("segment_map", 0x1000 + 20 * MiB, 20 * MiB, 3.0),
             trace_event("alloc", 0x1000 + 12 * MiB, 24 * MiB, 4.0),
             trace_event("free_completed", 0x1000 + 12 * MiB, 24 * MiB, 5.0),
             trace_event("segment_unmap", 0x1000 + 20 * MiB, 20 * MiB, 6.0)]
    segment = {"device": 0, "address": 0x1000, "total_size": 20 * MiB, "is_expandable": True,
               "segment_type": "large", "blocks": []}
    (tl,) = build_timelines({"segments": [segment], "device_traces": [trace]})
    assert tl.reserved is not None
    assert max(y for _, y in tl.reserved) == 40 * MiB and tl.reserved[-1][1] == 20 * MiB
    assert tl.reserved[0][1] == 0


def test_callsite_skips_gpurt_frames():
    frames = [{"filename": "/venv/site-packages/gpurt/memory.py", "line": 3, "name": "alloc"},
              {"filename": "/home/u/model.py", "line": 42, "name": "forward"}]
    assert callsite(frames) == "forward (model.py:42)"
    assert callsite(frames[:1]) == "alloc (memory.py:3)"
    assert callsite([]) == "(no stack recorded)"


def test_callsite_skips_frames_of_gpurt_subpackages_but_not_bundled_kernels():
    frames = [{"filename": "/venv/site-packages/gpurt/_memory/allocator.py", "line": 9,
               "name": "malloc"},
              {"filename": "/venv/site-packages/gpurt/kernels/gemm.py", "line": 7, "name": "gemm"}]
    assert callsite(frames) == "gemm (gemm.py:7)"


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * MiB) == "3.00 MiB"
    assert format_bytes(5 << 40) == "5120.00 GiB"


def test_load_snapshot_errors(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        load_snapshot(tmp_path / "missing.json")
    (tmp_path / "pickle.bin").write_bytes(b"\x80\x04\x95garbage")
    with pytest.raises(ValueError, match="_dump_snapshot"):
        load_snapshot(tmp_path / "pickle.bin")
    with pytest.raises(ValueError, match="segments"):
        load_snapshot({"hello": 1})


def test_generator_matches_fixture():
    """The committed fixture is what the generator makes (regenerate both together)."""
    assert synthetic().make_snapshot(steps=3) == json.load(open(FIXTURE))


# -- the HTML page ------------------------------------------------------------------------

def page_data(path):
    text = open(path, encoding="utf-8").read()
    match = re.search(r'<script type="application/json" id="memviz-data">(.*?)</script>', text,
                      re.S)
    assert match, "the page embeds its data"
    return text, json.loads(match.group(1))


def test_html_from_the_recorded_file(tmp_path):
    out = memviz.render_html(FIXTURE, tmp_path / "mem.html")
    text, data = page_data(out)
    (tl,) = data["timelines"]
    trace = json.load(open(FIXTURE))["device_traces"][0]
    assert tl["count"] == sum(1 for e in trace if e["action"] == "alloc")
    assert tl["leak_count"] == 6 and tl["leak_bytes"] == 3 * (2 * MiB + 128 * 1024)
    assert sum(b["leak"] for b in tl["bands"]) == 6
    assert sum(b["pend"] for b in tl["bands"]) == 1
    assert tl["oom_count"] == 1
    leaky = {c["name"]: c["leak_count"] for c in tl["callsites"] if c["leak_count"]}
    assert leaky == {"keep_history (train.py:88)": 3, "log_stats (train.py:95)": 3}
    assert "never freed" in text and "leak suspects" in text
    assert "memory_snapshot.json" in text  # the title names the file
    # self-contained: no scripts, styles or images fetched from anywhere
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', text)
    assert "<link" not in text and "@import" not in text


def test_html_escapes_hostile_frame_names(tmp_path):
    trace = [trace_event("alloc", 0x10, 4096, 1.0, name="</script><script>alert(1)</script>")]
    out = memviz.render_html({"segments": [], "device_traces": [trace]}, tmp_path / "x.html",
                             title="<b>title</b>")
    text, data = page_data(out)
    assert "</script><script>alert" not in text
    assert "&lt;b&gt;title&lt;/b&gt;" in text
    assert data["timelines"][0]["leak_count"] == 1


def test_html_of_a_snapshot_without_trace(tmp_path):
    snap = json.load(open(FIXTURE))
    snap["device_traces"] = []
    _, data = page_data(memviz.render_html(snap, tmp_path / "s.html"))
    (tl,) = data["timelines"]
    assert tl["steps"] == 0 and tl["count"] == 0 and tl["leak_count"] == 0
    assert tl["notices"] and "_record_memory_history" in tl["notices"][0]
    assert len(tl["bands"]) == 10  # the weights, 6 never freed, 1 free pending


def test_html_merges_small_allocations_but_keeps_leaks(tmp_path):
    snap = synthetic().make_snapshot(steps=8)
    _, data = page_data(memviz.render_html(snap, tmp_path / "m.html", max_bands=20))
    (tl,) = data["timelines"]
    assert len(tl["bands"]) == 20 and tl["merged_count"] > 0
    assert sum(b["leak"] for b in tl["bands"]) == 10  # half the bands go to leak suspects


# -- the PNG ------------------------------------------------------------------------------

def png_size(path):
    with open(path, "rb") as fh:
        head = fh.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = memviz.render_png(FIXTURE, tmp_path / "mem.png")
    width, height = png_size(out)
    assert 1200 <= width <= 2400 and 600 <= height <= 1400
    assert os.path.getsize(out) > 20_000


def test_png_two_devices_stack_vertically(tmp_path):
    pytest.importorskip("matplotlib")
    snap = json.load(open(FIXTURE))
    snap["device_traces"].append(snap["device_traces"][0][:40])
    width, height = png_size(memviz.render_png(snap, tmp_path / "two.png"))
    single = png_size(memviz.render_png(FIXTURE, tmp_path / "one.png"))
    assert width == single[0] and height > 1.7 * single[1]


def test_png_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"gpurt\[plot\]"):
        memviz.render_png(FIXTURE, tmp_path / "x.png")


def test_png_of_an_empty_snapshot_says_so(tmp_path):
    pytest.importorskip("matplotlib")
    with pytest.raises(ValueError, match="no devices"):
        memviz.render_png({"segments": [], "device_traces": [[]]}, tmp_path / "x.png")


# -- the command --------------------------------------------------------------------------

def test_memviz_main_writes_both(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    html_path, png_path = tmp_path / "o.html", tmp_path / "o.png"
    assert memviz.memviz_main([FIXTURE, "-o", str(html_path), "--png", str(png_path)]) == 0
    assert html_path.stat().st_size > 10_000 and png_size(png_path)[0] > 0
    out = capsys.readouterr().out
    assert "6 never freed" in out and "wrote" in out


def test_memviz_main_default_output_and_errors(tmp_path, capsys):
    snap = tmp_path / "snap.json"
    snap.write_text(open(FIXTURE).read())
    assert memviz.memviz_main([str(snap)]) == 0
    assert (tmp_path / "snap.html").exists()
    assert memviz.memviz_main([str(tmp_path / "nope.json")]) == 1
    assert "gpurt memviz: error: cannot read" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        memviz.memviz_main(["--help"])


# -- on the GPU ---------------------------------------------------------------------------

@pytest.mark.gpu
def test_history_of_real_allocations(gpu_state, tmp_path):
    memory = importlib.import_module("gpurt.memory")
    needed = ("_record_memory_history", "_snapshot", "_dump_snapshot",
              "caching_allocator_alloc", "caching_allocator_delete")
    if not all(hasattr(memory, name) for name in needed):
        pytest.skip("gpurt.memory's history API is not available yet")
    kept = freed = None
    path = str(tmp_path / "snap.json")
    memory._record_memory_history("all")
    try:
        kept = memory.caching_allocator_alloc(3 * MiB + 100)  # a live one at the end
        freed = memory.caching_allocator_alloc(256 * 1024)
        memory.caching_allocator_delete(freed)
        gpurt.synchronize()
        memory._dump_snapshot(path)
    finally:
        memory._record_memory_history(None)
    try:
        tl = next(t for t in build_timelines(path) if t.device == gpurt.current_device())
        ours = {a.address: a for a in tl.allocations if not a.before_trace}
        assert kept in ours and freed in ours
        assert ours[kept].size >= 3 * MiB + 100 and ours[kept].leak_suspect
        assert ours[freed].end is not None and not ours[freed].leak_suspect
        assert ours[kept].callsite.startswith("test_history_of_real_allocations")
        _, data = page_data(memviz.render_html(path, tmp_path / "real.html"))
        (page,) = [t for t in data["timelines"] if t["device"] == tl.device]
        assert page["leak_count"] >= 1
    finally:
        if kept is not None:
            memory.caching_allocator_delete(kept)

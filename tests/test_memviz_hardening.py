"""gpurt memviz with hostile or broken snapshots (issue #18): the page template is filled in
one pass, the data block cannot be broken out of, and NaN/Infinity or wrongly typed fields
give a clear error and exit code 2. CPU only."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from gpurt import memviz
from gpurt._profiler.memtimeline import SnapshotError, load_snapshot
from gpurt._profiler.memviz_page import PAGE

EVIL = "<img src=x onerror=alert(1)></script><script>alert(2)</script><!-- x"


def snapshot(name: str = "f", **event_fields: object) -> dict:
    event = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 1.0,
             "frames": [{"filename": "/x/app.py", "line": 3, "name": name}]}
    event.update(event_fields)
    return {"segments": [], "device_traces": [[event]]}


def data_block(page: str) -> str:
    return re.search(r'id="memviz-data">(.*?)</script>', page, re.S).group(1)


def test_a_file_named_with_the_data_marker_keeps_the_data_out_of_the_heading(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run__DATA__.json"
    path.write_text(json.dumps(snapshot(EVIL)))
    out = tmp_path / "page.html"
    assert memviz.memviz_main([str(path), "-o", str(out)]) == 0
    page = out.read_text()
    heading = re.search(r"<h1>(.*?)</h1>", page, re.S).group(1)
    assert heading == "gpurt memory timeline: run__DATA__.json"
    assert "<img" not in page


def test_the_data_block_cannot_be_broken_out_of(tmp_path: Path) -> None:
    out = tmp_path / "page.html"
    memviz.render_html(snapshot(EVIL), out, title="t")
    page = out.read_text()
    for marker in ("<script", "</script", "<!--"):
        assert page.lower().count(marker) == PAGE.lower().count(marker), marker
    block = data_block(page)
    assert "<" not in block
    frames = json.loads(block)["timelines"][0]
    assert EVIL in json.dumps(frames, ensure_ascii=False)  # the text survives, escaped


@pytest.mark.parametrize("text, problem", [
    ('{"segments": [], "device_traces": [[{"action": "alloc", "time_us": NaN}]]}', "NaN"),
    ('{"segments": [], "device_traces": [[{"action": "alloc", "size": Infinity}]]}',
     "Infinity"),
    ('{"segments": [], "device_traces": [[{"action": "alloc", "size": "big"}]]}', "size"),
    ('{"segments": [], "device_traces": [[{"action": "alloc", "size": -5}]]}', "size"),
    ('{"segments": [], "device_traces": [[{"action": "alloc", "addr": 1.5}]]}', "addr"),
    ('{"segments": [], "device_traces": [[{"action": 3}]]}', "action"),
    ('{"segments": [], "device_traces": [[{"action": "alloc", "time_us": "1"}]]}', "time_us"),
    ('{"segments": [], "device_traces": [[{"action": "alloc", "frames": "x"}]]}', "frames"),
    ('{"segments": [], "device_traces": [[{"action": "alloc", "frames": [{"line": "3"}]}]]}',
     "line"),
    ('{"segments": [], "device_traces": [["alloc"]]}', "an object"),
    ('{"segments": [], "device_traces": {"0": []}}', "device_traces"),
    ('{"segments": [{"device": 99999}], "device_traces": []}', "device"),
    ('{"segments": [{"device": -1}], "device_traces": []}', "device"),
    ('{"segments": [{"blocks": [{"size": true}]}], "device_traces": []}', "size"),
    ('{"segments": "none", "device_traces": []}', "segments"),
    ('[' * 100_000, "not a JSON memory snapshot"),
])
def test_a_bad_snapshot_exits_2_with_a_clear_error(tmp_path: Path, capsys, text: str,
                                                   problem: str) -> None:
    path = tmp_path / "snap.json"
    path.write_text(text)
    assert memviz.memviz_main([str(path), "-o", str(tmp_path / "out.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpurt memviz: error: ") and problem in err
    assert "Traceback" not in err
    assert not (tmp_path / "out.html").exists()


def test_a_dict_with_nan_is_refused_too(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="time_us"):
        memviz.render_html(snapshot(time_us=math.nan), tmp_path / "x.html")
    assert load_snapshot(snapshot())["device_traces"][0][0]["size"] == 512

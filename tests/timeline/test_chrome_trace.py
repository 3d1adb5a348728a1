"""The Chrome trace-event export: the shape Perfetto and chrome://tracing read, and its content."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest

from accelplat._cli import main as cli_main
from accelplat._types import GIB
from accelplat.timeline import (
    DeviceTrack,
    Sample,
    TestSpan,
    Trace,
    WaitSpan,
    save_trace,
    write_report,
)
from accelplat.timeline._chrome import render_chrome_trace

STARTED = 1_767_225_600.25


def _trace() -> Trace:
    """Two devices, three tests (two in parallel), two overlapping waits, a leak on device 1."""
    used = [(0, 0), (8 * GIB, 0), (8 * GIB, 0), (0, 2 * GIB), (0, 2 * GIB), (0, None)]
    samples = tuple(Sample(k * 0.5, reading) for k, reading in enumerate(used))
    tests = (
        TestSpan("t.py::test_a", 0.25, 1.25, (0, 0), (0, 0), "passed", 0.3),
        TestSpan("t.py::test_b", 0.5, 1.0, (0, 0), (0, 0), "passed", None),  # parallel to a
        TestSpan("t.py::test_leaky", 1.3, 1.6, (0, 0), (0, 2 * GIB), "failed", 1.35),
    )
    waits = (
        WaitSpan(0.5, 1.0, "settle", (0,), True, "t.py::test_a"),
        WaitSpan(0.75, 1.2, "clear", (1,), False, "t.py::test_b"),
    )
    return Trace(
        devices=(DeviceTrack(0, "GPU 0", 80 * GIB), DeviceTrack(1, "GPU 1", 80 * GIB)),
        samples=samples,
        tests=tests,
        waits=waits,
        platform="fakegpu",
        started_at=STARTED,
        duration=2.5,
        sample_hz=2.0,
        leak_grace_s=1.0,
    )


def _check_shape(doc: Any) -> list[dict[str, Any]]:
    """Assert the Trace Event Format's object form; return the events."""
    assert set(doc) == {"traceEvents", "displayTimeUnit", "otherData"}
    assert doc["displayTimeUnit"] in ("ms", "ns")
    events = doc["traceEvents"]
    assert isinstance(events, list)
    for e in events:
        assert isinstance(e["name"], str)
        assert e["ph"] in ("M", "C", "X")
        assert isinstance(e["pid"], int)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name")
            assert isinstance(e["tid"], int)
            assert isinstance(e["args"], dict)
            continue
        assert isinstance(e["ts"], float)
        assert e["ts"] >= 0
        if e["ph"] == "C":
            assert set(e["args"]) == {"bytes"}
            assert isinstance(e["args"]["bytes"], int)
        else:
            assert isinstance(e["tid"], int)
            assert isinstance(e["dur"], float)
            assert e["dur"] >= 0
            assert isinstance(e["cat"], str)
    return events


def test_the_document_has_the_trace_event_shape_and_strict_json() -> None:
    doc = render_chrome_trace(_trace())
    text = json.dumps(doc, allow_nan=False)  # no NaN or infinity: strict JSON
    _check_shape(json.loads(text))


def test_memory_is_a_counter_per_device_in_microseconds_of_wall_time() -> None:
    trace = _trace()
    events = _check_shape(render_chrome_trace(trace))
    names = {"device 0 used memory (GPU 0)": 0, "device 1 used memory (GPU 1)": 1}
    for name, pos in names.items():
        points = [(e["ts"], e["args"]["bytes"]) for e in events if e["name"] == name]
        assert [ts for ts, _ in points] == sorted(ts for ts, _ in points)
        for s in trace.samples:  # a counter holds its value: each reading is what it shows
            if s.used[pos] is None:
                continue
            ts = (STARTED + s.t) * 1e6
            shown = [v for t, v in points if t <= ts + 1e-3][-1]
            assert shown == s.used[pos], (name, s.t)
        assert len(points) < len(trace.samples)  # repeats are not written
    leaky = [e for e in events if e["name"] == "t.py::test_leaky"]
    assert leaky[0]["ts"] == pytest.approx((STARTED + 1.3) * 1e6)
    assert leaky[0]["dur"] == pytest.approx(0.3e6)


def test_tests_and_waits_are_slices_that_nest_on_named_lanes() -> None:
    events = _check_shape(render_chrome_trace(_trace()))
    slices = [e for e in events if e["ph"] == "X"]
    assert sorted(e["name"] for e in slices) == sorted(
        ["t.py::test_a", "t.py::test_b", "t.py::test_leaky", "settle", "clear"]
    )
    threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {threads[e["tid"]] for e in slices if e["cat"] == "tests"} == {"tests 1", "tests 2"}
    assert {threads[e["tid"]] for e in slices if e["cat"] == "memory-wait"} == {
        "memory waits 1",
        "memory waits 2",
    }
    for tid in threads:  # on one thread, slices nest or follow: never cross
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in slices if e["tid"] == tid)
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end
    (process,) = [e for e in events if e["name"] == "process_name"]
    assert process["args"]["name"] == "accelplat memory timeline (fakegpu)"
    leaky = next(e for e in slices if e["name"] == "t.py::test_leaky")
    assert leaky["args"]["left_held_bytes"] == {"1": 2 * GIB}
    assert leaky["args"]["outcome"] == "failed"
    clear = next(e for e in slices if e["name"] == "clear")
    assert clear["args"] == {"devices": [1], "ok": False, "test": "t.py::test_b"}


def test_report_writes_the_chrome_trace_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = save_trace(_trace(), tmp_path / "t.json")
    out = tmp_path / "t.chrome.json"
    assert cli_main(["report", str(src), "--chrome-trace", str(out)]) == 0
    assert "wrote" in capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert doc == json.loads(json.dumps(render_chrome_trace(_trace())))
    assert not (tmp_path / "report.html").exists()  # only what was asked for
    # the page and the trace together; an override of the tolerance reaches both
    page = tmp_path / "r.html"
    args = ["report", str(src), "--out", str(page), "--chrome-trace", str(out)]
    assert cli_main([*args, "--leak-tolerance", "4GiB"]) == 0
    assert page.is_file()
    assert not any(
        "left_held_bytes" in e.get("args", {}) for e in json.loads(out.read_text())["traceEvents"]
    )


def test_report_without_an_output_is_bad_usage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = save_trace(_trace(), tmp_path / "t.json")
    assert cli_main(["report", str(src)]) == 2
    assert "--out REPORT.html or --chrome-trace" in capsys.readouterr().err


def test_a_special_file_is_never_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    src = save_trace(_trace(), tmp_path / "t.json")
    try:
        code = cli_main(["report", str(src), "--chrome-trace", str(fifo)])
    except SystemExit as exc:  # argparse refuses it up front
        code = int(exc.code or 0)
    assert code == 2
    assert "not a regular file" in capsys.readouterr().err
    with pytest.raises(OSError, match="not a regular file"):
        write_report(_trace(), fifo, format="chrome")  # the writer refuses too
    assert fifo.is_fifo()

"""Export a :class:`~accelplat.timeline._trace.Trace` as Chrome trace-event JSON.

The format Perfetto (ui.perfetto.dev) and ``chrome://tracing`` open, and torch's profiler
writes: each device's used memory is a counter track (``"C"`` events), each test (or recorded
command) and memory wait a slice (``"X"``), and the tracks are named by metadata (``"M"``).
Timestamps are microseconds since the Unix epoch, so a run lines up with other traces of the
same host's wall clock. The format is described in Google's "Trace Event Format" document.
"""

from __future__ import annotations

import json
from typing import Any

from accelplat.timeline._trace import Trace, lanes

PID = 1  # one process: the recording
_TESTS_TID, _WAITS_TID = 1000, 2000  # lanes of tests count up from 1000, of waits from 2000


def render_chrome_trace(trace: Trace) -> dict[str, Any]:
    """Return ``trace`` as a Chrome trace-event document (``{"traceEvents": [...], ...}``).

    Memory is a counter per device in bytes; tests and waits are complete slices, each on the
    first free lane of its kind; leaks are in their test's ``args``.
    """

    def us(t: float) -> float:
        return round((trace.started_at + t) * 1e6, 3)

    what = "command" if trace.command is not None else "tests"
    events: list[dict[str, Any]] = [
        _meta("process_name", 0, name=f"accelplat memory timeline ({trace.platform or 'none'})"),
        _meta("process_sort_index", 0, sort_index=0),
    ]
    names = [f"device {d.index} used memory ({d.name})" for d in trace.devices]
    last: list[int | None] = [None] * len(names)
    for k, s in enumerate(trace.samples):
        for pos, (name, value) in enumerate(zip(names, s.used, strict=False)):
            # A counter holds its value until the next event: a change (or the last reading)
            # is written, a repeat is not; a missing reading is no point.
            if value is not None and (value != last[pos] or k == len(trace.samples) - 1):
                events.append(
                    {"name": name, "ph": "C", "ts": us(s.t), "pid": PID, "args": {"bytes": value}}
                )
                last[pos] = value
    leaked: dict[str, dict[str, int]] = {}
    for leak in trace.leaks():
        leaked.setdefault(leak.nodeid, {})[str(leak.device)] = leak.leaked
    test_lanes = lanes(trace.tests)
    for lane in sorted(set(test_lanes)):
        events.append(_meta("thread_name", _TESTS_TID + lane, name=f"{what} {lane + 1}"))
    for span, lane in zip(trace.tests, test_lanes, strict=True):
        args: dict[str, Any] = {"outcome": span.outcome}
        if span.body_start is not None:
            args["body_start_us"] = us(span.body_start)
        if span.nodeid in leaked:
            args["left_held_bytes"] = leaked[span.nodeid]
        tid = _TESTS_TID + lane
        events.append(_slice(span.nodeid, what, us(span.start), span.duration, tid=tid, args=args))
    wait_lanes = lanes(trace.waits)
    for lane in sorted(set(wait_lanes)):
        events.append(_meta("thread_name", _WAITS_TID + lane, name=f"memory waits {lane + 1}"))
    for w, lane in zip(trace.waits, wait_lanes, strict=True):
        args = {"devices": list(w.devices), "ok": w.ok, "test": w.test}
        tid = _WAITS_TID + lane
        events.append(_slice(w.kind, "memory-wait", us(w.start), w.duration, tid=tid, args=args))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": "accelplat",
            "platform": trace.platform,
            "started_at": trace.started_at,
            "command": None if trace.command is None else list(trace.command),
            "exit_code": trace.exit_code,
            "leak_tolerance_bytes": trace.leak_tolerance_bytes,
        },
    }


def _meta(kind: str, tid: int, **args: Any) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": PID, "tid": tid, "args": args}


def _slice(
    name: str, cat: str, ts: float, seconds: float, *, tid: int, args: dict[str, Any]
) -> dict[str, Any]:
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": ts,
        "dur": round(max(seconds, 0.0) * 1e6, 3),
        "pid": PID,
        "tid": tid,
        "args": args,
    }


def chrome_trace_text(trace: Trace) -> str:
    """Return :func:`render_chrome_trace`'s document as compact JSON text."""
    return json.dumps(render_chrome_trace(trace), allow_nan=False, separators=(",", ":")) + "\n"

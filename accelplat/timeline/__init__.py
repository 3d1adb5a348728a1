"""Device-memory timelines: sample memory while tests or a command run, then render a report.

Two ways to record:

* ``pytest --accelplat-timeline=report.html`` samples every visible device while the session runs,
  tags the samples with the test that was running and the memory waits that happened, and writes
  one self-contained HTML page (see :mod:`accelplat.timeline.pytest_hooks`).
* ``accelplat record --out trace.json -- COMMAND …`` samples while a command runs; ``accelplat
  report trace.json --out report.html`` renders the same page from the saved trace.

Building blocks: :class:`Recorder` and :class:`Sampler` (sampling with bounded storage),
:class:`Trace` and its JSON form (:func:`save_trace`, :func:`load_trace`), and
:func:`render_html` / :func:`write_report`.

Importing this package imports no framework and queries no device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelplat._lazy import lazy_namespace

# Names load on first use: the pytest plugin (``accelplat.timeline.pytest_hooks``) is imported
# by every pytest session, and most never ask for a timeline, so nothing is imported up front.
_EXPORTS: dict[str, str] = {
    "render_html": "accelplat.timeline.render",
    "write_report": "accelplat.timeline.render",
    "DEFAULT_CAPACITY": "accelplat.timeline.sampler",
    "DEFAULT_HZ": "accelplat.timeline.sampler",
    "Recorder": "accelplat.timeline.sampler",
    "SampleBuffer": "accelplat.timeline.sampler",
    "Sampler": "accelplat.timeline.sampler",
    "platform_reader": "accelplat.timeline.sampler",
    "DEFAULT_LEAK_TOLERANCE_BYTES": "accelplat.timeline.trace",
    "TRACE_FORMAT": "accelplat.timeline.trace",
    "TRACE_VERSION": "accelplat.timeline.trace",
    "DeviceTrack": "accelplat.timeline.trace",
    "Leak": "accelplat.timeline.trace",
    "Sample": "accelplat.timeline.trace",
    "TestSpan": "accelplat.timeline.trace",
    "Trace": "accelplat.timeline.trace",
    "WaitSpan": "accelplat.timeline.trace",
    "dumps_trace": "accelplat.timeline.trace",
    "load_trace": "accelplat.timeline.trace",
    "loads_trace": "accelplat.timeline.trace",
    "save_trace": "accelplat.timeline.trace",
}

__all__ = [
    "DEFAULT_CAPACITY",
    "DEFAULT_HZ",
    "DEFAULT_LEAK_TOLERANCE_BYTES",
    "TRACE_FORMAT",
    "TRACE_VERSION",
    "DeviceTrack",
    "Leak",
    "Recorder",
    "Sample",
    "SampleBuffer",
    "Sampler",
    "TestSpan",
    "Trace",
    "WaitSpan",
    "dumps_trace",
    "load_trace",
    "loads_trace",
    "platform_reader",
    "render_html",
    "save_trace",
    "write_report",
]


__getattr__, __dir__ = lazy_namespace(__name__, _EXPORTS, globals())


if TYPE_CHECKING:
    from accelplat.timeline.render import render_html, write_report
    from accelplat.timeline.sampler import (
        DEFAULT_CAPACITY,
        DEFAULT_HZ,
        Recorder,
        SampleBuffer,
        Sampler,
        platform_reader,
    )
    from accelplat.timeline.trace import (
        DEFAULT_LEAK_TOLERANCE_BYTES,
        TRACE_FORMAT,
        TRACE_VERSION,
        DeviceTrack,
        Leak,
        Sample,
        TestSpan,
        Trace,
        WaitSpan,
        dumps_trace,
        load_trace,
        loads_trace,
        save_trace,
    )

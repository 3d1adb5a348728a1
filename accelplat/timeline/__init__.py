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

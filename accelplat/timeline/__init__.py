"""Device-memory timelines: sample memory while tests or a command run, then render a report.

Two ways to record:

* ``pytest --accelplat-timeline=report.html`` samples every visible device while the session runs,
  tags the samples with the test that was running and the memory waits that happened, and writes
  one self-contained HTML page (see :mod:`accelplat.pytest_plugin._timeline`).
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

# Names load on first use: the pytest plugin (``accelplat.pytest_plugin._timeline``) is imported
# by every pytest session, and most never ask for a timeline, so nothing is imported up front.
_EXPORTS: dict[str, str] = {
    "render_html": "accelplat.timeline._render",
    "write_report": "accelplat.timeline._render",
    "DEFAULT_CAPACITY": "accelplat.timeline._sampler",
    "DEFAULT_HZ": "accelplat.timeline._sampler",
    "Recorder": "accelplat.timeline._sampler",
    "SampleBuffer": "accelplat.timeline._sampler",
    "Sampler": "accelplat.timeline._sampler",
    "platform_reader": "accelplat.timeline._sampler",
    "DEFAULT_LEAK_TOLERANCE_BYTES": "accelplat.timeline._trace",
    "TRACE_FORMAT": "accelplat.timeline._trace",
    "TRACE_VERSION": "accelplat.timeline._trace",
    "DeviceTrack": "accelplat.timeline._trace",
    "Leak": "accelplat.timeline._trace",
    "Sample": "accelplat.timeline._trace",
    "TestSpan": "accelplat.timeline._trace",
    "Trace": "accelplat.timeline._trace",
    "WaitSpan": "accelplat.timeline._trace",
    "dumps_trace": "accelplat.timeline._trace",
    "load_trace": "accelplat.timeline._trace",
    "loads_trace": "accelplat.timeline._trace",
    "save_trace": "accelplat.timeline._trace",
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
    from accelplat.timeline._render import render_html, write_report
    from accelplat.timeline._sampler import (
        DEFAULT_CAPACITY,
        DEFAULT_HZ,
        Recorder,
        SampleBuffer,
        Sampler,
        platform_reader,
    )
    from accelplat.timeline._trace import (
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

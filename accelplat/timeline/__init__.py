"""Device-memory timelines: sample memory while tests or a command run, then render a report.

``pytest --accelplat-timeline=report.html``, or ``accelplat record`` then ``accelplat report``,
write one self-contained HTML page (or Chrome trace-event JSON for Perfetto); the names below
do it from Python (``docs/timeline.md``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelplat import _lazy

# Names load on first use: the pytest plugin imports this package in every session.
_EXPORTS: dict[str, str] = {
    "DeviceTrack": "accelplat.timeline._trace",
    "Recorder": "accelplat.timeline._sampler",
    "Sample": "accelplat.timeline._trace",
    "Sampler": "accelplat.timeline._sampler",
    "TestSpan": "accelplat.timeline._trace",
    "Trace": "accelplat.timeline._trace",
    "WaitSpan": "accelplat.timeline._trace",
    "load_trace": "accelplat.timeline._trace",
    "save_trace": "accelplat.timeline._trace",
    "write_report": "accelplat.timeline._render",
}

__all__ = sorted(_EXPORTS)  # noqa: PLE0605 (the names are _EXPORTS' keys, one list to keep)

__getattr__, __dir__ = _lazy.lazy_namespace(__name__, _EXPORTS, globals())

if TYPE_CHECKING:
    from accelplat.timeline._render import write_report as write_report
    from accelplat.timeline._sampler import Recorder as Recorder
    from accelplat.timeline._sampler import Sampler as Sampler
    from accelplat.timeline._trace import DeviceTrack as DeviceTrack
    from accelplat.timeline._trace import Sample as Sample
    from accelplat.timeline._trace import TestSpan as TestSpan
    from accelplat.timeline._trace import Trace as Trace
    from accelplat.timeline._trace import WaitSpan as WaitSpan
    from accelplat.timeline._trace import load_trace as load_trace
    from accelplat.timeline._trace import save_trace as save_trace

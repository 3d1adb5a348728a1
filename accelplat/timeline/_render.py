"""Render a :class:`~accelplat.timeline._trace.Trace` as one self-contained HTML page.

Charts are inline SVG; trace strings are escaped. A checkbox switches the fitted y-axes to
0..total with CSS alone: each chart is drawn at both scales, the y-independent layers once.
"""

from __future__ import annotations

import bisect
import html
import itertools
import math
import os
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal, NamedTuple

from accelplat import _files
from accelplat._types import GIB, MIB
from accelplat._util import format_bytes
from accelplat.timeline._trace import Leak, Reading, Sample, TestSpan, Trace, WaitSpan

_PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
_LEAK, _WAIT, _WAIT_FAILED, _FAILED = "#d62728", "#ff7f0e", "#b30000", "#4b5563"
_CONTEXT_NOTE = "This platform's memory queries create a device context in the sampling process."


class _Geometry(NamedTuple):
    """A chart's drawing, in SVG user units: one for desktops, one for phones (CSS picks)."""

    cls: str  # "" or "phone", a class of the <svg>
    w: int  # the width
    left: int  # the margins of the plot
    right: int
    top: int
    plot_h: int
    axis_h: int  # the time axis' labels, below the plot
    lane_h: int  # a test lane
    font: int  # of axis labels
    lane_font: int  # of a test's name in its lane
    tick_gap: int  # the least distance between two time labels

    @property
    def plot_w(self) -> int:
        return self.w - self.left - self.right


# At 1240 CSS px a desktop chart draws 11-unit text at 11 px; a phone (390 px wide, 350 px for
# the chart) draws the 600-unit chart at 0.58: 19 units make 11 px, as on the desktop.
_WIDE = _Geometry("", 1200, 78, 16, 12, 220, 30, 16, 11, 10, 100)
_PHONE = _Geometry("phone", 600, 104, 26, 20, 260, 40, 26, 19, 16, 110)
_MAX_LANES = 6
_FOLDS = 4  # at most this many stretches without change are folded
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#1d1d1f;
background:#fff}h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px}
h3{font-size:15px;margin:18px 0 4px}.sub{color:#555;margin:0 0 16px}
dl.summary{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;margin:0}
dl.summary dt{color:#555}dl.summary dd{margin:0}.badges{margin:14px 0}
.badge{display:inline-block;padding:4px 10px;margin:0 8px 6px 0;border-radius:12px;
background:#eef2f7;font-weight:600}.badge.bad{background:#fde8e8;color:#a3161a}
.badge.warn{background:#fff1e0;color:#8a4b00}.badge.good{background:#e6f4ea;color:#17622e}
.notes{background:#fff8e1;border-left:4px solid #f0b400;padding:6px 12px}
svg.chart{width:100%;height:auto;display:block;border:1px solid #e3e6ea;border-radius:6px}
svg text{font:11px system-ui,sans-serif;fill:#444}.legend{margin:4px 0 0;color:#444;font-size:12px}
.legend span{display:inline-block;margin-right:16px}
.sw{display:inline-block;width:18px;height:10px;margin-right:5px;vertical-align:middle;
border-radius:2px}table{border-collapse:collapse;margin:4px 0 8px;font-size:13px}
th,td{border-bottom:1px solid #e3e6ea;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#f6f8fa}td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
td.id{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;overflow-wrap:anywhere}
tr.leak td{background:#fdecec}td.grew{color:#a3161a;font-weight:600}
tr.wait-failed td{background:#fdecec}.ok{color:#17622e}.failed{color:#a3161a;font-weight:600}
.skipped{color:#8a6d00}details summary{cursor:pointer;font-weight:600;margin:8px 0}
footer{margin-top:32px;color:#777;font-size:12px}.scale{margin:6px 0 10px;color:#444}
svg.chart{display:none}.charts svg.chart.fit-scale{display:block}.peak{color:#444;font-weight:400}
#full-scale:checked~.charts svg.chart.fit-scale{display:none}
#full-scale:checked~.charts svg.chart.full-scale{display:block}
.charts svg.chart.phone.fit-scale,
#full-scale:checked~.charts svg.chart.phone.full-scale{display:none}
svg text.lane-label{font:10px ui-monospace,SFMono-Regular,Menlo,monospace;fill:#1d1d1f}
svg text.peak-label{font:11px system-ui,sans-serif;font-weight:600;fill:#1d1d1f}
svg.phone text{font-size:19px}svg.phone text.lane-label{font-size:16px}
svg.phone text.peak-label{font-size:19px}h3,dd{overflow-wrap:anywhere}.scroll{overflow-x:auto}
@media (max-width:700px){body{margin:14px}
.charts svg.chart.fit-scale,#full-scale:checked~.charts svg.chart.full-scale{display:none}
.charts svg.chart.phone.fit-scale{display:block}
#full-scale:checked~.charts svg.chart.phone.fit-scale{display:none}
#full-scale:checked~.charts svg.chart.phone.full-scale{display:block}
dl.summary{gap:2px 10px}
table.stack,table.stack tbody,table.stack tr,table.stack td{display:block}
table.stack thead{display:none}table.stack tr{border:1px solid #e3e6ea;border-radius:6px;
margin:0 0 8px;padding:4px 0}table.stack td{border:0;padding:2px 10px;text-align:left}
table.stack td[data-label]::before{content:attr(data-label);display:inline-block;width:7.5em;
color:#555;font-family:system-ui,sans-serif}#tests td.id{min-width:16em}}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _fmt_s(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    minutes, rest = divmod(seconds, 60)
    if minutes < 120:
        return f"{int(minutes)} min {rest:.0f} s"
    return f"{minutes / 60:.1f} h"


def _fmt_short(seconds: float) -> str:  # a folded stretch's length, in few characters
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.0f} h"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _fmt_delta(n: int | None) -> str:
    return "?" if n is None else ("+" if n > 0 else "") + format_bytes(n)


def _nice_step(span: float, target: int) -> float:
    raw = span / max(1, target)
    if raw <= 0 or not math.isfinite(raw):
        return 1.0
    mag = 10.0 ** math.floor(math.log10(raw))
    return next((m * mag for m in (1, 2, 2.5, 5, 10) if raw <= m * mag), 10 * mag)


def _time_label(t: float, step: float) -> str:
    if step >= 60:
        h, rem = divmod(round(t), 3600)
        m, s = divmod(rem, 60)
        return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
    return f"{t:.{_decimals(step)}f} s"


def _decimals(step: float) -> int:  # what shows each multiple of ``step``: 2 for 0.25, 1 for 2.5
    return next((d for d in range(9) if abs(round(step, d) - step) <= step * 1e-6), 9)


def _lanes(spans: Sequence[TestSpan]) -> list[int]:  # the first lane free at each start
    ends: list[float] = []
    out: list[int] = []
    for span in spans:
        lane = next((k for k, end in enumerate(ends) if end <= span.start), None)
        if lane is None and len(ends) < _MAX_LANES:
            lane = len(ends)
            ends.append(span.end)
        elif lane is None:  # too many in parallel: share the lane that frees first
            lane = min(range(len(ends)), key=ends.__getitem__)
        ends[lane] = max(ends[lane], span.end)
        out.append(lane)
    return out


def _peak_of(trace: Trace, pos: int) -> tuple[int, float] | None:
    best: tuple[int, float] | None = None
    for s in trace.samples:
        value = s.used[pos] if pos < len(s.used) else None
        if value is not None and (best is None or value > best[0]):
            best = (value, s.t)
    for span in trace.tests:
        for value, t in ((span.used_before[pos], span.start), (span.used_after[pos], span.end)):
            if value is not None and (best is None or value > best[0]):
                best = (value, t)
    return best


def peaks_per_test(trace: Trace) -> list[Reading]:
    """Return per test the highest usage per device from its start to its end, both included."""
    times = [s.t for s in trace.samples]
    out: list[Reading] = []
    for span in trace.tests:
        lo = bisect.bisect_left(times, span.start)
        hi = bisect.bisect_right(times, span.end)
        peaks: list[int | None] = []
        for pos in range(len(trace.devices)):
            values = [span.used_before[pos], span.used_after[pos]]
            values += [s.used[pos] for s in trace.samples[lo:hi] if pos < len(s.used)]
            peaks.append(max((v for v in values if v is not None), default=None))
        out.append(tuple(peaks))
    return out


def _axis(lo: int, hi: int, total: int, *, full: bool) -> tuple[float, float]:
    # full: 0 to the total (or the peak, if higher). Fitted: a margin of a tenth of the range (at
    # least 1 MiB), down to 0 when the readings near it. A flat series (moving less than 2 % of
    # its reading) gets a tenth of the reading, or of a hundredth of the total: never a
    # ±1 MiB window that labels 20 GiB as 19.999, 20.000 and 20.001 GiB.
    if full:
        top = float(max(total, hi, 1))
        return 0.0, top if total > 0 else top * 1.1
    flat = hi - lo <= 0.02 * hi
    pad = max(hi * 0.1 if flat else (hi - lo) * 0.1, total * 0.01 if flat else 0.0, float(MIB))
    ymax = hi + pad
    if total > 0 and ymax > total >= hi:
        ymax = float(total)
    ymin = lo - pad
    if ymin < 0.25 * (ymax - ymin) or ymin < 0:
        ymin = 0.0
    return ymin, ymax


def _short_name(nodeid: str) -> str:  # the part worth a lane label: after the last ``::``
    name = nodeid.rsplit("::", 1)[-1]
    return name.rsplit("/", 1)[-1] or nodeid


def _program(command: Sequence[str]) -> str:  # a recorded command's lane label: its program
    return command[0].rsplit("/", 1)[-1] if command else ""


def _text_w(text: str, font: float) -> float:  # about, in a proportional font
    return 0.62 * font * len(text)


def _fit_label(text: str, width: float, font: float = 10) -> str:  # at ``font`` monospace
    capacity = int((width - 6) / (0.61 * font))
    if capacity >= len(text):
        return text
    return text[: capacity - 1] + "…" if capacity >= 6 else ""


def _envelope(
    samples: Sequence[Sample], pos: int, xs: Sequence[float], width: int
) -> list[list[tuple[float, int]]]:
    # Polyline segments of (x, used), a None reading ending one; per pixel column the first,
    # last, minimum and maximum are kept in time order, so spikes survive any thinning.
    segments: list[list[tuple[float, int]]] = [[]]
    column: list[tuple[float, int]] = []
    column_x: int | None = None

    def flush() -> None:
        if column:
            lo = min(column, key=lambda p: p[1])
            hi = max(column, key=lambda p: p[1])
            segments[-1].extend(sorted({column[0], lo, hi, column[-1]}, key=lambda p: p[0]))
            column.clear()

    for s, x in zip(samples, xs, strict=True):  # ``xs``: each sample's x
        value = s.used[pos] if pos < len(s.used) else None
        if value is None:
            flush()
            if segments[-1]:
                segments.append([])
            column_x = None
            continue
        col = min(width, int(x))
        if column_x is not None and col != column_x:
            flush()
        column_x = col
        column.append((x, value))
    flush()
    return [seg for seg in segments if seg]


class _Layers(NamedTuple):  # what both scales of a device's chart share
    band: str  # the test bands, drawn first
    body: str  # the test lanes and waits, drawn last
    height: int  # of the SVG
    peak: tuple[int, float] | None  # (bytes, seconds) of the highest reading
    low: int  # the lowest sampled reading
    envelope: list[list[tuple[float, int]]]  # the memory line's points (x, bytes)


_STEPS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300,
          600, 900, 1800, 3600, 7200, 14400, 21600, 43200, 86400)  # fmt: skip


def _folds(trace: Trace, end_t: float) -> list[tuple[float, float]]:
    """Return the stretches worth folding: long, with no test or wait edge and no change.

    A stretch qualifies when it lasts a fifth of the recording and 5 s or more, while no
    device's reading moves by more than 1 % of its total (or peak); a twentieth of it stays
    drawn at each end. A two-minute idle wait after 6 busy seconds folds to a narrow band.
    """
    events = {0.0, end_t}
    events.update(t for span in trace.tests for t in (span.start, span.end))
    events.update(t for w in trace.waits for t in (w.start, w.end))
    for pos, dev in enumerate(trace.devices):
        peak = _peak_of(trace, pos) if dev.total <= 0 else None
        scale = dev.total if dev.total > 0 else (peak[0] if peak else 0)
        threshold = max(0.01 * scale, float(MIB))
        before: Sample | None = None
        for s in trace.samples:
            value = s.used[pos] if pos < len(s.used) else None
            last = before.used[pos] if before is not None and pos < len(before.used) else None
            if before is not None and (
                value is None or last is None or abs(value - last) > threshold
            ):
                events.update((before.t, s.t))
            before = s
    times = sorted(t for t in events if 0.0 <= t <= end_t)
    least = max(0.2 * end_t, 5.0)
    gaps = sorted(
        ((b - a, a, b) for a, b in itertools.pairwise(times) if b - a >= least), reverse=True
    )
    return sorted((a + 0.05 * gap, b - 0.05 * gap) for gap, a, b in gaps[:_FOLDS])


class _TimeAxis:
    """Seconds to x for one geometry: linear, but each folded stretch drawn narrow."""

    def __init__(self, end_t: float, folds: Sequence[tuple[float, float]], geo: _Geometry) -> None:
        self.geo = geo
        self.folds = list(folds)
        self.fold_w = max(0.06 * geo.plot_w, 3.0 * geo.font)
        linear = end_t - sum(b - a for a, b in folds)
        per_s = (geo.plot_w - self.fold_w * len(folds)) / max(linear, 1e-12)
        t, x = 0.0, float(geo.left)
        self._t, self._x = [t], [x]
        for a, b in folds:
            x += (a - t) * per_s
            self._t.append(a)
            self._x.append(x)
            x += self.fold_w
            self._t.append(b)
            self._x.append(x)
            t = b
        self._t.append(end_t)
        self._x.append(float(geo.left + geo.plot_w))
        self.linear = [(self._t[k], self._t[k + 1]) for k in range(0, len(self._t), 2)]

    def __call__(self, t: float) -> float:
        k = min(max(bisect.bisect_right(self._t, t) - 1, 0), len(self._t) - 2)
        t0, t1, x0, x1 = self._t[k], self._t[k + 1], self._x[k], self._x[k + 1]
        return x0 if t1 <= t0 else x0 + (x1 - x0) * (min(max(t, t0), t1) - t0) / (t1 - t0)

    def many(self, times: Sequence[float]) -> list[float]:
        """Return the x of each of ``times``: one pass when they ascend, as samples do."""
        out: list[float] = []
        k, last = 0, len(self._t) - 2
        for t in times:
            if not self._t[k] <= t <= self._t[k + 1]:
                k = min(max(bisect.bisect_right(self._t, t) - 1, 0), last)
            t0, t1, x0, x1 = self._t[k], self._t[k + 1], self._x[k], self._x[k + 1]
            clamped = t0 if t < t0 else t1 if t > t1 else t
            out.append(x0 if t1 <= t0 else x0 + (x1 - x0) * (clamped - t0) / (t1 - t0))
        return out

    def ticks(self) -> list[tuple[float, str]]:
        """Return the time labels ``(x, text)``: nice steps per linear stretch, never crowded."""
        gap = self.geo.tick_gap
        folds = [(self(a) + self(b)) / 2 for a, b in self.folds]  # the folds' own labels
        placed: list[float] = []
        out: list[tuple[float, str]] = []
        for t0, t1 in self.linear:
            room = max(1, int((self(t1) - self(t0)) / gap) + 1)  # labels, the first included
            step = next((s for s in _STEPS if (t1 - t0) / s <= room), None)
            step = step if step is not None else _nice_step(t1 - t0, room)
            first = math.ceil(t0 / step - 1e-9)
            for k in range(first, first + min(room, 20) + 1):
                x = self(k * step)
                if k * step > t1 * 1.0001 or len(out) >= 20:
                    break
                crowded = any(abs(x - p) < 0.6 * gap for p in placed)
                if not crowded and all(abs(x - p) >= 0.9 * gap for p in folds):
                    placed.append(x)
                    out.append((x, _time_label(k * step, step)))
        return out


def _device_chart(
    trace: Trace, pos: int, x_of: _TimeAxis, leaked: set[str], layers: _Layers, *, full: bool
) -> str:
    # ``leaked`` names the tests leaking on device ``pos``
    dev = trace.devices[pos]
    color = _PALETTE[pos % len(_PALETTE)]
    peak = layers.peak
    high = peak[0] if peak is not None else 0
    ymin, ymax = _axis(min(layers.low, high), high, dev.total, full=full)
    span_y = max(ymax - ymin, 1.0)
    unit, unit_name = (GIB, "GiB") if ymax >= GIB else (MIB, "MiB")
    geo = x_of.geo
    left, right, top, plot_h = geo.left, geo.w - geo.right, geo.top, geo.plot_h

    def y_of(v: float) -> float:
        return top + plot_h * (1 - (min(max(v, ymin), ymax) - ymin) / span_y)

    scale = f"{geo.cls} chart {'full-scale' if full else 'fit-scale'}".lstrip()
    out: list[str] = [
        f'<svg class="{scale}" viewBox="0 0 {geo.w} {layers.height}" role="img" '
        f'data-device="{dev.index}" aria-label="Used memory of device {dev.index} over time">',
        layers.band,
    ]
    step = _nice_step(span_y / unit, 5 if plot_h * geo.font <= 260 * 11 else 4)
    decimals = _decimals(step)
    out.append('<g class="grid">')  # the grid and axes
    # Ticks are counted, never stepped up to the top: at 2**55 bytes a float step is too fine
    # to reach a tolerance relative to the value, and that loop ran for hours.
    first = math.ceil(ymin / unit / step - 1e-9)
    last = math.floor(ymax / unit / step + 1e-9)
    for k in range(first, min(last, first + 10) + 1):
        v = k * step
        y = y_of(v * unit)
        label = f"{v:.{decimals}f} {unit_name}"
        out.append(
            f'<line x1="{left}" x2="{right}" y1="{y:.2f}" y2="{y:.2f}" '
            f'stroke="#d0d5db" stroke-width="0.6"/>'
            f'<text x="{left - 6}" y="{y + geo.font * 0.35:.2f}" text-anchor="end">'
            f"{_e(label)}</text>"
        )
    for a, b in x_of.folds:  # a stretch without change, drawn narrow: a grey band, its length
        x0, x1 = x_of(a), x_of(b)
        out.append(
            f'<g class="fold"><rect x="{x0:.2f}" y="{top}" width="{x1 - x0:.2f}" '
            f'height="{plot_h}" fill="#eceef1"/><path d="M{x0:.2f},{top}V{top + plot_h}'
            f'M{x1:.2f},{top}V{top + plot_h}" stroke="#9aa3ad" stroke-dasharray="3 3"/>'
            f'<text x="{(x0 + x1) / 2:.2f}" y="{top + plot_h + geo.font + 5}" '
            f'text-anchor="middle">⋯{_e(_fmt_short(b - a))}⋯</text><title>{_e(_fmt_s(b - a))} '
            f"without a change, a test or a wait, drawn narrow</title></g>"
        )
    for x, label in x_of.ticks():
        out.append(
            f'<line x1="{x:.2f}" x2="{x:.2f}" y1="{top}" y2="{top + plot_h}" '
            f'stroke="#e6e9ed" stroke-width="0.6"/>'
            f'<text x="{x:.2f}" y="{top + plot_h + geo.font + 5}" text-anchor="middle">'
            f"{_e(label)}</text>"
        )
    total_box: tuple[float, float, float] | None = None  # the total's label: x0, x1, baseline
    if 0 < dev.total <= ymax * 1.0001:
        y = y_of(dev.total)
        total_text = f"total {format_bytes(dev.total)}"
        total_box = (right - 4 - _text_w(total_text, geo.font), right - 4, y + geo.font + 1)
        out.append(
            f'<line class="total" x1="{left}" x2="{right}" y1="{y:.2f}" y2="{y:.2f}" '
            f'stroke="#555" stroke-dasharray="4 3" stroke-width="0.8"/>'
            f'<text x="{right - 4}" y="{y + geo.font + 1:.2f}" text-anchor="end">total '
            f"{_e(format_bytes(dev.total))}</text>"
        )
    out.append(
        f'<rect x="{left}" y="{top}" width="{geo.plot_w}" height="{plot_h}" fill="none" '
        f'stroke="#9aa3ad" stroke-width="0.8"/></g>'
    )
    paths = []
    for seg in layers.envelope:
        points = seg if len(seg) > 1 else [seg[0], (seg[0][0] + 1.0, seg[0][1])]
        paths.append("M" + " L".join(f"{x:.2f},{y_of(v):.2f}" for x, v in points))
    if paths:
        out.append(
            f'<path class="used" d="{" ".join(paths)}" fill="none" stroke="{color}" '
            f'stroke-width="1.8" stroke-linejoin="round"><title>used memory, device '
            f"{dev.index}</title></path>"
        )
    if peak is not None:  # the peak: a marker and its figure
        px, py = x_of(peak[1]), y_of(peak[0])
        anchor = "end" if px > left + geo.plot_w * 0.8 else "start"
        dx = -7 if anchor == "end" else 7
        below = py < top + geo.font + 3
        text = f"peak {format_bytes(peak[0])}"
        w = _text_w(text, geo.font)
        x0 = px + dx - (w if anchor == "end" else 0)
        for _ in range(2):  # off the total's label: to the other side of the marker
            ty = py + geo.font + 3 if below else py - 6
            if total_box is None or not (
                x0 < total_box[1] and total_box[0] < x0 + w and abs(ty - total_box[2]) < geo.font
            ):
                break
            below = not below
        out.append(
            f'<g class="peak-marker"><circle cx="{px:.2f}" cy="{py:.2f}" r="4.5" fill="#fff" '
            f'stroke="{color}" stroke-width="2"/>'
            f'<text class="peak-label" x="{px + dx:.2f}" y="{ty:.2f}" text-anchor="{anchor}">'
            f"peak {_e(format_bytes(peak[0]))}</text>"
            f"<title>peak {_e(format_bytes(peak[0]))} at {_e(_fmt_s(peak[1]))}</title></g>"
        )
    for span in trace.tests:
        if span.nodeid not in leaked:
            continue
        before, after = span.used_before[pos], trace.held_after(span)[pos]
        if before is None or after is None or after <= before:
            continue
        x = x_of(span.end)  # a red bracket from before to after at the test's end
        out.append(
            f'<g class="leak-marker" data-nodeid="{_e(span.nodeid)}">'
            f'<line x1="{x:.2f}" x2="{x:.2f}" y1="{y_of(before):.2f}" y2="{y_of(after):.2f}" '
            f'stroke="{_LEAK}" stroke-width="3"/>'
            f'<circle cx="{x:.2f}" cy="{y_of(after):.2f}" r="4" fill="{_LEAK}"/>'
            f"<title>{_e(span.nodeid)} left {_e(_fmt_delta(after - before))} held on device "
            f"{dev.index}</title></g>"
        )
    return "".join(out) + layers.body + "</svg>"


def _chart_layers(
    trace: Trace,
    pos: int,
    x_of: _TimeAxis,
    leaked: set[str],
    *,
    lanes: Sequence[int],
    what: str,
    xs: Sequence[float],
) -> _Layers:
    # the layers of device ``pos``'s chart that do not depend on its y-axis; ``what`` names the
    # lane of the tests ("tests", or "command" for a recorded command), ``xs`` the samples' x
    dev = trace.devices[pos]
    geo = x_of.geo
    lane_h, top, plot_h = geo.lane_h, geo.top, geo.plot_h
    tests_top = top + plot_h + geo.axis_h
    waits_top = tests_top + (max(lanes, default=0) + 1) * lane_h + 8
    band = ['<g class="test-bands">']  # behind everything; the test lanes go below the plot
    body = [
        f'<text x="{geo.left - 6}" y="{tests_top + lane_h - 4}" text-anchor="end">{what}</text>'
        '<g class="test-lanes">'
    ]
    for i, (span, lane) in enumerate(zip(trace.tests, lanes, strict=True)):
        x0, x1 = x_of(span.start), x_of(span.end)
        is_leak = span.nodeid in leaked
        if x1 - x0 < 0.3 and not is_leak:
            continue
        tip = (
            f"{span.nodeid}\n{span.outcome or 'no outcome'}, {_fmt_s(span.duration)}, "
            f"device {dev.index}: {_fmt_delta(trace.growth(span)[pos])}"
        )
        band.append(
            f'<rect class="test-band{" leaked" if is_leak else ""}" '
            f'data-nodeid="{_e(span.nodeid)}" x="{x0:.2f}" y="{top}" '
            f'width="{max(x1 - x0, 1.5 if is_leak else 0.3):.2f}" height="{plot_h}" '
            f'fill="{"#fbd5d5" if is_leak else ("#eef3fa", "#e2eaf5")[i % 2]}">'
            f"<title>{_e(tip)}</title></rect>"
        )
        fill = _LEAK if is_leak else (_FAILED if span.outcome == "failed" else "#a9bcd6")
        y = tests_top + lane * lane_h
        body.append(
            f'<rect x="{x0:.2f}" y="{y + 1}" width="{max(x1 - x0, 1.5):.2f}" '
            f'height="{lane_h - 2}" fill="{fill}" stroke="#fff" stroke-width="0.5">'
            f"<title>{_e(span.nodeid)} ({_e(_fmt_s(span.duration))})</title></rect>"
        )
        name = _program(trace.command) if trace.command else _short_name(span.nodeid)
        label = _fit_label(name, x1 - x0, geo.lane_font)
        if label:
            colour = "#fff" if fill in (_LEAK, _FAILED) else "#1d1d1f"
            body.append(
                f'<text class="lane-label" x="{x0 + 3:.2f}" y="{y + lane_h - 0.3 * lane_h:.1f}" '
                f'style="fill:{colour}" data-nodeid="{_e(span.nodeid)}">{_e(label)}</text>'
            )
    band.append("</g>")
    body.append(
        f'</g><text x="{geo.left - 6}" y="{waits_top + lane_h - 4}" text-anchor="end">waits</text>'
        '<g class="waits">'
    )
    for w in trace.waits:
        if w.devices and dev.index not in w.devices:
            continue
        x0, x1 = x_of(w.start), x_of(w.end)
        fill = _WAIT if w.ok else _WAIT_FAILED
        tip = f"{w.kind}: {_fmt_s(w.duration)}{'' if w.ok else ' (failed)'}"
        if w.test:
            tip += f"\nin {w.test}"
        body.append(
            f'<rect class="wait" x="{x0:.2f}" y="{waits_top + 1}" width="{max(x1 - x0, 2):.2f}" '
            f'height="{lane_h - 2}" fill="{fill}"><title>{_e(tip)}</title></rect>'
            f'<rect x="{x0:.2f}" y="{top}" width="{max(x1 - x0, 0.5):.2f}" height="{plot_h}" '
            f'fill="{fill}" fill-opacity="0.12"/>'
        )
    body.append("</g>")
    peak = _peak_of(trace, pos)
    low = min((u for s in trace.samples if (u := s.used[pos]) is not None), default=0)
    envelope = _envelope(trace.samples, pos, xs, geo.w)
    return _Layers("".join(band), "".join(body), waits_top + lane_h + 10, peak, low, envelope)


def _legend(color: str, *, recorded: bool, folded: bool) -> str:
    keys = [(f"background:{color}", "used memory")]
    if recorded:
        keys += [("background:#a9bcd6", "the command"), (f"background:{_LEAK}", "left memory held")]
    else:
        keys += [
            ("background:#e2eaf5", "test span"),
            (f"background:{_LEAK}", "test that left memory held"),
            (f"background:{_FAILED}", "failed test"),
        ]
    keys += [
        (f"background:{_WAIT}", "memory wait"),
        ("border-top:2px dashed #555;height:0", "total"),
    ]
    if folded:
        keys.append(("background:#eceef1", "a stretch without change, drawn narrow"))
    spans = "".join(
        f'<span><i class="sw" style="{style}"></i>{text}</span>' for style, text in keys
    )
    return f'<div class="legend">{spans}</div>'


def _summary(trace: Trace, leaks: Sequence[Leak], end_t: float) -> str:
    started = datetime.fromtimestamp(trace.started_at, tz=timezone.utc)
    interval = (2**trace.decimation) / trace.sample_hz if trace.sample_hz > 0 else 0.0
    sampling = f"{trace.sample_hz:g} samples/s requested; {len(trace.samples)} samples kept"
    if trace.decimation:
        sampling += f", halved {trace.decimation}× to one per {_fmt_s(interval)} (peaks kept)"
    recorded = trace.command is not None
    rule = f"more than {format_bytes(trace.leak_tolerance_bytes)} still held "
    if recorded:
        rule += f"at the lowest point in the {trace.leak_grace_s:g} s after the command exits"
    else:
        rule += f"when the next test's body begins ({trace.leak_grace_s:g} s after the last test)"
    rows = [
        ("Platform", trace.platform or "none detected"),
        ("Started", started.strftime("%Y-%m-%d %H:%M:%S UTC")),
        ("Duration", _fmt_s(end_t)),
        ("Sampling", sampling),
        ("Leak rule", rule),
    ]
    if trace.command is not None:
        rows.append(("Command", " ".join(trace.command)))
    if trace.exit_code is not None:
        rows.append(("Exit status", str(trace.exit_code)))
    body = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in rows)
    leaked_tests = len({leak.nodeid for leak in leaks})
    wait_total = sum(w.duration for w in trace.waits)
    failed_waits = sum(not w.ok for w in trace.waits)
    if recorded:
        code = trace.exit_code
        held_on = sorted({leak.device for leak in leaks})
        badges = [
            f'<span class="badge {"good" if code == 0 else "bad"}">'
            f"{'not finished' if code is None else f'exit status {code}'}</span>",
            f'<span class="badge {"bad" if held_on else "good"}" id="leak-count">'
            + (
                f"left memory held on {_plural(len(held_on), 'device')}"
                if held_on
                else "no memory left held"
            )
            + "</span>",
        ]
    else:
        badges = [
            f'<span class="badge">{_plural(len(trace.tests), "test")}</span>',
            f'<span class="badge {"bad" if leaked_tests else "good"}" id="leak-count">'
            f"{leaked_tests} leaking</span>",
        ]
    if trace.waits or not recorded:  # a recorded command's own waits are not seen
        badges.append(
            f'<span class="badge {"warn" if trace.waits else ""}">'
            f"{_plural(len(trace.waits), 'wait')}, {_e(_fmt_s(wait_total))} in total</span>"
        )
    if failed_waits:
        badges.append(f'<span class="badge bad">{_plural(failed_waits, "wait")} failed</span>')
    notes = [_e(n) for n in trace.notes]
    if not trace.context_free:
        notes.append(_CONTEXT_NOTE)
    shown = f'<div class="notes">{"".join(f"<p>{n}</p>" for n in notes)}</div>' if notes else ""
    return f'<dl class="summary">{body}</dl><div class="badges">{"".join(badges)}</div>{shown}'


def _td(label: str, text: str, cls: str = "num") -> str:
    # ``data-label`` heads the cell when a phone shows each row as a card (the CSS)
    return f'<td class="{cls}" data-label="{label}">{text}</td>'


def _whose(leak: Leak) -> str:
    """`` (held by this process, child pid 7 1.00 GiB)`` for a leak judged by owner, else ``""``."""
    blame = leak.blame
    if blame is None or not blame.attributed:
        return ""
    parts = []
    if (blame.leaked or 0) - sum(blame.children.values()) > 0:
        parts.append("this process")
    parts += [f"child pid {p} {format_bytes(n)}" for p, n in sorted(blame.children.items())]
    return f" (held by {', '.join(parts)})" if parts else ""


def _leak_table(trace: Trace, leaks: Sequence[Leak], limit: int, *, recorded: bool) -> str:
    if not leaks:
        what = "The command" if recorded else "No test"
        held = "did not leave more than" if recorded else "left more than"
        return (
            f'<p id="no-leaks">{what} {held} '
            f"{_e(format_bytes(trace.leak_tolerance_bytes))} held on any device.</p>"
        )
    rows = "".join(
        '<tr class="leak">'
        + ("" if recorded else _td("Test", _e(leak.nodeid) + _e(_whose(leak)), "id"))
        + _td("Device", str(leak.device))
        + _td("Before", _e(format_bytes(leak.before)))
        + _td("At end", _e(format_bytes(leak.at_end)))
        + _td("Lowest after", _e(format_bytes(leak.after)))
        + _td("Left held", _e(_fmt_delta(leak.leaked)), "num grew")
        + "</tr>"
        for leak in leaks[:limit]
    )
    more = f"<p>… and {len(leaks) - limit} more.</p>" if len(leaks) > limit else ""
    return (
        '<table id="leaks" class="stack"><thead><tr>'
        + ("" if recorded else "<th>Test</th>")
        + '<th class="num">Device</th><th class="num">Before</th><th class="num">At end</th>'
        '<th class="num">Lowest after</th><th class="num">Left held</th>'
        f"</tr></thead><tbody>{rows}</tbody></table>{more}"
    )


def _command_table(trace: Trace, peaks: list[Reading]) -> str:
    # a recorded command is one span: per device, what it held before, after and at the peak
    if not trace.tests:
        return '<p id="no-tests">The command did not start.</p>'
    span = trace.tests[0]
    rows = []
    for pos, dev in enumerate(trace.devices):
        before, after = span.used_before[pos], trace.held_after(span)[pos]
        growth = trace.growth(span)[pos]
        grew = growth is not None and growth > trace.leak_tolerance_bytes
        rows.append(
            f'<tr class="{"leak" if grew else "test"}">'
            + _td("Device", f"{dev.index}: {_e(dev.name)}", "")
            + _td("Before", _e(format_bytes(before)))
            + _td("Peak", _e(format_bytes(peaks[0][pos])), "num peak")
            + _td("Lowest after", _e(format_bytes(after)))
            + _td("Change", _e(_fmt_delta(growth)), "num grew" if grew else "num")
            + "</tr>"
        )
    return (
        '<table id="tests" class="stack"><thead><tr><th>Device</th><th class="num">Before</th>'
        '<th class="num">Peak</th><th class="num">Lowest after</th><th class="num">Change</th>'
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _wait_table(waits: Sequence[WaitSpan]) -> str:
    if not waits:
        return '<p id="no-waits">No memory wait was observed.</p>'
    rows = []
    for w in waits:
        devices = ", ".join(str(d) for d in w.devices) or "all"
        result = '<span class="ok">settled</span>' if w.ok else '<span class="failed">failed</span>'
        rows.append(
            f'<tr class="{"wait" if w.ok else "wait-failed"}">'
            + _td("Took", _e(_fmt_s(w.duration)))
            + _td("Wait", _e(w.kind), "")
            + _td("During", _e(w.test or "(outside tests)"), "id")
            + _td("Devices", _e(devices), "")
            + _td("Result", result, "")
            + _td("At", f"{w.start:.2f} s")
            + "</tr>"
        )
    return (
        '<table id="waits" class="stack"><thead><tr><th class="num">Took</th><th>Wait</th>'
        "<th>During</th>"
        '<th>Devices</th><th>Result</th><th class="num">At</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _test_table(trace: Trace, leaked: set[str], limit: int, peaks: list[Reading]) -> str:
    if not trace.tests:
        return '<p id="no-tests">No test ran while recording.</p>'
    heads = "".join(f'<th class="num">Δ dev {d.index}</th>' for d in trace.devices)
    heads += "".join(f'<th class="num">Peak dev {d.index}</th>' for d in trace.devices)
    rows = []
    tol = trace.leak_tolerance_bytes
    for i, span in enumerate(trace.tests[:limit]):
        deltas = "".join(
            f'<td class="num{" grew" if g is not None and g > tol else ""}">'
            f"{_e(_fmt_delta(g))}</td>"
            for g in trace.growth(span)
        )
        deltas += "".join(
            f'<td class="num peak">{_e("?" if p is None else format_bytes(p))}</td>'
            for p in peaks[i]
        )
        cls = {"passed": "ok", "failed": "failed", "skipped": "skipped"}.get(span.outcome, "")
        rows.append(
            f'<tr class="{"leak" if span.nodeid in leaked else "test"}">'
            f'<td class="num">{i + 1}</td><td class="id">{_e(span.nodeid)}</td>'
            f'<td class="{cls}">{_e(span.outcome)}</td><td class="num">{span.start:.2f} s</td>'
            f'<td class="num">{_e(_fmt_s(span.duration))}</td>{deltas}</tr>'
        )
    more = f"<p>… and {len(trace.tests) - limit} more.</p>" if len(trace.tests) > limit else ""
    open_attr = " open" if len(trace.tests) <= 300 else ""
    return (
        f"<details{open_attr}><summary>All {len(trace.tests)} tests</summary>"
        '<div class="scroll"><table id="tests"><thead><tr><th class="num">#</th><th>Test</th>'
        "<th>Outcome</th>"
        f'<th class="num">Start</th><th class="num">Took</th>{heads}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>{more}</details>"
    )


def render_html(
    trace: Trace,
    *,
    title: str | None = None,
    leak_tolerance_bytes: int | None = None,
    leak_grace_s: float | None = None,
    max_rows: int = 5000,
) -> str:
    """Return the report page for ``trace``: one HTML document that fetches nothing.

    ``leak_tolerance_bytes`` and ``leak_grace_s`` override the trace's; ``max_rows`` bounds the
    leak and test tables.
    """
    if leak_tolerance_bytes is not None:
        trace = replace(trace, leak_tolerance_bytes=leak_tolerance_bytes)
    if leak_grace_s is not None:
        trace = replace(trace, leak_grace_s=leak_grace_s)
    leaks = trace.leaks()
    leaked = {leak.nodeid for leak in leaks}
    end_t = max(
        trace.duration,
        trace.samples[-1].t if trace.samples else 0.0,
        max((s.end for s in trace.tests), default=0.0),
        max((w.end for w in trace.waits), default=0.0),
        1e-3,
    )
    heading = title or "Device memory timeline"
    charts: list[str] = []
    leaked_on: dict[int, set[str]] = {dev.index: set() for dev in trace.devices}
    for leak in leaks:
        leaked_on.setdefault(leak.device, set()).add(leak.nodeid)
    per_test = peaks_per_test(trace)
    folds = _folds(trace, end_t)
    axes = [_TimeAxis(end_t, folds, geo) for geo in (_WIDE, _PHONE)]
    times = [s.t for s in trace.samples]
    xs_of = [x_of.many(times) for x_of in axes]
    lanes = _lanes(trace.tests)
    recorded = trace.command is not None  # one span: the command ``accelplat record`` ran
    what = "command" if recorded else "tests"
    for pos, dev in enumerate(trace.devices):
        color = _PALETTE[pos % len(_PALETTE)]
        total = format_bytes(dev.total) if dev.total > 0 else "unknown"
        leaked_here = leaked_on[dev.index]
        drawn = []
        for x_of, xs in zip(axes, xs_of, strict=True):  # each geometry at both scales
            layers = _chart_layers(trace, pos, x_of, leaked_here, lanes=lanes, what=what, xs=xs)
            for full in (False, True):
                drawn.append(_device_chart(trace, pos, x_of, leaked_here, layers, full=full))
        peak = layers.peak
        peak_text = ""
        if peak is not None:
            during = [
                span.nodeid
                for span, p in zip(trace.tests, per_test, strict=True)
                if p[pos] == peak[0] and span.start <= peak[1] <= span.end
            ]
            where = f" during {during[0]}" if during and not recorded else ""
            peak_text = (
                f' <span class="peak" data-peak="{peak[0]}">— peak '
                f"{_e(format_bytes(peak[0]))} at {_e(_fmt_s(peak[1]))}{_e(where)}</span>"
            )
        charts.append(
            f'<section class="device"><h3>Device {dev.index}: {_e(dev.name)} '
            f"({_e(total)}){peak_text}</h3>"
            f"{''.join(drawn)}"
            f"{_legend(color, recorded=recorded, folded=bool(folds))}</section>"
        )
    if not charts:
        charts.append('<p id="no-devices">No device was sampled.</p>')
    platform = trace.platform or "no platform"
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(heading)} — {_e(platform)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_e(heading)}</h1>"
        '<p class="sub">'
        + (
            "Used memory per device while a command ran, recorded by accelplat."
            if recorded
            else "Used memory per device, the tests that ran and the memory waits, recorded by "
            "accelplat."
        )
        + "</p>"
        f"{_summary(trace, leaks, end_t)}"
        "<h2>Memory over time</h2>"
        '<input type="checkbox" id="full-scale"><label for="full-scale" class="scale"> '
        "Full scale: every y-axis from 0 to the device's total (otherwise fitted to the memory "
        "used)</label>"
        f'<div class="charts">{"".join(charts)}</div>'
        f"<h2>{'Memory the command left held' if recorded else 'Tests that left memory held'}"
        f"</h2>{_leak_table(trace, leaks, max_rows, recorded=recorded)}"
        f"<h2>Slowest memory waits</h2>{_wait_table(trace.slowest_waits(20))}"
        + (
            f"<h2>Memory per device</h2>{_command_table(trace, per_test)}"
            if recorded
            else f"<h2>Tests</h2>{_test_table(trace, leaked, max_rows, per_test)}"
        )
        + "<footer>"
        + (_COMMAND_RULE if recorded else _TEST_RULE)
        + " Hover over bands, bars and markers for details.</footer></body></html>\n"
    )


_COMMAND_RULE = (
    "The command leaks on a device when the device still holds more than the tolerance beyond "
    "what it held when the command started, at the lowest point in the grace period after it "
    "exited."
)
_TEST_RULE = (
    "A test leaks on a device when the device still holds more than the tolerance "
    "beyond what it held before the test's set-up, at the lowest point between the end of "
    "the test's teardown and the start of the next test's body (after the last test: the "
    "grace period). Memory that comes back late, during the next set-up or a settle wait, "
    "is therefore not a leak."
)


def write_report(
    trace: Trace,
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    leak_tolerance_bytes: int | None = None,
    leak_grace_s: float | None = None,
    format: Literal["html", "chrome"] = "html",
) -> Path:
    """Write a report of ``trace`` to ``path`` (its directory must exist) atomically.

    Args:
        trace: The recorded session.
        path: Where; a path that is not a regular file is never replaced.
        title: The page's title (``html``).
        leak_tolerance_bytes: What the leak rule tolerates (``html``).
        leak_grace_s: How long after a test the leak rule waits (``html``).
        format: ``"html"``, :func:`render_html`'s self-contained page, or ``"chrome"``, the
            Chrome trace-event JSON that Perfetto and ``chrome://tracing`` open (memory as
            counter tracks, tests and waits as slices).

    Raises:
        OSError: When the file cannot be written.
        ValueError: For another ``format``.
    """
    if format == "chrome":
        from accelplat.timeline._chrome import chrome_trace_text

        return _files.write_text_atomic(path, chrome_trace_text(trace))
    if format != "html":
        raise ValueError(f"format must be 'html' or 'chrome', got {format!r}")
    page = render_html(
        trace, title=title, leak_tolerance_bytes=leak_tolerance_bytes, leak_grace_s=leak_grace_s
    )
    return _files.write_text_atomic(path, page)

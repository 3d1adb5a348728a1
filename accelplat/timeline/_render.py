"""Render a :class:`~accelplat.timeline._trace.Trace` as one self-contained HTML page.

Each device's chart is inline SVG, drawn for a desktop and for a phone, each at a fitted and at a
full scale: the stylesheet (``report.css``, inlined) shows one of the four with CSS alone. The
page's frame is ``report.html`` and its wording for tests or for a recorded command
``report.json``, both package data. Every string from the trace is escaped.
"""

from __future__ import annotations

import bisect
import html
import itertools
import json
import math
import os
import string
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Literal, NamedTuple, cast

from accelplat import _files
from accelplat._types import GIB, MIB
from accelplat._util import format_bytes
from accelplat.timeline._chrome import chrome_trace_text
from accelplat.timeline._trace import Leak, Reading, Sample, TestSpan, Trace, WaitSpan, lanes

_PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
_LEAK, _FAILED, _TEST, _FOLD = "#d62728", "#4b5563", "#a9bcd6", "#eceef1"
_WAIT, _WAIT_FAILED, _CHECK = "#ff7f0e", "#b30000", "#b9a7d9"  # a wait, a failed one, the check's
_CONTEXT_NOTE = "This platform's memory queries create a device context in the sampling process."


class _Geometry(NamedTuple):
    """A chart's layout in SVG user units, for a desktop or for a phone."""

    phone: bool
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
_WIDE = _Geometry(False, 1200, 78, 16, 12, 220, 30, 16, 11, 10, 100)
_PHONE = _Geometry(True, 600, 104, 26, 20, 260, 40, 26, 19, 16, 110)
_Line = list[list[tuple[float, int]]]  # a device's polyline segments of (x, used)
_Ends = tuple[tuple[int, float] | None, int, int]  # peak (bytes, seconds), lowest sample, highest
_MAX_LANES = 6
MAX_ROWS = 5000  # rows of the leak and test tables
_FOLDS = 4  # at most this many flat stretches are folded
_STEPS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300,
          600, 900, 1800, 3600, 7200, 14400, 21600, 43200, 86400)  # fmt: skip


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _fmt_s(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)} min {rest:.0f} s" if minutes < 120 else f"{minutes / 60:.1f} h"


def _fmt_short(seconds: float) -> str:  # a folded stretch's length, in few characters
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.0f} h"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _fmt_delta(n: int | None) -> str:
    return "?" if n is None else ("+" if n > 0 else "") + format_bytes(n)


def _nice_step(span: float, target: int) -> float:
    raw = span / target  # > 0: a chart spans at least 1 ms and 1 byte
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


def _extremes(trace: Trace, pos: int) -> _Ends:
    """Return device ``pos``'s highest reading ``(bytes, seconds)``, its lowest sample and peak."""
    sampled = [(v, s.t) for s in trace.samples if (v := s.used[pos]) is not None]
    ends = [((s.used_before[pos], s.start), (s.used_after[pos], s.end)) for s in trace.tests]
    spans = [(v, t) for pair in ends for v, t in pair if v is not None]
    peak = max(sampled + spans, key=lambda p: p[0], default=None)
    return peak, min((v for v, _ in sampled), default=0), 0 if peak is None else peak[0]


def peaks_per_test(trace: Trace) -> list[Reading]:
    """Return per test the highest usage per device from its start to its end, both included."""
    times = [s.t for s in trace.samples]
    out: list[Reading] = []
    for span in trace.tests:
        lo, hi = bisect.bisect_left(times, span.start), bisect.bisect_right(times, span.end)
        inside = (s.used for s in trace.samples[lo:hi])
        columns = zip(span.used_before, span.used_after, *inside, strict=False)
        out.append(tuple(max((v for v in col if v is not None), default=None) for col in columns))
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
    ymax = float(total) if total > 0 and hi + pad > total >= hi else hi + pad
    ymin = lo - pad  # below ymax: 0.0 when near 0 or under it
    return (0.0 if ymin < 0.25 * (ymax - ymin) else ymin), ymax


def _short_name(nodeid: str) -> str:  # the part worth a lane label: after the last ``::``
    return nodeid.rsplit("::", 1)[-1].rsplit("/", 1)[-1] or nodeid


def _fit_label(text: str, width: float, font: float = 10) -> str:  # at ``font`` monospace
    capacity = int((width - 6) / (0.61 * font))
    if capacity >= len(text):
        return text
    return text[: capacity - 1] + "…" if capacity >= 6 else ""


def _envelope(samples: Sequence[Sample], pos: int, xs: Sequence[float], width: int) -> _Line:
    # Polyline segments of (x, used), a None reading ending one; per pixel column the first,
    # last, minimum and maximum are kept in time order, so spikes survive any thinning.
    segments = []
    points = [
        (x, -1 if (v := s.used[pos]) is None else v) for x, s in zip(xs, samples, strict=True)
    ]
    for known, run in itertools.groupby(points, key=lambda p: p[1] >= 0):  # -1: no reading
        if known:
            segment: list[tuple[float, int]] = []
            for _, group in itertools.groupby(run, key=lambda p: min(width, int(p[0]))):
                col = list(group)
                lo, hi = min(col, key=lambda p: p[1]), max(col, key=lambda p: p[1])
                segment += sorted({col[0], lo, hi, col[-1]})
            segments.append(segment)
    return segments


def _folds(trace: Trace, end_t: float) -> list[tuple[float, float]]:
    """Return the stretches worth folding: long and flat, with no test or wait edge inside.

    Flat: over the whole stretch each device's readings stay within 1 % of its total (or peak;
    at least 1 MiB) of one another. The stretch's own range counts, not its steps, so a slow
    ramp never folds. A stretch qualifies when it lasts a fifth of the recording and 5 s or
    more; the four longest fold, each keeping a twentieth of it drawn at either end.
    """
    spans: list[TestSpan | WaitSpan] = [*trace.tests, *trace.waits]
    edges = sorted({t for s in spans for t in (s.start, s.end)})
    limits = [
        max(0.01 * (dev.total or _extremes(trace, pos)[2]), float(MIB))
        for pos, dev in enumerate(trace.devices)
    ]
    runs: list[tuple[float, float]] = []
    start = last = -1.0  # the open run's first and last sample; -1: none open
    lo: list[int] = []  # per device, the least and the most of the open run's readings
    hi: list[int] = []
    k = 0  # the edges at or before the last sample
    for s in trace.samples:
        k, passed = bisect.bisect_right(edges, s.t), k
        known = None not in s.used
        used = cast("tuple[int, ...]", s.used)  # used only when known
        rows = zip(used, lo, hi, limits, strict=True)
        if start >= 0 and known and k == passed and all(b - m <= v <= a + m for v, a, b, m in rows):
            lo, hi, last = list(map(min, lo, used)), list(map(max, hi, used)), s.t
            continue
        runs.append((start, last))
        start, last, lo, hi = (s.t if known else -1.0), s.t, list(used), list(used)
    runs.append((start, last))
    runs = [(a, b) for a, b in runs if a >= 0 and b - a >= max(0.2 * end_t, 5.0)]
    longest = sorted(runs, key=lambda r: r[0] - r[1])[:_FOLDS]
    return sorted((a + 0.05 * (b - a), b - 0.05 * (b - a)) for a, b in longest)


class _TimeAxis:
    """Seconds to x for one geometry: linear, but each folded stretch drawn narrow."""

    def __init__(self, end_t: float, folds: Sequence[tuple[float, float]], geo: _Geometry) -> None:
        self.geo = geo
        self.folds = list(folds)
        self.fold_w = max(0.06 * geo.plot_w, 3.0 * geo.font)
        linear = end_t - sum(b - a for a, b in folds)
        self.per_s = per_s = (geo.plot_w - self.fold_w * len(folds)) / max(linear, 1e-12)
        self._t = [0.0, *(t for fold in folds for t in fold), end_t]  # knots: 0, folds' ends, end
        self._x = [float(geo.left)]  # between two knots, a linear stretch or (odd k) a fold
        for k, (t0, t1) in enumerate(itertools.pairwise(self._t)):
            self._x.append(self._x[-1] + (self.fold_w if k % 2 else (t1 - t0) * per_s))
        self._x[-1] = float(geo.left + geo.plot_w)

    def __call__(self, t: float) -> float:
        return self.many([t])[0]

    def many(self, times: Sequence[float]) -> list[float]:
        """Return the x of each of ``times`` (ascending, within the axis): a stretch at a time."""
        out: list[float] = []
        for k in range(len(self._t) - 1):
            t0, t1, x0, x1 = self._t[k], self._t[k + 1], self._x[k], self._x[k + 1]
            end = bisect.bisect_right(times, t1) if k < len(self._t) - 2 else len(times)
            scale = (x1 - x0) / (t1 - t0) if t1 > t0 else 0.0
            out += [x0 + (t - t0) * scale for t in times[len(out) : end]]
        return out

    def ticks(self) -> list[tuple[float, str]]:
        """Return the time labels ``(x, text)``: one nice step, never crowded nor on a fold."""
        gap = self.geo.tick_gap
        beyond = _nice_step(self._t[-1], int(self.geo.plot_w / gap))  # past a day per label
        step = next((s for s in _STEPS if s * self.per_s >= gap), beyond)
        centres = [(self(a) + self(b)) / 2 for a, b in self.folds]  # where the folds' labels go
        out: list[tuple[float, str]] = []
        for t0, t1 in zip(self._t[::2], self._t[1::2], strict=True):  # the linear stretches
            first = math.ceil(t0 / step - 1e-9)
            for k in range(first, min(math.floor(t1 / step + 1e-9), first + 20) + 1):
                x = self(k * step)
                apart = all(abs(x - p) >= 0.6 * gap for p, _ in out)
                if apart and all(abs(x - c) >= 0.9 * gap for c in centres) and len(out) < 20:
                    out.append((x, _time_label(k * step, step)))
        return out


class _Page(NamedTuple):  # what every chart and table of one page shares
    trace: Trace
    leaks: list[Leak]
    growth: list[tuple[int | None, ...]]  # per test, per device: what the leak rule holds
    lanes: list[int]  # per test
    peaks: list[Reading]  # per test, per device: the highest reading


def _wait_fill(w: WaitSpan) -> str:
    return _CHECK if w.by_leak_check else _WAIT if w.ok else _WAIT_FAILED


def _wait_tip(w: WaitSpan) -> str:
    if w.by_leak_check:
        end = "memory came back" if w.ok else "memory still held"
        tip = f"the leak check waited {_fmt_s(w.duration)}: {end}"
    else:
        tip = f"{w.kind}: {_fmt_s(w.duration)}{'' if w.ok else ' (failed)'}"
    return tip + (f"\nin {w.test}" if w.test else "")


def _el(tag: str, attrs: str, text: str = "", tip: str = "") -> str:
    """An SVG element: ``attrs`` as written, then ``text`` and a tooltip ``tip`` (escaped)."""
    inner = _e(text) + (f"<title>{_e(tip)}</title>" if tip else "")
    return f"<{tag} {attrs}>{inner}</{tag}>" if inner else f"<{tag} {attrs}/>"


def _box(x0: float, x1: float, y: float, h: float, least: float = 0.3) -> str:
    return f'x="{x0:.2f}" y="{y:.2f}" width="{max(x1 - x0, least):.2f}" height="{h:.2f}"'


def _seg(xs: tuple[float, float], ys: tuple[float, float], stroke: str, width: float = 0.6) -> str:
    xy = f'x1="{xs[0]:.2f}" x2="{xs[1]:.2f}" y1="{ys[0]:.2f}" y2="{ys[1]:.2f}"'
    return f'{xy} stroke="{stroke}" stroke-width="{width}"'


def _at(x: float, y: float, anchor: str = "end") -> str:
    return f'x="{x:.2f}" y="{y:.2f}" text-anchor="{anchor}"'


def _chart(page: _Page, pos: int, x_of: _TimeAxis, line: _Line, ends: _Ends, *, full: bool) -> str:
    """Return device ``pos``'s chart at one geometry and scale; ``line``: its memory envelope."""
    trace, geo, dev = page.trace, x_of.geo, page.trace.devices[pos]
    color = _PALETTE[pos % len(_PALETTE)]
    peak, low, high = ends
    ymin, ymax = _axis(low, high, dev.total, full=full)
    span_y = max(ymax - ymin, 1.0)
    left, right, top, plot_h, lane_h = geo.left, geo.w - geo.right, geo.top, geo.plot_h, geo.lane_h
    bottom, tests_top = top + plot_h, top + plot_h + geo.axis_h
    waits_top = tests_top + (max(page.lanes, default=0) + 1) * lane_h + 8
    leaked = {leak.nodeid: leak for leak in page.leaks if leak.device == dev.index}

    def y_of(v: float) -> float:
        return top + plot_h * (1 - (min(max(v, ymin), ymax) - ymin) / span_y)

    out = [
        f'<svg class="{"phone " * geo.phone}chart {"full" if full else "fit"}-scale" '
        f'viewBox="0 0 {geo.w} {waits_top + lane_h + 10}" role="img" data-device="{dev.index}" '
        f'aria-label="Used memory of device {dev.index} over time">'
    ]
    spans = [
        (i, s, x_of(s.start), x_of(s.end), s.nodeid in leaked) for i, s in enumerate(trace.tests)
    ]
    spans = [s for s in spans if s[3] - s[2] >= 0.3 or s[4]]  # too narrow to see: left out
    for i, span, x0, x1, hit in spans:  # bands behind everything
        tip = f"{span.nodeid}\n{span.outcome or 'no outcome'}, {_fmt_s(span.duration)}, device "
        tip += f"{dev.index}: {_fmt_delta(page.growth[i][pos])}"
        fill = "#fbd5d5" if hit else ("#eef3fa", "#e2eaf5")[i % 2]
        box = _box(x0, x1, top, plot_h, 0.3 + 1.2 * hit)
        attrs = f'class="test-band{" leaked" * hit}" data-nodeid="{_e(span.nodeid)}" {box}'
        out.append(_el("rect", f'{attrs} fill="{fill}"', tip=tip))
    waits = [w for w in trace.waits if not w.devices or dev.index in w.devices]
    for w in waits:  # a light band over the chart while a wait lasts
        attrs = _box(x_of(w.start), x_of(w.end), top, plot_h, 0.5)
        out.append(_el("rect", f'{attrs} fill="{_wait_fill(w)}" fill-opacity="0.12"'))
    unit, unit_name = (GIB, "GiB") if ymax >= GIB else (MIB, "MiB")
    step = _nice_step(span_y / unit, 5 if plot_h * geo.font <= 260 * 11 else 4)
    # Ticks are counted, never stepped up to the top: at 2**55 bytes a float step is too fine
    # to reach a tolerance relative to the value, and that loop ran for hours.
    first = math.ceil(ymin / unit / step - 1e-9)
    for k in range(first, min(math.floor(ymax / unit / step + 1e-9), first + 10) + 1):
        y = y_of(k * step * unit)
        out.append(_el("line", _seg((left, right), (y, y), "#d0d5db")))
        label = f"{k * step:.{_decimals(step)}f} {unit_name}"
        out.append(_el("text", _at(left - 6, y + geo.font * 0.35), label))
    label_y = bottom + geo.font + 5
    for a, b in x_of.folds:  # a flat stretch, drawn narrow: a grey band and its length
        x0, x1 = x_of(a), x_of(b)
        tip = f"{_fmt_s(b - a)} flat (no reading moved by more than 1 % of the total), no test "
        out += [
            f'<g class="fold">{_el("rect", f"{_box(x0, x1, top, plot_h)} fill={_FOLD!r}")}',
            f'<path d="M{x0:.2f},{top}V{bottom}M{x1:.2f},{top}V{bottom}" stroke="#9aa3ad" '
            'stroke-dasharray="3 3"/>',
            _el("text", _at((x0 + x1) / 2, label_y, "middle"), f"⋯{_fmt_short(b - a)}⋯"),
            f"<title>{_e(tip)}or wait: drawn narrow</title></g>",
        ]
    for x, label in x_of.ticks():
        out.append(_el("line", _seg((x, x), (top, bottom), "#e6e9ed")))
        out.append(_el("text", _at(x, label_y, "middle"), label))
    if 0 < dev.total <= ymax * 1.0001:
        y, total = y_of(dev.total), f"total {format_bytes(dev.total)}"
        attrs = f'class="total" {_seg((left, right), (y, y), "#555", 0.8)} stroke-dasharray="4 3"'
        out.append(_el("line", attrs, tip=total))
    frame = _box(left, right, top, plot_h)
    out.append(_el("rect", f'{frame} fill="none" stroke="#9aa3ad" stroke-width="0.8"'))
    dashed = (seg if len(seg) > 1 else [*seg, (seg[0][0] + 1.0, seg[0][1])] for seg in line)
    if d := " ".join("M" + " L".join(f"{x:.2f},{y_of(v):.2f}" for x, v in seg) for seg in dashed):
        attrs = f'class="used" d="{d}" fill="none" stroke="{color}" stroke-width="1.8"'
        out.append(_el("path", attrs, tip=f"used memory, device {dev.index}"))
    if peak is not None:  # a marker and its figure, beside it
        px, py, text = x_of(peak[1]), y_of(peak[0]), f"peak {format_bytes(peak[0])}"
        anchor, dx = ("end", -7) if px > left + geo.plot_w * 0.8 else ("start", 7)
        ty = py + geo.font + 3 if py < top + geo.font + 3 else py - 6
        out += [
            f'<g class="peak-marker"><circle cx="{px:.2f}" cy="{py:.2f}" r="4.5" fill="#fff" '
            f'stroke="{color}" stroke-width="2"/>',
            _el("text", f'class="peak-label" {_at(px + dx, ty, anchor)}', text),
            f"<title>{_e(text)} at {_e(_fmt_s(peak[1]))}</title></g>",
        ]
    for _, span, _, x1, _ in spans:  # a red bracket from before to after at a leak's end
        leak = leaked.get(span.nodeid)
        if leak is not None and leak.after > leak.before:
            y0, y1 = y_of(leak.before), y_of(leak.after)
            tip = f"{span.nodeid} left {_fmt_delta(leak.leaked)} held on device {dev.index}"
            out += [
                f'<g class="leak-marker" data-nodeid="{_e(span.nodeid)}">',
                _el("line", _seg((x1, x1), (y0, y1), _LEAK, 3)),
                f'<circle cx="{x1:.2f}" cy="{y1:.2f}" r="4" fill="{_LEAK}"/>',
                f"<title>{_e(tip)}</title></g>",
            ]
    what = "command" if trace.command is not None else "tests"
    out.append(_el("text", _at(left - 6, tests_top + lane_h - 4), what))
    for i, span, x0, x1, hit in spans:  # the lanes below the plot
        fill = _LEAK if hit else (_FAILED if span.outcome == "failed" else _TEST)
        y = tests_top + page.lanes[i] * lane_h
        attrs = f'{_box(x0, x1, y + 1, lane_h - 2, 1.5)} fill="{fill}" stroke="#fff"'
        out.append(_el("rect", attrs, tip=f"{span.nodeid} ({_fmt_s(span.duration)})"))
        name = trace.command[0].rsplit("/", 1)[-1] if trace.command else _short_name(span.nodeid)
        if label := _fit_label(name, x1 - x0, geo.lane_font):
            ink = "#fff" if fill in (_LEAK, _FAILED) else "#1d1d1f"
            at = _at(x0 + 3, y + 0.7 * lane_h, "start")
            attrs = f'class="lane-label" {at} style="fill:{ink}" data-nodeid="{_e(span.nodeid)}"'
            out.append(_el("text", attrs, label))
    out.append(_el("text", _at(left - 6, waits_top + lane_h - 4), "waits"))
    for w in waits:
        attrs = f'class="wait" {_box(x_of(w.start), x_of(w.end), waits_top + 1, lane_h - 2, 2)}'
        out.append(_el("rect", f'{attrs} fill="{_wait_fill(w)}"', tip=_wait_tip(w)))
    return "".join(out) + "</svg>"


def _badge(text: str, cls: str = "", ident: str = "") -> str:
    attr = f' id="{ident}"' if ident else ""
    return f'<span class="badge {cls}"{attr}>{_e(text)}</span>'


def _summary(trace: Trace, leaks: Sequence[Leak], end_t: float) -> str:
    sampling = f"{trace.sample_hz:g} samples/s requested; {len(trace.samples)} samples kept"
    if trace.decimation:
        interval = 2**trace.decimation / trace.sample_hz if trace.sample_hz > 0 else 0.0
        sampling += f", halved {trace.decimation}× to one per {_fmt_s(interval)} (peaks kept)"
    command, grace = trace.command, f"{trace.leak_grace_s:g} s"
    rule = f"more than {format_bytes(trace.leak_tolerance_bytes)} still held " + (
        f"when the next test's body begins ({grace} after the last test)"
        if command is None
        else f"at the lowest point in the {grace} after the command exits"
    )
    rows = [
        ("Platform", trace.platform or "none detected"),
        ("Started", time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(trace.started_at))),
        ("Duration", _fmt_s(end_t)),
        ("Sampling", sampling),
        ("Leak rule", rule),
        ("Command", None if command is None else " ".join(command)),
        ("Exit status", trace.exit_code),
    ]
    body = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in rows if v is not None)
    if command is not None:
        code, held = trace.exit_code, len({leak.device for leak in leaks})
        status = "not finished" if code is None else f"exit status {code}"
        badges = [_badge(status, "good" if code == 0 else "bad")]
        text = f"left memory held on {_plural(held, 'device')}" if held else "no memory left held"
    else:
        held = len({leak.nodeid for leak in leaks})
        badges, text = [_badge(_plural(len(trace.tests), "test"))], f"{held} leaking"
    badges.append(_badge(text, "bad" if held else "good", "leak-count"))
    waits = [w for w in trace.waits if not w.by_leak_check]
    if waits or command is None:  # a recorded command's own waits are not seen
        total = f"{_plural(len(waits), 'wait')}, {_fmt_s(sum(w.duration for w in waits))} in total"
        badges.append(_badge(total, "warn" * bool(waits)))
    if failed := sum(not w.ok for w in waits):
        badges.append(_badge(f"{_plural(failed, 'wait')} failed", "bad"))
    notes = [_e(n) for n in trace.notes] + ([] if trace.context_free else [_CONTEXT_NOTE])
    shown = f'<div class="notes">{"".join(f"<p>{n}</p>" for n in notes)}</div>' if notes else ""
    return f'<dl class="summary">{body}</dl><div class="badges">{"".join(badges)}</div>{shown}'


Cell = tuple[str, str]  # (HTML, class)


def _table(ident: str, heads: Sequence[Cell], rows: Sequence[tuple[str, Sequence[Cell]]]) -> str:
    """A table of ``heads`` (text, class) and rows (class, cells); each cell names its head."""
    th = "".join(f'<th class="{cls}">{_e(text)}</th>' for text, cls in heads)
    trs = "".join(
        f'<tr class="{row}">'
        + "".join(
            f'<td class="{cls}" data-label="{_e(head)}">{text}</td>'
            for (head, _), (text, cls) in zip(heads, cells, strict=True)
        )
        + "</tr>"
        for row, cells in rows
    )
    kind = "" if ident == "tests" else ' class="stack"'  # a phone shows a card per row
    return f'<table id="{ident}"{kind}><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>'


def _whose(leak: Leak) -> str:
    """`` (held by this process, child pid 7 1.00 GiB)`` for a leak judged by owner, else ``""``."""
    blame = leak.blame
    if blame is None or not blame.attributed:
        return ""
    parts = ["this process"] if (blame.leaked or 0) - sum(blame.children.values()) > 0 else []
    parts += [f"child pid {p} {format_bytes(n)}" for p, n in sorted(blame.children.items())]
    return f" (held by {', '.join(parts)})" if parts else ""


def _more(total: int) -> str:
    return f"<p>… and {total - MAX_ROWS} more.</p>" if total > MAX_ROWS else ""


def _sizes(*sizes: int | None) -> list[Cell]:
    return [(_e(format_bytes(n)), "num") for n in sizes]


def _delta(n: int | None, tolerance: int) -> Cell:
    return _e(_fmt_delta(n)), "num grew" if (n or 0) > tolerance else "num"


def _leak_table(trace: Trace, leaks: Sequence[Leak], none_left: str) -> str:
    if not leaks:
        tolerance = _e(format_bytes(trace.leak_tolerance_bytes))
        return f'<p id="no-leaks">{none_left} more than {tolerance} held on any device.</p>'
    test = trace.command is None
    heads = [("Test", "")] * test + [(h, "num") for h in _LEAK_HEADS]
    rows = []
    for leak in leaks[:MAX_ROWS]:
        cells = [(_e(leak.nodeid + _whose(leak)), "id")] * test + [(str(leak.device), "num")]
        cells += _sizes(leak.before, leak.at_end, leak.after)
        rows.append(("leak", [*cells, (_e(_fmt_delta(leak.leaked)), "num grew")]))
    return _table("leaks", heads, rows) + _more(len(leaks))


def _wait_table(trace: Trace) -> str:
    heads = [(h, "num" if h in ("Took", "At") else "") for h in _WAIT_HEADS]
    rows = []
    for w in trace.slowest_waits(20):
        devices = _e(", ".join(map(str, w.devices)) or "all")
        cells = [(_e(_fmt_s(w.duration)), "num"), (_e(w.kind), "")]
        cells += [(_e(w.test or "(outside tests)"), "id"), (devices, ""), (_RESULT[w.ok], "")]
        rows.append(("wait" if w.ok else "wait-failed", [*cells, (f"{w.start:.2f} s", "num")]))
    table = _table("waits", heads, rows) if rows else _NO_WAITS
    if own := [w for w in trace.waits if w.by_leak_check]:
        took = _e(_fmt_s(sum(w.duration for w in own)))
        table += (
            f'<p id="leak-check-waits">Apart from these, the leak check waited '
            f"{_plural(len(own), 'time')}, {took} in all, for a test's memory to come back; "
            f"{sum(not w.ok for w in own)} ended with memory still held.</p>"
        )
    return table


def _test_table(page: _Page, no_tests: str) -> str:
    trace, tol, peaks = page.trace, page.trace.leak_tolerance_bytes, page.peaks
    if not trace.tests:
        return f'<p id="no-tests">{no_tests}</p>'
    if trace.command is not None:  # one span: per device, before, at the peak and after
        span, grew, held = trace.tests[0], page.growth[0], trace.held_after(trace.tests[0])
        heads = [("Device", ""), *[(h, "num") for h in _COMMAND_HEADS]]
        rows = []
        for pos, dev in enumerate(trace.devices):
            sizes = _sizes(span.used_before[pos], peaks[0][pos], held[pos])
            cells = [(f"{dev.index}: {_e(dev.name)}", ""), *sizes, _delta(grew[pos], tol)]
            rows.append(("leak" if (grew[pos] or 0) > tol else "test", cells))
        return _table("per-device", heads, rows)
    heads = [("#", "num"), ("Test", ""), ("Outcome", ""), ("Start", "num"), ("Took", "num")]
    heads += [(f"{what} dev {d.index}", "num") for what in ("Δ", "Peak") for d in trace.devices]
    leaked = {leak.nodeid for leak in page.leaks}
    rows = []
    for i, span in enumerate(trace.tests[:MAX_ROWS]):
        outcome = {"passed": "ok", "failed": "failed", "skipped": "skipped"}.get(span.outcome, "")
        cells = [(str(i + 1), "num"), (_e(span.nodeid), "id"), (_e(span.outcome), outcome)]
        cells += [(f"{span.start:.2f} s", "num"), (_e(_fmt_s(span.duration)), "num")]
        cells += [_delta(g, tol) for g in page.growth[i]]
        cells += [(_e(format_bytes(p)), "num peak") for p in peaks[i]]
        rows.append(("leak" if span.nodeid in leaked else "test", cells))
    return (
        f"<details{' open' * (len(trace.tests) <= 300)}><summary>All {len(trace.tests)} tests"
        f'</summary><p class="hint{" always" * (len(trace.devices) > 2)}">Wider than the screen: '
        f'scroll the table sideways.</p><div class="scroll">{_table("tests", heads, rows)}</div>'
        f"{_more(len(trace.tests))}</details>"
    )


def _device(page: _Page, pos: int, axes: list[_TimeAxis], xs: list[list[float]]) -> str:
    """Return device ``pos``'s section: its heading, its four charts and their legend."""
    trace, dev = page.trace, page.trace.devices[pos]
    extremes = _extremes(trace, pos)
    drawn = []
    for x_of, x in zip(axes, xs, strict=True):
        line = _envelope(trace.samples, pos, x, x_of.geo.w)
        both = "".join(_chart(page, pos, x_of, line, extremes, full=f) for f in (False, True))
        drawn.append(f'<div class="{"narrow" if x_of.geo.phone else "wide"}">{both}</div>')
    peak, text = extremes[0], ""
    if peak is not None:
        tests = zip(trace.tests, page.peaks, strict=True) if trace.command is None else ()
        during = [s.nodeid for s, p in tests if p[pos] == peak[0] and s.start <= peak[1] <= s.end]
        where = f" during {during[0]}" if during else ""
        text = f"— peak {format_bytes(peak[0])} at {_fmt_s(peak[1])}{where}"
        text = f' <span class="peak" data-peak="{peak[0]}">{_e(text)}</span>'
    if trace.command is not None:  # the legend
        keys = [(_TEST, "the command"), (_LEAK, "left memory held")]
    else:
        keys = [("#e2eaf5", "test span"), (_LEAK, "test that left memory held")]
        keys.append((_FAILED, "failed test"))
    keys = [(_PALETTE[pos % len(_PALETTE)], "used memory"), *keys, (_WAIT, "memory wait")]
    keys += [(_CHECK, "the leak check's own wait")] * any(w.by_leak_check for w in trace.waits)
    keys += [(_FOLD, "a flat stretch, drawn narrow")] * bool(axes[0].folds)
    legend = "".join(f'<span><i class="sw" style="background:{c}"></i>{k}</span>' for c, k in keys)
    total = format_bytes(dev.total) if dev.total > 0 else "unknown"
    return (
        f'<section class="device"><h3>Device {dev.index}: {_e(dev.name)} ({_e(total)}){text}'
        f'</h3>{"".join(drawn)}<div class="legend">{legend}{_TOTAL_KEY}</div></section>'
    )


def _data(name: str) -> str:  # a file of the package
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def render_html(trace: Trace, *, title: str | None = None) -> str:
    """Return the report page for ``trace``: one HTML document that fetches nothing.

    The leak and test tables show at most :data:`MAX_ROWS` rows each.
    """
    growth = [trace.growth(s) for s in trace.tests]
    page = _Page(
        trace, trace.leaks(), growth, lanes(trace.tests, _MAX_LANES), peaks_per_test(trace)
    )
    ends = [s.end for s in trace.tests] + [w.end for w in trace.waits]
    end_t = max(trace.duration, *(s.t for s in trace.samples[-1:]), *ends, 1e-3)
    folds = _folds(trace, end_t)
    axes = [_TimeAxis(end_t, folds, geo) for geo in (_WIDE, _PHONE)]
    xs = [x_of.many([s.t for s in trace.samples]) for x_of in axes]
    charts = "".join(_device(page, pos, axes, xs) for pos in range(len(trace.devices)))
    text = json.loads(_data("report.json"))["tests" if trace.command is None else "command"]
    # The template's line breaks are there to read it by: the page has one, at its end.
    return string.Template(_data("report.html").replace("\n", "") + "\n").substitute(
        text,
        title=_e(title or "Device memory timeline"),
        platform=_e(trace.platform or "no platform"),
        css=_data("report.css"),
        summary=_summary(trace, page.leaks, end_t),
        charts=charts or '<p id="no-devices">No device was sampled.</p>',
        leaks=_leak_table(trace, page.leaks, text["none_left"]),
        waits=_wait_table(trace),
        tests=_test_table(page, text["no_tests"]),
    )


_TOTAL_KEY = '<span><i class="sw" style="border-top:2px dashed #555;height:0"></i>total</span>'
_NO_WAITS = '<p id="no-waits">No memory wait was observed.</p>'
_RESULT = ('<span class="failed">failed</span>', '<span class="ok">settled</span>')  # by ok
_LEAK_HEADS = ("Device", "Before", "At end", "Lowest after", "Left held")
_WAIT_HEADS = ("Took", "Wait", "During", "Devices", "Result", "At")
_COMMAND_HEADS = ("Before", "Peak", "Lowest after", "Change")


def write_report(
    trace: Trace,
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    format: Literal["html", "chrome"] = "html",
) -> Path:
    """Write a report of ``trace`` to ``path`` (its directory must exist) atomically.

    The leak rule is the trace's (``dataclasses.replace`` it to judge by another tolerance or
    grace period).

    Args:
        trace: The recorded session.
        path: Where; a path that is not a regular file is never replaced.
        title: The page's title (``html``).
        format: ``"html"``, :func:`render_html`'s self-contained page, or ``"chrome"``, the
            Chrome trace-event JSON that Perfetto and ``chrome://tracing`` open (memory as
            counter tracks, tests and waits as slices).

    Raises:
        OSError: When the file cannot be written.
        ValueError: For another ``format``.
    """
    if format not in ("html", "chrome"):
        raise ValueError(f"format must be 'html' or 'chrome', got {format!r}")
    text = render_html(trace, title=title) if format == "html" else chrome_trace_text(trace)
    return _files.write_text_atomic(path, text)

"""Render a :class:`~accelplat.timeline._trace.Trace` as one self-contained HTML page.

Charts are inline SVG; trace strings are escaped. A checkbox switches the fitted y-axes to
0..total with CSS alone: each chart is drawn at both scales, the y-independent layers once.
"""

from __future__ import annotations

import bisect
import html
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

from accelplat import _files
from accelplat._types import GIB, MIB
from accelplat._util import format_bytes
from accelplat.timeline._trace import Leak, Reading, Sample, TestSpan, Trace, WaitSpan

_PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
_LEAK, _WAIT, _WAIT_FAILED, _FAILED = "#d62728", "#ff7f0e", "#b30000", "#4b5563"
_CONTEXT_NOTE = "This platform's memory queries create a device context in the sampling process."

# chart geometry, in SVG user units: the width and the plot's margins, heights, test lanes
_W, _LEFT, _RIGHT, _TOP = 1200, 78, 16, 12
_PLOT_H, _AXIS_H, _LANE_H, _MAX_LANES = 220, 30, 16, 6
_PLOT_W = _W - _LEFT - _RIGHT

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
td.id{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;word-break:break-all}
tr.leak td{background:#fdecec}td.grew{color:#a3161a;font-weight:600}
tr.wait-failed td{background:#fdecec}.ok{color:#17622e}.failed{color:#a3161a;font-weight:600}
.skipped{color:#8a6d00}details summary{cursor:pointer;font-weight:600;margin:8px 0}
footer{margin-top:32px;color:#777;font-size:12px}.scale{margin:6px 0 10px;color:#444}
svg.chart.full-scale{display:none}#full-scale:checked~.charts svg.chart.fit-scale{display:none}
#full-scale:checked~.charts svg.chart.full-scale{display:block}.peak{color:#444;font-weight:400}
svg text.lane-label{font:10px ui-monospace,SFMono-Regular,Menlo,monospace;fill:#1d1d1f}
svg text.peak-label{font:11px system-ui,sans-serif;font-weight:600;fill:#1d1d1f}
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
    decimals = 0 if step >= 1 else max(0, -math.floor(math.log10(step)))
    return f"{t:.{decimals}f} s"


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
    # least 1 MiB; a tenth of the reading for a flat series), down to 0 when the readings near it.
    if full:
        top = float(max(total, hi, 1))
        return 0.0, top if total > 0 else top * 1.1
    pad = max((hi - lo) * 0.1 if hi > lo else hi * 0.1, float(MIB))
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


def _fit_label(text: str, width: float) -> str:  # cut to ``width`` SVG units at 10 px monospace
    capacity = int((width - 6) / 6.1)
    if capacity >= len(text):
        return text
    return text[: capacity - 1] + "…" if capacity >= 6 else ""


def _envelope(
    samples: Sequence[Sample], pos: int, x_of: Callable[[float], float], width: int
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

    for s in samples:
        value = s.used[pos] if pos < len(s.used) else None
        if value is None:
            flush()
            if segments[-1]:
                segments.append([])
            column_x = None
            continue
        x = x_of(s.t)
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


def _x_scale(end_t: float) -> Callable[[float], float]:
    def x_of(t: float) -> float:
        return _LEFT + _PLOT_W * (t / end_t)

    return x_of


def _device_chart(
    trace: Trace, pos: int, end_t: float, leaked: set[str], layers: _Layers, *, full: bool
) -> str:
    # ``leaked`` names the tests leaking on device ``pos``
    dev = trace.devices[pos]
    color = _PALETTE[pos % len(_PALETTE)]
    peak = layers.peak
    high = peak[0] if peak is not None else 0
    ymin, ymax = _axis(min(layers.low, high), high, dev.total, full=full)
    span_y = max(ymax - ymin, 1.0)
    unit, unit_name = (GIB, "GiB") if ymax >= GIB else (MIB, "MiB")
    x_of = _x_scale(end_t)

    def y_of(v: float) -> float:
        return _TOP + _PLOT_H * (1 - (min(max(v, ymin), ymax) - ymin) / span_y)

    scale = "full-scale" if full else "fit-scale"
    out: list[str] = [
        f'<svg class="chart {scale}" viewBox="0 0 {_W} {layers.height}" role="img" '
        f'data-device="{dev.index}" aria-label="Used memory of device {dev.index} over time">',
        layers.band,
    ]
    step = _nice_step(span_y / unit, 5)
    decimals = max(0, -math.floor(math.log10(step))) if step < 1 else 0
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
            f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y:.2f}" y2="{y:.2f}" '
            f'stroke="#d0d5db" stroke-width="0.6"/>'
            f'<text x="{_LEFT - 6}" y="{y + 4:.2f}" text-anchor="end">{_e(label)}</text>'
        )
    for tstep in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60,
                  120, 300, 600, 900, 1800, 3600, 7200, 14400, 21600, 43200, 86400):  # fmt: skip
        if end_t / tstep <= 10:
            break
    else:
        tstep = _nice_step(end_t, 10)
    for k in range(min(int(end_t / tstep * 1.0001), 20) + 1):
        t = k * tstep
        x = x_of(t)
        out.append(
            f'<line x1="{x:.2f}" x2="{x:.2f}" y1="{_TOP}" y2="{_TOP + _PLOT_H}" '
            f'stroke="#e6e9ed" stroke-width="0.6"/>'
            f'<text x="{x:.2f}" y="{_TOP + _PLOT_H + 16}" text-anchor="middle">'
            f"{_e(_time_label(t, tstep))}</text>"
        )
    if 0 < dev.total <= ymax * 1.0001:
        y = y_of(dev.total)
        out.append(
            f'<line class="total" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y:.2f}" y2="{y:.2f}" '
            f'stroke="#555" stroke-dasharray="4 3" stroke-width="0.8"/>'
            f'<text x="{_W - _RIGHT - 4}" y="{y + 12:.2f}" text-anchor="end">total '
            f"{_e(format_bytes(dev.total))}</text>"
        )
    out.append(
        f'<rect x="{_LEFT}" y="{_TOP}" width="{_PLOT_W}" height="{_PLOT_H}" fill="none" '
        f'stroke="#9aa3ad" stroke-width="0.8"/></g>'
    )
    paths = []
    for seg in _envelope(trace.samples, pos, x_of, _W):
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
        anchor = "end" if px > _LEFT + _PLOT_W * 0.8 else "start"
        dx = -7 if anchor == "end" else 7
        ty = py + 14 if py < _TOP + 14 else py - 6
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


def _chart_layers(trace: Trace, pos: int, end_t: float, leaked: set[str]) -> _Layers:
    # the layers of device ``pos``'s chart that do not depend on its y-axis
    dev = trace.devices[pos]
    x_of = _x_scale(end_t)
    lanes = _lanes(trace.tests)
    tests_top = _TOP + _PLOT_H + _AXIS_H
    waits_top = tests_top + (max(lanes, default=0) + 1) * _LANE_H + 8
    band = ['<g class="test-bands">']  # behind everything; the test lanes go below the plot
    body = [
        f'<text x="{_LEFT - 6}" y="{tests_top + _LANE_H - 2}" text-anchor="end">tests</text>'
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
            f'data-nodeid="{_e(span.nodeid)}" x="{x0:.2f}" y="{_TOP}" '
            f'width="{max(x1 - x0, 1.5 if is_leak else 0.3):.2f}" height="{_PLOT_H}" '
            f'fill="{"#fbd5d5" if is_leak else ("#eef3fa", "#e2eaf5")[i % 2]}">'
            f"<title>{_e(tip)}</title></rect>"
        )
        fill = _LEAK if is_leak else (_FAILED if span.outcome == "failed" else "#a9bcd6")
        y = tests_top + lane * _LANE_H
        body.append(
            f'<rect x="{x0:.2f}" y="{y + 1}" width="{max(x1 - x0, 1.5):.2f}" '
            f'height="{_LANE_H - 2}" fill="{fill}" stroke="#fff" stroke-width="0.5">'
            f"<title>{_e(span.nodeid)} ({_e(_fmt_s(span.duration))})</title></rect>"
        )
        label = _fit_label(_short_name(span.nodeid), x1 - x0)
        if label:
            colour = "#fff" if fill in (_LEAK, _FAILED) else "#1d1d1f"
            body.append(
                f'<text class="lane-label" x="{x0 + 3:.2f}" y="{y + _LANE_H - 4}" '
                f'style="fill:{colour}" data-nodeid="{_e(span.nodeid)}">{_e(label)}</text>'
            )
    band.append("</g>")
    body.append(
        f'</g><text x="{_LEFT - 6}" y="{waits_top + _LANE_H - 2}" text-anchor="end">waits</text>'
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
            f'height="{_LANE_H - 2}" fill="{fill}"><title>{_e(tip)}</title></rect>'
            f'<rect x="{x0:.2f}" y="{_TOP}" width="{max(x1 - x0, 0.5):.2f}" height="{_PLOT_H}" '
            f'fill="{fill}" fill-opacity="0.12"/>'
        )
    body.append("</g>")
    peak = _peak_of(trace, pos)
    low = min((u for s in trace.samples if (u := s.used[pos]) is not None), default=0)
    return _Layers("".join(band), "".join(body), waits_top + _LANE_H + 10, peak, low)


def _summary(trace: Trace, leaks: Sequence[Leak], end_t: float) -> str:
    started = datetime.fromtimestamp(trace.started_at, tz=timezone.utc)
    interval = (2**trace.decimation) / trace.sample_hz if trace.sample_hz > 0 else 0.0
    sampling = f"{trace.sample_hz:g} samples/s requested; {len(trace.samples)} samples kept"
    if trace.decimation:
        sampling += f", halved {trace.decimation}× to one per {_fmt_s(interval)} (peaks kept)"
    rule = f"more than {format_bytes(trace.leak_tolerance_bytes)} still held when the next test's"
    rule += f" body begins ({trace.leak_grace_s:g} s after the last test)"
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
    badges = [
        f'<span class="badge">{_plural(len(trace.tests), "test")}</span>',
        f'<span class="badge {"bad" if leaked_tests else "good"}" id="leak-count">'
        f"{leaked_tests} leaking</span>",
        f'<span class="badge {"warn" if trace.waits else ""}">'
        f"{_plural(len(trace.waits), 'wait')}, {_e(_fmt_s(wait_total))} in total</span>",
    ]
    if failed_waits:
        badges.append(f'<span class="badge bad">{_plural(failed_waits, "wait")} failed</span>')
    notes = [_e(n) for n in trace.notes]
    if not trace.context_free:
        notes.append(_CONTEXT_NOTE)
    shown = f'<div class="notes">{"".join(f"<p>{n}</p>" for n in notes)}</div>' if notes else ""
    return f'<dl class="summary">{body}</dl><div class="badges">{"".join(badges)}</div>{shown}'


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


def _leak_table(trace: Trace, leaks: Sequence[Leak], limit: int) -> str:
    if not leaks:
        return (
            f'<p id="no-leaks">No test left more than '
            f"{_e(format_bytes(trace.leak_tolerance_bytes))} held on any device.</p>"
        )
    rows = "".join(
        f'<tr class="leak"><td class="id">{_e(leak.nodeid)}{_e(_whose(leak))}</td>'
        f'<td class="num">{leak.device}</td>'
        f'<td class="num">{_e(format_bytes(leak.before))}</td>'
        f'<td class="num">{_e(format_bytes(leak.at_end))}</td>'
        f'<td class="num">{_e(format_bytes(leak.after))}</td>'
        f'<td class="num grew">{_e(_fmt_delta(leak.leaked))}</td></tr>'
        for leak in leaks[:limit]
    )
    more = f"<p>… and {len(leaks) - limit} more.</p>" if len(leaks) > limit else ""
    return (
        '<table id="leaks"><thead><tr><th>Test</th><th class="num">Device</th>'
        '<th class="num">Before</th><th class="num">At end</th>'
        '<th class="num">Lowest after</th><th class="num">Left held</th>'
        f"</tr></thead><tbody>{rows}</tbody></table>{more}"
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
            f'<td class="num">{_e(_fmt_s(w.duration))}</td><td>{_e(w.kind)}</td>'
            f'<td class="id">{_e(w.test or "(outside tests)")}</td><td>{_e(devices)}</td>'
            f'<td>{result}</td><td class="num">{w.start:.2f} s</td></tr>'
        )
    return (
        '<table id="waits"><thead><tr><th class="num">Took</th><th>Wait</th><th>During</th>'
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
        '<table id="tests"><thead><tr><th class="num">#</th><th>Test</th><th>Outcome</th>'
        f'<th class="num">Start</th><th class="num">Took</th>{heads}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>{more}</details>"
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
    for pos, dev in enumerate(trace.devices):
        color = _PALETTE[pos % len(_PALETTE)]
        total = format_bytes(dev.total) if dev.total > 0 else "unknown"
        leaked_here = leaked_on[dev.index]
        layers = _chart_layers(trace, pos, end_t, leaked_here)
        peak = layers.peak
        peak_text = ""
        if peak is not None:
            during = [
                span.nodeid
                for span, p in zip(trace.tests, per_test, strict=True)
                if p[pos] == peak[0] and span.start <= peak[1] <= span.end
            ]
            where = f" during {during[0]}" if during else ""
            peak_text = (
                f' <span class="peak" data-peak="{peak[0]}">— peak '
                f"{_e(format_bytes(peak[0]))} at {_e(_fmt_s(peak[1]))}{_e(where)}</span>"
            )
        charts.append(
            f'<section class="device"><h3>Device {dev.index}: {_e(dev.name)} '
            f"({_e(total)}){peak_text}</h3>"
            f"{_device_chart(trace, pos, end_t, leaked_here, layers, full=False)}"
            f"{_device_chart(trace, pos, end_t, leaked_here, layers, full=True)}"
            '<div class="legend">'
            f'<span><i class="sw" style="background:{color}"></i>used memory</span>'
            '<span><i class="sw" style="background:#e2eaf5"></i>test span</span>'
            f'<span><i class="sw" style="background:{_LEAK}"></i>test that left memory held</span>'
            f'<span><i class="sw" style="background:{_FAILED}"></i>failed test</span>'
            f'<span><i class="sw" style="background:{_WAIT}"></i>memory wait</span>'
            '<span><i class="sw" style="border-top:2px dashed #555;height:0"></i>total</span>'
            "</div></section>"
        )
    if not charts:
        charts.append('<p id="no-devices">No device was sampled.</p>')
    platform = trace.platform or "no platform"
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(heading)} — {_e(platform)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_e(heading)}</h1>"
        f'<p class="sub">Used memory per device, the tests that ran and the memory waits, '
        f"recorded by accelplat.</p>"
        f"{_summary(trace, leaks, end_t)}"
        "<h2>Memory over time</h2>"
        '<input type="checkbox" id="full-scale"><label for="full-scale" class="scale"> '
        "Full scale: every y-axis from 0 to the device's total (otherwise fitted to the memory "
        "used)</label>"
        f'<div class="charts">{"".join(charts)}</div>'
        f"<h2>Tests that left memory held</h2>{_leak_table(trace, leaks, max_rows)}"
        f"<h2>Slowest memory waits</h2>{_wait_table(trace.slowest_waits(20))}"
        f"<h2>Tests</h2>{_test_table(trace, leaked, max_rows, per_test)}"
        "<footer>A test leaks on a device when the device still holds more than the tolerance "
        "beyond what it held before the test's set-up, at the lowest point between the end of "
        "the test's teardown and the start of the next test's body (after the last test: the "
        "grace period). Memory that comes back late, during the next set-up or a settle wait, "
        "is therefore not a leak. Hover over bands, bars and markers for details."
        "</footer></body></html>\n"
    )


def write_report(
    trace: Trace,
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    leak_tolerance_bytes: int | None = None,
    leak_grace_s: float | None = None,
) -> Path:
    """Write :func:`render_html`'s page to ``path`` (its directory must exist) atomically.

    Raises:
        OSError: When the file cannot be written.
    """
    page = render_html(
        trace, title=title, leak_tolerance_bytes=leak_tolerance_bytes, leak_grace_s=leak_grace_s
    )
    return _files.write_text_atomic(path, page)

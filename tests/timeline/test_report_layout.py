"""The report's layout: folded flat stretches, time ticks, flat axes, phones, a recorded command."""

from __future__ import annotations

import html
import itertools
import re
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelplat._types import GIB, MIB
from accelplat.timeline import DeviceTrack, Sample, TestSpan, Trace, WaitSpan
from accelplat.timeline._render import (
    _PHONE,
    _WIDE,
    _axis,
    _decimals,
    _folds,
    _time_label,
    _TimeAxis,
    render_html,
)

H200 = 140 * GIB


def _busy_then_idle(idle_until: float = 126.0, *, edge: float | None = None) -> Trace:
    """Six busy seconds, then nothing changes until ``idle_until``; 130 s in all, at 10 Hz.

    ``edge``: a test ends then, inside the idle stretch.
    """
    samples = []
    for k in range(1301):
        t = k / 10
        used = 0.5 * GIB + (60 * GIB if 0.5 < t < 4.0 else 0) + (20 * GIB if t < idle_until else 0)
        samples.append(Sample(t, (int(used) if t > 0.3 else 0,)))
    reading = (0,)
    tests = [TestSpan("tests/t.py::test_busy", 0.1, 5.9, reading, reading, "passed", 0.2)]
    if edge is not None:
        tests.append(TestSpan("tests/t.py::test_idle", 6.0, edge, reading, reading, "passed", 6.1))
    return Trace(
        devices=(DeviceTrack(0, "H200", H200),),
        samples=tuple(samples),
        tests=tuple(tests),
        waits=(WaitSpan(6.0, 125.0, "settle", (0,)),) if edge is None else (),
        duration=130.0,
        sample_hz=10.0,
    )


def test_a_long_stretch_without_change_is_folded_so_the_busy_seconds_get_the_width() -> None:
    trace = _busy_then_idle()
    ((a, b),) = _folds(trace, 130.0)
    assert 6.0 < a < 15.0  # a twentieth of the stretch stays drawn at each end
    assert 115.0 < b < 126.0
    for geo in (_WIDE, _PHONE):
        x_of = _TimeAxis(130.0, [(a, b)], geo)
        busy = (x_of(6.0) - x_of(0.0)) / geo.plot_w
        assert busy > 0.2  # linear, 6 s of 130 would be 4.6 %
        assert x_of(0.0) == geo.left
        assert x_of(130.0) == pytest.approx(geo.left + geo.plot_w)
        assert x_of(b) - x_of(a) == pytest.approx(x_of.fold_w)
        xs = [x_of(t / 4) for t in range(521)]
        assert xs == sorted(xs)  # monotonic: time never runs backwards


def test_a_test_edge_or_a_change_splits_a_flat_stretch() -> None:
    # a test ends at 60 s: the flat stretch folds on either side of it, from sample to sample
    assert _folds(_busy_then_idle(edge=60.0), 130.0) == [
        pytest.approx((6.0 + 2.695, 59.9 - 2.695)),
        pytest.approx((60.0 + 3.295, 125.9 - 3.295)),  # the fall starts at 126 s
    ]
    busy = _busy_then_idle(idle_until=300.0)  # no fall at 126 s: still one fold, to the end
    assert len(_folds(busy, 130.0)) == 1
    short = replace(_busy_then_idle(), samples=_busy_then_idle().samples[:101], waits=())
    assert _folds(short, 10.0) == []  # 4 idle seconds: under 5 s, kept linear


def _series(values: list[float], hz: float = 10.0, total: int = 80 * GIB) -> Trace:
    samples = tuple(Sample(k / hz, (int(v),)) for k, v in enumerate(values))
    return Trace(
        devices=(DeviceTrack(0, "GPU", total),),
        samples=samples,
        duration=samples[-1].t,
        sample_hz=hz,
    )


def _flat_inside(trace: Trace, folds: list[tuple[float, float]]) -> bool:
    """Whether every fold holds readings within 1 % of the total of one another."""
    for a, b in folds:
        inside = [s.used[0] for s in trace.samples if a <= s.t <= b]
        if inside and max(inside) - min(inside) > 0.01 * trace.devices[0].total:  # type: ignore[operator]
            return False
    return True


def test_a_slow_ramp_is_never_folded_however_small_its_steps() -> None:
    """10 -> 60 GiB of 80 GiB over 60 s at 10 Hz: each step is 0.1 % of the total."""
    values = [10 * GIB] * 50 + [10 * GIB + 50 * GIB * k / 600 for k in range(601)]
    trace = _series(values)
    assert _folds(trace, trace.duration) == []
    page = render_html(trace)
    assert '<g class="fold">' not in page
    x_of = _TimeAxis(trace.duration, [], _WIDE)  # linear: the rise takes its share of the width
    assert (x_of(65.0) - x_of(5.0)) / _WIDE.plot_w == pytest.approx(60 / 65)


def test_a_step_between_two_flat_stretches_folds_each_side_apart() -> None:
    values = [20 * GIB] * 600 + [40 * GIB] * 600  # 60 s flat, a 20 GiB step, 60 s flat
    trace = _series(values)
    folds = _folds(trace, trace.duration)
    assert len(folds) == 2
    assert folds[0][1] < 60.0 < folds[1][0]  # neither crosses the step
    assert _flat_inside(trace, folds)


def test_noise_within_a_hundredth_of_the_total_still_folds() -> None:
    wobble = [0.0, 0.3, -0.2, 0.4, -0.4, 0.1]  # percent of the total
    values = [GIB] * 30 + [30 * GIB + 0.008 * GIB * wobble[k % 6] * 100 for k in range(1200)]
    trace = _series(values)
    folds = _folds(trace, trace.duration)
    assert len(folds) == 1
    a, b = folds[0]
    assert 3.0 < a < 10.0
    assert b > 110.0
    assert _flat_inside(trace, folds)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["flat", "ramp", "step", "noise"]),
            st.integers(1, 400),  # samples
            st.floats(0, 70),  # GiB: the level it moves to
        ),
        min_size=1,
        max_size=6,
    )
)
def test_whatever_the_shape_a_fold_holds_only_flat_readings(
    pieces: list[tuple[str, int, float]],
) -> None:
    values: list[float] = []
    level = 10.0 * GIB
    for kind, n, to in pieces:
        target = to * GIB
        for k in range(n):
            if kind == "ramp":
                values.append(level + (target - level) * (k + 1) / n)
            elif kind == "noise":
                values.append(level + (0.004 * 80 * GIB) * ((k * 7919) % 3 - 1))
            else:
                values.append(target if kind == "step" else level)
        level = values[-1]
    trace = _series(values)
    folds = _folds(trace, trace.duration)
    assert len(folds) <= 4
    assert _flat_inside(trace, folds)
    least = max(0.2 * trace.duration, 5.0)
    assert all((b - a) / 0.9 >= least - 1e-9 for a, b in folds)


def test_the_report_draws_the_fold_and_names_its_length() -> None:
    page = render_html(_busy_then_idle())
    fitted = page.split('<svg class="chart fit-scale"')[1].split("</svg>")[0]
    assert fitted.count('<g class="fold">') == 1
    label = re.search(r'<g class="fold">.*?⋯([^<]*)⋯</text><title>([^<]*)</title>', fitted)
    assert label is not None
    assert label.group(1) == "107 s"
    assert "flat (no reading moved by more than 1 % of the total)" in label.group(2)
    assert "a flat stretch, drawn narrow" in page  # the legend says what the band is
    phone = page.split('<svg class="phone chart fit-scale"')[1].split("</svg>")[0]
    assert phone.count('<g class="fold">') == 1  # the phone's chart folds the same stretch


@settings(max_examples=60, deadline=None)
@given(
    end=st.floats(1e-3, 1e7, allow_nan=False),
    cuts=st.lists(st.floats(0, 1, allow_nan=False), max_size=8),
)
def test_time_labels_never_crowd_nor_cross_a_fold(end: float, cuts: list[float]) -> None:
    points = sorted(c * end for c in cuts)
    folds = [(a, b) for a, b in zip(points[::2], points[1::2], strict=False) if b > a]
    for geo in (_WIDE, _PHONE):
        x_of = _TimeAxis(end, folds[:4], geo)
        ticks = x_of.ticks()
        assert 1 <= len(ticks) <= 20 or (folds and len(ticks) <= 20)
        xs = sorted(x for x, _ in ticks)
        assert all(b - a >= 0.6 * geo.tick_gap - 1e-6 for a, b in itertools.pairwise(xs))
        centres = [(x_of(a) + x_of(b)) / 2 for a, b in folds[:4]]
        assert all(abs(x - c) >= 0.9 * geo.tick_gap - 1e-6 for x in xs for c in centres)
        assert all(geo.left - 1e-6 <= x <= geo.left + geo.plot_w + 1e-6 for x in xs)


@pytest.mark.parametrize(
    ("step", "decimals", "label"),
    [(0.25, 2, "0.75 s"), (2.5, 1, "7.5 s"), (0.2, 1, "0.6 s"), (5, 0, "15 s"), (0.001, 3, "")],
)
def test_tick_labels_show_each_multiple_exactly(step: float, decimals: int, label: str) -> None:
    """A 0.25 step labelled with one decimal read 0.0, 0.2, 0.5, 0.8: wrong twice."""
    assert _decimals(step) == decimals
    if label:
        assert _time_label(3 * step, step) == label


@pytest.mark.parametrize(
    ("lo", "hi", "total", "expected"),
    [
        (20 * GIB, 20 * GIB + 4096, H200, (18 * GIB + 4096 * 0.9, 22 * GIB + 4096 * 1.1)),
        (0, 0, H200, (0.0, H200 * 0.01)),  # nothing used: a hundredth of the device
        (40 * GIB, 40 * GIB + 512 * MIB, H200, (40 * GIB - 4147.2 * MIB, 44 * GIB + 563.2 * MIB)),
    ],
    ids=["nearly-flat", "flat-at-zero", "flat-within-2-percent"],
)
def test_a_flat_series_gets_a_readable_axis(
    lo: int, hi: int, total: int, expected: tuple[float, float]
) -> None:
    """Not the ±1 MiB window that labelled 20 GiB as 19.999, 20.000 and 20.001 GiB."""
    ymin, ymax = _axis(lo, hi, total, full=False)
    assert (ymin, ymax) == pytest.approx(expected)
    assert ymax - ymin >= 0.1 * hi


def test_nearly_flat_readings_get_labels_a_person_can_tell_apart() -> None:
    samples = tuple(Sample(t / 10, (20 * GIB + (t % 3) * 4096,)) for t in range(50))
    trace = Trace(devices=(DeviceTrack(0, "H200", H200),), samples=samples, duration=5.0)
    fitted = render_html(trace).split('<svg class="chart fit-scale"')[1].split("</svg>")[0]
    labels = re.findall(r'text-anchor="end">([0-9.]+ [MG]iB)</text>', fitted)
    assert "20.0 GiB" in labels or "20 GiB" in labels
    assert all(len(label.split()[0]) <= 4 for label in labels), labels


def test_every_device_has_a_phone_chart_that_css_shows_on_a_narrow_screen() -> None:
    page = render_html(_busy_then_idle())
    assert page.count('<svg class="chart fit-scale" viewBox="0 0 1200 ') == 1
    assert page.count('<svg class="phone chart fit-scale" viewBox="0 0 600 ') == 1
    assert page.count('<svg class="phone chart full-scale" viewBox="0 0 600 ') == 1
    assert "@media (max-width:700px)" in page
    assert "svg.phone text{font-size:19px}" in page  # 19 units of 600 at 350 px: 11 px
    assert 'class="stack"' in page  # the leak and wait tables become cards
    assert 'data-label="Left held"' not in page  # no leak in this trace: no table


def _visible_text(page: str) -> str:
    body = re.sub(r"<title>.*?</title>|<style>.*?</style>", " ", page, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", body))


def _recorded(used_after: int) -> Trace:
    argv = ("python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m")
    line = " ".join(argv)
    samples = (Sample(0.0, (0,)), Sample(1.0, (8 * GIB,)), Sample(3.0, (used_after,)))
    span = TestSpan(line, 0.0, 2.0, (0,), (used_after,), "exit 0", 0.0)
    return Trace(
        devices=(DeviceTrack(0, "H200", H200),),
        samples=samples,
        tests=(span,),
        duration=3.0,
        sample_hz=10.0,
        command=argv,
        exit_code=0,
    )


@pytest.mark.parametrize("leaks", [False, True], ids=["clean", "leaking"])
def test_a_recorded_command_is_called_a_command_and_named_once(leaks: bool) -> None:
    trace = _recorded(4 * GIB if leaks else 0)
    page = render_html(trace)
    text = _visible_text(page)
    line = "python -m vllm.entrypoints.openai.api_server --model m"
    assert text.count(line) == 1  # the summary's Command row, nowhere else
    assert "1 test" not in text
    assert "leaking" not in text
    assert "exit status 0" in text
    assert "Tests that left memory held" not in text
    assert "All 1 tests" not in text
    assert "after the command exits" in text  # the leak rule in a command's words
    if leaks:
        assert "left memory held on 1 device" in text
        assert "Memory the command left held" in text
        assert re.search(r"Left held\s*</th>", page)
        assert "+4.00 GiB" in text
    else:
        assert "no memory left held" in text
        assert "The command did not leave more than 256.00 MiB held" in text
    lanes = re.findall(r'<text class="lane-label"[^>]*>([^<]*)</text>', page)
    assert set(lanes) == {"python"}  # the program, not the whole command line


@pytest.mark.parametrize("at", [0.2, 9.8], ids=["left", "right"])
def test_the_peak_label_stays_inside_the_plot(at: float) -> None:
    """A device filled to its total at an edge: the figure goes on the side with room."""
    samples = tuple(Sample(t / 10, (H200 if abs(t / 10 - at) < 0.15 else GIB,)) for t in range(101))
    trace = Trace(devices=(DeviceTrack(0, "H200", H200),), samples=samples, duration=10.0)
    page = render_html(trace)
    for geo in (_WIDE, _PHONE):
        head = '<svg class="phone chart ' if geo.phone else '<svg class="chart '
        for chart in [part.split("</svg>")[0] for part in page.split(head)[1:]]:
            peak = re.search(
                r'class="peak-label" x="([0-9.]+)" y="([0-9.]+)" text-anchor="(\w+)">([^<]*)<',
                chart,
            )
            assert peak is not None
            x, y, anchor = float(peak.group(1)), float(peak.group(2)), peak.group(3)
            width = 0.62 * geo.font * len(peak.group(4))
            x0 = x - width if anchor == "end" else x
            assert geo.left <= x0
            assert x0 + width <= geo.w - geo.right
            assert geo.top < y <= geo.top + geo.plot_h

"""``accelplat report`` never tracebacks, and its work grows linearly with the trace.

Three classes: a value out of range anywhere in a trace is refused at load with exit status 2
and the field named; whatever the loader accepts renders; and the per-test leak judgement
(:meth:`Trace.held_after`) is exact and touches each sample a bounded number of times, however
the tests' judgement windows overlap. Render time itself is measured in
``benchmarks/bench_report.py``, not here.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelplat._cli import main
from accelplat._types import GIB, MIB
from accelplat.errors import ConfigurationError
from accelplat.timeline._render import render_html
from accelplat.timeline._trace import (
    DeviceTrack,
    Sample,
    TestSpan,
    Trace,
    load_trace,
    loads_trace,
)

GOOD: dict[str, Any] = {
    "format": "accelplat.timeline",
    "version": 1,
    "platform": "cuda",
    "started_at": 1_700_000_000.0,
    "duration": 3.0,
    "sample_hz": 20.0,
    "decimation": 0,
    "leak_tolerance_bytes": 1024,
    "leak_grace_s": 1.0,
    "context_free": True,
    "command": ["python", "x.py"],
    "exit_code": 0,
    "notes": [],
    "devices": [{"index": 0, "name": "GPU 0", "total": 80 * 2**30}],
    "samples": [[0.0, 10], [1.0, 20], [2.0, 10], [3.0, 10]],
    "tests": [
        {
            "nodeid": "t::a",
            "start": 0.0,
            "end": 1.5,
            "outcome": "passed",
            "used_before": [10],
            "used_after": [20],
            "body_start": 0.5,
        }
    ],
    "waits": [{"start": 0.1, "end": 0.2, "kind": "settle", "devices": [0], "ok": True}],
}


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node: Any = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def test_the_reference_trace_is_valid() -> None:
    from accelplat.timeline._trace import TRACE_FORMAT, TRACE_VERSION

    assert (GOOD["format"], GOOD["version"]) == (TRACE_FORMAT, TRACE_VERSION)
    render_html(loads_trace(json.dumps(GOOD)))


HUGE = 10**400
OUT_OF_RANGE = [
    (("started_at",), 1e20, "started_at"),
    (("started_at",), HUGE, "started_at"),
    (("duration",), HUGE, "duration"),
    (("duration",), 1e300, "duration"),
    (("sample_hz",), HUGE, "sample_hz"),
    (("leak_grace_s",), 1e300, "leak_grace_s"),
    (("leak_tolerance_bytes",), HUGE, "leak_tolerance_bytes"),
    (("exit_code",), HUGE, "exit_code"),
    (("exit_code",), -(2**40), "exit_code"),
    (("devices", 0, "total"), HUGE, "devices[0].total"),
    (("devices", 0, "total"), 2**64, "devices[0].total"),
    (("devices", 0, "index"), HUGE, "devices[0].index"),
    (("samples", 1, 1), HUGE, "samples[1][1]"),
    (("samples", 1, 0), HUGE, "samples[1][0]"),
    (("samples", 3, 0), 1e300, "samples[3][0]"),
    (("tests", 0, "used_before", 0), HUGE, "tests[0].used_before[0]"),
    (("tests", 0, "end"), HUGE, "tests[0].end"),
    (("waits", 0, "devices", 0), HUGE, "waits[0].devices[0]"),
    (("waits", 0, "end"), 1e300, "waits[0].end"),
]


@pytest.mark.parametrize(
    ("path", "value", "field"), OUT_OF_RANGE, ids=[f[2] + "=" + str(f[1])[:8] for f in OUT_OF_RANGE]
)
def test_out_of_range_values_are_refused_at_load_naming_the_field(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    path: tuple[Any, ...],
    value: Any,
    field: str,
) -> None:
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(_set(GOOD, path, value)))
    with pytest.raises(ConfigurationError, match="trace field " + re.escape(field)):
        load_trace(trace)
    status = main(["report", str(trace), "--out", str(tmp_path / "r.html")])
    err = capsys.readouterr().err
    assert status == 2
    assert field in err
    assert "Traceback" not in err
    assert not (tmp_path / "r.html").exists()


# Values at the edge of every range: each loads, and each renders.
EDGES = [
    (("started_at",), 253_402_300_799.0),
    (("started_at",), 0),
    (("duration",), 1e9),
    (("devices", 0, "total"), 2**63 - 1),
    (("samples", 1, 1), 2**63 - 1),
    (("tests", 0, "used_after", 0), 2**63 - 1),
    (("leak_tolerance_bytes",), 2**63 - 1),
    (("leak_grace_s",), 1e9),
    (("exit_code",), -(2**31)),
    (("sample_hz",), 1e9),
    (("decimation",), 62),
]


@pytest.mark.parametrize(("path", "value"), EDGES)
def test_values_at_the_edge_of_every_range_render(
    tmp_path: Path, path: tuple[Any, ...], value: Any
) -> None:
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(_set(GOOD, path, value)))
    assert main(["report", str(trace), "--out", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").stat().st_size > 1000


_numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 1, 2**63 - 1, 2**63, 10**30, 1e9, 1e20]),
)
_NUMERIC_PATHS = [
    ("started_at",),
    ("duration",),
    ("sample_hz",),
    ("leak_grace_s",),
    ("leak_tolerance_bytes",),
    ("decimation",),
    ("exit_code",),
    ("devices", 0, "total"),
    ("samples", 0, 0),
    ("samples", 2, 1),
    ("tests", 0, "start"),
    ("tests", 0, "end"),
    ("tests", 0, "body_start"),
    ("tests", 0, "used_before", 0),
    ("waits", 0, "start"),
    ("waits", 0, "end"),
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_NUMERIC_PATHS), _numbers), min_size=1, max_size=4))
def test_whatever_the_loader_accepts_renders(changes: list[tuple[tuple[Any, ...], Any]]) -> None:
    doc = GOOD
    for path, value in changes:
        doc = _set(doc, path, value)
    try:
        trace = loads_trace(json.dumps(doc))
    except ConfigurationError:
        return  # refused, with a message (the class of errors the command exits 2 for)
    page = render_html(trace)
    assert page.startswith("<!DOCTYPE html>")


# -- linear work, exact answers ----------------------------------------------------------------


class CountingSamples(tuple):  # type: ignore[type-arg]
    """A tuple of samples that counts element reads (by index and by iteration)."""

    reads = 0

    def __getitem__(self, key: Any) -> Any:
        item = super().__getitem__(key)
        CountingSamples.reads += len(item) if isinstance(key, slice) else 1
        return item

    def __iter__(self) -> Iterator[Any]:
        for item in super().__iter__():
            CountingSamples.reads += 1
            yield item


def _trace(n_samples: int, n_tests: int, *, bodies: bool, grace: float) -> Trace:
    samples = tuple(
        Sample(i * 0.05, (1000 + (i * 7919) % 500, None if i % 13 == 0 else i % 97))
        for i in range(n_samples)
    )
    span_len = n_samples * 0.05 / n_tests
    tests = tuple(
        TestSpan(
            f"t{k}",
            k * span_len,
            (k + 1) * span_len - 0.01,
            (1000, 0),
            (1200, None),
            "passed",
            k * span_len + 0.02 if bodies and k % 3 else None,
        )
        for k in range(n_tests)
    )
    return Trace(
        devices=(DeviceTrack(0, "a", 10**6), DeviceTrack(1, "b", 10**6)),
        samples=samples,
        tests=tests,
        leak_grace_s=grace,
        duration=n_samples * 0.05,
        sample_hz=20,
    )


def _plain_scan(trace: Trace, span: TestSpan) -> tuple[int | None, ...]:
    """``held_after`` by its definition: the least reading in (end, judged_at], or at the end."""
    until = trace.judged_at(span)
    out: list[int | None] = []
    for pos, at_end in enumerate(span.used_after):
        inside = [s.used[pos] for s in trace.samples if span.end < s.t <= until]
        out.append(min((v for v in [*inside, at_end] if v is not None), default=None))
    return tuple(out)


@pytest.mark.parametrize("bodies", [True, False], ids=["with-bodies", "no-bodies"])
@pytest.mark.parametrize("grace", [0.0, 2.0, 1e6], ids=["grace-0", "grace-2", "grace-huge"])
def test_held_after_is_exact_and_reads_each_sample_a_bounded_number_of_times(
    bodies: bool, grace: float
) -> None:
    trace = _trace(4000, 200, bodies=bodies, grace=grace)
    expected = [_plain_scan(trace, s) for s in trace.tests]
    counted = replace(trace, samples=CountingSamples(trace.samples))
    CountingSamples.reads = 0
    got = [counted.held_after(s) for s in counted.tests]
    assert got == expected
    # One pass: each sample is read to push it, at most once more per device to compare.
    assert CountingSamples.reads <= 4 * (len(trace.samples) + len(trace.tests)) * 2
    leaks = counted.leaks()
    assert {leak.nodeid for leak in leaks} <= {s.nodeid for s in trace.tests}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0, 50), min_size=1, max_size=12),
    st.lists(st.tuples(st.floats(0, 50), st.floats(0, 10), st.booleans()), max_size=8),
    st.floats(0, 100),
)
def test_held_after_matches_the_plain_scan_for_any_layout(
    times: list[float], spans: list[tuple[float, float, bool]], grace: float
) -> None:
    times.sort()
    samples = tuple(Sample(t, ((i * 37) % 11,)) for i, t in enumerate(times))
    tests = tuple(
        TestSpan(f"t{i}", s, s + d, (5,), (7,), "", s + d / 2 if body else None)
        for i, (s, d, body) in enumerate(sorted(spans))
    )
    trace = Trace(
        devices=(DeviceTrack(0, "a", 100),), samples=samples, tests=tests, leak_grace_s=grace
    )
    for span in tests:
        assert trace.held_after(span) == _plain_scan(trace, span)


def test_a_span_from_elsewhere_is_judged_by_the_plain_scan() -> None:
    trace = _trace(100, 5, bodies=True, grace=1.0)
    stranger = replace(trace.tests[2], nodeid="elsewhere")
    assert trace.held_after(stranger) == _plain_scan(trace, stranger)


# -- huge but accepted readings: the page's size follows the trace's, never the values ----------

_BIG = [0, 1, 2**20, 2**50, 2**55, 2**62, 2**63 - 2, 2**63 - 1]
_SHAPES = {
    "constant": lambda v: [v, v, v, v],
    "from-zero": lambda v: [0, v, v // 2, v],
    "one-byte-apart": lambda v: [max(v - 1, 0), v, v, max(v - 1, 0)],
    "single": lambda v: [v],
}


def _readings_trace(values: list[int], total: int, duration: float = 3.0) -> Trace:
    step = duration / max(1, len(values) - 1)
    samples = tuple(Sample(i * step, (v,)) for i, v in enumerate(values))
    tests = (TestSpan("t::a", 0.0, duration, (values[0],), (values[-1],), "passed", 0.0),)
    return Trace(
        devices=(DeviceTrack(0, "GPU 0", total),),
        samples=samples,
        tests=tests,
        duration=duration,
        sample_hz=20.0,
    )


def _chart_ticks(page: str) -> list[tuple[int, int, list[str]]]:
    """Per chart: y grid lines, time grid lines, and the y labels."""
    out = []
    for part in page.split('<svg class="chart')[1:]:
        chart = part.split("</svg>")[0]
        labels = re.findall(r'text-anchor="end">([0-9.]+ [MG]iB)</text>', chart)
        out.append((chart.count('stroke="#d0d5db"'), chart.count('stroke="#e6e9ed"'), labels))
    return out


@pytest.mark.parametrize("shape", sorted(_SHAPES))
@pytest.mark.parametrize("value", _BIG, ids=[f"2**{v.bit_length()}~{v % 7}" for v in _BIG])
@pytest.mark.parametrize("total", ["none", "equal", "smaller"])
def test_huge_readings_render_a_small_page_with_a_few_ticks(
    shape: str, value: int, total: str
) -> None:
    values = _SHAPES[shape](value)
    device_total = {"none": 0, "equal": value, "smaller": value // 3}[total]
    trace = loads_trace(json.dumps(_readings_trace(values, device_total).to_json()))  # accepted
    page = render_html(trace)
    assert len(page) < 60_000  # 2**50 wrote 77 MB; 2**55 and up never finished
    for y_lines, t_lines, labels in _chart_ticks(page):
        assert 2 <= y_lines <= 11
        assert 2 <= t_lines <= 21
        assert len(labels) == len(set(labels)) == y_lines  # distinct, one per line


@pytest.mark.parametrize("value", [10 * MIB, GIB, 40 * GIB, 2**50, 2**63 - 1])
def test_a_constant_series_gets_an_axis_of_a_tenth_of_its_value(value: int) -> None:
    """Not a ±1 MiB window that labels 40 GiB as 39.999, 40.000, 40.001 GiB."""
    page = render_html(_readings_trace([value] * 5, 0))
    _, _, labels = _chart_ticks(page)[0]  # the fitted chart
    unit = GIB if labels[0].endswith("GiB") else MIB
    numbers = [float(label.split()[0]) * unit for label in labels]
    assert max(numbers) - min(numbers) >= value * 0.1
    assert min(numbers) <= value <= max(numbers)


@pytest.mark.parametrize("duration", [0.0, 1e-6, 1e-3, 0.5, 59.9, 3600.0, 86_400.0 * 3, 1e9])
def test_any_accepted_duration_gets_a_bounded_time_axis(duration: float) -> None:
    trace = loads_trace(json.dumps(_readings_trace([1, 2**63 - 1], 0, duration).to_json()))
    for _, t_lines, _ in _chart_ticks(render_html(trace)):
        assert 1 <= t_lines <= 21


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.integers(0, 2**63 - 1)), min_size=1, max_size=30),
    st.integers(0, 2**63 - 1),
)
def test_any_accepted_readings_give_a_page_linear_in_the_samples(
    values: list[int | None], total: int
) -> None:
    samples = tuple(Sample(i * 0.1, (v,)) for i, v in enumerate(values))
    trace = Trace(devices=(DeviceTrack(0, "GPU 0", total),), samples=samples, duration=3.0)
    page = render_html(trace)
    assert len(page) < 30_000 + 400 * len(values)
    for y_lines, t_lines, _ in _chart_ticks(page):
        assert y_lines <= 11
        assert t_lines <= 21

"""Tests of the memory timeline: trace model and JSON, sampler, recorder, report, plugin, CLI."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import stat
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from accelplat._cli import main as cli_main
from accelplat._leaks import DEFAULT_LEAK_TOLERANCE_BYTES, parse_leak_tolerance
from accelplat._platform import BasePlatform
from accelplat._registry import set_current_platform
from accelplat._types import GIB, MIB, DeviceInfo, MemoryInfo, ProbeResult
from accelplat.errors import BackendError, ConfigurationError, NotARegularFileError
from accelplat.pytest_plugin._timeline import WAIT_EVENT_ATTRIBUTE, WAIT_LOGGER, WaitEventTap
from accelplat.timeline import (
    DeviceTrack,
    Recorder,
    Sample,
    Sampler,
    TestSpan,
    Trace,
    WaitSpan,
    load_trace,
    save_trace,
    write_report,
)
from accelplat.timeline._render import render_html
from accelplat.timeline._sampler import validate_hz
from accelplat.timeline._trace import Reading, dumps_trace, loads_trace

pytest_plugins = ["pytester"]

WAIT_S = 60.0
"""How long a test waits for a sampling thread to do something: only a hang reaches it, so it
is generous for a loaded machine. No test asserts how fast a thread runs."""


# --------------------------------------------------------------------------------------------
# test doubles at the platform boundary


class FakeGpu(BasePlatform):
    """Devices whose used memory the test sets; a device in ``failing`` raises on query."""

    name = "fakegpu"
    device_type = "cuda"

    def __init__(self, n: int = 2, total: int = 80 * GIB) -> None:
        self.used = [0] * n
        self.total = total
        self.failing: set[int] = set()

    @classmethod
    def probe(cls) -> ProbeResult:
        return ProbeResult(True, "fake")

    def devices(self) -> Sequence[DeviceInfo]:
        return [DeviceInfo(i, i, f"Fake GPU {i}") for i in range(len(self.used))]

    def _memory_info(self, device: int) -> MemoryInfo:
        if device in self.failing:
            raise BackendError(self.name, "device fell off the bus", "GpuIsLost")
        used = self.used[device]
        return MemoryInfo(free=self.total - used, total=self.total, used=used, source="fake")


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _recorder(gpu: FakeGpu, clock: FakeClock) -> Recorder:
    return Recorder(gpu, clock=clock, wall_clock=lambda: 1_700_000_000.0)


def _story() -> Trace:
    """Two devices; one clean test, one that leaks 2 GiB on device 1, one wait.

    Times are exact binary fractions, so JSON round trips are exact.
    """
    gpu, clock = FakeGpu(), FakeClock()
    rec = _recorder(gpu, clock)
    rec.sampler.sample()
    clock.t += 0.125
    rec.begin_test("tests/test_a.py::test_clean")
    rec.begin_body("tests/test_a.py::test_clean")
    gpu.used[0] = 10 * GIB
    clock.t += 0.5
    rec.sampler.sample()
    gpu.used[0] = 0
    clock.t += 0.5
    rec.end_test("tests/test_a.py::test_clean", "passed")
    clock.t += 0.125
    rec.begin_test("tests/test_a.py::test_leaky")
    token = rec.begin_wait("settle", [1])
    clock.t += 1.5
    rec.end_wait(token, ok=True)
    rec.begin_body("tests/test_a.py::test_leaky")
    gpu.used[1] = 2 * GIB
    clock.t += 0.375
    rec.end_test("tests/test_a.py::test_leaky", "failed")
    clock.t += 0.25
    return rec.stop()


# --------------------------------------------------------------------------------------------
# trace model and JSON


def test_trace_round_trips_through_json() -> None:
    trace = _story()
    again = loads_trace(dumps_trace(trace))
    assert again == trace


def test_story_trace_has_spans_leak_and_wait() -> None:
    trace = _story()
    assert [t.nodeid for t in trace.tests] == [
        "tests/test_a.py::test_clean",
        "tests/test_a.py::test_leaky",
    ]
    assert trace.tests[0].outcome == "passed"
    assert trace.growth(trace.tests[0]) == (0, 0)
    assert trace.growth(trace.tests[1]) == (0, 2 * GIB)
    leaks = trace.leaks()
    assert [(leak.nodeid, leak.device, leak.leaked) for leak in leaks] == [
        ("tests/test_a.py::test_leaky", 1, 2 * GIB)
    ]
    (wait,) = trace.waits
    assert wait.kind == "settle"
    assert wait.devices == (1,)
    assert wait.test == "tests/test_a.py::test_leaky"
    assert wait.duration == pytest.approx(1.5)
    assert trace.duration == 3.375
    assert trace.started_at == 1_700_000_000.0
    assert trace.platform == "fakegpu"
    # the peak of test_clean was sampled
    assert max(s.used[0] or 0 for s in trace.samples) == 10 * GIB


def test_leak_tolerance_is_exclusive_and_sorted_largest_first() -> None:
    def span(name: str, before: tuple[int | None, ...], after: tuple[int | None, ...]) -> TestSpan:
        return TestSpan(name, 0, 1, before, after)

    trace = Trace(
        devices=(DeviceTrack(0, "a", GIB), DeviceTrack(3, "b", GIB)),
        samples=(),
        tests=(
            span("exact", (0, 0), (DEFAULT_LEAK_TOLERANCE_BYTES, 0)),
            span("small", (0, 0), (DEFAULT_LEAK_TOLERANCE_BYTES + 1, None)),
            span("big", (None, 100), (5, 100 + 512 * MIB)),
            span("shrinks", (GIB, GIB), (0, 0)),
        ),
    )
    got = [(leak.nodeid, leak.device, leak.leaked) for leak in trace.leaks()]
    assert got == [("big", 3, 512 * MIB), ("small", 0, DEFAULT_LEAK_TOLERANCE_BYTES + 1)]
    assert [leak.nodeid for leak in replace(trace, leak_tolerance_bytes=0).leaks()] == [
        "big",
        "small",
        "exact",
    ]
    assert trace.leak_tolerance_bytes == DEFAULT_LEAK_TOLERANCE_BYTES


def _lazy_release_trace(release_after_s: float) -> Trace:
    """One test frees 8 GiB at its end, but the device returns it ``release_after_s`` later."""
    samples = [Sample(0.0, (GIB,)), Sample(0.5, (9 * GIB,)), Sample(1.0, (9 * GIB,))]
    t = 1.0
    while t < 1.0 + release_after_s + 1.0:
        t += 0.25
        samples.append(Sample(t, (9 * GIB if t < 1.0 + release_after_s else GIB,)))
    return Trace(
        devices=(DeviceTrack(0, "gpu", 80 * GIB),),
        samples=tuple(samples),
        tests=(TestSpan("lazy", 0.0, 1.0, (GIB,), (9 * GIB,)),),
        leak_grace_s=2.0,
    )


def test_memory_that_comes_back_within_the_grace_is_not_a_leak() -> None:
    trace = _lazy_release_trace(1.5)
    assert trace.held_after(trace.tests[0]) == (GIB,)
    assert trace.leaks() == []
    # with no grace, the same test is blamed for what was held at its end
    (leak,) = replace(trace, leak_grace_s=0.0).leaks()
    assert (leak.before, leak.at_end, leak.after, leak.leaked) == (GIB, 9 * GIB, 9 * GIB, 8 * GIB)


def test_memory_still_held_after_the_grace_is_a_leak() -> None:
    trace = _lazy_release_trace(2.5)
    (leak,) = trace.leaks()
    assert leak.leaked == 8 * GIB
    assert replace(trace, leak_grace_s=3.0).leaks() == []


def _sequence(*, freed_at: float, bodies: dict[str, float | None]) -> Trace:
    """``a`` takes 8 GiB and keeps it until ``freed_at``; ``b`` and ``c`` follow it."""
    samples = tuple(
        Sample(t / 4, (GIB if t / 4 < 0.5 or t / 4 >= freed_at else 9 * GIB,)) for t in range(41)
    )
    return Trace(
        devices=(DeviceTrack(0, "gpu", 80 * GIB),),
        samples=samples,
        tests=(
            TestSpan("a", 0.0, 1.0, (GIB,), (9 * GIB,), "passed", bodies["a"]),
            TestSpan("b", 1.25, 3.0, (9 * GIB,), (9 * GIB,), "passed", bodies["b"]),
            TestSpan("c", 3.25, 10.0, (GIB,), (GIB,), "passed", bodies["c"]),
        ),
        leak_grace_s=2.0,
    )


def test_memory_back_before_the_next_body_begins_is_not_a_leak() -> None:
    # b's set-up (a settle wait, say) lasts until 2.5 s; a's memory returns at 2.25 s
    trace = _sequence(freed_at=2.25, bodies={"a": 0.25, "b": 2.5, "c": 3.5})
    assert trace.judged_at(trace.tests[0]) == 2.5
    assert trace.leaks() == []


def test_memory_freed_by_a_later_body_is_still_a_leak() -> None:
    # b's body begins at 1.5 s; the memory comes back at 2.25 s, while b runs (b freed it)
    trace = _sequence(freed_at=2.25, bodies={"a": 0.25, "b": 1.5, "c": 3.5})
    assert [(leak.nodeid, leak.leaked) for leak in trace.leaks()] == [("a", 8 * GIB)]
    # within the grace period, but the grace applies only where no body follows
    assert trace.judged_at(trace.tests[0]) == 1.5


def test_tests_without_a_body_are_passed_over() -> None:
    # b was skipped in its set-up (no body); c's body begins at 3.5 s, after the memory returned
    trace = _sequence(freed_at=3.0, bodies={"a": 0.25, "b": None, "c": 3.5})
    assert trace.judged_at(trace.tests[0]) == 3.5
    assert trace.leaks() == []
    # the last test is judged after the grace period
    assert trace.judged_at(trace.tests[2]) == 12.0


def test_slowest_waits_longest_first() -> None:
    waits = tuple(WaitSpan(float(i), float(i) + d, "settle") for i, d in enumerate([1, 5, 3]))
    trace = Trace(devices=(), samples=(), waits=waits)
    assert [w.duration for w in trace.slowest_waits(2)] == [5, 3]
    assert trace.slowest_waits(0) == []


def _valid_doc() -> dict[str, object]:
    return json.loads(dumps_trace(_story()))  # type: ignore[no-any-return]


def _mutate(path: str, value: object) -> dict[str, object]:
    doc = _valid_doc()
    target: object = doc
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]  # type: ignore[index]
    last = keys[-1]
    if isinstance(target, list):
        target[int(last)] = value
    elif value is _DELETE:
        del target[last]  # type: ignore[attr-defined]
    else:
        target[last] = value  # type: ignore[index]
    return doc


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("format", "something-else", "format"),
        ("version", 2, "unsupported trace version 2"),
        ("version", True, "unsupported trace version"),
        ("devices", {"0": 1}, "devices"),
        ("devices.0.index", -1, "devices[0].index"),
        ("devices.0.total", True, "devices[0].total"),
        ("devices.1.index", 0, "repeats"),
        ("devices.0.name", 5, "devices[0].name"),
        ("samples.1.0", -0.5, "samples[1][0]"),
        ("samples.2.0", 0.0, "time goes backwards"),
        ("samples.1", [0.5, 1], "samples[1]"),
        ("samples.1.1", -4, "samples[1][1]"),
        ("samples.1.1", 1.5, "samples[1][1]"),
        ("samples.1.1", "7", "samples[1][1]"),
        ("tests.0.end", 0.0, "earlier than its start"),
        ("tests.0.body_start", 99.0, "outside the test's span"),
        ("tests.0.body_start", "soon", "tests[0].body_start"),
        ("tests.0.used_after", [1], "one per device"),
        ("tests.0.nodeid", None, "tests[0].nodeid"),
        ("tests.0", "x", "tests[0]"),
        ("waits.0.ok", "yes", "waits[0].ok"),
        ("waits.0.devices", [0, "1"], "waits[0].devices[1]"),
        ("waits.0.test", 3, "waits[0].test"),
        ("exit_code", 1.5, "exit_code"),
        ("decimation", 10**9, "decimation"),
        ("command", "rm -rf /", "command"),
        ("notes", ["x" * 131_073], "notes[0]"),
        ("samples", _DELETE, "samples"),
    ],
)
def test_malformed_trace_is_a_configuration_error(path: str, value: object, message: str) -> None:
    text = json.dumps(_mutate(path, value))
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        loads_trace(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not valid JSON"),
        ("{", "not valid JSON"),
        ("[]", "expected an object"),
        ('{"format": "accelplat.timeline", "version": 1, "started_at": NaN}', "NaN"),
        ('{"x": Infinity}', "Infinity"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        (b"\xff\xfe{", "not UTF-8"),
    ],
)
def test_unparseable_trace_is_a_configuration_error(text: str | bytes, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        loads_trace(text)


def test_oversized_trace_is_refused_before_parsing(tmp_path: Path) -> None:
    text = dumps_trace(_story())
    with pytest.raises(ConfigurationError, match="limit"):
        loads_trace(text, max_bytes=len(text) - 1)
    path = tmp_path / "big.json"
    path.write_text(text + " " * 100)
    with pytest.raises(ConfigurationError, match="larger than the limit"):
        load_trace(path, max_bytes=len(text) + 10)
    assert load_trace(path, max_bytes=len(text) + 100) == _story()


def test_load_trace_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read trace"):
        load_trace(tmp_path / "absent.json")
    with pytest.raises(ConfigurationError, match="cannot read trace"):
        load_trace(tmp_path)


def test_save_trace_is_atomic_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = save_trace(_story(), tmp_path / "t.json")
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]
    doc = json.loads(path.read_text())
    assert doc["format"] == "accelplat.timeline"
    assert doc["version"] == 1
    assert len(doc["samples"][0]) == 1 + len(doc["devices"])


def test_written_files_follow_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        trace_path = save_trace(_story(), tmp_path / "t.json")
        page_path = write_report(_story(), tmp_path / "r.html")
    finally:
        os.umask(old)
    assert stat.S_IMODE(trace_path.stat().st_mode) == 0o644
    assert stat.S_IMODE(page_path.stat().st_mode) == 0o644


def test_older_optional_fields_have_defaults() -> None:
    doc = {"format": "accelplat.timeline", "version": 1, "devices": [], "samples": [[0.5]]}
    trace = loads_trace(json.dumps(doc))
    assert trace.tests == ()
    assert trace.waits == ()
    assert trace.duration == 0.5
    assert trace.leak_tolerance_bytes == DEFAULT_LEAK_TOLERANCE_BYTES


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("1048576B", MIB),
        ("64MiB", 64 * MIB),
        ("64 mib", 64 * MIB),
        ("1.5GiB", int(1.5 * GIB)),
        ("2g", 2 * GIB),
        ("500MB", 500_000_000),
        ("3kB", 3000),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_leak_tolerance(text, argument="size") == expected


@pytest.mark.parametrize(
    "text", ["", "x", "-1", "1e5", "5 parsecs", "9" * 400, "1.2.3MiB", "1048576"]
)
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ConfigurationError, match=r"--tol(:| must be| has more than)"):
        parse_leak_tolerance(text, argument="--tol")


# --------------------------------------------------------------------------------------------
# sampling


def _ticked(capacity: int, readings: list[Reading], dt: float) -> Iterator[Sampler]:
    """A sampler that takes ``readings`` one tick of ``dt`` apart, yielding itself after each."""
    clock = FakeClock(0.0)
    values = iter(readings)
    sampler = Sampler(lambda: next(values), capacity=capacity, clock=clock)
    for i in range(len(readings)):
        clock.t = i * dt
        sampler.sample()
        yield sampler


def test_the_sampler_keeps_every_sample_until_full() -> None:
    *_, sampler = _ticked(8, [(i,) for i in range(7)], 1.0)
    assert sampler.decimation == 0
    assert [s.t for s in sampler.samples()] == [float(i) for i in range(7)]


def test_the_sampler_is_bounded_keeps_peaks_and_time_order() -> None:
    n = 10_000
    spike_at = 7_777
    readings: list[Reading] = [
        (50 * GIB if i == spike_at else i % 3, None if i % 2 else i) for i in range(n)
    ]
    for sampler in _ticked(16, readings, 0.05):
        assert len(sampler.samples()) <= 16
    samples = sampler.samples()
    assert sampler.decimation >= 9  # 10_000 ticks into 16 slots: each slot spans >= 2**9 ticks
    times = [s.t for s in samples]
    assert times == sorted(times)
    assert times[0] == 0.0
    assert max(s.used[0] or 0 for s in samples) == 50 * GIB
    # the second device alternates readings and failures: a merged sample keeps the reading
    assert all(s.used[1] is not None for s in samples)
    # stored samples are evenly spaced by 2**decimation ticks
    step = 0.05 * 2**sampler.decimation
    assert times[1] - times[0] == pytest.approx(step)


@pytest.mark.parametrize("capacity", [0, 1, 3, 2.0, True])
def test_the_sampler_rejects_bad_capacity(capacity: object) -> None:
    with pytest.raises(ConfigurationError, match="capacity"):
        Sampler(tuple, capacity=capacity)  # type: ignore[arg-type]


@pytest.mark.parametrize("hz", [0, -1, float("nan"), float("inf"), 1001, True, "20"])
def test_validate_hz_rejects(hz: object) -> None:
    with pytest.raises(ConfigurationError, match="--rate"):
        validate_hz(hz, argument="--rate")


def test_sampler_times_are_relative_to_its_creation() -> None:
    clock = FakeClock(50.0)
    values = iter([(1,), (2,), (3,)])
    sampler = Sampler(lambda: next(values), hz=10, clock=clock)
    clock.t = 50.25
    assert sampler.sample() == (0.25, (1,))
    clock.t = 51.0
    sampler.sample()
    assert [(s.t, s.used) for s in sampler.samples()] == [(0.25, (1,)), (1.0, (2,))]


def test_sampler_thread_samples_until_stopped() -> None:
    calls: list[float] = []
    five = threading.Event()

    def read() -> tuple[int, ...]:
        calls.append(time.monotonic())
        if len(calls) >= 5:
            five.set()
        return (len(calls),)

    sampler = Sampler(read, hz=200)
    sampler.start()
    sampler.start()  # idempotent
    thread = sampler._thread
    assert thread is not None
    assert five.wait(WAIT_S)  # five samples came, however slowly a loaded machine runs
    sampler.stop(timeout=WAIT_S)
    assert not thread.is_alive()  # stopped means stopped: no thread is left to sample
    count = len(calls)
    assert count >= 5
    assert len(sampler.samples()) == count


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_fork_waits_for_the_read_in_progress_and_the_child_has_no_sampler() -> None:
    reading = threading.Event()
    release = threading.Event()
    released_at: list[float] = []

    def read() -> tuple[int, ...]:
        if not released_at:  # the first read blocks until released
            reading.set()
            release.wait(WAIT_S)
            released_at.append(time.monotonic())
        return (1,)

    sampler = Sampler(read, hz=200)
    sampler.start()
    try:
        assert reading.wait(WAIT_S)
        threading.Timer(0.05, release.set).start()
        pid = os.fork()
        if pid == 0:  # child: no thread, a usable lock, sampling on demand still works
            idle = sampler._thread is None or not sampler._thread.is_alive()
            ok = idle and sampler.sample()[1] == (1,)
            os._exit(0 if ok else 1)
        forked_at = time.monotonic()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert released_at
        assert forked_at >= released_at[0]  # the fork waited for the read to finish
        count = len(sampler.samples())
        deadline = time.monotonic() + WAIT_S
        while len(sampler.samples()) <= count and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(sampler.samples()) > count  # and the parent goes on sampling
    finally:
        release.set()
        sampler.stop()


def test_the_recorder_survives_a_failing_device() -> None:
    gpu, clock = FakeGpu(n=3), FakeClock()
    gpu.used = [GIB, 2 * GIB, 3 * GIB]
    gpu.failing = {1}
    rec = _recorder(gpu, clock)
    assert rec.devices == (
        DeviceTrack(0, "Fake GPU 0", 80 * GIB),
        DeviceTrack(1, "Fake GPU 1", 0),
        DeviceTrack(2, "Fake GPU 2", 80 * GIB),
    )
    assert rec.sampler.sample()[1] == (GIB, None, 3 * GIB)
    gpu.failing = set()
    assert rec.sampler.sample()[1] == (GIB, 2 * GIB, 3 * GIB)


def test_recorder_notes_when_a_body_begins() -> None:
    gpu, clock = FakeGpu(n=1), FakeClock()
    rec = _recorder(gpu, clock)
    rec.begin_test("t")
    clock.t += 0.5
    rec.begin_body("t")
    clock.t += 0.25
    rec.begin_body("t")  # only the first counts
    rec.begin_body("unknown")  # ignored
    clock.t += 0.25
    rec.end_test("t", "passed")
    rec.begin_test("skipped")
    rec.end_test("skipped", "skipped")
    first, second = rec.stop().tests
    assert first.body_start == pytest.approx(first.start + 0.5)
    assert second.body_start is None


def test_recorder_closes_open_spans_on_stop_and_tags_waits() -> None:
    gpu, clock = FakeGpu(n=1), FakeClock()
    rec = _recorder(gpu, clock)
    assert rec.current_test is None
    outside = rec.begin_wait("clear")
    clock.t += 1
    rec.begin_test("t1")
    assert rec.current_test == "t1"
    inside = rec.begin_wait("settle", [0])
    clock.t += 2
    rec.end_wait(inside, ok=False)
    assert rec.end_wait(inside) is None  # a token ends once
    assert rec.end_test("never-begun") is None
    trace = rec.stop()
    assert rec.stop() == trace
    assert [(t.nodeid, t.outcome) for t in trace.tests] == [("t1", "unfinished")]
    assert [(w.kind, w.test, w.ok) for w in trace.waits] == [
        ("clear", None, False),  # still open at stop: closed as failed, in start order
        ("settle", "t1", False),
    ]
    del outside


def test_recorder_without_platform_records_spans_only() -> None:
    clock = FakeClock()
    rec = Recorder(None, clock=clock, notes=["No platform was sampled: test"])
    rec.begin_test("t")
    clock.t += 1
    rec.end_test("t", "passed")
    trace = rec.stop()
    assert trace.devices == ()
    assert trace.tests[0].used_before == ()
    assert trace.leaks() == []
    assert "No device was sampled" in render_html(trace)
    assert "No platform was sampled: test" in render_html(trace)


def test_a_recorder_of_the_current_platform_notes_why_nothing_was_sampled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "no-such-platform")
    set_current_platform(None)
    rec = Recorder.of_current_platform(hz=5)
    trace = rec.stop()
    assert trace.devices == ()
    assert [n for n in trace.notes if n.startswith("No platform was sampled: ")]
    assert "no-such-platform" in trace.notes[0]
    gpu = FakeGpu(n=2)
    set_current_platform(gpu)
    try:
        rec = Recorder.of_current_platform(hz=5)
        assert len(rec.stop().devices) == 2
    finally:
        set_current_platform(None)


def test_linger_samples_until_memory_is_back_or_the_grace_runs_out() -> None:
    gpu, clock = FakeGpu(n=1), FakeClock()
    rec = _recorder(gpu, clock)
    rec.begin_test("t")
    gpu.used[0] = 4 * GIB
    rec.end_test("t", "passed")
    sleeps: list[float] = []

    def sleep(s: float) -> None:  # the device gives the memory back after 1 s
        sleeps.append(s)
        clock.t += s
        if sum(sleeps) >= 1.0:
            gpu.used[0] = 0

    rec.linger(sleep)
    assert sum(sleeps) == pytest.approx(1.0)
    assert all(s == pytest.approx(0.05) for s in sleeps)  # one sample per tick at 20 Hz
    assert rec.stop().leaks() == []

    # memory never comes back: lingering stops at the grace period (2 s)
    gpu2, clock2 = FakeGpu(n=1), FakeClock()
    rec2 = _recorder(gpu2, clock2)
    rec2.begin_test("t")
    gpu2.used[0] = 4 * GIB
    rec2.end_test("t", "passed")
    slept: list[float] = []

    def sleep2(s: float) -> None:
        slept.append(s)
        clock2.t += s

    rec2.linger(sleep2)
    assert sum(slept) == pytest.approx(2.0, abs=0.06)
    assert [leak.leaked for leak in rec2.stop().leaks()] == [4 * GIB]


def test_linger_returns_at_once_without_tests() -> None:
    rec = _recorder(FakeGpu(), FakeClock())
    rec.linger(lambda s: pytest.fail("must not sleep"))


@pytest.mark.parametrize("grace", [-1, float("nan"), float("inf"), True, "2"])
def test_recorder_rejects_bad_grace(grace: object) -> None:
    with pytest.raises(ConfigurationError, match="leak_grace_s"):
        Recorder(None, leak_grace_s=grace)  # type: ignore[arg-type]


@pytest.mark.parametrize("tolerance", [-1, 1.5, True])
def test_recorder_rejects_bad_tolerance(tolerance: object) -> None:
    with pytest.raises(ConfigurationError, match="leak_tolerance_bytes"):
        Recorder(None, leak_tolerance_bytes=tolerance)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# the report page


def test_report_shows_charts_tests_leak_and_waits() -> None:
    page = render_html(_story())
    assert page.count('<svg class="chart fit-scale"') == 2
    assert page.count('<svg class="chart full-scale"') == 2
    assert 'data-device="0"' in page
    assert 'data-device="1"' in page
    assert "Fake GPU 1" in page
    # the leak table has exactly the leaking test, and its band is highlighted
    leak_table = page[page.index('<table id="leaks"') : page.index("</table>", page.index("leaks"))]
    assert "test_leaky" in leak_table
    assert "test_clean" not in leak_table
    assert "+2.00 GiB" in leak_table
    charts = page.split('<svg class="chart fit-scale"')[1:]
    # highlighted on device 1, where it leaked, and not on device 0
    assert 'class="test-band leaked" data-nodeid="tests/test_a.py::test_leaky"' in charts[1]
    assert "leaked" not in charts[0]
    assert 'class="test-band" data-nodeid="tests/test_a.py::test_clean"' in page
    assert 'class="leak-marker" data-nodeid="tests/test_a.py::test_leaky"' in page
    # the wait is listed with its duration and test
    wait_table = page[page.index('<table id="waits"') :]
    assert "1.50 s" in wait_table.split("</table>")[0]
    assert "settle" in wait_table.split("</table>")[0]
    assert '<table id="tests"' in page
    assert "1 leaking" in page


def test_report_is_self_contained() -> None:
    page = render_html(_story())
    lowered = page.lower()
    for needle in ("http:", "https:", "<script", "src=", "@import", "url(", "<link"):
        assert needle not in lowered, needle


def test_report_escapes_hostile_text() -> None:
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    trace = Trace(
        devices=(DeviceTrack(0, evil, GIB),),
        samples=(Sample(0.0, (0,)), Sample(1.0, (GIB // 2,))),
        tests=(TestSpan(evil, 0.1, 0.9, (0,), (GIB // 2,), evil),),
        waits=(WaitSpan(0.2, 0.3, evil, (0,), True, evil),),
        platform=evil,
        command=(evil,),
        notes=(evil,),
    )
    page = render_html(trace, title=evil)
    assert "<script" not in page
    assert "<img" not in page
    assert "&lt;script&gt;" in page


def test_report_without_tests_waits_or_readings() -> None:
    trace = Trace(
        devices=(DeviceTrack(0, "gpu", 0),),
        samples=(Sample(0.0, (None,)), Sample(0.5, (None,))),
    )
    page = render_html(trace)
    assert 'id="no-leaks"' in page
    assert 'id="no-waits"' in page
    assert 'id="no-tests"' in page
    assert 'class="used"' not in page  # nothing to draw, nothing invented


def test_report_thins_long_traces_but_keeps_peaks() -> None:
    n = 200_000
    peak_at = 123_457
    samples = tuple(Sample(i * 0.01, (GIB if i == peak_at else GIB // 4,)) for i in range(n))
    trace = Trace(devices=(DeviceTrack(0, "gpu", 2 * GIB),), samples=samples)
    page = render_html(trace)
    path = re.search(r'<path class="used" d="([^"]*)"', page)
    assert path is not None
    points = path.group(1).split()
    assert len(points) <= 4 * 1200  # at most four points per pixel column
    ys = [float(p.lstrip("ML").split(",")[1]) for p in points]
    assert min(ys) < max(ys)  # the single-sample spike is drawn (smaller y is higher)
    assert len(page) < 1_000_000


def test_report_leak_tolerance_override() -> None:
    page = render_html(replace(_story(), leak_tolerance_bytes=4 * GIB))
    assert 'id="no-leaks"' in page
    assert "4.00 GiB" in page


def test_write_report(tmp_path: Path) -> None:
    path = write_report(_story(), tmp_path / "r.html", title="My run")
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    assert "<h1>My run</h1>" in text


# --------------------------------------------------------------------------------------------
# waits observed through logging


def test_wait_event_tap_records_structured_events_only() -> None:
    gpu, clock = FakeGpu(n=1), FakeClock()
    rec = _recorder(gpu, clock)
    tap = WaitEventTap(rec)
    logger = logging.getLogger(WAIT_LOGGER)
    tap.install()
    try:
        rec.begin_test("t")
        start = {"event": "start", "id": 7, "kind": "settle", "devices": [0]}
        logger.debug("waiting", extra={WAIT_EVENT_ATTRIBUTE: start})
        logger.debug("plain message without an event")
        logger.debug("bad", extra={WAIT_EVENT_ATTRIBUTE: "nonsense"})
        logger.debug("bad id", extra={WAIT_EVENT_ATTRIBUTE: {"event": "start", "id": True}})
        logger.debug("unknown end", extra={WAIT_EVENT_ATTRIBUTE: {"event": "end", "id": 99}})
        clock.t += 0.75
        logger.debug("done", extra={WAIT_EVENT_ATTRIBUTE: {"event": "end", "id": 7, "ok": False}})
    finally:
        tap.remove()
    (wait,) = rec.stop().waits
    assert (wait.kind, wait.devices, wait.ok, wait.test) == ("settle", (0,), False, "t")
    assert wait.duration == pytest.approx(0.75)


class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_wait_event_tap_leaves_what_handlers_see_unchanged() -> None:
    rec = Recorder(None, clock=FakeClock())
    logger = logging.getLogger(WAIT_LOGGER)
    parent = logging.getLogger("accelplat")
    seen = _ListHandler()
    parent.addHandler(seen)
    saved_parent, saved_own = parent.level, logger.level
    parent.setLevel(logging.WARNING)
    logger.setLevel(logging.NOTSET)
    tap = WaitEventTap(rec)
    try:
        tap.install()
        event = {"event": "start", "id": 1, "kind": "clear"}
        logger.debug("debug event", extra={WAIT_EVENT_ATTRIBUTE: event})
        logger.warning("a warning")
        parent.setLevel(logging.DEBUG)  # a user asking for debug output later still gets it
        logger.debug("debug after")
        tap.remove()
        assert logger.level == logging.NOTSET
        logger.debug("not tapped", extra={WAIT_EVENT_ATTRIBUTE: {"event": "start", "id": 2}})
    finally:
        parent.removeHandler(seen)
        parent.setLevel(saved_parent)
        logger.setLevel(saved_own)
    assert seen.messages == ["a warning", "debug after", "not tapped"]
    assert [w.kind for w in rec.stop().waits] == ["clear"]  # only the event seen while installed


def test_wait_event_tap_yields_to_a_level_set_later(caplog: pytest.LogCaptureFixture) -> None:
    rec = Recorder(None, clock=FakeClock())
    logger = logging.getLogger(WAIT_LOGGER)
    saved = logger.level
    logger.setLevel(logging.NOTSET)
    tap = WaitEventTap(rec)
    tap.install()
    try:
        logger.debug("hidden while tapped")
        with caplog.at_level(logging.DEBUG, logger=WAIT_LOGGER):  # a test asks for DEBUG
            logger.debug("wanted", extra={WAIT_EVENT_ATTRIBUTE: {"event": "start", "id": 1}})
        logger.debug("hidden again")
    finally:
        tap.remove()
        logger.setLevel(saved)
    assert [r.getMessage() for r in caplog.records] == ["wanted"]
    assert len(rec.stop().waits) == 1  # and the tap still saw the event


# --------------------------------------------------------------------------------------------
# the pytest plugin, in an inner pytest session


def _plugin_args() -> list[str]:
    installed = any(ep.name == "accelplat" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "accelplat.pytest_plugin"]


_INNER_CONFTEST = """
import pytest
from accelplat._types import GIB, DeviceInfo, MemoryInfo, ProbeResult
from accelplat._platform import BasePlatform
from accelplat._registry import set_current_platform


class InnerGpu(BasePlatform):
    name = "innergpu"
    device_type = "cuda"

    def __init__(self):
        self.used = [GIB // 2]

    @classmethod
    def probe(cls):
        return ProbeResult(True, "inner")

    def devices(self):
        return [DeviceInfo(0, 0, "Inner GPU")]

    def _memory_info(self, device):
        return MemoryInfo(free=16 * GIB - self.used[0], total=16 * GIB, used=self.used[0])


GPU = InnerGpu()


def pytest_configure(config):
    set_current_platform(GPU)


def pytest_unconfigure(config):
    set_current_platform(None)


@pytest.fixture
def gpu():
    return GPU


@pytest.fixture
def settled_device_memory():
    from accelplat._memory import wait_for_memory_to_clear

    return wait_for_memory_to_clear(threshold_bytes=GIB, platform=GPU)


@pytest.fixture
def warm_cache():
    return None
"""

_INNER_TESTS = """
from accelplat._types import GIB


def test_alloc_and_free(gpu):
    gpu.used[0] += 4 * GIB
    gpu.used[0] -= 4 * GIB


def test_keeps_memory(gpu, settled_device_memory):
    gpu.used[0] += 3 * GIB


def test_fails(gpu, warm_cache):
    assert False
"""


def test_plugin_writes_report_and_trace(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(_INNER_CONFTEST)
    pytester.makepyfile(test_inner=_INNER_TESTS)
    pytester.makeini(
        "[pytest]\naccelplat_timeline_wait_fixtures =\n    settled_device_memory\n    warm_cache\n"
    )
    result = pytester.runpytest_inprocess(
        *_plugin_args(),
        "--accelplat-timeline=out/report.html",
        "--accelplat-timeline-json=out/trace.json",
        "--accelplat-timeline-hz=50",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        ["accelplat timeline: *report.html, *trace.json (* 3 tests, 1 leaking, slowest wait *)"]
    )
    trace = load_trace(pytester.path / "out" / "trace.json")
    assert trace.platform == "innergpu"
    assert trace.sample_hz == 50
    assert trace.exit_code == 1
    outcomes = {t.nodeid: t.outcome for t in trace.tests}
    assert outcomes == {
        "test_inner.py::test_alloc_and_free": "passed",
        "test_inner.py::test_keeps_memory": "passed",
        "test_inner.py::test_fails": "failed",
    }
    leaks = trace.leaks()
    assert [(leak.nodeid, leak.leaked) for leak in leaks] == [
        ("test_inner.py::test_keeps_memory", 3 * GIB)
    ]
    # the settle fixture waits through accelplat._memory: its own wait event is recorded, the
    # fixture's set-up is not recorded a second time; a fixture that logs no event is timed
    assert [(w.kind, w.devices, w.ok, w.test) for w in trace.waits] == [
        ("clear", (0,), True, "test_inner.py::test_keeps_memory"),
        ("fixture:warm_cache", (), True, "test_inner.py::test_fails"),
    ]
    for span in trace.tests:  # every test got past its set-up: each body start is noted
        assert span.body_start is not None
        assert span.start <= span.body_start <= span.end
    page = (pytester.path / "out" / "report.html").read_text(encoding="utf-8")
    assert "test_inner.py::test_fails" in page
    assert (
        '<tr class="leak"><td class="id" data-label="Test">test_inner.py::test_keeps_memory' in page
    )


def test_the_leak_checks_own_wait_is_not_a_wait_that_failed(pytester: pytest.Pytester) -> None:
    """The leak check waits for a leaking test's memory: its wait, apart from the suite's."""
    pytester.makeconftest(_INNER_CONFTEST)
    pytester.makepyfile(test_inner=_INNER_TESTS)
    pytester.makeini("[pytest]\naccelplat_timeline_wait_fixtures = warm_cache\n")
    result = pytester.runpytest_inprocess(
        *_plugin_args(),
        "--accelplat-leak-check",
        "--accelplat-leak-wait=0.2",
        "--accelplat-timeline=report.html",
        "--accelplat-timeline-json=trace.json",
        "-p",
        "no:cacheprovider",
    )
    trace = load_trace(pytester.path / "trace.json")
    own = [w for w in trace.waits if w.by_leak_check]
    assert [(w.kind, w.ok, w.test) for w in own] == [
        ("leak check", False, "test_inner.py::test_keeps_memory")
    ]
    assert all(w.by_leak_check or w.ok for w in trace.waits)
    assert own[0] not in trace.slowest_waits()
    page = (pytester.path / "report.html").read_text(encoding="utf-8")
    assert "wait failed" not in page  # no red chip for the check's own wait
    assert 'id="leak-check-waits"' in page
    assert "the leak check waited 1 time" in page.lower()
    assert [leak.nodeid for leak in trace.leaks()] == ["test_inner.py::test_keeps_memory"]
    slowest = re.search(r"slowest wait ([0-9.]+) s", result.stdout.str())
    assert slowest is not None  # warm_cache's set-up, not the check's 0.2 s
    assert float(slowest.group(1)) < 0.15


def test_plugin_is_inert_without_the_option(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner="def test_ok():\n    pass\n")
    result = pytester.runpytest_inprocess(*_plugin_args(), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "accelplat timeline" not in result.stdout.str()
    assert not list(pytester.path.glob("*.html"))


def test_a_session_without_the_option_loads_no_recorder(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_inner=(
            "import sys\n"
            "def test_nothing_of_the_recorder_is_loaded():\n"
            "    assert 'accelplat.pytest_plugin' in sys.modules\n"
            "    loaded = [m for m in ('accelplat.timeline._sampler', 'accelplat.timeline._trace',"
            " 'accelplat._leaks', 'accelplat._types') if m in sys.modules]\n"
            "    assert loaded == []\n"
        )
    )
    quick = ("-p", "no:xdist", "-p", "no:hypothesispytest", "-p", "no:cacheprovider")  # 1 s less
    result = pytester.runpytest_subprocess(*_plugin_args(), *quick)
    result.assert_outcomes(passed=1)


def test_plugin_rejects_bad_options(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner="def test_ok():\n    pass\n")
    result = pytester.runpytest_inprocess(
        *_plugin_args(), "--accelplat-timeline=r.html", "--accelplat-timeline-hz=0"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--accelplat-timeline-hz must be in (0, 1000]*"])
    result = pytester.runpytest_inprocess(
        *_plugin_args(),
        "--accelplat-timeline=r.html",
        "--accelplat-timeline-leak-tolerance=lots",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result = pytester.runpytest_inprocess(
        *_plugin_args(), "--accelplat-timeline=r.html", "--accelplat-timeline-leak-grace=-1"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--accelplat-timeline-leak-grace must be a finite number*"])


# --------------------------------------------------------------------------------------------
# accelplat record / accelplat report


@pytest.fixture
def fake_gpu() -> FakeGpu:
    gpu = FakeGpu(n=1)
    gpu.used = [GIB]
    set_current_platform(gpu)
    return gpu


def test_record_propagates_exit_status_and_saves_trace(
    tmp_path: Path, fake_gpu: FakeGpu, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "trace.json"
    html = tmp_path / "r.html"
    code = "import sys; print('child ran'); sys.exit(3)"
    argv = ["record", "--out", str(out), "--html", str(html), "--hz", "100"]
    status = cli_main([*argv, "--", sys.executable, "-c", code])
    assert status == 3
    trace = load_trace(out)
    assert trace.command == (sys.executable, "-c", code)
    assert trace.exit_code == 3
    assert trace.platform == "fakegpu"
    assert [t.outcome for t in trace.tests] == ["exit 3"]
    assert trace.samples
    assert trace.samples[0].used == (GIB,)
    assert "exit 3" in html.read_text(encoding="utf-8")


def test_record_reports_death_by_signal_like_a_shell(tmp_path: Path, fake_gpu: FakeGpu) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    status = cli_main(
        ["record", "--out", str(tmp_path / "t.json"), "--", sys.executable, "-c", code]
    )
    assert status == 128 + 15


def test_record_missing_program_is_127_and_still_writes(tmp_path: Path, fake_gpu: FakeGpu) -> None:
    out = tmp_path / "t.json"
    status = cli_main(["record", "--out", str(out), "--", str(tmp_path / "no-such-program")])
    assert status == 127
    assert load_trace(out).exit_code == 127


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["record", "--out", "{tmp}/t.json"], "needs a command"),
        (["record", "--out", "{tmp}/t.json", "--"], "needs a command"),
        (["record", "--out", "{tmp}/t.json", "--hz", "0", "--", "true"], "--hz must be"),
        (["record", "--out", "{tmp}/nodir/t.json", "--", "true"], "does not exist"),
        (
            ["record", "--out", "{tmp}/t.json", "--leak-tolerance", "x", "--", "true"],
            "non-negative size",
        ),
        (["record", "--out", "{tmp}/t.json", "--leak-grace", "-2", "--", "true"], "--leak-grace"),
    ],
)
def test_record_usage_errors(
    tmp_path: Path,
    fake_gpu: FakeGpu,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    status = cli_main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert status == 2
    assert message in capsys.readouterr().err


def test_report_renders_a_saved_trace(tmp_path: Path) -> None:
    src = save_trace(_story(), tmp_path / "t.json")
    out = tmp_path / "r.html"
    assert cli_main(["report", str(src), "--out", str(out), "--title", "CI run 42"]) == 0
    page = out.read_text(encoding="utf-8")
    assert "<h1>CI run 42</h1>" in page
    assert "test_leaky" in page


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not valid JSON"),
        ('{"format": "accelplat.timeline", "version": 99}', "unsupported trace version 99"),
    ],
)
def test_report_rejects_bad_traces_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    src = tmp_path / "t.json"
    src.write_text(content)
    assert cli_main(["report", str(src), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert not (tmp_path / "r.html").exists()


# --------------------------------------------------------------------------------------------
# the report page: peaks, the y-axis, test labels


def _y_labels(svg: str) -> list[float]:
    """The y-axis labels of one chart, in GiB."""
    found = re.findall(r'text-anchor="end">([0-9.]+) (GiB|MiB)</text>', svg)
    return [float(v) / (1024 if unit == "MiB" else 1) for v, unit in found]


def test_report_names_each_device_peak_and_each_test_peak() -> None:
    from accelplat.timeline._render import peaks_per_test

    trace = _story()
    assert peaks_per_test(trace) == [(10 * GIB, 0), (0, 2 * GIB)]
    page = render_html(trace)
    assert re.search(
        r'data-peak="10737418240">— peak 10\.00 GiB at 625 ms during tests/test_a\.py::test_clean<',
        page,
    )
    assert (
        'data-peak="2147483648">— peak 2.00 GiB at 3.12 s during tests/test_a.py::test_leaky'
        in (page)
    )
    assert page.count('class="peak-marker"') == 8  # one per chart: 2 scales × desktop, phone
    table = page[page.index('<table id="tests"') :]
    head = table[: table.index("</thead>")]
    assert "Peak dev 0" in head
    assert "Peak dev 1" in head
    clean_row = table[table.index("test_clean") : table.index("</tr>", table.index("test_clean"))]
    peaks = re.findall(r'class="num peak" data-label="[^"]*">([^<]*)<', clean_row)
    assert peaks == ["10.00 GiB", "0 B"]


def test_a_small_leak_on_a_big_device_gets_a_fitted_axis() -> None:
    gpu, clock = FakeGpu(n=1), FakeClock()
    gpu.used[0] = GIB
    rec = Recorder(
        gpu, clock=clock, wall_clock=lambda: 1_700_000_000.0, leak_tolerance_bytes=64 * MIB
    )
    rec.sampler.sample()
    clock.t += 0.5
    rec.begin_test("tests/test_b.py::test_keeps_a_buffer")
    rec.begin_body("tests/test_b.py::test_keeps_a_buffer")
    gpu.used[0] = GIB + 200 * MIB
    clock.t += 0.5
    rec.sampler.sample()
    rec.end_test("tests/test_b.py::test_keeps_a_buffer", "passed")
    clock.t += 3.0
    rec.sampler.sample()
    trace = rec.stop()
    assert [leak.leaked for leak in trace.leaks()] == [200 * MIB]
    page = render_html(trace)
    fitted = page.split('<svg class="chart fit-scale"')[1].split("</svg>")[0]
    full = page.split('<svg class="chart full-scale"')[1].split("</svg>")[0]
    labels = _y_labels(fitted)
    assert min(labels) >= 0.9  # no longer from 0 ...
    assert max(labels) <= 1.3  # ... to the 80 GiB total: the 200 MiB step fills the chart
    assert len(labels) >= 3
    assert 'class="total"' not in fitted  # off the fitted scale
    full_labels = _y_labels(full)
    assert min(full_labels) == 0
    assert max(full_labels) >= 80
    assert 'class="total"' in full
    assert 'id="full-scale"' in page  # the checkbox that switches the scale


def test_test_names_are_written_where_they_fit() -> None:
    from accelplat.timeline._render import _fit_label, _short_name

    assert _short_name("tests/test_a.py::TestX::test_y[p1]") == "test_y[p1]"
    assert _fit_label("test_generate[tp2]", 400) == "test_generate[tp2]"
    cut = _fit_label("test_prefix_cache_reuse[tp2]", 100)
    assert cut.endswith("…")
    assert len(cut) < len("test_prefix_cache_reuse[tp2]")
    assert _fit_label("test_prefix_cache_reuse[tp2]", 20) == ""
    page = render_html(_story())
    fitted = page.split('<svg class="chart fit-scale"')[1].split("</svg>")[0]
    labels = re.findall(r'<text class="lane-label"[^>]*>([^<]*)</text>', fitted)
    assert labels == ["test_clean", "test_leaky"]


@pytest.mark.parametrize(
    ("lo", "hi", "total", "full", "expected"),
    [
        (GIB, GIB + 200 * MIB, 80 * GIB, False, (GIB - 20 * MIB, GIB + 220 * MIB)),
        (0, 60 * GIB, 80 * GIB, False, (0.0, 66 * GIB)),  # near zero: from zero
        (0, 78 * GIB, 80 * GIB, False, (0.0, 80 * GIB)),  # never above the total it reaches
        (GIB, 2 * GIB, 80 * GIB, True, (0.0, 80 * GIB)),
        (5 * GIB, 5 * GIB, 0, False, (4.5 * GIB, 5.5 * GIB)),  # flat: a tenth of the reading
        (0, 0, 0, False, (0.0, float(MIB))),  # flat at zero: at least 1 MiB
    ],
)
def test_axis_range(
    lo: int, hi: int, total: int, full: bool, expected: tuple[float, float]
) -> None:
    from accelplat.timeline._render import _axis

    assert _axis(lo, hi, total, full=full) == pytest.approx(expected)


_WRITE_ERRORS = {
    "disk-full": OSError(errno.ENOSPC, "No space left on device"),
    "quota": OSError(errno.EDQUOT, "Disk quota exceeded"),
    "read-only": OSError(errno.EROFS, "Read-only file system"),
    "permission": PermissionError(errno.EACCES, "Permission denied"),
    "io-error": OSError(errno.EIO, "Input/output error"),
    "is-a-dir": IsADirectoryError(errno.EISDIR, "Is a directory"),
    "not-a-dir": NotADirectoryError(errno.ENOTDIR, "Not a directory"),
    "name-too-long": OSError(errno.ENAMETOOLONG, "File name too long"),
    "directory-gone": FileNotFoundError(errno.ENOENT, "No such file or directory"),
    "not-regular": NotARegularFileError("r.html", "is a device, not a regular file"),
}


@pytest.mark.parametrize("how", sorted(_WRITE_ERRORS))
def test_report_exits_1_when_the_page_cannot_be_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A runtime failure (1), not bad usage (2): the trace and the arguments were fine.

    The failures come when the page is written (a target refused up front, when the command
    starts, is bad usage: the argument checks' own tests).
    """
    src = save_trace(_story(), tmp_path / "t.json")
    out = tmp_path / "r.html"

    def refuse(path: object, text: str) -> Path:
        raise _WRITE_ERRORS[how]

    monkeypatch.setattr("accelplat._files.write_text_atomic", refuse)
    assert cli_main(["report", str(src), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("accelplat report: error: cannot write ")
    assert "Traceback" not in err
    assert not os.path.isfile(out)

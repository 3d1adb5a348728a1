"""What a recording meets, the trace says, and what the recorder writes, the loader reads.

Two classes. A device whose reading fails during a recording (lost mid-run, lost from the
start, failing on and off, several at once, errors of every kind and size): the trace's notes
name each device once, with when its queries began to fail and the first error. And whatever a
platform, a test or a command hands the recorder (a name, node id, outcome, wait kind, note or
argument too long for a trace, a reading beyond a signed 64-bit integer, a clock before 1970 or
after 9999, a grace period or tolerance beyond what a trace holds) either is refused up front or
gives a trace that :func:`load_trace` reads back: the recording is never lost to its own file.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from accelplat._platform import Platform
from accelplat._types import GIB
from accelplat.errors import BackendError, ConfigurationError
from accelplat.timeline import Recorder, load_trace, save_trace
from accelplat.timeline._trace import MAX_TEXT, dumps_trace, loads_trace


@dataclass
class _Info:
    used: Any
    total: Any


@dataclass
class _Dev:
    index: int
    name: str


class HostileGpu:
    """Devices whose ``memory_info`` does whatever ``answer[index]`` says (return or raise)."""

    name = "hostile"
    context_free = True

    def __init__(self, n: int, name: str = "GPU") -> None:
        self.answer: dict[int, Callable[[], _Info]] = dict.fromkeys(range(n), self.fine)
        self._names = [f"{name} {i}" for i in range(n)]

    @staticmethod
    def fine() -> _Info:
        return _Info(used=GIB, total=80 * GIB)

    def devices(self) -> Sequence[_Dev]:
        return [_Dev(i, name) for i, name in enumerate(self._names)]

    def memory_info(self, index: int) -> _Info:
        return self.answer[index]()


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _raise(exc: BaseException) -> Callable[[], _Info]:
    def answer() -> _Info:
        raise exc

    return answer


def _recorder(gpu: HostileGpu, clock: Clock, **kw: Any) -> Recorder:
    return Recorder(cast(Platform, gpu), clock=clock, wall_clock=lambda: 1.7e9, **kw)


def _reloaded(rec: Recorder, tmp_path: Path, **kw: Any) -> Any:
    rec.stop()
    trace = rec.trace(**kw)
    save_trace(trace, tmp_path / "t.json")
    back = load_trace(tmp_path / "t.json")
    assert back == loads_trace(dumps_trace(trace))
    return back


FAILURES = {
    "backend-error": BackendError("hostile", "GPU is lost", "NVML_ERROR_GPU_IS_LOST"),
    "runtime-error": RuntimeError("device fell off the bus"),
    "os-error": OSError(19, "No such device"),
    "huge-message": RuntimeError("x" * 100_000),
    "control-characters": RuntimeError("\x1b[2J\x00\n<script>"),
    "empty-message": RuntimeError(),
}
ODD_ANSWERS = {
    "text": lambda: _Info(used="lots", total=80 * GIB),
    "nan": lambda: _Info(used=math.nan, total=80 * GIB),
    "infinity": lambda: _Info(used=math.inf, total=80 * GIB),
    "none": lambda: _Info(used=None, total=80 * GIB),
    "2**63": lambda: _Info(used=2**63, total=80 * GIB),
    "10**30": lambda: _Info(used=10**30, total=80 * GIB),
}


@pytest.mark.parametrize("how", sorted(FAILURES) + sorted(ODD_ANSWERS))
def test_a_device_lost_mid_record_is_named_once_with_when_and_why(tmp_path: Path, how: str) -> None:
    gpu, clock = HostileGpu(3), Clock()
    rec = _recorder(gpu, clock)
    rec.start()
    rec.sampler.stop()  # samples are taken by hand below
    rec.begin_test("t::a")
    clock.t += 1.5
    gpu.answer[1] = _raise(FAILURES[how]) if how in FAILURES else ODD_ANSWERS[how]
    for _ in range(4):
        clock.t += 0.25
        rec.sampler.sample()
    rec.end_test("t::a", "passed")
    trace = _reloaded(rec, tmp_path)
    notes = [n for n in trace.notes if n.startswith("Device ")]
    assert len(notes) == 1, trace.notes
    assert notes[0].startswith("Device 1 could not be read at 1.750 s (")
    assert "failed queries in all" in notes[0]
    assert len(notes[0]) < 700  # a 100 KB message is cut
    if how in FAILURES:
        assert type(FAILURES[how]).__name__ in notes[0]
    assert [s.used[1] for s in trace.samples if s.t >= 1.75] == [None] * 6  # 4, end, stop
    assert all(s.used[0] == GIB for s in trace.samples)


def test_a_device_unreadable_from_the_start_is_noted_as_recording_began(tmp_path: Path) -> None:
    gpu, clock = HostileGpu(2), Clock()
    gpu.answer[0] = _raise(RuntimeError("no such device"))
    rec = _recorder(gpu, clock)
    assert rec.devices[0].total == 0
    rec.sampler.sample()
    trace = _reloaded(rec, tmp_path)
    assert trace.notes == (
        "Device 0 could not be read as recording began (3 failed queries in all): "
        "RuntimeError: no such device",
    )


def test_a_device_failing_on_and_off_and_two_devices_failing_give_one_note_each(
    tmp_path: Path,
) -> None:
    gpu, clock = HostileGpu(3), Clock()
    rec = _recorder(gpu, clock)
    for step in range(6):
        clock.t += 1
        gpu.answer[2] = _raise(RuntimeError(f"flaky {step}")) if step % 2 else gpu.fine
        if step == 4:
            gpu.answer[0] = _raise(RuntimeError("gone"))
        rec.sampler.sample()
    trace = _reloaded(rec, tmp_path)  # stopping takes one more sample: 3 and 4 failures
    assert trace.notes == (
        "Device 0 could not be read at 5.000 s (3 failed queries in all): RuntimeError: gone",
        "Device 2 could not be read at 2.000 s (4 failed queries in all): RuntimeError: flaky 1",
    )


def test_a_single_failure_says_so_without_a_count(tmp_path: Path) -> None:
    gpu, clock = HostileGpu(1), Clock()
    rec = _recorder(gpu, clock)
    clock.t += 0.5
    gpu.answer[0] = _raise(RuntimeError("once"))
    rec.sampler.sample()
    gpu.answer[0] = gpu.fine
    trace = _reloaded(rec, tmp_path)
    assert trace.notes == ("Device 0 could not be read at 0.500 s: RuntimeError: once",)


def test_a_recording_without_failures_has_no_device_notes(tmp_path: Path) -> None:
    gpu, clock = HostileGpu(2), Clock()
    rec = _recorder(gpu, clock)
    rec.sampler.sample()
    assert _reloaded(rec, tmp_path).notes == ()


# -- what the recorder writes, the loader reads -------------------------------------------------

LONG = "n" * (MAX_TEXT + 10)


@pytest.mark.parametrize(
    "what",
    ["device-name", "nodeid", "outcome", "wait-kind", "note", "constructor-note", "argument"],
)
def test_text_too_long_for_a_trace_is_cut_not_fatal_to_the_file(tmp_path: Path, what: str) -> None:
    gpu, clock = HostileGpu(1, name=LONG if what == "device-name" else "GPU"), Clock()
    rec = _recorder(gpu, clock, notes=[LONG] if what == "constructor-note" else ())
    nodeid = LONG if what == "nodeid" else "t::a"
    rec.begin_test(nodeid)
    token = rec.begin_wait(LONG if what == "wait-kind" else "settle")
    clock.t += 1
    rec.end_wait(token)
    rec.end_test(nodeid, LONG if what == "outcome" else "passed")
    if what == "note":
        rec.add_note(LONG)
    command = ["python", LONG if what == "argument" else "x.py"]
    trace = _reloaded(rec, tmp_path, command=command)
    texts = [
        trace.devices[0].name,
        trace.tests[0].nodeid,
        trace.tests[0].outcome,
        trace.waits[0].kind,
        trace.waits[0].test,
        *trace.notes,
        *trace.command,
    ]
    assert max(len(t) for t in texts) == MAX_TEXT
    assert any(t.endswith("…") for t in texts)


@pytest.mark.parametrize("wall", [-1.0, -1e9, 1e13, 1e300])
def test_a_wall_clock_no_date_can_show_is_kept_in_range(tmp_path: Path, wall: float) -> None:
    rec = Recorder(None, clock=Clock(), wall_clock=lambda: wall)
    trace = _reloaded(rec, tmp_path)
    assert 0 <= trace.started_at <= 253_402_300_799.0


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"leak_grace_s": 1e10}, "leak_grace_s"),
        ({"leak_grace_s": 1e300}, "leak_grace_s"),
        ({"leak_tolerance_bytes": 2**63}, "leak_tolerance_bytes"),
        ({"leak_tolerance_bytes": 10**30}, "leak_tolerance_bytes"),
    ],
)
def test_settings_beyond_what_a_trace_holds_are_refused_up_front(
    kw: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigurationError, match=field):
        Recorder(None, clock=Clock(), **kw)


@pytest.mark.parametrize(("kw", "value"), [({"leak_grace_s": 1e9}, 1e9), ({}, None)])
def test_settings_at_the_edge_round_trip(tmp_path: Path, kw: dict[str, Any], value: Any) -> None:
    rec = Recorder(None, clock=Clock(), leak_tolerance_bytes=2**63 - 1, **kw)
    trace = _reloaded(rec, tmp_path)
    assert trace.leak_tolerance_bytes == 2**63 - 1
    if value is not None:
        assert trace.leak_grace_s == value

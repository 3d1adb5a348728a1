"""One definition of a leak: the leak check and the timeline judge a test alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accelplat._leaks import (
    DEFAULT_LEAK_TOLERANCE_BYTES,
    is_leak,
    leaked_bytes,
    parse_leak_tolerance,
)
from accelplat._types import MIB
from accelplat.pytest_plugin import _shared as pytest_plugin
from accelplat.timeline._trace import DeviceTrack, TestSpan, Trace, load_trace
from tests.pytest_plugin.test_plugin import write_spec

pytest_plugins = ["pytester"]


def test_one_default_for_both_features() -> None:
    assert (
        parse_leak_tolerance(pytest_plugin.DEFAULT_LEAK_TOLERANCE, argument="x")
        == DEFAULT_LEAK_TOLERANCE_BYTES
    )
    assert Trace(devices=(), samples=(), tests=()).leak_tolerance_bytes == (
        DEFAULT_LEAK_TOLERANCE_BYTES
    )


@pytest.mark.parametrize(
    ("before", "after", "tolerance", "leak"),
    [
        (0, 256 * MIB, 256 * MIB, False),  # exactly the tolerance: not a leak
        (0, 256 * MIB + 1, 256 * MIB, True),
        (MIB, 0, 0, False),  # freed memory
        (None, 10 * MIB, 0, False),  # unknown before
        (0, None, 0, False),  # unknown after
        (5, 5, 0, False),
        (5, 6, 0, True),
    ],
)
def test_the_rule(before: int | None, after: int | None, tolerance: int, leak: bool) -> None:
    assert is_leak(before, after, tolerance) is leak
    span = TestSpan("t", 0.0, 1.0, (before,), (after,))
    trace = Trace(
        devices=(DeviceTrack(0, "d", 1 << 40),),
        samples=(),
        tests=(span,),
        leak_tolerance_bytes=tolerance,
    )
    assert bool(trace.leaks()) is leak
    grown = leaked_bytes(before, after)
    assert trace.growth(span) == (grown,)


LEAKY_TESTS = """
def test_leaks_a_lot(accel_platform):
    accel_platform.clock.advance(1.0)


def test_leaks_a_little(accel_platform):
    accel_platform.clock.advance(1.0)


def test_clean():
    pass
"""


@pytest.mark.parametrize(
    ("flags", "flagged"),
    [
        ((), {"test_leaks_a_lot"}),
        (("--accelplat-leak-tolerance", "64MiB"), {"test_leaks_a_lot", "test_leaks_a_little"}),
        (("--accelplat-leak-tolerance", "2GiB"), set()),
    ],
)
def test_leak_check_and_timeline_give_the_same_verdict(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    flags: tuple[str, ...],
    flagged: set[str],
) -> None:
    write_spec(
        pytester,
        monkeypatch,
        devices=[
            {
                "total": "16GiB",
                "used": "1GiB",
                "timeline": [
                    {"at": 1.0, "used": "2GiB"},  # the first test leaves 1 GiB
                    {"at": 2.0, "used": "2148MiB"},  # the second 100 MiB
                ],
            }
        ],
    )
    pytester.makepyfile(test_leak=LEAKY_TESTS)
    out = pytester.path / "trace.json"
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--strict-markers",
        "--accelplat-platform",
        "simulated",
        "--accelplat-leak-check",
        "--accelplat-timeline",
        str(pytester.path / "report.html"),
        "--accelplat-timeline-json",
        str(out),
        *flags,
    )
    result.assert_outcomes(passed=3)
    text = result.stdout.str()
    by_check = {name for name in ("test_leaks_a_lot", "test_leaks_a_little", "test_clean")
                if f"test_leak.py::{name}: device 0" in text}  # fmt: skip
    trace = load_trace(out)
    by_timeline = {leak.nodeid.rpartition("::")[2] for leak in trace.leaks()}
    assert by_check == flagged
    assert by_timeline == flagged
    assert json.loads(Path(out).read_text())["leak_tolerance_bytes"] == trace.leak_tolerance_bytes

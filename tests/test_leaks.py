"""One definition of a leak: the leak check and the timeline judge a test alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accelplat._leaks import (
    DEFAULT_LEAK_TOLERANCE_BYTES,
    Holdings,
    first_context,
    judge,
    parse_leak_tolerance,
)
from accelplat._registry import get_platform
from accelplat._types import GIB, MIB
from accelplat.errors import ConfigurationError
from accelplat.pytest_plugin import _shared as pytest_plugin
from accelplat.timeline._sampler import Recorder
from accelplat.timeline._trace import (
    DeviceTrack,
    SpanOwners,
    TestSpan,
    Trace,
    dumps_trace,
    load_trace,
    loads_trace,
)
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
    span = TestSpan("t", 0.0, 1.0, (before,), (after,))
    trace = Trace(
        devices=(DeviceTrack(0, "d", 1 << 40),),
        samples=(),
        tests=(span,),
        leak_tolerance_bytes=tolerance,
    )
    assert bool(trace.leaks()) is leak
    grown = None if before is None or after is None else after - before
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


# -- the rule by owner ---------------------------------------------------------------------------


def test_judged_by_owner_the_context_and_co_tenants_are_not_blamed() -> None:
    before = Holdings(0, own=0, others=0)
    after = Holdings(GIB + 527 * MIB + 3 * GIB, own=527 * MIB + GIB, others=3 * GIB)
    blame = judge(before, after, context=527 * MIB)
    assert blame.attributed
    assert blame.leaked == GIB
    assert blame.others == 3 * GIB
    assert blame.is_leak(256 * MIB)
    assert not judge(before, after, context=527 * MIB + GIB).is_leak(0)


def test_a_child_new_since_the_test_began_is_blamed_an_older_one_is_not() -> None:
    before = Holdings(2 * GIB, own=0, children={7: 2 * GIB}, others=0)
    after = Holdings(5 * GIB, own=0, children={7: 4 * GIB, 8: GIB}, others=0)
    blame = judge(before, after)
    assert blame.children == {8: GIB}
    assert blame.leaked == GIB


def test_without_attribution_the_device_is_judged_whole() -> None:
    blame = judge(Holdings(GIB), Holdings(3 * GIB))
    assert not blame.attributed
    assert blame.leaked == 2 * GIB
    assert blame.others is None


def test_the_hosts_memory_is_not_judged() -> None:
    blame = judge(Holdings(GIB, judged=False), Holdings(9 * GIB, judged=False))
    assert blame.leaked is None
    assert not blame.is_leak(0)


def test_the_context_is_given_once_and_only_up_to_the_allowance() -> None:
    seen: set[int] = set()
    none, small, big = Holdings(0, own=0), Holdings(0, own=527 * MIB), Holdings(0, own=3 * GIB)
    assert first_context(seen, 0, none, big, GIB) == GIB  # a leak in the first test still shows
    assert first_context(seen, 0, none, small, GIB) == 0  # once per device
    assert first_context(seen, 1, small, big, GIB) == 0  # present before any test: given to none
    assert first_context(seen, 2, none, none, GIB) == 0  # none yet: decided later
    assert seen == {0, 1}
    assert first_context(seen, 2, none, small, GIB) == 527 * MIB
    assert first_context(seen, 3, Holdings(0), big, GIB) == 0  # not attributed: no context


def test_a_cpu_recording_reports_no_leak_where_host_memory_grew() -> None:
    """``accelplat record`` on the CPU platform: host memory moves for reasons of its own."""
    span = TestSpan("cmd", 0.0, 1.0, (GIB,), (3 * GIB,))
    devices = (DeviceTrack(0, "host", 64 * GIB),)
    assert Trace(devices=devices, samples=(), tests=(span,)).leaks()
    host = Trace(devices=devices, samples=(), tests=(span,), accelerator=False)
    assert host.leaks() == []
    assert loads_trace(dumps_trace(host)).accelerator is False
    rec = Recorder(get_platform("cpu"), hz=5)
    assert rec.trace().accelerator is False


def test_owner_readings_round_trip_through_a_trace_and_are_checked() -> None:
    owners = SpanOwners(0, Holdings(0, own=0, others=0), Holdings(GIB, own=GIB, children={9: 1}))
    span = TestSpan("t", 0.0, 1.0, (0,), (GIB,), owners=(owners,))
    trace = Trace(devices=(DeviceTrack(0, "d", 1 << 40),), samples=(), tests=(span,))
    again = loads_trace(dumps_trace(trace))
    assert again.tests[0].owners == (owners,)
    (leak,) = again.leaks()
    assert leak.blame is not None
    assert leak.leaked == GIB + 1
    doc = json.loads(dumps_trace(trace))
    doc["tests"][0]["owners"][0]["after"]["children"] = [[0, 5]]
    with pytest.raises(ConfigurationError, match=r"owners\[0\]\.after\.children\[0\]\[0\]"):
        loads_trace(json.dumps(doc))

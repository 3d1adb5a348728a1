"""Memory primitives: usage stats, snapshots, and the clear/settle waits, on a virtual clock."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import pytest

import accelplat
from accelplat import _registry as registry
from accelplat._backends.simulated import RealClock, SimulatedClock, SimulatedPlatform
from accelplat._memory import (
    PollPolicy,
    record_usage_stats,
    snapshot,
    wait_for_memory_to_clear,
    wait_for_memory_to_settle,
)
from accelplat._owners import default_clock
from accelplat._types import GIB, MIB, HolderState, MemoryInfo, UsageSnapshot
from accelplat._util import REAL_CLOCK
from accelplat.errors import (
    ConfigurationError,
    DeviceNotFoundError,
    MemoryNotSettledError,
)

TOTAL = 80 * GIB


def make(
    *devices: dict[str, Any],
    release: dict[str, Any] | None = None,
    clock: SimulatedClock | None = None,
) -> SimulatedPlatform:
    spec: dict[str, Any] = {"devices": [{"total": TOTAL, **d} for d in devices]}
    if release is not None:
        spec["release"] = release
    return SimulatedPlatform.from_spec(spec, clock=clock or SimulatedClock())


def vclock(platform: SimulatedPlatform) -> SimulatedClock:
    assert isinstance(platform.clock, SimulatedClock)
    return platform.clock


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[UsageSnapshot, dict[int, int]]] = []

    def __call__(self, snap: UsageSnapshot, targets: Mapping[int, int]) -> None:
        self.calls.append((snap, dict(targets)))


# ---------------------------------------------------------------------------------------------
# PollPolicy


def test_poll_policy_defaults_grow_and_cap() -> None:
    policy = PollPolicy()
    assert policy.initial_s == 0.005
    assert policy.max_s == 0.04
    seq = [policy.initial_s]
    for _ in range(10):
        seq.append(policy.next_interval(seq[-1], changed=False))
    assert seq[1] == pytest.approx(0.0075)
    assert seq == sorted(seq)
    assert seq[-1] == policy.max_s
    assert policy.next_interval(policy.max_s, changed=True) == policy.initial_s


def test_poll_policy_fixed() -> None:
    policy = PollPolicy.fixed(1.0)
    assert policy.next_interval(1.0, changed=False) == 1.0
    assert policy.next_interval(1.0, changed=True) == 1.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"initial_s": 0}, "initial_s must be > 0"),
        ({"initial_s": -1}, "initial_s must be > 0"),
        ({"initial_s": math.nan}, "initial_s must be finite"),
        ({"max_s": math.inf}, "max_s must be finite"),
        ({"factor": 0.5}, "factor must be >= 1"),
        ({"initial_s": 1.0, "max_s": 0.5}, "max_s must be >= initial_s"),
        ({"initial_s": True}, "initial_s must be a number"),
        ({"factor": "2"}, "factor must be a number"),
    ],
)
def test_poll_policy_validation(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        PollPolicy(**kwargs)


# ---------------------------------------------------------------------------------------------
# record_usage_stats / snapshot


def test_record_usage_stats_in_gib_for_all_or_some_devices() -> None:
    platform = make({"used": 3 * GIB}, {"used": GIB // 2})
    assert record_usage_stats(platform=platform) == {0: (3.0, 80.0), 1: (0.5, 80.0)}
    assert record_usage_stats([1], platform=platform) == {1: (0.5, 80.0)}


def test_record_usage_stats_uses_current_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    platform = make({"used": GIB})
    with registry.use_platform(platform):
        assert record_usage_stats() == {0: (1.0, 80.0)}
        assert accelplat.record_usage_stats() == {0: (1.0, 80.0)}


@pytest.mark.parametrize(
    ("devices", "error", "match"),
    [
        ([], ConfigurationError, "at least one"),
        ([2], DeviceNotFoundError, "0..1"),
        ([-1], DeviceNotFoundError, "not a visible"),
        ([True], DeviceNotFoundError, "not a visible"),
        (["0"], DeviceNotFoundError, "not a visible"),
        ([0, 0], ConfigurationError, "more than once"),
        ("01", ConfigurationError, "sequence"),
        (0, ConfigurationError, "sequence"),
    ],
)
def test_bad_device_lists(devices: Any, error: type[Exception], match: str) -> None:
    platform = make({}, {})
    with pytest.raises(error, match=match):
        record_usage_stats(devices, platform=platform)
    with pytest.raises(error, match=match):
        wait_for_memory_to_clear(devices, threshold_bytes=0, platform=platform)


def test_snapshot_timestamps_come_from_platform_clock_and_holders() -> None:
    clock = SimulatedClock(start=10.0, epoch=5000.0)
    platform = make(
        {"used": GIB, "holders": [{"used": GIB, "pid": 99, "name": "w", "state": "child"}]},
        {"used": 0},
        clock=clock,
    )
    clock.advance(2.0)
    snap = snapshot(platform=platform)
    assert snap.timestamp == 12.0
    assert snap.wall_time == 5002.0
    assert snap.memory[0].used == 2 * GIB
    assert set(snap.holders) == {0}  # device 1 cannot tell: absent
    (holder,) = snap.holders[0]
    assert (holder.pid, holder.state, holder.used_bytes) == (99, HolderState.CHILD, GIB)
    assert snapshot(platform=platform, holders=False).holders == {}


def test_default_clock() -> None:
    platform = make({})
    assert default_clock(platform) is platform.clock
    assert default_clock(object()) is REAL_CLOCK
    real = SimulatedPlatform.from_spec({"devices": [{"total": 1}]})
    assert isinstance(default_clock(real), RealClock)


# ---------------------------------------------------------------------------------------------
# wait_for_memory_to_clear: timing


def test_already_clear_returns_at_once_without_sleeping() -> None:
    platform = make({"used": GIB})
    result = wait_for_memory_to_clear(
        threshold_bytes=2 * GIB, stable_duration_s=0, platform=platform
    )
    assert result.already_settled
    assert result.polls == 1
    assert result.waited_s == 0.0
    assert vclock(platform).sleeps == []
    assert result.targets == {0: 2 * GIB}
    assert result.snapshot.memory[0].used == GIB


def test_step_release_is_seen_within_one_poll_cap() -> None:
    platform = make({"used": 60 * GIB, "timeline": [{"at": 1.0, "used": 0}]})
    policy = PollPolicy()
    result = wait_for_memory_to_clear(
        threshold_bytes=GIB, stable_duration_s=0, timeout_s=10, poll=policy, platform=platform
    )
    assert not result.already_settled
    assert 1.0 <= result.waited_s <= 1.0 + policy.max_s
    assert result.snapshot.memory[0].used == 0
    sleeps = vclock(platform).sleeps
    assert max(sleeps) <= policy.max_s
    assert result.polls == len(sleeps) + 1


def test_stability_window_is_waited_exactly_after_release() -> None:
    platform = make({"used": 60 * GIB, "timeline": [{"at": 1.0, "used": 0}]})
    result = wait_for_memory_to_clear(
        threshold_bytes=GIB, stable_duration_s=2.0, timeout_s=10, platform=platform
    )
    # window opens at the first sample after 1.0 (within max_s) and ends exactly 2 s later
    assert 3.0 <= result.waited_s <= 3.0 + PollPolicy().max_s
    assert not result.already_settled


def test_window_applies_even_when_already_below() -> None:
    platform = make({"used": 0})
    result = wait_for_memory_to_clear(
        threshold_bytes=GIB, stable_duration_s=1.5, timeout_s=10, platform=platform
    )
    assert result.waited_s == pytest.approx(1.5)
    assert not result.already_settled


def test_window_restarts_when_usage_moves_more_than_tolerance() -> None:
    # below target throughout, but drops by 2 GiB at t=1: the window restarts there
    platform = make({"used": 3 * GIB, "timeline": [{"at": 1.0, "used": GIB}]})
    result = wait_for_memory_to_clear(
        threshold_bytes=4 * GIB,
        stable_duration_s=2.0,
        stable_tolerance_bytes=512 * MIB,
        timeout_s=10,
        platform=platform,
    )
    assert 3.0 <= result.waited_s <= 3.0 + PollPolicy().max_s
    # with a tolerance larger than the move, the window is not disturbed
    platform = make({"used": 3 * GIB, "timeline": [{"at": 1.0, "used": GIB}]})
    result = wait_for_memory_to_clear(
        threshold_bytes=4 * GIB,
        stable_duration_s=2.0,
        stable_tolerance_bytes=4 * GIB,
        timeout_s=10,
        platform=platform,
    )
    assert result.waited_s == pytest.approx(2.0)


def test_window_restarts_when_usage_goes_back_above_target() -> None:
    platform = make(
        {
            "used": 0,
            "timeline": [{"at": 1.0, "used": 8 * GIB}, {"at": 1.5, "used": 0}],
        }
    )
    result = wait_for_memory_to_clear(
        threshold_bytes=GIB, stable_duration_s=1.0, timeout_s=10, platform=platform
    )
    assert 2.5 <= result.waited_s <= 2.5 + PollPolicy().max_s


def test_polling_speeds_up_after_a_change() -> None:
    platform = make(
        {"used": 60 * GIB, "timeline": [{"at": 2.0, "used": 30 * GIB}, {"at": 4.0, "used": 0}]}
    )
    policy = PollPolicy(initial_s=0.01, factor=2.0, max_s=0.32)
    wait_for_memory_to_clear(
        threshold_bytes=GIB, stable_duration_s=0, timeout_s=10, poll=policy, platform=platform
    )
    sleeps = vclock(platform).sleeps
    assert sleeps[:6] == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.16, 0.32])
    # after the 30 GiB drop at t=2 the next sleep is initial_s again
    t = 0.0
    after_change = None
    for i, s in enumerate(sleeps):
        t += s
        if t >= 2.0:
            after_change = sleeps[i + 1]
            break
    assert after_change == pytest.approx(0.01)


def test_fixed_interval_policy() -> None:
    platform = make({"used": 60 * GIB, "timeline": [{"at": 2.5, "used": 0}]})
    result = wait_for_memory_to_clear(
        threshold_bytes=GIB, timeout_s=30, poll=PollPolicy.fixed(1.0), platform=platform
    )
    assert result.waited_s == pytest.approx(3.0)
    assert vclock(platform).sleeps == [1.0, 1.0, 1.0]


def test_explicit_clock_overrides_platform_clock() -> None:
    platform_clock = SimulatedClock()
    platform = make({"used": 0}, clock=platform_clock)
    other = SimulatedClock()
    wait_for_memory_to_clear(
        threshold_bytes=GIB, stable_duration_s=0.5, platform=platform, clock=other
    )
    assert other.sleeps
    assert not platform_clock.sleeps


def test_real_clock_wait_is_short() -> None:
    platform = SimulatedPlatform.from_spec(
        {"devices": [{"total": TOTAL, "used": 10 * GIB, "timeline": [{"at": 0.02, "used": 0}]}]}
    )
    result = wait_for_memory_to_clear(
        threshold_bytes=GIB, stable_duration_s=0, timeout_s=5, platform=platform
    )
    assert 0.0 < result.waited_s < 1.0
    assert result.snapshot.memory[0].used == 0


# ---------------------------------------------------------------------------------------------
# wait_for_memory_to_clear: timeouts


def test_timeout_raises_at_deadline_with_diagnosis() -> None:
    platform = make(
        {
            "used": 60 * GIB,
            "timeline": [
                {"at": 1.0, "used": 10 * GIB},
                {"stuck": {"used": 6 * GIB, "pid": 4242, "name": "engine", "state": "zombie"}},
            ],
        },
        {"used": 0},
    )
    with pytest.raises(MemoryNotSettledError) as info:
        wait_for_memory_to_clear(
            threshold_bytes=2 * GIB, stable_duration_s=0, timeout_s=5.0, platform=platform
        )
    err = info.value
    assert isinstance(err, TimeoutError)
    assert err.waited_s == pytest.approx(5.0)
    assert vclock(platform).monotonic() == pytest.approx(5.0)  # never slept past the deadline
    assert err.targets == {0: 2 * GIB, 1: 2 * GIB}
    assert err.history[0] == (66 * GIB, 16 * GIB, 66 * GIB, 16 * GIB)
    assert err.history[1] == (0, 0, 0, 0)
    assert err.snapshot.memory[0].used == 16 * GIB
    assert [h.pid for h in err.snapshot.holders[0]] == [4242]
    message = str(err)
    assert "device 0: used 16.00 GiB, target <= 2.00 GiB" in message
    assert "first 66.00, min 16.00, max 66.00, last 16.00 GiB" in message
    assert "pid 4242 'engine' (zombie) 6.00 GiB" in message
    assert "device 1" not in message  # it met its target
    assert "1 of 2" in message


def test_timeout_message_for_unknown_holders_and_self() -> None:
    platform = make(
        {"used": 8 * GIB},
        {"used": 8 * GIB, "holders": [{"used": 0, "pid": 1, "state": "self", "name": "me"}]},
    )
    with pytest.raises(MemoryNotSettledError) as info:
        wait_for_memory_to_clear(threshold_ratio=0.05, timeout_s=1, platform=platform)
    message = str(info.value)
    assert "device 0" in message
    assert "holders: unknown" in message
    assert "(self)" in message
    assert "this process itself holds" in message


def test_timeout_when_usage_never_stabilises() -> None:
    # below target all the time, but moves by 1 GiB every 0.5 s: no 1 s window ever completes
    steps = [{"at": 0.5 * k, "used": (k % 2) * GIB} for k in range(1, 40)]
    platform = make({"used": 0, "timeline": steps})
    with pytest.raises(MemoryNotSettledError, match="had not stayed there") as info:
        wait_for_memory_to_clear(
            threshold_bytes=4 * GIB,
            stable_duration_s=1.0,
            stable_tolerance_bytes=256 * MIB,
            timeout_s=5,
            platform=platform,
        )
    assert info.value.waited_s == pytest.approx(5.0)


def test_timeout_zero_samples_once() -> None:
    platform = make({"used": 8 * GIB})
    with pytest.raises(MemoryNotSettledError):
        wait_for_memory_to_clear(threshold_bytes=GIB, timeout_s=0, platform=platform)
    assert vclock(platform).sleeps == []
    result = wait_for_memory_to_clear(threshold_bytes=8 * GIB, timeout_s=0, platform=platform)
    assert result.already_settled


def test_sleeps_never_cross_the_deadline() -> None:
    platform = make({"used": 8 * GIB})
    with pytest.raises(MemoryNotSettledError):
        wait_for_memory_to_clear(
            threshold_bytes=GIB, timeout_s=1.234, poll=PollPolicy.fixed(1.0), platform=platform
        )
    assert vclock(platform).sleeps == pytest.approx([1.0, 0.234])


def test_defaults_come_from_release_profile() -> None:
    release = {"lazy": True, "stable_duration_s": 1.25, "settle_timeout_s": 7.5}
    platform = make({"used": 8 * GIB}, release=release)
    with pytest.raises(MemoryNotSettledError) as info:
        wait_for_memory_to_clear(threshold_bytes=GIB, platform=platform)
    assert info.value.waited_s == pytest.approx(7.5)
    platform = make({"used": 0}, release=release)
    result = wait_for_memory_to_clear(threshold_bytes=GIB, platform=platform)
    assert result.waited_s == pytest.approx(1.25)


# ---------------------------------------------------------------------------------------------
# thresholds


def targets_for(platform: SimulatedPlatform, **kwargs: Any) -> dict[int, int]:
    result = wait_for_memory_to_clear(timeout_s=0, stable_duration_s=0, platform=platform, **kwargs)
    return dict(result.targets)


def test_ratio_bytes_and_both() -> None:
    platform = make({"used": 0}, {"used": 0})
    assert targets_for(platform, threshold_ratio=0.1) == {0: 8 * GIB, 1: 8 * GIB}
    assert targets_for(platform, threshold_bytes=GIB) == {0: GIB, 1: GIB}
    both = targets_for(platform, threshold_bytes=10 * GIB, threshold_ratio=0.1)
    assert both == {0: 10 * GIB, 1: 10 * GIB}
    both = targets_for(platform, threshold_bytes=GIB, threshold_ratio=0.1)
    assert both == {0: 8 * GIB, 1: 8 * GIB}


def test_per_device_mappings() -> None:
    platform = make({"used": 0}, {"used": 0})
    got = targets_for(platform, threshold_bytes={0: GIB, 1: 2 * GIB}, threshold_ratio={0: 0, 1: 0})
    assert got == {0: GIB, 1: 2 * GIB}
    got = targets_for(platform, devices=[1], threshold_ratio={1: 0.5})
    assert got == {1: 40 * GIB}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"threshold_bytes": {0: GIB}}, r"missing \[1\]"),
        ({"threshold_bytes": {0: GIB, 1: GIB, 2: GIB}}, r"not waited on \[2\]"),
        ({"threshold_ratio": {0: 0.1, 1: 1.5}}, r"threshold_ratio\[1\] must be in \[0, 1\]"),
        ({"threshold_bytes": {0: -1, 1: 0}}, r"threshold_bytes\[0\] must be >= 0"),
    ],
)
def test_bad_mappings(kwargs: dict[str, Any], match: str) -> None:
    platform = make({}, {})
    with pytest.raises(ConfigurationError, match=match):
        wait_for_memory_to_clear(platform=platform, timeout_s=0, **kwargs)


def test_idle_floor_raises_low_ratio_targets_only() -> None:
    release = {"lazy": True, "stable_duration_s": 0, "idle_floor": "4GiB"}
    platform = make({"used": 0}, release=release)
    assert targets_for(platform, threshold_ratio=0.02) == {0: 4 * GIB}  # 1.6 GiB -> floor
    assert targets_for(platform, threshold_ratio=0.1) == {0: 8 * GIB}  # above the floor
    assert targets_for(platform, threshold_bytes=GIB) == {0: GIB}  # bytes are taken as given
    small = SimulatedPlatform.from_spec(
        {"release": release, "devices": [{"total": "2GiB"}]}, clock=SimulatedClock()
    )
    assert targets_for(small, threshold_ratio=0.0) == {0: 2 * GIB}  # capped at total


def test_waits_report_the_targets_the_idle_floor_raised() -> None:
    release = {"lazy": True, "stable_duration_s": 0, "idle_floor": "4GiB"}
    platform = make({"used": 0}, {"used": 0}, release=release)
    result = wait_for_memory_to_clear(
        threshold_ratio={0: 0.02, 1: 0.1}, timeout_s=0, platform=platform
    )
    assert result.raised_targets == {0: 4 * GIB}  # device 1's 8 GiB is its own ratio
    both = wait_for_memory_to_clear(
        threshold_ratio=0.02, threshold_bytes={0: GIB, 1: 5 * GIB}, timeout_s=0, platform=platform
    )
    assert both.targets == {0: 4 * GIB, 1: 5 * GIB}
    assert both.raised_targets == {0: 4 * GIB}  # the bytes already ask for more on device 1
    full = make({"used": 70 * GIB}, release=release)
    with pytest.raises(MemoryNotSettledError) as info:
        wait_for_memory_to_clear(threshold_ratio=0.01, timeout_s=0, platform=full)
    assert info.value.raised_targets == {0: 4 * GIB}


def test_waits_and_snapshots_read_through_the_reader_given() -> None:
    platform = make({"used": 10 * GIB}, {"used": 0})
    reads: list[int] = []

    def half(device: int) -> MemoryInfo:
        reads.append(device)
        info = platform.memory_info(device)
        return MemoryInfo(free=info.free, total=info.total, used=info.used // 2)

    result = wait_for_memory_to_clear(
        [0], threshold_bytes=5 * GIB, timeout_s=0, platform=platform, read=half
    )
    assert result.already_settled
    assert reads == [0]
    assert snapshot([0], platform=platform, read=half).memory[0].used == 5 * GIB
    with pytest.raises(ConfigurationError, match="read must be callable"):
        wait_for_memory_to_clear(threshold_bytes=GIB, platform=platform, read=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="read must be callable"):
        snapshot(platform=platform, read="used")  # type: ignore[arg-type]


def test_idle_floor_applies_only_below_a_five_percent_ratio() -> None:
    # vLLM floors only ratios below 5 %: on a 40 GiB device 5 % (2 GiB) is taken as given
    release = {"lazy": True, "stable_duration_s": 0, "idle_floor": "4GiB"}
    card = SimulatedPlatform.from_spec(
        {"release": release, "devices": [{"total": "40GiB"}]}, clock=SimulatedClock()
    )
    assert targets_for(card, threshold_ratio=0.05) == {0: 2 * GIB}
    assert targets_for(card, threshold_ratio=0.049) == {0: 4 * GIB}


def test_idle_floor_lets_a_lazy_device_clear() -> None:
    # idle usage 2.5 GiB never goes lower; a 1 % target (0.8 GiB) is raised to the 4 GiB floor
    platform = make(
        {"used": 70 * GIB, "timeline": [{"lazy": {"start": 0.5, "tau": 0.3, "to": "2.5GiB"}}]},
        release={"lazy": True, "stable_duration_s": 1.0, "idle_floor": "4GiB"},
    )
    result = wait_for_memory_to_settle(threshold_ratio=0.01, timeout_s=30, platform=platform)
    assert result.targets == {0: 4 * GIB}
    assert result.snapshot.memory[0].used <= 4 * GIB


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "threshold_bytes or threshold_ratio"),
        ({"threshold_ratio": 1.01}, r"threshold_ratio must be in \[0, 1\]"),
        ({"threshold_ratio": -0.1}, r"threshold_ratio must be in \[0, 1\]"),
        ({"threshold_ratio": math.nan}, "threshold_ratio must be finite"),
        ({"threshold_ratio": True}, "threshold_ratio must be a number"),
        ({"threshold_bytes": -1}, "threshold_bytes must be >= 0"),
        ({"threshold_bytes": False}, "threshold_bytes must be a number"),
        ({"threshold_bytes": "4GiB"}, "threshold_bytes must be a number"),
        ({"threshold_bytes": GIB, "timeout_s": -1}, "timeout_s must be >= 0"),
        ({"threshold_bytes": GIB, "timeout_s": math.nan}, "timeout_s must be finite"),
        ({"threshold_bytes": GIB, "timeout_s": math.inf}, "timeout_s must be finite"),
        ({"threshold_bytes": GIB, "timeout_s": True}, "timeout_s must be a number"),
        ({"threshold_bytes": GIB, "stable_duration_s": -0.5}, "stable_duration_s must be >= 0"),
        ({"threshold_bytes": GIB, "stable_duration_s": math.inf}, "stable_duration_s must be"),
        ({"threshold_bytes": GIB, "stable_tolerance_bytes": -1}, "stable_tolerance_bytes"),
        ({"threshold_bytes": GIB, "stable_tolerance_bytes": True}, "stable_tolerance_bytes"),
        ({"threshold_bytes": GIB, "poll": 0.1}, "poll must be a PollPolicy"),
        ({"threshold_bytes": GIB, "on_poll": 3}, "on_poll must be callable"),
        ({"threshold_bytes": GIB, "clock": object()}, "clock must have"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs: dict[str, Any], match: str) -> None:
    platform = make({"used": 0})
    with pytest.raises(ConfigurationError, match=match):
        wait_for_memory_to_clear(platform=platform, **kwargs)
    assert vclock(platform).sleeps == []


def test_configuration_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        wait_for_memory_to_clear(platform=make({}), threshold_ratio=2.0)


# ---------------------------------------------------------------------------------------------
# progress: on_poll and logging


def test_on_poll_sees_every_sample_with_targets() -> None:
    platform = make({"used": 60 * GIB, "timeline": [{"at": 0.3, "used": 0}]})
    recorder = Recorder()
    result = wait_for_memory_to_clear(
        threshold_bytes=GIB, stable_duration_s=0, on_poll=recorder, platform=platform
    )
    assert len(recorder.calls) == result.polls
    assert all(targets == {0: GIB} for _, targets in recorder.calls)
    assert recorder.calls[0][0].memory[0].used == 60 * GIB
    assert recorder.calls[-1][0] is result.snapshot
    stamps = [snap.timestamp for snap, _ in recorder.calls]
    assert stamps == sorted(stamps)


def test_logs_to_accelplat_memory_logger(caplog: pytest.LogCaptureFixture) -> None:
    platform = make({"used": 60 * GIB, "timeline": [{"at": 0.1, "used": 0}]})
    with caplog.at_level(logging.DEBUG, logger="accelplat._memory"):
        wait_for_memory_to_clear(threshold_bytes=GIB, stable_duration_s=0, platform=platform)
    records = [r for r in caplog.records if r.name == "accelplat._memory"]
    assert any("poll" in r.getMessage() for r in records)
    assert any("settled after" in r.getMessage() for r in records)


def test_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    platform = make({"used": 60 * GIB, "timeline": [{"at": 0.1, "used": 0}]})
    wait_for_memory_to_clear(threshold_bytes=GIB, stable_duration_s=0.2, platform=platform)
    with pytest.raises(MemoryNotSettledError):
        wait_for_memory_to_clear(threshold_bytes=0, timeout_s=0.0, platform=make({"used": 1}))
    assert capsys.readouterr() == ("", "")


# ---------------------------------------------------------------------------------------------
# wait_for_memory_to_settle


LAZY = {"lazy": True, "stable_duration_s": 2.0, "settle_timeout_s": 60.0}
EAGER = {"lazy": False, "stable_duration_s": 2.0, "settle_timeout_s": 60.0}


def test_settle_on_lazy_platform_waits_window_even_when_below() -> None:
    platform = make({"used": GIB}, release=LAZY)
    result = wait_for_memory_to_settle(platform=platform)
    assert not result.already_settled
    assert result.waited_s == pytest.approx(2.0)
    assert result.targets == {0: 8 * GIB}  # default ratio 0.1


def test_settle_on_lazy_platform_follows_lazy_release() -> None:
    platform = make(
        {
            "used": 70 * GIB,
            "timeline": [{"lazy": {"start": 0.5, "delay": 0.5, "tau": 0.5, "to": 0}}],
        },
        release=LAZY,
    )
    result = wait_for_memory_to_settle(platform=platform)
    dev = platform.spec.devices[0]
    # first moment the device is at/below 8 GiB, then the 2 s window (plus restarts while the
    # tail still moves more than 512 MiB)
    assert result.snapshot.memory[0].used <= 8 * GIB
    assert result.waited_s >= 2.0
    assert result.waited_s <= dev.quiet_after() + 2.0 + PollPolicy().max_s


def test_settle_on_eager_platform_returns_at_once_when_below() -> None:
    platform = make({"used": GIB}, release=EAGER)
    result = wait_for_memory_to_settle(platform=platform)
    assert result.already_settled
    assert result.polls == 1
    assert vclock(platform).sleeps == []


def test_settle_on_eager_platform_waits_for_target_without_window() -> None:
    platform = make({"used": 70 * GIB, "timeline": [{"at": 0.7, "used": 0}]}, release=EAGER)
    result = wait_for_memory_to_settle(platform=platform)
    assert 0.7 <= result.waited_s <= 0.7 + PollPolicy().max_s


def test_settle_force_applies_window_on_eager_platform() -> None:
    platform = make({"used": GIB}, release=EAGER)
    result = wait_for_memory_to_settle(platform=platform, force=True)
    assert result.waited_s == pytest.approx(2.0)


def test_settle_times_out_with_holders() -> None:
    platform = make(
        {"used": 0, "timeline": [{"stuck": {"used": 20 * GIB, "pid": 77, "name": "leak"}}]},
        release=LAZY,
    )
    with pytest.raises(MemoryNotSettledError, match="pid 77 'leak'") as info:
        wait_for_memory_to_settle(platform=platform, timeout_s=3, owners="all")
    assert info.value.waited_s == pytest.approx(3.0)


def test_settle_on_ours_names_a_stuck_co_tenant_and_does_not_wait_for_it() -> None:
    platform = make(
        {"used": 0, "timeline": [{"stuck": {"used": 20 * GIB, "pid": 77, "name": "leak"}}]},
        release=LAZY,
    )
    result = wait_for_memory_to_settle(platform=platform, timeout_s=3)
    assert result.owners == "ours"
    assert result.waited_s == pytest.approx(LAZY["stable_duration_s"])
    assert "pid 77 'leak' 20.00 GiB" in result.note
    assert result.snapshot.memory[0].used == 20 * GIB  # the real reading, not ours
    assert result.snapshot.attribution[0].others_bytes == 20 * GIB


def test_settle_bad_input() -> None:
    platform = make({}, release=LAZY)
    with pytest.raises(ConfigurationError, match="threshold_ratio"):
        wait_for_memory_to_settle(threshold_ratio=None, platform=platform)
    with pytest.raises(ConfigurationError, match="force"):
        wait_for_memory_to_settle(force="yes", platform=platform)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="timeout_s"):
        wait_for_memory_to_settle(timeout_s=-1, platform=platform)
    with pytest.raises(DeviceNotFoundError):
        wait_for_memory_to_settle(devices=[3], platform=platform)


def test_settle_with_ratio_mapping_and_devices() -> None:
    platform = make({"used": 0}, {"used": 50 * GIB}, release=EAGER)
    result = wait_for_memory_to_settle(threshold_ratio={0: 0.1}, devices=[0], platform=platform)
    assert result.already_settled
    assert result.targets == {0: 8 * GIB}


# ---------------------------------------------------------------------------------------------
# import hygiene


def test_memory_waits_never_import_torch(tmp_path: Any) -> None:
    code = (
        "import sys\n"
        "import accelplat\n"
        "from accelplat._backends.simulated import SimulatedPlatform\n"
        "p = SimulatedPlatform.from_spec({'clock': 'virtual', 'devices': [{'total': 100}]})\n"
        "accelplat.record_usage_stats(platform=p)\n"
        "accelplat.wait_for_memory_to_clear(threshold_bytes=0, platform=p, timeout_s=1)\n"
        "accelplat.wait_for_memory_to_settle(platform=p)\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# ---------------------------------------------------------------------------------------------
# wait events for timeline recorders, and platforms without devices


def wait_events(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [
        r.accelplat_wait
        for r in caplog.records
        if r.name == "accelplat._memory" and hasattr(r, "accelplat_wait")
    ]


def test_each_wait_logs_start_and_end_events(caplog: pytest.LogCaptureFixture) -> None:
    platform = make({"used": 0}, {"used": 8 * GIB}, release=LAZY)
    with caplog.at_level(logging.DEBUG, logger="accelplat._memory"):
        wait_for_memory_to_clear([0], threshold_bytes=GIB, platform=platform)
        with pytest.raises(MemoryNotSettledError):
            wait_for_memory_to_settle(threshold_ratio=0.05, timeout_s=1, platform=platform)
    first_start, first_end, second_start, second_end = wait_events(caplog)
    assert first_start == {"event": "start", "id": first_start["id"], "kind": "clear",
                           "devices": [0]}  # fmt: skip
    assert first_end == {"event": "end", "id": first_start["id"], "ok": True}
    assert second_start["kind"] == "settle"
    assert second_start["devices"] == [0, 1]
    assert second_start["id"] != first_start["id"]
    assert second_end == {"event": "end", "id": second_start["id"], "ok": False}


def test_bad_arguments_log_no_wait_event(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="accelplat._memory"), pytest.raises(ValueError):
        wait_for_memory_to_clear(threshold_ratio=3.0, platform=make({}))
    assert wait_events(caplog) == []


def test_platform_without_devices() -> None:
    from accelplat._backends.simulated import SimulatedSpec

    platform = SimulatedPlatform(SimulatedSpec(devices=()), clock=SimulatedClock())
    assert record_usage_stats(platform=platform) == {}
    assert snapshot(platform=platform).memory == {}
    result = wait_for_memory_to_clear(threshold_ratio=0.1, stable_duration_s=5, platform=platform)
    assert result.already_settled
    assert result.targets == {}
    assert vclock(platform).sleeps == []
    with pytest.raises(DeviceNotFoundError, match="none: no device is visible"):
        wait_for_memory_to_clear([0], threshold_ratio=0.1, platform=platform)

"""Properties of the wait algorithm, on random simulated timelines and a virtual clock.

For timelines along which usage only goes down (a release: steps, linear releases, lazy
exponential tails, in any order), the waiter

* never returns before usage has been at or below the target, and within the tolerance, for the
  whole stability window;
* returns within one poll cap (``PollPolicy.max_s``) of the earliest moment it could have;
* when it cannot return, raises within one poll of ``timeout_s`` (on the virtual clock: exactly
  at it), never sleeping past the deadline.

For arbitrary timelines (usage also goes up), the guarantee is about what the waiter saw: every
sample in the stability window met the target and stayed within the tolerance.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelplat._backends.simulated import (
    LazyRelease,
    Linear,
    SimulatedClock,
    SimulatedDevice,
    SimulatedPlatform,
    SimulatedSpec,
    Step,
)
from accelplat._backends.simulated._model import Segment
from accelplat._memory import PollPolicy, wait_for_memory_to_clear
from accelplat._types import GIB, MIB, UsageSnapshot
from accelplat.errors import MemoryNotSettledError

TOTAL = 64 * GIB
EPS = 1e-6
SETTINGS = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=False,
)

levels = st.integers(min_value=0, max_value=TOTAL // MIB).map(lambda m: m * MIB)
gaps = st.floats(min_value=0.0, max_value=2.0, allow_nan=False, allow_infinity=False)


@st.composite
def monotone_devices(draw: st.DrawFn) -> SimulatedDevice:
    """A device whose usage never increases: a release in up to four pieces of any kind."""
    start_level = level = draw(levels)
    t = draw(gaps)
    segments: list[Segment] = []
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        to = draw(st.integers(min_value=0, max_value=level // MIB).map(lambda m: m * MIB))
        kind = draw(st.sampled_from(["step", "linear", "lazy"]))
        if kind == "step":
            segments.append(Step(at=t, used=to))
        elif kind == "linear":
            segments.append(Linear(start=t, end=t + draw(gaps), to=to))
        else:
            tau = draw(st.floats(min_value=0.01, max_value=1.0))
            delay = draw(st.floats(min_value=0.0, max_value=0.5))
            segments.append(LazyRelease(start=t, to=to, tau_s=tau, delay_s=delay))
        level = to
        t += draw(gaps)
    return SimulatedDevice(total=TOTAL, used=start_level, timeline=tuple(segments))


policies = st.builds(
    lambda initial, factor, extra: PollPolicy(initial, factor, initial + extra),
    st.floats(min_value=0.005, max_value=0.05),
    st.floats(min_value=1.0, max_value=3.0),
    st.floats(min_value=0.0, max_value=0.5),
)


@dataclass
class Scenario:
    device: SimulatedDevice
    target: int
    window: float
    tolerance: int
    timeout: float
    policy: PollPolicy


@st.composite
def scenarios(
    draw: st.DrawFn, devices: st.SearchStrategy[SimulatedDevice], *, tolerance: int | None = None
) -> Scenario:
    """A device, a target near its levels, and wait parameters; mostly non-trivial waits."""
    device = draw(devices)
    marks = [device.used] + [s.used if isinstance(s, Step) else s.to for s in device.timeline]
    near = st.sampled_from(marks).flatmap(
        lambda m: st.integers(min_value=max(0, m - 64 * MIB), max_value=min(TOTAL, m + 64 * MIB))
    )
    target = draw(st.one_of(levels, near))
    window = draw(st.floats(0.0, 3.0))
    timeout = draw(st.floats(0.2, 10.0))  # timeout_s=0 is covered by the unit tests
    if tolerance is None:
        tolerance = draw(st.sampled_from([0, 64 * MIB, 512 * MIB, 4 * GIB, TOTAL]))
    return Scenario(device, target, window, tolerance, timeout, draw(policies))


@dataclass
class Outcome:
    returned: bool
    at: float
    already_settled: bool
    samples: list[tuple[float, int]]


def run(sc: Scenario) -> tuple[Outcome, SimulatedClock]:
    device, target, window = sc.device, sc.target, sc.window
    tolerance, timeout, policy = sc.tolerance, sc.timeout, sc.policy
    clock = SimulatedClock()
    platform = SimulatedPlatform(SimulatedSpec(devices=(device,)), clock=clock)
    samples: list[tuple[float, int]] = []

    def on_poll(snap: UsageSnapshot, targets: Mapping[int, int]) -> None:
        samples.append((snap.timestamp, snap.memory[0].used))

    try:
        result = wait_for_memory_to_clear(
            threshold_bytes=target,
            stable_duration_s=window,
            stable_tolerance_bytes=tolerance,
            timeout_s=timeout,
            poll=policy,
            on_poll=on_poll,
            platform=platform,
        )
    except MemoryNotSettledError as exc:
        waited = exc.waited_s
        return Outcome(False, waited, False, samples), clock
    assert result.waited_s == clock.monotonic()
    assert result.polls == len(samples)
    return Outcome(True, result.waited_s, result.already_settled, samples), clock


def first_at_or_below(device: SimulatedDevice, target: int) -> float | None:
    """Earliest time usage is <= target on a non-increasing timeline (upper bracket)."""
    quiet = device.quiet_after() + EPS
    if device.used_at(quiet) > target:
        return None
    if device.used_at(0.0) <= target:
        return 0.0
    lo, hi = 0.0, quiet
    for _ in range(80):
        mid = (lo + hi) / 2
        if device.used_at(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


def check_common(
    outcome: Outcome, clock: SimulatedClock, timeout: float, policy: PollPolicy
) -> None:
    # the reported wait is the time that passed; sleeps are bounded by the poll cap and never
    # cross the deadline
    assert outcome.at == clock.monotonic()
    assert all(0 <= s <= policy.max_s + 1e-12 for s in clock.sleeps)
    assert clock.monotonic() <= timeout + 1e-9
    if not outcome.returned:
        assert timeout - 1e-9 <= outcome.at <= timeout + policy.max_s


@SETTINGS
@given(sc=scenarios(monotone_devices()))
def test_monotone_release_never_early_never_late(sc: Scenario) -> None:
    device, target, window, tolerance = sc.device, sc.target, sc.window, sc.tolerance
    timeout, policy = sc.timeout, sc.policy
    quiet = device.quiet_after()
    final = device.used_at(quiet + EPS)
    assert device.used_at(quiet + 1.0) == final  # the oracle's idea of "quiet" is right
    outcome, clock = run(sc)
    check_common(outcome, clock, timeout, policy)
    crossing = first_at_or_below(device, target)

    if outcome.returned:
        assert crossing is not None
        r = outcome.at
        if outcome.already_settled:
            assert r == 0.0
            assert window == 0.0
            assert device.used_at(0.0) <= target
        # never early: at/below target and within tolerance for the whole window
        assert r >= crossing + window - 1e-6
        start = max(0.0, r - window + 1e-9)
        points = [start + (r - start) * k / 64 for k in range(65)]
        points += [s.start for s in device.timeline if start <= s.start <= r]
        end_value = device.used_at(r)
        for t in points:
            value = device.used_at(t)
            assert value <= target
            assert value - end_value <= tolerance

    # never late: the earliest possible return is bounded; it must have returned by then
    if crossing is not None:
        bounds = [max(crossing, quiet) + window + policy.max_s]
        if tolerance >= TOTAL:
            bounds.append(crossing + window + policy.max_s)
        latest = min(bounds)
        if latest + EPS < timeout:
            assert outcome.returned
            assert outcome.at <= latest + EPS
    else:
        assert not outcome.returned


@SETTINGS
@given(sc=scenarios(monotone_devices(), tolerance=TOTAL))
def test_return_is_within_one_poll_cap_of_earliest_moment(sc: Scenario) -> None:
    device, target, window, timeout, policy = (
        sc.device,
        sc.target,
        sc.window,
        sc.timeout,
        sc.policy,
    )
    # with a tolerance covering any movement, only the target matters: the earliest moment is
    # exactly crossing + window, and the waiter must land within one poll cap after it
    outcome, clock = run(sc)
    check_common(outcome, clock, timeout, policy)
    crossing = first_at_or_below(device, target)
    if crossing is None:
        assert not outcome.returned
        return
    earliest = crossing + window
    if outcome.returned:
        if outcome.already_settled:
            assert earliest == 0.0
        assert earliest - 1e-6 <= outcome.at <= earliest + policy.max_s + EPS
    else:
        assert earliest + policy.max_s + EPS >= timeout


@st.composite
def wandering_devices(draw: st.DrawFn) -> SimulatedDevice:
    """Usage that goes up and down in steps."""
    t = 0.0
    steps: list[Segment] = []
    for _ in range(draw(st.integers(min_value=0, max_value=8))):
        t += draw(st.floats(min_value=0.0, max_value=1.5))
        steps.append(Step(at=t, used=draw(levels)))
    return SimulatedDevice(total=TOTAL, used=draw(levels), timeline=tuple(steps))


@SETTINGS
@given(sc=scenarios(wandering_devices()))
def test_what_the_waiter_saw_met_the_window(sc: Scenario) -> None:
    target, window, tolerance, timeout, policy = (
        sc.target,
        sc.window,
        sc.tolerance,
        sc.timeout,
        sc.policy,
    )
    outcome, clock = run(sc)
    check_common(outcome, clock, timeout, policy)
    samples = outcome.samples
    assert samples
    assert samples[0][0] == 0.0
    gaps_seen = [b[0] - a[0] for a, b in itertools.pairwise(samples)]
    assert all(g <= policy.max_s + 1e-9 for g in gaps_seen)
    if not outcome.returned:
        return
    r = outcome.at
    assert samples[-1][0] == r
    # some sample at or before r - window opened a window that every later sample respected
    opened = False
    for i, (t, base) in enumerate(samples):
        if t > r - window + 1e-9:
            break
        tail = [u for _, u in samples[i:]]
        if all(u <= target and abs(u - base) <= tolerance for u in tail):
            opened = True
            break
    assert opened

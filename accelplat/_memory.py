"""Device-memory primitives: usage statistics, snapshots, and waiting for memory to clear or settle.

Test suites start an engine, stop it, and start the next one. Between the two, device memory has
to come back: at once on eager platforms (CUDA frees a process's memory within a second of its
exit), seconds later on lazy ones (ROCm tears processes down from a kernel work queue, Level Zero
defers frees). The waits here are one algorithm for every platform; what differs is *data*, the
platform's :class:`~accelplat._types.ReleaseProfile` (lazy or not, stability window, default
timeout, idle floor).

The algorithm (:func:`wait_for_memory_to_clear`):

1. Sample every device once. When each meets its target and no stability window is asked for,
   return at once (``already_settled=True``).
2. Otherwise poll adaptively: sleep :attr:`PollPolicy.initial_s`, growing by
   :attr:`PollPolicy.factor` per quiet poll up to :attr:`PollPolicy.max_s`, and drop back to
   ``initial_s`` as soon as usage moves by more than the tolerance.
3. A stability window opens at the first sample where every device is at or below its target;
   it restarts whenever a device goes above its target or moves more than
   ``stable_tolerance_bytes`` away from where the window opened. The wait returns at the first
   sample taken ``stable_duration_s`` after the window opened; the sleep before that sample is
   shortened so that it lands exactly there.
4. No sleep runs past the deadline: the last sample is taken at the deadline, and if it does not
   complete the window, :class:`~accelplat.errors.MemoryNotSettledError` names each device that
   missed its target, how its usage moved, and which processes held the memory.

Every wait logs a start and an end event at DEBUG level on the ``accelplat._memory`` logger: a
record whose ``accelplat_wait`` attribute is ``{"event": "start", "id": <int>, "kind": "clear" or
"settle", "devices": [...]}``, then ``{"event": "end", "id": <same>, "ok": <bool>}``; timeline
recorders turn them into wait spans.

Every function here reads memory through ``Platform.memory_info`` only: on context-free platforms
(CUDA through NVML, ROCm through sysfs, CPU) nothing here creates a device context, takes device
memory, or imports a framework. Progress goes to ``on_poll`` callbacks and to the
``accelplat._memory`` logger; nothing is printed.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from accelplat._platform import Platform
from accelplat._types import GIB, MIB, MemoryInfo
from accelplat._usage import HolderState, MemoryHolder, SettleResult, UsageSnapshot
from accelplat._util import REAL_CLOCK, Clock
from accelplat._validate import byte_count, device_index, duration, finite_number, ratio
from accelplat.errors import (
    AccelplatError,
    ConfigurationError,
    MemoryNotSettledError,
)

__all__ = [
    "DEFAULT_STABLE_TOLERANCE_BYTES",
    "REAL_CLOCK",
    "Clock",
    "PollPolicy",
    "default_clock",
    "record_usage_stats",
    "snapshot",
    "wait_for_memory_to_clear",
    "wait_for_memory_to_settle",
]

logger = logging.getLogger("accelplat._memory")

DEFAULT_STABLE_TOLERANCE_BYTES = 512 * MIB
"""How far usage may move inside a stability window and still count as stable (vLLM's default)."""

_EVENT = "accelplat_wait"
"""Log-record attribute of the start and end events of every wait (for timeline recorders)."""

_EPSILON_S = 1e-9
"""Slack for comparisons of clock readings, so float rounding cannot cause zero-length sleeps."""

OnPoll = Callable[[UsageSnapshot, Mapping[int, int]], None]
"""Signature of ``on_poll`` callbacks: the sample just taken and the per-device targets."""


def default_clock(platform: object) -> Clock:
    """Return the clock waits on ``platform`` use when the caller passes none.

    Args:
        platform: Any platform object.

    Returns:
        The platform's ``clock`` attribute when it has one with ``monotonic()`` and ``sleep()``
        (the simulated platform does), else :data:`REAL_CLOCK`.
    """
    candidate = getattr(platform, "clock", None)
    if (
        candidate is not None
        and callable(getattr(candidate, "monotonic", None))
        and callable(getattr(candidate, "sleep", None))
    ):
        clock: Clock = candidate
        return clock
    return REAL_CLOCK


@dataclass(frozen=True)
class PollPolicy:
    """How often a wait samples device memory.

    Sampling is cheap on context-free backends (one NVML memory query takes 5-8 µs, a sysfs read
    tens of µs), so the cap is short: a release is seen at most ``max_s`` after it happened, and
    a wait returns at most ``max_s`` after the end of its stability window. The defaults poll at
    5, 7.5, 11, 17, 25, 38 and then every 40 ms: at most 25 samples a second, well under 1 % of
    one core on NVML, and a release is never noticed more than 40 ms late. A backend whose query
    is slow (a subprocess, a framework call) may deserve a longer ``max_s``.

    Attributes:
        initial_s: First sleep, and the sleep after usage moved by more than the tolerance.
        factor: Growth of the sleep after each poll where usage stayed put (``>= 1``; ``1`` polls
            at a fixed interval).
        max_s: Longest sleep between two samples (``>= initial_s``).

    Raises:
        ConfigurationError: On construction, for non-finite, non-positive or inconsistent values.
    """

    initial_s: float = 0.005
    factor: float = 1.5
    max_s: float = 0.04

    def __post_init__(self) -> None:
        initial = finite_number(self.initial_s, "PollPolicy.initial_s")
        factor = finite_number(self.factor, "PollPolicy.factor")
        maximum = finite_number(self.max_s, "PollPolicy.max_s")
        if initial <= 0:
            raise ConfigurationError(f"PollPolicy.initial_s must be > 0, got {self.initial_s!r}")
        if factor < 1:
            raise ConfigurationError(f"PollPolicy.factor must be >= 1, got {self.factor!r}")
        if maximum < initial:
            raise ConfigurationError(
                f"PollPolicy.max_s must be >= initial_s ({self.initial_s!r}), got {self.max_s!r}"
            )

    @classmethod
    def fixed(cls, interval_s: float) -> PollPolicy:
        """Return a policy that polls every ``interval_s`` seconds, never adapting.

        Args:
            interval_s: The interval, ``> 0``.

        Returns:
            ``PollPolicy(interval_s, 1.0, interval_s)``.
        """
        return cls(initial_s=interval_s, factor=1.0, max_s=interval_s)

    def next_interval(self, current_s: float, *, changed: bool) -> float:
        """Return the sleep that follows a sleep of ``current_s``.

        Args:
            current_s: The previous sleep.
            changed: Whether usage moved by more than the tolerance since the previous sample.

        Returns:
            ``initial_s`` when ``changed``, else ``current_s * factor`` capped at ``max_s``.
        """
        if changed:
            return self.initial_s
        return min(self.max_s, max(self.initial_s, current_s * self.factor))


# --------------------------------------------------------------------------------------------
# validation helpers


def _resolve_platform(platform: Platform | None) -> Platform:
    if platform is not None:
        return platform
    from accelplat._registry import current_platform

    return current_platform()


def _resolve_devices(devices: Sequence[int] | None, platform: Platform) -> list[int]:
    count = platform.device_count()
    if devices is None:
        return list(range(count))
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
        raise ConfigurationError(
            f"devices must be a sequence of visible device indices or None, got {devices!r}"
        )
    if len(devices) == 0:
        raise ConfigurationError(
            "devices must name at least one visible device (None means all of them)"
        )
    resolved: list[int] = []
    for item in devices:
        resolved.append(device_index(item, count, platform.name))
    duplicates = sorted({d for d in resolved if resolved.count(d) > 1})
    if duplicates:
        raise ConfigurationError(f"devices lists device(s) {duplicates} more than once")
    return resolved


def _per_device(
    value: object,
    devices: Sequence[int],
    argument: str,
    check: Callable[[object, str], float | int],
) -> dict[int, float | int] | None:
    """Expand a scalar or a per-device mapping into a dict over exactly ``devices``."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        keys = set(value)
        wanted = set(devices)
        if keys != wanted:
            missing = sorted(wanted - keys)
            extra = sorted(keys - wanted, key=repr)
            parts = []
            if missing:
                parts.append(f"missing {missing}")
            if extra:
                parts.append(f"not waited on {extra}")
            raise ConfigurationError(
                f"{argument} as a mapping must name exactly the devices waited on "
                f"{sorted(wanted)}: {'; '.join(parts)}"
            )
        return {d: check(value[d], f"{argument}[{d}]") for d in devices}
    checked = check(value, argument)
    return dict.fromkeys(devices, checked)


IDLE_FLOOR_MAX_RATIO = 0.05
"""Ratios below this are subject to the platform's idle floor; vLLM's test helper floors only
ratios below 5 % (tests/utils.py, ``wait_for_gpu_memory_to_clear``)."""


def _compute_targets(
    memory: Mapping[int, MemoryInfo],
    threshold_bytes: Mapping[int, float | int] | None,
    threshold_ratio: Mapping[int, float | int] | None,
    idle_floor: int,
) -> dict[int, int]:
    """Per device, the usage at or below which it counts as clear.

    With both thresholds the larger wins. A ratio below :data:`IDLE_FLOOR_MAX_RATIO` whose target
    falls below the platform's idle floor is raised to the floor (capped at the device's total),
    because an idle device never gets lower; larger ratios are taken as given, as in vLLM.
    """
    targets: dict[int, int] = {}
    for device, info in memory.items():
        candidates: list[int] = []
        if threshold_bytes is not None:
            candidates.append(int(threshold_bytes[device]))
        if threshold_ratio is not None:
            ratio = float(threshold_ratio[device])
            by_ratio = math.floor(ratio * info.total)
            if ratio < IDLE_FLOOR_MAX_RATIO and by_ratio < idle_floor:
                by_ratio = min(idle_floor, max(info.total, 0))
            candidates.append(by_ratio)
        targets[device] = max(candidates)
    return targets


# --------------------------------------------------------------------------------------------
# sampling


def _wall_time(clock: Clock) -> float:
    wall = getattr(clock, "time", None)
    if callable(wall):
        return float(wall())
    return time.time()


def _query_holders(
    platform: Platform, devices: Sequence[int]
) -> dict[int, tuple[MemoryHolder, ...]]:
    holders: dict[int, tuple[MemoryHolder, ...]] = {}
    for device in devices:
        try:
            found = platform.memory_holders(device)
        except AccelplatError as exc:  # holders are a diagnosis; never let them mask the result
            logger.debug("memory_holders(%d) failed on %s: %s", device, platform.name, exc)
            continue
        if found is not None:
            holders[device] = tuple(found)
    return holders


def _take_snapshot(
    platform: Platform, devices: Sequence[int], clock: Clock, *, holders: bool
) -> UsageSnapshot:
    memory = {d: platform.memory_info(d) for d in devices}
    stamp = clock.monotonic()
    wall = _wall_time(clock)
    held = _query_holders(platform, devices) if holders else {}
    return UsageSnapshot(timestamp=stamp, wall_time=wall, memory=memory, holders=held)


def snapshot(
    devices: Sequence[int] | None = None,
    *,
    platform: Platform | None = None,
    holders: bool = True,
) -> UsageSnapshot:
    """Sample memory of several devices together.

    Args:
        devices: Visible device indices; ``None`` means every visible device.
        platform: The platform to ask; ``None`` means :func:`~accelplat.current_platform`.
        holders: Also ask which processes hold memory, where the platform can tell (a device
            whose platform answers ``None`` is absent from :attr:`UsageSnapshot.holders`).

    Returns:
        A :class:`~accelplat._usage.UsageSnapshot`; its ``timestamp`` comes from the platform's
        clock (see :func:`default_clock`), ``wall_time`` from the wall clock.

    Raises:
        ConfigurationError: For an empty or malformed device list, or a duplicate index.
        DeviceNotFoundError: For an index that is not visible.

    Side effects:
        Reads memory through ``Platform.memory_info`` (and ``memory_holders``); creates no device
        context and imports no framework on context-free platforms.
    """
    plat = _resolve_platform(platform)
    resolved = _resolve_devices(devices, plat)
    return _take_snapshot(plat, resolved, default_clock(plat), holders=bool(holders))


def record_usage_stats(
    devices: Sequence[int] | None = None,
    *,
    platform: Platform | None = None,
) -> dict[int, tuple[float, float]]:
    """Return per visible device ``(used GiB, total GiB)``, the shape vLLM's test helpers use.

    Args:
        devices: Visible device indices; ``None`` means every visible device.
        platform: The platform to ask; ``None`` means :func:`~accelplat.current_platform`.

    Returns:
        ``{device: (used / 2**30, total / 2**30)}``.

    Raises:
        ConfigurationError: For an empty or malformed device list, or a duplicate index.
        DeviceNotFoundError: For an index that is not visible.

    Side effects:
        Reads memory through ``Platform.memory_info``; creates no device context and imports no
        framework on context-free platforms.
    """
    return snapshot(devices, platform=platform, holders=False).used_gib()


# --------------------------------------------------------------------------------------------
# waiting


@dataclass
class _History:
    first: int
    low: int
    high: int
    last: int

    def add(self, used: int) -> None:
        self.low = min(self.low, used)
        self.high = max(self.high, used)
        self.last = used

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.first, self.low, self.high, self.last)


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _describe_holder(holder: MemoryHolder) -> str:
    name = f" {holder.name!r}" if holder.name else ""
    held = _gib(holder.used_bytes) if holder.used_bytes is not None else "unknown bytes"
    return f"pid {holder.pid}{name} ({holder.state.value}) {held}"


def _timeout_message(
    *,
    platform_name: str,
    last: UsageSnapshot,
    targets: Mapping[int, int],
    history: Mapping[int, _History],
    waited_s: float,
    timeout_s: float,
    stable_duration_s: float,
    stable_tolerance_bytes: int,
    window_open_s: float | None,
) -> str:
    missed = [d for d in sorted(targets) if last.memory[d].used > targets[d]]
    if missed:
        head = (
            f"device memory did not clear within {waited_s:.2f} s (timeout_s={timeout_s:g}) on "
            f"{len(missed)} of {len(targets)} {platform_name} device(s):"
        )
        shown = missed
    else:
        lasted = 0.0 if window_open_s is None else window_open_s
        head = (
            f"device memory met its targets on {platform_name} but had not stayed there, within "
            f"{_gib(stable_tolerance_bytes)}, for stable_duration_s={stable_duration_s:g} when "
            f"the timeout passed ({waited_s:.2f} s, timeout_s={timeout_s:g}); the current stable "
            f"stretch had lasted {lasted:.2f} s:"
        )
        shown = sorted(targets)
    lines = [head]
    self_held = False
    for device in shown:
        info = last.memory[device]
        first, low, high, now = history[device].as_tuple()
        line = (
            f"  device {device}: used {_gib(info.used)}, target <= {_gib(targets[device])} "
            f"(total {_gib(info.total)}); during the wait first {first / GIB:.2f}, "
            f"min {low / GIB:.2f}, max {high / GIB:.2f}, last {now / GIB:.2f} GiB; "
        )
        held = last.holders.get(device)
        if held is None:
            line += "holders: unknown (the platform cannot tell)"
        elif not held:
            line += "holders: none listed by the driver"
        else:
            ordered = sorted(held, key=lambda h: -(h.used_bytes or 0))
            line += "held by " + ", ".join(_describe_holder(h) for h in ordered)
            self_held = self_held or any(h.state is HolderState.SELF for h in held)
        lines.append(line)
    if self_held:
        lines.append(
            "  hint: this process itself holds device memory; free it (delete the model, "
            "gc.collect(), empty the allocator cache) before waiting"
        )
    return "\n".join(lines)


def _wait(
    *,
    platform: Platform,
    devices: list[int],
    threshold_bytes: Mapping[int, float | int] | None,
    threshold_ratio: Mapping[int, float | int] | None,
    timeout_s: float,
    stable_duration_s: float,
    stable_tolerance_bytes: int,
    poll: PollPolicy,
    on_poll: OnPoll | None,
    clock: Clock,
    kind: str,
) -> SettleResult:
    """The one wait algorithm (see the module docstring); arguments are already validated."""
    what = f"wait_for_memory_to_{kind}"
    debug = logger.isEnabledFor(logging.DEBUG)
    start = clock.monotonic()
    deadline = start + timeout_s
    snap = _take_snapshot(platform, devices, clock, holders=False)
    polls = 1
    targets = _compute_targets(
        snap.memory, threshold_bytes, threshold_ratio, platform.release.idle_floor_bytes
    )
    if not devices:
        logger.debug("%s on %s: no visible device, nothing to wait for", what, platform.name)
        return SettleResult(0.0, polls, snap, True, targets)
    used = {d: snap.memory[d].used for d in devices}
    history = {d: _History(u, u, u, u) for d, u in used.items()}
    if debug:
        logger.debug(
            "%s on %s: devices %s, targets %s, timeout %.3g s, window %.3g s; now %s",
            what,
            platform.name,
            devices,
            {d: _gib(t) for d, t in targets.items()},
            timeout_s,
            stable_duration_s,
            snap.describe(),
        )
    if on_poll is not None:
        on_poll(snap, targets)

    def met(values: Mapping[int, int]) -> bool:
        return all(values[d] <= targets[d] for d in devices)

    if met(used) and stable_duration_s <= 0:
        waited = max(0.0, clock.monotonic() - start)
        logger.debug("%s: already settled", what)
        return SettleResult(waited, polls, snap, True, targets)

    window_start: float | None = snap.timestamp if met(used) else None
    window_base = dict(used)
    interval = poll.initial_s
    previous = dict(used)
    while True:
        if (
            window_start is not None
            and snap.timestamp - window_start >= stable_duration_s - _EPSILON_S
        ):
            waited = max(0.0, snap.timestamp - start)
            logger.debug("%s: settled after %.3f s and %d polls", what, waited, polls)
            return SettleResult(waited, polls, snap, False, targets)
        now = clock.monotonic()
        if now >= deadline - _EPSILON_S:
            break
        pause = min(interval, deadline - now)
        if window_start is not None:
            pause = min(pause, window_start + stable_duration_s - now)
        clock.sleep(max(0.0, pause))
        snap = _take_snapshot(platform, devices, clock, holders=False)
        polls += 1
        used = {d: snap.memory[d].used for d in devices}
        for d in devices:
            history[d].add(used[d])
        changed = any(abs(used[d] - previous[d]) > stable_tolerance_bytes for d in devices)
        previous = used
        interval = poll.next_interval(interval, changed=changed)
        if not met(used):
            window_start = None
        elif window_start is None or any(
            abs(used[d] - window_base[d]) > stable_tolerance_bytes for d in devices
        ):
            window_start = snap.timestamp
            window_base = dict(used)
        if debug:
            logger.debug(
                "%s: poll %d at %.3f s: %s (window %s, next sleep %.3f s)",
                what,
                polls,
                snap.timestamp - start,
                snap.describe(),
                "closed" if window_start is None else f"open {snap.timestamp - window_start:.3f} s",
                interval,
            )
        if on_poll is not None:
            on_poll(snap, targets)

    waited = max(0.0, now - start)
    final = dataclasses.replace(snap, holders=_query_holders(platform, devices))
    message = _timeout_message(
        platform_name=platform.name,
        last=final,
        targets=targets,
        history=history,
        waited_s=waited,
        timeout_s=timeout_s,
        stable_duration_s=stable_duration_s,
        stable_tolerance_bytes=stable_tolerance_bytes,
        window_open_s=None if window_start is None else snap.timestamp - window_start,
    )
    logger.debug("%s: timed out: %s", what, message)
    raise MemoryNotSettledError(
        message,
        snapshot=final,
        targets=targets,
        waited_s=waited,
        history={d: h.as_tuple() for d, h in history.items()},
    )


_wait_ids = itertools.count(1)


def _check_callable(value: object, argument: str) -> None:
    if value is not None and not callable(value):
        raise ConfigurationError(f"{argument} must be callable or None, got {value!r}")


def _check_poll(value: object) -> PollPolicy:
    if value is None:
        return PollPolicy()
    if not isinstance(value, PollPolicy):
        raise ConfigurationError(f"poll must be a PollPolicy or None, got {value!r}")
    return value


def _check_clock(value: object, platform: Platform) -> Clock:
    if value is None:
        return default_clock(platform)
    if not isinstance(value, Clock):
        raise ConfigurationError(
            f"clock must have monotonic() and sleep(seconds) methods, got {value!r}"
        )
    return value


class _WaitArguments(NamedTuple):
    """The arguments of a wait, validated, with the platform and devices resolved."""

    platform: Platform
    clock: Clock
    devices: list[int]
    threshold_bytes: dict[int, float | int] | None
    threshold_ratio: dict[int, float | int] | None
    timeout_s: float | None
    stable_duration_s: float | None
    stable_tolerance_bytes: int
    poll: PollPolicy


def _check_wait_arguments(
    devices: Sequence[int] | None,
    *,
    threshold_bytes: object = None,
    threshold_ratio: object = None,
    timeout_s: object = None,
    stable_duration_s: object = None,
    stable_tolerance_bytes: object = DEFAULT_STABLE_TOLERANCE_BYTES,
    poll: object = None,
    on_poll: object = None,
    platform: Platform | None = None,
    clock: object = None,
    kind: str = "clear",
) -> _WaitArguments:
    """Validate the arguments of a wait and resolve the platform and devices; sample nothing.

    Shared by the waits here and by helpers that must reject what a wait would reject even when
    they end up not waiting (``accelplat.integrations.vllm``).

    Raises:
        ConfigurationError: Naming the argument (see :func:`wait_for_memory_to_clear`).
        DeviceNotFoundError: For a device index that is not visible.
    """
    if threshold_bytes is None and threshold_ratio is None:
        raise ConfigurationError(
            f"wait_for_memory_to_{kind} needs threshold_bytes or threshold_ratio (or both)"
        )
    timeout = None if timeout_s is None else duration(timeout_s, "timeout_s")
    window = None if stable_duration_s is None else duration(stable_duration_s, "stable_duration_s")
    tolerance = byte_count(
        stable_tolerance_bytes, "stable_tolerance_bytes", not_a_number="a number of bytes"
    )
    policy = _check_poll(poll)
    _check_callable(on_poll, "on_poll")
    if not isinstance(threshold_bytes, Mapping) and threshold_bytes is not None:
        byte_count(threshold_bytes, "threshold_bytes")
    if not isinstance(threshold_ratio, Mapping) and threshold_ratio is not None:
        ratio(threshold_ratio, "threshold_ratio")

    plat = _resolve_platform(platform)
    chosen_clock = _check_clock(clock, plat)
    resolved = _resolve_devices(devices, plat)
    return _WaitArguments(
        platform=plat,
        clock=chosen_clock,
        devices=resolved,
        threshold_bytes=_per_device(threshold_bytes, resolved, "threshold_bytes", byte_count),
        threshold_ratio=_per_device(threshold_ratio, resolved, "threshold_ratio", ratio),
        timeout_s=timeout,
        stable_duration_s=window,
        stable_tolerance_bytes=tolerance,
        poll=policy,
    )


def _validated_wait(
    devices: Sequence[int] | None,
    *,
    threshold_bytes: int | Mapping[int, int] | None,
    threshold_ratio: float | Mapping[int, float] | None,
    timeout_s: float | None,
    stable_duration_s: float | None,
    stable_tolerance_bytes: int,
    poll: PollPolicy | None,
    on_poll: OnPoll | None,
    platform: Platform | None,
    clock: Clock | None,
    kind: str,
) -> SettleResult:
    """Validate the arguments of a wait, fill in the platform's defaults, and wait."""
    args = _check_wait_arguments(
        devices,
        threshold_bytes=threshold_bytes,
        threshold_ratio=threshold_ratio,
        timeout_s=timeout_s,
        stable_duration_s=stable_duration_s,
        stable_tolerance_bytes=stable_tolerance_bytes,
        poll=poll,
        on_poll=on_poll,
        platform=platform,
        clock=clock,
        kind=kind,
    )
    plat = args.platform
    profile = plat.release
    # Start and end events for timeline recorders: DEBUG records whose ``accelplat_wait``
    # attribute is {"event": "start", "id", "kind", "devices"} or {"event": "end", "id", "ok"}.
    wait_id = next(_wait_ids)
    begin = {"event": "start", "id": wait_id, "kind": kind, "devices": list(args.devices)}
    logger.debug("%s wait %d starts", kind, wait_id, extra={_EVENT: begin})
    ok = False
    try:
        result = _wait(
            platform=plat,
            devices=args.devices,
            threshold_bytes=args.threshold_bytes,
            threshold_ratio=args.threshold_ratio,
            timeout_s=profile.settle_timeout_s if args.timeout_s is None else args.timeout_s,
            stable_duration_s=(
                profile.stable_duration_s
                if args.stable_duration_s is None
                else args.stable_duration_s
            ),
            stable_tolerance_bytes=args.stable_tolerance_bytes,
            poll=args.poll,
            on_poll=on_poll,
            clock=args.clock,
            kind=kind,
        )
        ok = True
        return result
    finally:
        end = {"event": "end", "id": wait_id, "ok": ok}
        logger.debug("%s wait %d ends (ok=%s)", kind, wait_id, ok, extra={_EVENT: end})


def wait_for_memory_to_clear(
    devices: Sequence[int] | None = None,
    *,
    threshold_bytes: int | Mapping[int, int] | None = None,
    threshold_ratio: float | Mapping[int, float] | None = None,
    timeout_s: float | None = None,
    stable_duration_s: float | None = None,
    stable_tolerance_bytes: int = DEFAULT_STABLE_TOLERANCE_BYTES,
    poll: PollPolicy | None = None,
    on_poll: OnPoll | None = None,
    platform: Platform | None = None,
    clock: Clock | None = None,
) -> SettleResult:
    """Wait until used memory of every device is at or below its target, and stays there.

    A device's target is ``threshold_bytes``, or ``threshold_ratio × total``, or with both the
    larger of the two. A ratio below 5 % whose target is below the platform's
    ``release.idle_floor_bytes`` is raised to that floor (capped at the device's total), as vLLM
    does: a lazily-releasing platform keeps some memory
    resident at idle, and a target below it could never be met. Byte targets are taken as given.

    Args:
        devices: Visible device indices; ``None`` means every visible device (with none visible,
            the wait returns at once).
        threshold_bytes: Used bytes at or below which a device is clear; an int for every device
            or a mapping naming exactly the devices waited on. Compared as a float, so a value
            too large for one (``10**400``) is refused rather than read as "always clear".
        threshold_ratio: Fraction of each device's total, in ``[0, 1]``; a float or a mapping
            naming exactly the devices waited on.
        timeout_s: Give up after this many seconds; ``None`` means the platform's
            ``release.settle_timeout_s``. ``0`` samples once.
        stable_duration_s: How long every device must stay at or below its target, and within
            ``stable_tolerance_bytes`` of where that stretch began; ``None`` means the platform's
            ``release.stable_duration_s``.
        stable_tolerance_bytes: Movement that still counts as stable, and the movement after
            which polling speeds up again.
        poll: Polling intervals; ``None`` means :class:`PollPolicy()`.
        on_poll: Called after every sample, the first included, with the sample and the targets.
            Exceptions it raises propagate.
        platform: The platform to ask; ``None`` means :func:`~accelplat.current_platform`.
        clock: Time source and sleeper; ``None`` means :func:`default_clock` of the platform.

    Returns:
        A :class:`~accelplat._usage.SettleResult`; ``already_settled`` is ``True`` when the first
        sample met every target and no window was required.

    Raises:
        ConfigurationError: Naming the argument, for a missing threshold, a ratio outside
            ``[0, 1]``, negative bytes, a negative or non-finite duration, a number too large for
            a float, a ``bool`` where a number belongs, an empty device list, or a mapping whose
            keys are not the devices.
        DeviceNotFoundError: For a device index that is not visible.
        MemoryNotSettledError: When the timeout passes first; its message names each device that
            missed its target, how its usage moved, and the processes holding the memory.

    Side effects:
        Sleeps on ``clock``; logs to the ``accelplat._memory`` logger at DEBUG level. Reads memory
        through ``Platform.memory_info`` only: creates no device context, takes no device memory
        and imports no framework on context-free platforms.
    """
    return _validated_wait(
        devices,
        threshold_bytes=threshold_bytes,
        threshold_ratio=threshold_ratio,
        timeout_s=timeout_s,
        stable_duration_s=stable_duration_s,
        stable_tolerance_bytes=stable_tolerance_bytes,
        poll=poll,
        on_poll=on_poll,
        platform=platform,
        clock=clock,
        kind="clear",
    )


def wait_for_memory_to_settle(
    *,
    threshold_ratio: float | Mapping[int, float] | None = 0.1,
    timeout_s: float | None = None,
    devices: Sequence[int] | None = None,
    force: bool = False,
    platform: Platform | None = None,
    clock: Clock | None = None,
    poll: PollPolicy | None = None,
    on_poll: OnPoll | None = None,
) -> SettleResult:
    """Wait until memory freed by a previous engine has come back, as the platform releases it.

    What happens depends on the platform's release profile, read as data:

    * lazy platforms (``release.lazy``; ROCm, XPU): wait until every device is at or below
      ``threshold_ratio`` of its total and has stayed there for ``release.stable_duration_s``;
    * eager platforms (CUDA, CPU): sample once and return at once (``already_settled=True``) when
      every device is already below the threshold. When one is not, memory is usually still on
      its way back from a process that is exiting (NVML shows a normal exit as free 0.4-0.9 s
      later), so wait for the threshold without a stability window, up to the timeout, and raise
      :class:`~accelplat.errors.MemoryNotSettledError` naming the holders if it never comes.
    * ``force=True`` treats every platform as lazy (the profile's window applies everywhere).

    This differs from vLLM's helper, which returns without looking on eager platforms: a device
    that is still full there is reported instead of surfacing later as an engine start failure.

    Args:
        threshold_ratio: Fraction of each device's total, in ``[0, 1]``, or a mapping naming
            exactly the devices waited on. A value below the platform's idle floor is raised to it.
        timeout_s: Give up after this many seconds; ``None`` means ``release.settle_timeout_s``.
        devices: Visible device indices; ``None`` means every visible device.
        force: Apply the stability window even on an eager platform.
        platform: The platform to ask; ``None`` means :func:`~accelplat.current_platform`.
        clock: Time source and sleeper; ``None`` means :func:`default_clock` of the platform.
        poll: Polling intervals; ``None`` means :class:`PollPolicy()`.
        on_poll: Called after every sample with the sample and the targets.

    Returns:
        A :class:`~accelplat._usage.SettleResult`.

    Raises:
        ConfigurationError: For ``threshold_ratio=None``, a bad ratio, timeout or device list.
        DeviceNotFoundError: For a device index that is not visible.
        MemoryNotSettledError: When the timeout passes first.

    Side effects:
        As :func:`wait_for_memory_to_clear`: creates no device context, imports no framework.
    """
    if threshold_ratio is None:
        raise ConfigurationError(
            "wait_for_memory_to_settle needs threshold_ratio (a fraction in [0, 1]); "
            "use wait_for_memory_to_clear for a byte threshold"
        )
    if not isinstance(force, bool):
        raise ConfigurationError(f"force must be True or False, got {force!r}")
    plat = _resolve_platform(platform)
    profile = plat.release
    window = profile.stable_duration_s if (profile.lazy or force) else 0.0
    return _validated_wait(
        devices,
        threshold_bytes=None,
        threshold_ratio=threshold_ratio,
        timeout_s=timeout_s,
        stable_duration_s=window,
        stable_tolerance_bytes=DEFAULT_STABLE_TOLERANCE_BYTES,
        poll=poll,
        on_poll=on_poll,
        platform=plat,
        clock=clock,
        kind="settle",
    )

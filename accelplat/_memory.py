"""Device-memory primitives: usage statistics, snapshots, and waiting for memory to clear or settle.

One wait algorithm for every platform (:func:`_wait`, described in ``docs/memory.md``, as are the
start and end events each wait logs); what differs is data, the platform's ``ReleaseProfile``.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from accelplat._owners import OwnedReading, ReleaseReading, attribute
from accelplat._platform import Platform, optional
from accelplat._types import (
    GIB,
    MIB,
    HolderState,
    MemoryHolder,
    MemoryInfo,
    SettleResult,
    UsageSnapshot,
)
from accelplat._util import REAL_CLOCK, Clock
from accelplat._validate import (
    byte_count,
    device_index,
    duration,
    finite_number,
    integer,
    number,
    ratio,
)
from accelplat._vendor import procs
from accelplat.errors import AccelplatError, ConfigurationError, MemoryNotSettledError

logger = logging.getLogger("accelplat._memory")

DEFAULT_STABLE_TOLERANCE_BYTES = 512 * MIB  # movement a stability window tolerates (vLLM's)
IDLE_FLOOR_MAX_RATIO = 0.05  # vLLM floors only ratios under 5 % (tests/utils.py)

_EVENT = "accelplat_wait"
_EPSILON_S = 1e-9  # slack for comparing clock readings: float rounding makes no 0-length sleeps
_MAX_STALLS = 1000  # sleeps in a row after which a clock that never moves on ends the wait

OnPoll = Callable[[UsageSnapshot, Mapping[int, int]], None]  # (sample, per-device targets)
Reader = Callable[[int], MemoryInfo]  # reads one visible device (platform.memory_info)


def default_clock(platform: object) -> Clock:
    """Return the platform's ``clock`` when it is a :class:`~accelplat._util.Clock`, else real."""
    candidate = optional(platform, "clock")
    return candidate if isinstance(candidate, Clock) else REAL_CLOCK


@dataclass(frozen=True)
class PollPolicy:
    """How often a wait samples device memory: 5, 7.5, 11, 17, 25, 38, then every 40 ms by default.

    Attributes:
        initial_s: First sleep, and the sleep after usage moved by more than the tolerance.
        factor: Growth of the sleep after each poll where usage stayed put (``>= 1``).
        max_s: Longest sleep between two samples (``>= initial_s``).

    Raises:
        ConfigurationError: On construction, for non-finite, non-positive or inconsistent values.
    """

    # a release is noticed at most 40 ms late, at under 1 % of a core on NVML (5-8 µs a query)
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
        """Return a policy that polls every ``interval_s`` seconds, never adapting."""
        return cls(initial_s=interval_s, factor=1.0, max_s=interval_s)

    def next_interval(self, current_s: float, *, changed: bool) -> float:
        """Return ``initial_s`` if usage ``changed``, else ``current_s × factor`` to ``max_s``."""
        if changed:
            return self.initial_s
        return min(self.max_s, max(self.initial_s, current_s * self.factor))


def _resolve_platform(platform: Platform | None) -> Platform:
    if platform is None:
        from accelplat._registry import current_platform

        return current_platform()
    if isinstance(platform, type) or not isinstance(platform, Platform):
        raise ConfigurationError(f"platform must be a Platform or None, got {platform!r:.200}")
    return platform


def _resolve_devices(devices: Sequence[int] | None, platform: Platform) -> list[int]:
    count = platform.device_count()
    if devices is None:
        return list(range(count))
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
        raise ConfigurationError(
            f"devices must be a sequence of visible device indices or None, got {devices!r:.200}"
        )
    if len(devices) == 0:
        raise ConfigurationError("devices must name at least one visible device (None: all)")
    resolved = [device_index(item, count, platform.name) for item in devices]
    duplicates = sorted(d for d, n in Counter(resolved).items() if n > 1)
    if duplicates:
        raise ConfigurationError(f"devices lists device(s) {duplicates} more than once")
    return resolved


def _check_reader(read: object, platform: Platform) -> Reader:
    if read is None:
        return platform.memory_info
    if not callable(read):
        raise ConfigurationError(f"read must be callable or None, got {read!r:.200}")

    def checked(device: int) -> MemoryInfo:
        info = read(device)
        if not isinstance(info, MemoryInfo):
            raise ConfigurationError(
                f"read({device}) must return a MemoryInfo, got {type(info).__name__}"
            )
        return info

    return checked


def _per_device(
    value: object, devices: Sequence[int], argument: str, check: Callable[[object, str], float]
) -> dict[int, float] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        return dict.fromkeys(devices, check(value, argument))
    keys, wanted = set(value), set(devices)
    if keys != wanted:
        parts = []
        if missing := sorted(wanted - keys):
            parts.append(f"missing {missing}")
        if extra := sorted(keys - wanted, key=repr):
            parts.append(f"not waited on {extra[:10]}" + (" …" if len(extra) > 10 else ""))
        raise ConfigurationError(
            f"{argument} as a mapping must name exactly the devices waited on "
            f"{sorted(wanted)}: {'; '.join(parts)}"
        )
    return {d: check(value[d], f"{argument}[{d}]") for d in devices}


@dataclass(frozen=True)
class _Wait:
    """A wait's arguments, validated, with the platform, devices and defaults resolved."""

    kind: str
    platform: Platform
    read: Reader
    clock: Clock
    devices: list[int]
    threshold_bytes: Mapping[int, float] | None
    threshold_ratio: Mapping[int, float] | None
    timeout_s: float
    stable_duration_s: float
    stable_tolerance_bytes: int
    poll: PollPolicy
    on_poll: OnPoll | None


def _check_wait(
    kind: str,
    *,
    devices: Sequence[int] | None,
    threshold_ratio: object,
    timeout_s: object,
    stable_duration_s: object,
    poll: object,
    on_poll: object,
    platform: Platform | None,
    clock: object,
    threshold_bytes: object = None,
    stable_tolerance_bytes: object = DEFAULT_STABLE_TOLERANCE_BYTES,
    read: object = None,
) -> _Wait:
    """Validate a public wait's own parameters (sampling nothing); fill in the defaults."""
    if threshold_bytes is None and threshold_ratio is None:
        raise ConfigurationError(
            f"wait_for_memory_to_{kind} needs threshold_bytes or threshold_ratio (or both)"
        )
    timeout = None if timeout_s is None else duration(timeout_s, "timeout_s")
    window = None if stable_duration_s is None else duration(stable_duration_s, "stable_duration_s")
    tolerance = byte_count(stable_tolerance_bytes, "stable_tolerance_bytes")
    if poll is not None and not isinstance(poll, PollPolicy):
        raise ConfigurationError(f"poll must be a PollPolicy or None, got {poll!r:.200}")
    if on_poll is not None and not callable(on_poll):
        raise ConfigurationError(f"on_poll must be callable or None, got {on_poll!r:.200}")
    plat = _resolve_platform(platform)
    if clock is not None and not isinstance(clock, Clock):
        raise ConfigurationError(
            f"clock must have monotonic() and sleep(seconds) methods, got {clock!r:.200}"
        )
    resolved = _resolve_devices(devices, plat)
    profile = plat.release
    return _Wait(
        kind=kind,
        platform=plat,
        read=_check_reader(read, plat),
        clock=default_clock(plat) if clock is None else clock,
        devices=resolved,
        threshold_bytes=_per_device(threshold_bytes, resolved, "threshold_bytes", byte_count),
        threshold_ratio=_per_device(threshold_ratio, resolved, "threshold_ratio", ratio),
        timeout_s=profile.settle_timeout_s if timeout is None else timeout,
        stable_duration_s=profile.stable_duration_s if window is None else window,
        stable_tolerance_bytes=tolerance,
        poll=PollPolicy() if poll is None else poll,
        on_poll=cast("OnPoll | None", on_poll),
    )


def _compute_targets(
    w: _Wait, memory: Mapping[int, MemoryInfo]
) -> tuple[dict[int, int], dict[int, int]]:
    """Per device, the usage at or below which it counts as clear, and those the floor raised."""
    floor = w.platform.release.idle_floor_bytes
    targets: dict[int, int] = {}
    raised: dict[int, int] = {}
    for device, info in memory.items():
        asked: list[int] = []
        if w.threshold_bytes is not None:
            asked.append(int(w.threshold_bytes[device]))
        floored = -1
        if w.threshold_ratio is not None:
            fraction = w.threshold_ratio[device]
            by_ratio = math.floor(fraction * info.total)
            asked.append(by_ratio)
            if fraction < IDLE_FLOOR_MAX_RATIO and by_ratio < floor:
                floored = min(floor, max(info.total, 0))
        targets[device] = max(*asked, floored)
        if floored > max(asked):
            raised[device] = floored
    return targets, raised


def _now(clock: Clock) -> float:
    """Read ``clock.monotonic()``: a reading that is no finite number would stall the wait."""
    return number(clock.monotonic(), "clock.monotonic()")


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


def _sample(read: Reader, devices: Sequence[int], clock: Clock) -> UsageSnapshot:
    memory = {d: read(d) for d in devices}
    timestamp = _now(clock)
    wall = getattr(clock, "time", None)  # the simulated clock has a virtual wall time
    wall_time = number(wall(), "clock.time()") if callable(wall) else time.time()
    return UsageSnapshot(timestamp=timestamp, wall_time=wall_time, memory=memory)


def snapshot(
    devices: Sequence[int] | None = None,
    *,
    platform: Platform | None = None,
    holders: bool = True,
    read: Reader | None = None,
) -> UsageSnapshot:
    """Sample memory of several devices together, timed by :func:`default_clock`.

    ``devices``, ``platform`` and ``read`` are :func:`wait_for_memory_to_clear`'s; ``holders``
    also asks which processes hold memory and whose it is (``attribution``: this process, its
    descendants, others; or why that cannot be told).

    Raises:
        ConfigurationError: For a malformed device list or ``read``; ``DeviceNotFoundError``.
    """
    plat = _resolve_platform(platform)
    reader = _check_reader(read, plat)
    resolved = _resolve_devices(devices, plat)
    snap = _sample(reader, resolved, default_clock(plat))
    if holders:
        if optional(plat, "is_accelerator"):
            procs.descendants()  # remember this process's children before one of them exits
        found = _query_holders(plat, resolved)
        owners = {
            d: attribute(plat, d, snap.memory[d].used, found.get(d), reason=None) for d in resolved
        }
        return dataclasses.replace(snap, holders=found, attribution=owners)
    return snap


def record_usage_stats(
    devices: Sequence[int] | None = None, *, platform: Platform | None = None
) -> dict[int, tuple[float, float]]:
    """Return ``{device: (used GiB, total GiB)}`` (vLLM's helpers' shape); as :func:`snapshot`."""
    return snapshot(devices, platform=platform, holders=False).used_gib()


_History = tuple[int, int, int, int]  # first, min, max, last used bytes during a wait


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _describe_holder(holder: MemoryHolder) -> str:
    name = f" {holder.name!r}" if holder.name else ""
    held = _gib(holder.used_bytes) if holder.used_bytes is not None else "unknown bytes"
    return f"pid {holder.pid}{name} ({holder.state.value}) {held}"


def _timeout_message(
    w: _Wait,
    last: UsageSnapshot,
    targets: Mapping[int, int],
    history: Mapping[int, _History],
    *,
    waited_s: float,
    window_open_s: float | None,
) -> str:
    name = w.platform.name
    missed = [d for d in sorted(targets) if last.memory[d].used > targets[d]]
    if missed:
        head = (
            f"device memory did not clear within {waited_s:.2f} s (timeout_s={w.timeout_s:g}) on "
            f"{len(missed)} of {len(targets)} {name} device(s):"
        )
        shown = missed
    else:
        lasted = 0.0 if window_open_s is None else window_open_s
        head = (
            f"device memory met its targets on {name} but had not stayed there, within "
            f"{_gib(w.stable_tolerance_bytes)}, for stable_duration_s={w.stable_duration_s:g} "
            f"when the timeout passed ({waited_s:.2f} s, timeout_s={w.timeout_s:g}); the current "
            f"stable stretch had lasted {lasted:.2f} s:"
        )
        shown = sorted(targets)
    lines = [head]
    self_held = False
    for device in shown:
        info = last.memory[device]
        first, low, high, now = history[device]
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


def _wait(w: _Wait) -> SettleResult:
    """The one wait algorithm (see docs/memory.md, "The algorithm"); ``w`` is validated."""
    what = f"wait_for_memory_to_{w.kind}"
    devices, clock, poll, tolerance = w.devices, w.clock, w.poll, w.stable_tolerance_bytes
    debug = logger.isEnabledFor(logging.DEBUG)  # the f-strings below format only when shown
    start = _now(clock)
    deadline = start + w.timeout_s
    snap = _sample(w.read, devices, clock)
    polls = 1
    targets, raised = _compute_targets(w, snap.memory)
    if not devices:
        logger.debug("%s on %s: no visible device, nothing to wait for", what, w.platform.name)
        return SettleResult(0.0, polls, snap, True, targets, raised)
    used = {d: snap.memory[d].used for d in devices}
    history: dict[int, _History] = {d: (u, u, u, u) for d, u in used.items()}
    if debug:
        shown = {d: _gib(t) for d, t in targets.items()}
        logger.debug(
            f"{what} on {w.platform.name}: devices {devices}, targets {shown}, timeout "
            f"{w.timeout_s:.3g} s, window {w.stable_duration_s:.3g} s; now {snap.describe()}"
        )
    if w.on_poll is not None:
        w.on_poll(snap, targets)

    def met(values: Mapping[int, int]) -> bool:
        return all(values[d] <= targets[d] for d in devices)

    if met(used) and w.stable_duration_s <= 0:
        waited = max(0.0, _now(clock) - start)
        logger.debug("%s: already settled", what)
        return SettleResult(waited, polls, snap, True, targets, raised)

    window_start: float | None = snap.timestamp if met(used) else None
    window_base, previous = dict(used), dict(used)
    interval, stalls = poll.initial_s, 0
    while True:
        if (
            window_start is not None
            and snap.timestamp - window_start >= w.stable_duration_s - _EPSILON_S
        ):
            waited = max(0.0, snap.timestamp - start)
            logger.debug("%s: settled after %.3f s and %d polls", what, waited, polls)
            return SettleResult(waited, polls, snap, False, targets, raised)
        now = _now(clock)
        if now >= deadline - _EPSILON_S:
            break
        pause = min(interval, deadline - now)
        if window_start is not None:
            pause = min(pause, window_start + w.stable_duration_s - now)
        clock.sleep(max(0.0, pause))
        snap = _sample(w.read, devices, clock)
        polls += 1
        stalls = stalls + 1 if snap.timestamp <= now else 0
        if stalls >= _MAX_STALLS:
            raise ConfigurationError(
                f"clock {clock!r:.200} did not move on in {stalls} sleeps: its sleep() must "
                "advance monotonic(), or the wait never ends"
            )
        used = {d: snap.memory[d].used for d in devices}
        for d, (first, low, high, _) in history.items():
            history[d] = (first, min(low, used[d]), max(high, used[d]), used[d])
        changed = any(abs(used[d] - previous[d]) > tolerance for d in devices)
        previous = used
        interval = poll.next_interval(interval, changed=changed)
        if not met(used):
            window_start = None
        elif window_start is None or any(
            abs(used[d] - window_base[d]) > tolerance for d in devices
        ):
            window_start = snap.timestamp
            window_base = dict(used)
        if debug:
            window = (
                "closed" if window_start is None else f"open {snap.timestamp - window_start:.3f}"
            )
            logger.debug(
                f"{what}: poll {polls} at {snap.timestamp - start:.3f} s: {snap.describe()} "
                f"(window {window}, next sleep {interval:.3f} s)"
            )
        if w.on_poll is not None:
            w.on_poll(snap, targets)

    waited = max(0.0, now - start)
    final = dataclasses.replace(snap, holders=_query_holders(w.platform, devices))
    opened = None if window_start is None else snap.timestamp - window_start
    message = _timeout_message(w, final, targets, history, waited_s=waited, window_open_s=opened)
    logger.debug("%s: timed out: %s", what, message)
    raise MemoryNotSettledError(
        message,
        snapshot=final,
        targets=targets,
        waited_s=waited,
        history=history,
        raised_targets=raised,
    )


_wait_ids = itertools.count(1)


def _run(w: _Wait) -> SettleResult:
    """Run :func:`_wait` between a start and an end event for timeline recorders."""
    wait_id = next(_wait_ids)
    begin = {"event": "start", "id": wait_id, "kind": w.kind, "devices": list(w.devices)}
    logger.debug("%s wait %d starts", w.kind, wait_id, extra={_EVENT: begin})
    ok = False
    try:
        result = _wait(w)
        ok = True
    finally:
        end = {"event": "end", "id": wait_id, "ok": ok}
        logger.debug("%s wait %d ends (ok=%s)", w.kind, wait_id, ok, extra={_EVENT: end})
    return result


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
    read: Reader | None = None,
) -> SettleResult:
    """Wait until used memory of every device is at or below its target, and stays there.

    A target is ``threshold_bytes``, ``threshold_ratio × total`` or the larger of the two; a ratio
    under 5 % is raised to the platform's idle floor (docs/memory.md, "Targets").

    Args:
        devices: Visible device indices; ``None``: every visible one (none visible: no wait).
        threshold_bytes: Used bytes at or below which a device is clear; an int or a mapping.
        threshold_ratio: Fraction of each device's total, in ``[0, 1]``; a float or a mapping.
        timeout_s: Give up after this many seconds (``0`` samples once); ``None``: the profile's.
        stable_duration_s: How long devices must stay at or below target; ``None``: the profile's.
        stable_tolerance_bytes: Movement that still counts as stable (and speeds polling up).
        poll: Polling intervals; ``None``: :class:`PollPolicy()`.
        on_poll: Called with each sample, the first included, and the targets; errors propagate.
        platform: The platform to ask; ``None``: :func:`~accelplat.current_platform`.
        clock: Time source and sleeper; ``None``: :func:`default_clock` of the platform.
        read: How to read one device's memory; ``None``: ``platform.memory_info``.

    Raises:
        ConfigurationError: Naming a malformed argument, or for a clock that never moves on.
        DeviceNotFoundError: For a device index that is not visible.
        MemoryNotSettledError: On timeout, naming the devices that missed, their usage, holders.
    """
    return _run(_check_wait("clear", **locals()))  # every parameter, by name


OWNERS = ("ours", "all")


def wait_for_memory_to_settle(
    *,
    threshold_ratio: float | Mapping[int, float] | None = 0.1,
    timeout_s: float | None = None,
    devices: Sequence[int] | None = None,
    force: bool = False,
    owners: str = "ours",
    platform: Platform | None = None,
    clock: Clock | None = None,
    poll: PollPolicy | None = None,
    on_poll: OnPoll | None = None,
) -> SettleResult:
    """Wait until memory freed by a previous engine has come back, as the platform releases it.

    On lazy platforms (or with ``force=True``) the memory judged must stay at or below
    ``threshold_ratio`` (not ``None``) of each device's total for the profile's window; on eager
    ones without a window. ``owners="ours"`` (the default) judges only the memory of this
    process and its descendants, alive or exited and still listed, where the driver attributes
    memory per process; co-tenants' memory is not waited for but named in the result's ``note``
    (and in the error). A device without attribution (the host CPU, a pid namespace, no process
    list) is judged whole, the reason in ``note``. ``owners="all"`` judges whole devices.
    ``on_poll`` sees the bytes judged as ``used`` (ours, where attributed); the result's
    ``snapshot`` is the real last sample. The rest is :func:`wait_for_memory_to_clear`'s.

    Raises:
        ConfigurationError: For a malformed argument; ``owners`` not ``"ours"`` or ``"all"``.
        MemoryNotSettledError: On timeout, naming whose memory was held.
    """
    if threshold_ratio is None:
        raise ConfigurationError(
            "wait_for_memory_to_settle needs threshold_ratio (a fraction in [0, 1]); "
            "use wait_for_memory_to_clear for a byte threshold"
        )
    if not isinstance(force, bool):
        raise ConfigurationError(f"force must be True or False, got {force!r:.200}")
    if owners not in OWNERS:
        raise ConfigurationError(f"owners must be 'ours' or 'all', got {owners!r:.200}")
    plat = _resolve_platform(platform)
    profile = plat.release
    reading = OwnedReading(plat, _resolve_devices(devices, plat)) if owners == "ours" else None
    w = _check_wait(
        "settle",
        devices=devices,
        threshold_ratio=threshold_ratio,
        timeout_s=timeout_s,
        stable_duration_s=profile.stable_duration_s if (profile.lazy or force) else 0.0,
        poll=poll,
        on_poll=on_poll,
        platform=plat,
        clock=clock,
        read=reading,
    )
    if reading is None:
        return _run(w)
    try:
        result = _run(w)
    except MemoryNotSettledError as exc:
        raise _owned_timeout(exc, reading, w, "this process and its descendants held") from None
    note = reading.others_note()
    if note:
        logger.info("wait_for_memory_to_settle: %s", note)
    return dataclasses.replace(
        result, snapshot=reading.real(result.snapshot), owners="ours", note=note
    )


def _explained(
    exc: MemoryNotSettledError, real: UsageSnapshot, lines: list[str]
) -> MemoryNotSettledError:
    """``exc`` with the owner-aware message ``lines`` and the real snapshot."""
    return MemoryNotSettledError(
        "\n".join(lines),
        snapshot=real,
        targets=exc.targets,
        waited_s=exc.waited_s,
        history=exc.history,
        raised_targets=exc.raised_targets,
    )


def _owned_timeout(
    exc: MemoryNotSettledError, reading: OwnedReading, w: _Wait, what: str
) -> MemoryNotSettledError:
    """The timeout of a wait on owners, its message in owners' terms (holders named)."""
    real = reading.real(exc.snapshot)
    lines = [
        f"device memory that {what} did not come back within {exc.waited_s:.2f} s "
        f"(timeout_s={w.timeout_s:g}) on {w.platform.name}:"
    ]
    for device in sorted(exc.targets):
        info = real.memory[device]
        owned = exc.snapshot.memory[device].used
        target = _gib(exc.targets[device])
        attribution = real.attribution.get(device)
        if device in reading.fallback or attribution is None or not attribution.available:
            why = reading.fallback.get(device) or (attribution.reason if attribution else "")
            held = real.holders.get(device)
            names = ", ".join(_describe_holder(h) for h in held) if held else "unknown"
            lines.append(
                f"  device {device} (judged whole: {why}): used {_gib(info.used)}, "
                f"target <= {target}; holders: {names}"
            )
            continue
        shown = [h for h in real.holders.get(device, ()) if h.state is HolderState.SELF]
        shown += list(attribution.children)
        ours = ", ".join(_describe_holder(h) for h in shown) or "none listed"
        others = ", ".join(_describe_holder(h) for h in attribution.others) or "none"
        lines.append(
            f"  device {device}: ours {_gib(owned)}, target <= {target} (used {_gib(info.used)} "
            f"of {_gib(info.total)}); ours: {ours}; others, not waited for: {others}"
        )
    return _explained(exc, real, lines)


FALLBACK_RELEASE_WINDOW_S = 1.0  # unattributed: the used counter must stop moving this long


def wait_for_release(
    pids: Sequence[int],
    *,
    timeout_s: float | None = None,
    descendants: bool = True,
    devices: Sequence[int] | None = None,
    poll: PollPolicy | None = None,
    platform: Platform | None = None,
    clock: Clock | None = None,
) -> SettleResult:
    """Wait until the processes ``pids`` hold no device memory, or are gone.

    Where the driver attributes memory per process (NVML, KFD, Level Zero Sysman), the wait
    ends at the first sample in which the driver lists none of them (a process that exited but
    is still listed is still holding); on a lazy platform a process the driver stopped listing
    counts until the device's used memory has fallen by what it held, so a release is never
    called done before the counter moved. A device without attribution is judged whole: the
    processes must have exited, then its used memory must stay within the stability tolerance
    for 1 s (or the platform's longer window); the result's ``note`` says so. Polls as every
    wait does (:class:`PollPolicy`): at most 40 ms late by default.

    Args:
        pids: Process ids (as this process sees them), at least one.
        timeout_s: Give up after this many seconds; ``None``: the platform's settle timeout.
        descendants: Also wait for the processes' descendants, as they are at the call.
        devices: Visible device indices; ``None``: every visible one.
        poll: Polling intervals; ``None``: :class:`PollPolicy()`.
        platform: The platform to ask; ``None``: :func:`~accelplat.current_platform`.
        clock: Time source and sleeper; ``None``: :func:`default_clock` of the platform.

    Returns:
        A :class:`SettleResult` whose ``snapshot`` is the last real sample, with owners.

    Raises:
        ConfigurationError: For malformed arguments.
        DeviceNotFoundError: For a device index that is not visible.
        MemoryNotSettledError: On timeout, naming the processes that still held memory.
    """
    if isinstance(pids, (str, bytes)) or not isinstance(pids, Sequence) or not pids:
        raise ConfigurationError(
            f"pids must be a non-empty sequence of process ids, got {pids!r:.200}"
        )
    checked = frozenset(
        integer(p, f"pids[{i}]", minimum=1, maximum=2**31 - 1) for i, p in enumerate(pids)
    )
    if not isinstance(descendants, bool):
        raise ConfigurationError(f"descendants must be True or False, got {descendants!r:.200}")
    tracked = set(checked)
    if descendants:
        for pid in checked:
            tracked |= procs.descendants(pid)
    plat = _resolve_platform(platform)
    resolved = _resolve_devices(devices, plat)
    reading = ReleaseReading(plat, resolved, frozenset(tracked), lazy=plat.release.lazy)
    window = 0.0
    thresholds: dict[int, int] = dict.fromkeys(resolved, 0)
    if reading.fallback:
        window = max(FALLBACK_RELEASE_WINDOW_S, plat.release.stable_duration_s)
        for device in reading.fallback:
            thresholds[device] = max(0, plat.memory_info(device).total)
    w = _check_wait(
        "release",
        devices=resolved,
        threshold_bytes=thresholds,
        threshold_ratio=None,
        timeout_s=timeout_s,
        stable_duration_s=window,
        poll=poll,
        on_poll=None,
        platform=plat,
        clock=clock,
        read=reading,
    )
    try:
        result = _run(w)
    except MemoryNotSettledError as exc:
        raise _release_timeout(exc, reading, w) from None
    fell = [f"device {d} judged whole: {why}" for d, why in sorted(reading.fallback.items())]
    return dataclasses.replace(
        result, snapshot=reading.real(result.snapshot), owners="ours", note="; ".join(fell)
    )


def _release_timeout(
    exc: MemoryNotSettledError, reading: ReleaseReading, w: _Wait
) -> MemoryNotSettledError:
    real = reading.real(exc.snapshot)
    shown = ", ".join(str(p) for p in sorted(reading.pids)[:20])
    lines = [
        f"processes {shown} did not release device memory within {exc.waited_s:.2f} s "
        f"(timeout_s={w.timeout_s:g}) on {w.platform.name}:"
    ]
    for device, held in sorted(reading.still_holding().items()):
        awaited = reading.pending.get(device, (0, 0))[0]
        if held:
            lines.append(
                f"  device {device}: still listed: " + ", ".join(_describe_holder(h) for h in held)
            )
        elif awaited:
            lines.append(
                f"  device {device}: no longer listed, but the device's used memory has not "
                f"fallen by the {_gib(awaited)} they held (lazy release)"
            )
    for device, why in sorted(reading.fallback.items()):
        alive = ", ".join(str(p) for p in sorted(reading.running)) or "none"
        lines.append(
            f"  device {device} (judged whole: {why}): still running: {alive}; used "
            f"{_gib(real.memory[device].used)}"
        )
    return _explained(exc, real, lines)

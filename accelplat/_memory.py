"""Device-memory waits: one algorithm over readings, many judges of what counts.

Each wait takes readings from the one sampler (:func:`accelplat._owners.sample`) and gives them
to its :class:`Judge`, which says which bytes of each device count: the device's used bytes
(clear), this process's and its descendants' (settle on ours), what given processes still hold
(release), what a test is blamed for (the leak check). :meth:`Wait.run` is the one algorithm
(docs/memory.md, "The algorithm", and the start and end events each wait logs); what differs
between platforms is data, the platform's ``ReleaseProfile``.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from accelplat._owners import BYTES_UNREPORTED, Reader, default_clock, gib, running, sample
from accelplat._platform import Platform
from accelplat._types import GIB, MIB, HolderState, MemoryHolder, MemoryInfo, SettleResult
from accelplat._types import UsageSnapshot as Reading
from accelplat._util import Clock
from accelplat._validate import byte_count, device_index, duration, flag, integer, number, ratio
from accelplat._vendor import procs
from accelplat.errors import ConfigurationError, MemoryNotSettledError

logger = logging.getLogger("accelplat._memory")

DEFAULT_STABLE_TOLERANCE_BYTES = 512 * MIB  # movement a stability window tolerates (vLLM's)
IDLE_FLOOR_MAX_RATIO = 0.05  # vLLM floors only ratios under 5 % (tests/utils.py)
FALLBACK_RELEASE_WINDOW_S = 1.0  # unattributed: the used counter must stop moving this long

_EVENT = "accelplat_wait"
_EPSILON_S = 1e-9  # slack for comparing clock readings: float rounding makes no 0-length sleeps
_MAX_STALLS = 1000  # sleeps in a row after which a clock that never moves on ends the wait

OnPoll = Callable[[Reading, Mapping[int, int]], None]  # (reading, per-device targets)
_History = tuple[int, int, int, int]  # first, min, max, last bytes counted during a wait


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
        initial = number(self.initial_s, "PollPolicy.initial_s", above=0)
        number(self.factor, "PollPolicy.factor", minimum=1)
        if number(self.max_s, "PollPolicy.max_s") < initial:
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


def _holders(held: Sequence[MemoryHolder] | None) -> str:
    """Name ``held``, the largest first: ``pid 7 'python' (alive) 8.00 GiB, …``."""
    return ", ".join(
        f"pid {h.pid}{f' {h.name!r}' if h.name else ''} ({h.state.value}) "
        + (gib(h.used_bytes) if h.used_bytes is not None else "unknown bytes")
        for h in sorted(held or (), key=lambda h: -(h.used_bytes or 0))
    )


class Judge:
    """The device-wide judge: a device's used bytes count (:func:`wait_for_memory_to_clear`).

    A judge is called once per reading, in order, and may keep state between readings.
    ``holders``: its readings must carry holders and owners; ``ready``: ``False`` holds every
    device back whatever it counts (a process that must exit first).
    """

    owners: ClassVar[str] = "all"
    holders: ClassVar[bool] = False
    ready = True

    def __call__(self, reading: Reading) -> dict[int, int]:
        """Return the bytes of each device of ``reading`` that count against its target."""
        return {d: m.used for d, m in reading.memory.items()}

    def note(self, reading: Reading) -> str:
        """Return what the result's ``note`` says after ``reading``, the last; ``""``: nothing."""
        return ""

    def describe(self, w: Wait, last: Reading, history: Mapping[int, _History]) -> str:
        """Return the timeout's message: the devices that missed, how usage moved, who held it."""
        missed = [d for d in sorted(w.targets) if w.counts[d] > w.targets[d]]
        if missed:
            head = (
                f"device memory did not clear within {w.waited_s:.2f} s (timeout_s="
                f"{w.timeout_s:g}) on {len(missed)} of {len(w.targets)} {w.platform.name} "
                "device(s):"
            )
        else:
            head = (
                f"device memory met its targets on {w.platform.name} but had not stayed there, "
                f"within {gib(w.tolerance)}, for stable_duration_s={w.window_s:g} when the "
                f"timeout passed ({w.waited_s:.2f} s, timeout_s={w.timeout_s:g}); the current "
                f"stable stretch had lasted {w.open_s:.2f} s:"
            )
        lines = [head]
        for device in missed or sorted(w.targets):
            info, held = last.memory[device], last.holders.get(device)
            first, low, high, now = history[device]
            named = f"held by {_holders(held)}" if held else "holders: none listed by the driver"
            lines.append(
                f"  device {device}: used {gib(info.used)}, target <= {gib(w.targets[device])} "
                f"(total {gib(info.total)}); during the wait first {first / GIB:.2f}, "
                f"min {low / GIB:.2f}, max {high / GIB:.2f}, last {now / GIB:.2f} GiB; "
                + ("holders: unknown (the platform cannot tell)" if held is None else named)
            )
        if any(h.state is HolderState.SELF for d in missed for h in last.holders.get(d, ())):
            lines.append(
                "  hint: this process itself holds device memory; free it (delete the model, "
                "gc.collect(), empty the allocator cache) before waiting"
            )
        return "\n".join(lines)


class _Ours(Judge):
    """This process's and its descendants' bytes where attributed, else the device's used."""

    owners = "ours"
    holders = True

    def __call__(self, reading: Reading) -> dict[int, int]:
        return {
            d: m.used if (ours := reading.attribution[d].ours_bytes) is None else ours
            for d, m in reading.memory.items()
        }

    def note(self, reading: Reading) -> str:
        """Name the co-tenants' memory not waited for, and the devices judged whole."""
        owners = sorted(reading.attribution.items())
        parts = [
            f"not waited for, device {d}: {a.describe()}"
            for d, a in owners
            if a.available and a.others
        ]
        parts += [f"device {d} judged whole: {a.reason}" for d, a in owners if not a.available]
        return "; ".join(parts)

    def describe(self, w: Wait, last: Reading, history: Mapping[int, _History]) -> str:
        """Name, per device, our holders and the others not waited for."""
        lines = [
            f"device memory that this process and its descendants held did not come back within "
            f"{w.waited_s:.2f} s (timeout_s={w.timeout_s:g}) on {w.platform.name}:"
        ]
        for device in sorted(w.targets):
            info, owners = last.memory[device], last.attribution[device]
            held = last.holders.get(device)
            target = f"target <= {gib(w.targets[device])}"
            if not owners.available:
                lines.append(
                    f"  device {device} (judged whole: {owners.reason}): used {gib(info.used)}, "
                    f"{target}; holders: {_holders(held) or 'unknown'}"
                )
                continue
            ours = [h for h in held or () if h.state is HolderState.SELF] + [*owners.children]
            lines.append(
                f"  device {device}: ours {gib(w.counts[device])}, {target} (used "
                f"{gib(info.used)} of {gib(info.total)}); ours: "
                f"{_holders(ours) or 'none listed'}; others, not waited for: "
                f"{_holders(owners.others) or 'none'}"
            )
        return "\n".join(lines)


_PENDING_SLACK = 64 * MIB  # a lazily freed holder's bytes count back within this (or a tenth)


class _Released(Judge):
    """What the processes ``pids`` still hold, per device; devices judged whole where not told.

    Attributed devices count the bytes the driver lists for them (one byte for a listing without
    bytes), and on a lazy platform also those of a holder the driver stopped listing until the
    device's used counter has fallen by them (``pending``): KFD removes a process's files before
    TTM frees its buffers, so the list moves before the counter. Devices without attribution at
    the ``first`` reading count their used bytes, held back while a process still runs.
    """

    owners = "ours"
    holders = True

    def __init__(self, pids: frozenset[int], first: Reading, *, lazy: bool) -> None:
        self.pids, self.lazy = pids, lazy
        self.whole = {  # a list without bytes still names the holders: a wait on them holds
            d: a.reason
            for d, a in first.attribution.items()
            if a.reason and a.reason != BYTES_UNREPORTED.format(device=d)
        }
        self.listed = {d: self._listed(first, d) for d in first.memory}
        self.used_before = {d: m.used for d, m in first.memory.items()}
        self.pending: dict[int, tuple[int, int]] = {}  # device: (bytes awaited, used before)
        self.running = frozenset(filter(running, pids)) if self.whole else frozenset()

    def _listed(self, reading: Reading, device: int) -> dict[int, int]:
        held = reading.holders.get(device, ())
        return {
            h.pid: 1 if h.used_bytes is None else h.used_bytes for h in held if h.pid in self.pids
        }

    def __call__(self, reading: Reading) -> dict[int, int]:
        if self.whole:  # the tracked processes that still run hold these devices back
            self.running = frozenset(filter(running, self.pids))
            self.ready = not self.running
        return {
            d: m.used if d in self.whole else self._held(reading, d)
            for d, m in reading.memory.items()
        }

    def _held(self, reading: Reading, device: int) -> int:
        now, before = self._listed(reading, device), self.listed[device]
        used = reading.memory[device].used
        if self.lazy:
            vanished = sum(b for p, b in before.items() if p not in now)
            awaited, used_before = self.pending.get(device, (0, used))
            if vanished:
                awaited += vanished
                used_before = max(used_before, self.used_before.get(device, used))
            if awaited and used_before - used >= awaited - min(awaited // 10, _PENDING_SLACK):
                awaited = 0
            self.pending[device] = (awaited, used_before if awaited else used)
        self.listed[device], self.used_before[device] = now, used
        return sum(now.values()) + self.pending.get(device, (0, 0))[0]

    def note(self, reading: Reading) -> str:
        """Name the devices judged whole."""
        return "; ".join(f"device {d} judged whole: {why}" for d, why in sorted(self.whole.items()))

    def describe(self, w: Wait, last: Reading, history: Mapping[int, _History]) -> str:
        """Name the processes still listed, the bytes still awaited, the ones still running."""
        shown = ", ".join(str(p) for p in sorted(self.pids)[:20])
        lines = [
            f"processes {shown} did not release device memory within {w.waited_s:.2f} s "
            f"(timeout_s={w.timeout_s:g}) on {w.platform.name}:"
        ]
        for device in sorted(set(last.memory) - set(self.whole)):
            if held := [h for h in last.holders.get(device, ()) if h.pid in self.pids]:
                lines.append(f"  device {device}: still listed: {_holders(held)}")
            elif awaited := self.pending.get(device, (0, 0))[0]:
                lines.append(
                    f"  device {device}: no longer listed, but the device's used memory has not "
                    f"fallen by the {gib(awaited)} they held (lazy release)"
                )
        alive = ", ".join(str(p) for p in sorted(self.running)) or "none"
        lines += [
            f"  device {device} (judged whole: {why}): still running: {alive}; used "
            f"{gib(last.memory[device].used)}"
            for device, why in sorted(self.whole.items())
        ]
        return "\n".join(lines)


def resolve_platform(platform: Platform | None) -> Platform:
    """``platform``, checked; ``None``: the current one. ConfigurationError for a non-platform."""
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
    if duplicates := sorted(d for d, n in Counter(resolved).items() if n > 1):
        raise ConfigurationError(f"devices lists device(s) {duplicates} more than once")
    return resolved


def _check_reader(read: object) -> Reader | None:
    if read is None:
        return None
    if not callable(read):
        raise ConfigurationError(f"read must be callable or None, got {read!r:.200}")

    def checked(device: int) -> MemoryInfo:
        if not isinstance(info := read(device), MemoryInfo):
            raise ConfigurationError(
                f"read({device}) must return a MemoryInfo, got {type(info).__name__}"
            )
        return info

    return checked


def _per_device(
    value: object, devices: Sequence[int], argument: str, check: Callable[[object, str], float]
) -> dict[int, float] | None:
    if value is None or not isinstance(value, Mapping):
        return None if value is None else dict.fromkeys(devices, check(value, argument))
    keys, wanted = set(value), set(devices)
    if keys != wanted:
        parts = [f"missing {missing}"] if (missing := sorted(wanted - keys)) else []
        if extra := sorted(keys - wanted, key=repr):
            parts.append(f"not waited on {extra[:10]}" + (" …" if len(extra) > 10 else ""))
        raise ConfigurationError(
            f"{argument} as a mapping must name exactly the devices waited on "
            f"{sorted(wanted)}: {'; '.join(parts)}"
        )
    return {d: check(value[d], f"{argument}[{d}]") for d in devices}


def _now(clock: Clock) -> float:
    """Read ``clock.monotonic()``: a reading that is no finite number would stall the wait."""
    return number(clock.monotonic(), "clock.monotonic()")


_wait_ids = itertools.count(1)


class Wait:
    """One wait on ``devices``: the platform, devices, clock and reader resolved, nothing sampled.

    :meth:`run` waits, by the one algorithm, until every device's count (as ``judge`` says) is at
    or below its target and stays there.

    Raises:
        ConfigurationError: Naming a malformed argument; ``DeviceNotFoundError``.
    """

    def __init__(
        self,
        kind: str,
        judge: Judge,
        platform: Platform | None,
        devices: Sequence[int] | None,
        *,
        clock: object = None,
        read: object = None,
    ) -> None:
        self.platform = plat = resolve_platform(platform)
        if clock is not None and not isinstance(clock, Clock):
            raise ConfigurationError(
                f"clock must have monotonic() and sleep(seconds) methods, got {clock!r:.200}"
            )
        self.devices = _resolve_devices(devices, plat)
        self.kind, self.judge, reader = kind, judge, _check_reader(read)
        self.clock = default_clock(plat) if clock is None else clock
        self._sample = functools.partial(sample, plat, self.devices, read=reader, clock=self.clock)
        self.targets: dict[int, int] = {}  # per device, the count at or below which it is clear
        self.raised: dict[int, int] = {}  # the targets the idle floor raised
        self.counts: dict[int, int] = {}  # the last reading's, as the judge counted it
        self.waited_s = self.open_s = 0.0

    def sample(self, *, holders: bool = False, first: bool = False) -> Reading:
        """Take one reading of the devices, with holders where the judge needs them."""
        # remember: the process table walked once, at the first reading
        return self._sample(holders=holders or self.judge.holders, remember=first)

    def _set_targets(self, memory: Mapping[int, MemoryInfo]) -> None:
        floor = self.platform.release.idle_floor_bytes
        for device, info in memory.items():
            by_bytes = -1 if self.by_bytes is None else int(self.by_bytes[device])
            by_ratio = floored = -1
            if self.by_ratio is not None:
                by_ratio = math.floor(self.by_ratio[device] * info.total)
                if self.by_ratio[device] < IDLE_FLOOR_MAX_RATIO and by_ratio < floor:
                    floored = min(floor, max(info.total, 0))
            self.targets[device] = max(by_bytes, by_ratio, floored)
            if floored > max(by_bytes, by_ratio):
                self.raised[device] = floored

    def run(
        self,
        threshold_bytes: object = None,
        threshold_ratio: object = None,
        *,
        timeout_s: object = None,
        stable_duration_s: object = None,
        stable_tolerance_bytes: object = DEFAULT_STABLE_TOLERANCE_BYTES,
        poll: object = None,
        on_poll: object = None,
    ) -> SettleResult:
        """Check the wait's own arguments, then wait (docs/memory.md, "The algorithm").

        ``None`` takes the profile's default; the wait logs a start and an end event.

        Raises:
            ConfigurationError: Naming a malformed argument, for a clock that never moves on, or
                a reader that reads no memory.
            MemoryNotSettledError: On timeout, as the judge describes it.
        """
        if threshold_bytes is None and threshold_ratio is None:
            raise ConfigurationError(
                f"wait_for_memory_to_{self.kind} needs threshold_bytes or threshold_ratio (or both)"
            )
        profile = self.platform.release
        timeout = profile.settle_timeout_s if timeout_s is None else timeout_s
        window = profile.stable_duration_s if stable_duration_s is None else stable_duration_s
        self.timeout_s = duration(timeout, "timeout_s")
        self.window_s = duration(window, "stable_duration_s")
        self.tolerance = byte_count(stable_tolerance_bytes, "stable_tolerance_bytes")
        if poll is not None and not isinstance(poll, PollPolicy):
            raise ConfigurationError(f"poll must be a PollPolicy or None, got {poll!r:.200}")
        if on_poll is not None and not callable(on_poll):
            raise ConfigurationError(f"on_poll must be callable or None, got {on_poll!r:.200}")
        self.poll, self.on_poll = PollPolicy() if poll is None else poll, on_poll
        self.by_bytes = _per_device(threshold_bytes, self.devices, "threshold_bytes", byte_count)
        self.by_ratio = _per_device(threshold_ratio, self.devices, "threshold_ratio", ratio)
        wait_id, ok = next(_wait_ids), False
        begin = {"event": "start", "id": wait_id, "kind": self.kind, "devices": list(self.devices)}
        logger.debug("%s wait %d starts", self.kind, wait_id, extra={_EVENT: begin})
        try:
            result = self._wait()
            ok = True
        finally:
            end = {"event": "end", "id": wait_id, "ok": ok}
            logger.debug("%s wait %d ends (ok=%s)", self.kind, wait_id, ok, extra={_EVENT: end})
        return result

    def _wait(self) -> SettleResult:
        what, judge, devices, clock = f"{self.kind} wait", self.judge, self.devices, self.clock
        start = _now(clock)
        reading = self.sample(first=True)
        counts, polls = judge(reading), 1
        self._set_targets(reading.memory)
        targets, tolerance = self.targets, self.tolerance
        history: dict[int, _History] = {d: (c, c, c, c) for d, c in counts.items()}
        logger.debug("%s: targets %s, window %s s", what, targets, self.window_s)
        if self.on_poll is not None:
            self.on_poll(reading, targets)

        def met(values: Mapping[int, int]) -> bool:
            return judge.ready and all(values[d] <= targets[d] for d in devices)

        def result(waited: float, settled: bool) -> SettleResult:
            if note := judge.note(reading):
                logger.info("%s: %s", what, note)
            return SettleResult(
                waited, polls, reading, settled, targets, self.raised, judge.owners, note
            )

        if not devices or (met(counts) and self.window_s <= 0):
            logger.debug("%s: already settled", what)
            return result(max(0.0, _now(clock) - start) if devices else 0.0, True)
        opened: float | None = reading.timestamp if met(counts) else None
        base, previous, interval, stalls = counts, counts, self.poll.initial_s, 0
        while True:
            if opened is not None and reading.timestamp - opened >= self.window_s - _EPSILON_S:
                logger.debug("%s: settled after %d polls", what, polls)
                return result(max(0.0, reading.timestamp - start), False)
            now = _now(clock)
            if now >= start + self.timeout_s - _EPSILON_S:
                break
            pause = min(interval, start + self.timeout_s - now)
            clock.sleep(
                max(0.0, pause if opened is None else min(pause, opened + self.window_s - now))
            )
            reading = self.sample()
            counts, polls = judge(reading), polls + 1
            stalls = stalls + 1 if reading.timestamp <= now else 0
            if stalls >= _MAX_STALLS:
                raise ConfigurationError(
                    f"clock {clock!r:.200} did not move on in {stalls} sleeps: its sleep() must "
                    "advance monotonic(), or the wait never ends"
                )
            for d, (first, low, high, _) in history.items():
                history[d] = (first, min(low, counts[d]), max(high, counts[d]), counts[d])
            moved = any(abs(counts[d] - previous[d]) > tolerance for d in devices)
            interval, previous = self.poll.next_interval(interval, changed=moved), counts
            if not met(counts):
                opened = None
            elif opened is None or any(abs(counts[d] - base[d]) > tolerance for d in devices):
                opened, base = reading.timestamp, counts
            logger.debug("%s: poll %d, window opened at %s", what, polls, opened)
            if self.on_poll is not None:
                self.on_poll(reading, targets)
        if not judge.holders:  # who holds the memory, named once, at the timeout
            named = self.sample(holders=True)
            reading = replace(reading, holders=named.holders, attribution=named.attribution)
        self.counts, self.waited_s = counts, max(0.0, now - start)
        self.open_s = 0.0 if opened is None else reading.timestamp - opened
        message = judge.describe(self, reading, history)
        logger.debug("%s: timed out: %s", what, message)
        raise MemoryNotSettledError(
            message,
            snapshot=reading,
            targets=targets,
            waited_s=self.waited_s,
            history=history,
            raised_targets=self.raised,
        )


def snapshot(
    devices: Sequence[int] | None = None,
    *,
    platform: Platform | None = None,
    holders: bool = True,
    read: Reader | None = None,
) -> Reading:
    """Sample memory of several devices together, timed by :func:`default_clock`.

    ``devices``, ``platform`` and ``read`` are :func:`wait_for_memory_to_clear`'s; ``holders``
    also asks which processes hold memory and whose it is (``attribution``: this process, its
    descendants, others; or why that cannot be told).

    Raises:
        ConfigurationError: For a malformed device list or ``read``; ``DeviceNotFoundError``.
    """
    plat, reader = resolve_platform(platform), _check_reader(read)
    return sample(plat, _resolve_devices(devices, plat), read=reader, holders=holders)


def record_usage_stats(
    devices: Sequence[int] | None = None, *, platform: Platform | None = None
) -> dict[int, tuple[float, float]]:
    """Return ``{device: (used GiB, total GiB)}`` (vLLM's helpers' shape); as :func:`snapshot`."""
    return snapshot(devices, platform=platform, holders=False).used_gib()


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
        on_poll: Called with each reading, the first included, and the targets; errors propagate.
        platform: The platform to ask; ``None``: :func:`~accelplat.current_platform`.
        clock: Time source and sleeper; ``None``: :func:`default_clock` of the platform.
        read: How to read one device's memory; ``None``: ``platform.memory_info``.

    Raises:
        ConfigurationError: Naming a malformed argument, or for a clock that never moves on.
        DeviceNotFoundError: For a device index that is not visible.
        MemoryNotSettledError: On timeout, naming the devices that missed, their usage, holders.
    """
    w = Wait("clear", Judge(), platform, devices, clock=clock, read=read)
    return w.run(
        threshold_bytes,
        threshold_ratio,
        timeout_s=timeout_s,
        stable_duration_s=stable_duration_s,
        stable_tolerance_bytes=stable_tolerance_bytes,
        poll=poll,
        on_poll=on_poll,
    )


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
    ``on_poll`` sees each reading (its ``attribution`` says whose memory it is) and the targets.
    The rest is :func:`wait_for_memory_to_clear`'s.

    Raises:
        ConfigurationError: For a malformed argument; ``owners`` not ``"ours"`` or ``"all"``.
        MemoryNotSettledError: On timeout, naming whose memory was held.
    """
    if threshold_ratio is None:
        raise ConfigurationError(
            "wait_for_memory_to_settle needs threshold_ratio (a fraction in [0, 1]); "
            "use wait_for_memory_to_clear for a byte threshold"
        )
    flag(force, "force")
    if owners not in ("ours", "all"):
        raise ConfigurationError(f"owners must be 'ours' or 'all', got {owners!r:.200}")
    w = Wait("settle", _Ours() if owners == "ours" else Judge(), platform, devices, clock=clock)
    profile = w.platform.release
    window = profile.stable_duration_s if (profile.lazy or force) else 0.0
    return w.run(
        None,
        threshold_ratio,
        timeout_s=timeout_s,
        stable_duration_s=window,
        poll=poll,
        on_poll=on_poll,
    )


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
        A :class:`SettleResult` whose ``snapshot`` is the last reading, with owners.

    Raises:
        ConfigurationError: For malformed arguments.
        DeviceNotFoundError: For a device index that is not visible.
        MemoryNotSettledError: On timeout, naming the processes that still held memory.
    """
    if isinstance(pids, (str, bytes)) or not isinstance(pids, Sequence) or not pids:
        raise ConfigurationError(
            f"pids must be a non-empty sequence of process ids, got {pids!r:.200}"
        )
    tracked = {integer(p, f"pids[{i}]", minimum=1, maximum=2**31 - 1) for i, p in enumerate(pids)}
    for pid in list(tracked) if flag(descendants, "descendants") else ():
        tracked |= procs.descendants(pid)
    w = Wait("release", Judge(), platform, devices, clock=clock)
    first = sample(w.platform, w.devices)  # decides which devices are judged whole
    w.judge = judge = _Released(frozenset(tracked), first, lazy=w.platform.release.lazy)
    targets = {d: max(0, first.memory[d].total) if d in judge.whole else 0 for d in w.devices}
    window = max(FALLBACK_RELEASE_WINDOW_S, w.platform.release.stable_duration_s)
    return w.run(
        targets, timeout_s=timeout_s, stable_duration_s=window if judge.whole else 0, poll=poll
    )

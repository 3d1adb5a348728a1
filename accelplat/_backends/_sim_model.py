"""The simulated platform's model: timeline segments, holders, devices and the spec.

With their limits and value checks (each value is checked when its object is built).

Imports no framework; touches no device.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field
from typing import Literal

from accelplat import _validate
from accelplat._platform import StartMethod
from accelplat._types import MIB, GraphSupport, ReleaseProfile
from accelplat._usage import HolderState, MemoryHolder
from accelplat.errors import ConfigurationError

__all__ = []

MAX_SPEC_BYTES = 1 * MIB
"""Largest spec file accepted."""

MAX_DEVICES = 256
"""Most devices a spec may declare (after ``count`` replication)."""

MAX_SEGMENTS = 10_000
"""Most timeline segments per device."""

MAX_HOLDERS = 1_000
"""Most holders per device."""

MAX_DEVICE_BYTES = 2**50
"""Largest size accepted anywhere in a spec (1 PiB)."""

MAX_TIME_S = 1e9
"""Largest time or duration accepted in a spec (about 31 years)."""

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
MAX_TEXT = 256


# --------------------------------------------------------------------------------------------
# timeline segments


@dataclass(frozen=True)
class Step:
    """From ``at`` on, the device uses ``used`` bytes.

    Attributes:
        at: Seconds since the platform started.
        used: Bytes in use from then on.
    """

    at: float
    used: int

    @property
    def start(self) -> float:
        """When the segment takes over (``at``)."""
        return self.at

    def value(self, t: float, before: int) -> int:
        """Return usage at ``t >= start``."""
        return self.used

    def quiet_after(self) -> float:
        """Return the time after which this segment no longer changes usage."""
        return self.at


@dataclass(frozen=True)
class Linear:
    """A linear release (or growth) from ``from_`` at ``start`` to ``to`` at ``end``.

    Attributes:
        start: Seconds since the platform started.
        end: When ``to`` is reached (``>= start``); usage stays at ``to`` afterwards.
        to: Bytes in use at ``end``.
        from_: Bytes in use at ``start``; ``None`` means the usage just before ``start``.
    """

    start: float
    end: float
    to: int
    from_: int | None = None

    def value(self, t: float, before: int) -> int:
        """Return usage at ``t >= start``; ``before`` is the usage just before ``start``."""
        origin = before if self.from_ is None else self.from_
        if t >= self.end or self.end <= self.start:
            return self.to
        fraction = (t - self.start) / (self.end - self.start)
        return round(origin + (self.to - origin) * fraction)

    def quiet_after(self) -> float:
        """Return ``end``."""
        return self.end


@dataclass(frozen=True)
class LazyRelease:
    """A lazy release: usage holds for ``delay_s``, then decays exponentially towards ``to``.

    Usage at ``t`` is ``to + trunc((from - to) * exp(-(t - start - delay_s) / tau_s))``, truncated
    to whole multiples of ``granularity`` bytes, so the tail reaches ``to`` exactly, at
    ``start + delay_s + tau_s * ln(|from - to| / granularity)``.

    Attributes:
        start: Seconds since the platform started.
        to: Bytes in use once the release is complete.
        tau_s: Time constant of the exponential, ``> 0``.
        from_: Bytes in use at ``start``; ``None`` means the usage just before ``start``.
        delay_s: Seconds before the release begins (deferred teardown).
        granularity: Size of the chunks memory returns in, ``>= 1`` byte.
    """

    start: float
    to: int
    tau_s: float
    from_: int | None = None
    delay_s: float = 0.0
    granularity: int = MIB

    def value(self, t: float, before: int) -> int:
        """Return usage at ``t >= start``; ``before`` is the usage just before ``start``."""
        origin = before if self.from_ is None else self.from_
        elapsed = t - self.start - self.delay_s
        if elapsed <= 0:
            return origin
        remaining = (origin - self.to) * math.exp(-elapsed / self.tau_s)
        chunks = int(remaining / self.granularity)
        return self.to + chunks * self.granularity

    def quiet_after(self, before: int | None = None) -> float:
        """Return the time from which usage equals ``to``.

        Args:
            before: Usage just before ``start``, needed when ``from_`` is ``None``.
        """
        origin = self.from_ if self.from_ is not None else before
        begin = self.start + self.delay_s
        if origin is None:
            return math.inf
        gap = abs(origin - self.to)
        if gap < self.granularity:
            return begin
        return begin + self.tau_s * math.log(gap / self.granularity)


Segment = Step | Linear | LazyRelease
"""One piece of a device's timeline."""


@dataclass(frozen=True)
class SimulatedHolder:
    """A process holding ``used`` bytes on top of the timeline between ``start`` and ``end``.

    Attributes:
        used: Bytes it holds while active.
        start: When it starts holding them.
        end: When it lets go; ``None`` means never (a stuck holder).
        pid: Process id reported by ``memory_holders``; ``None`` keeps it anonymous (its bytes
            still count).
        name: Process name reported with it.
        state: What ``memory_holders`` says about the pid.
    """

    used: int
    start: float = 0.0
    end: float | None = None
    pid: int | None = None
    name: str = ""
    state: HolderState = HolderState.ALIVE

    def active(self, t: float) -> bool:
        """Return whether the holder holds its memory at ``t``."""
        return self.start <= t and (self.end is None or t < self.end)


@dataclass(frozen=True)
class SimulatedDevice:
    """One simulated device.

    Usage at time ``t`` is the timeline's value (``used`` before the first segment; each segment
    takes over at its start and rules until the next one starts) plus the bytes of every active
    holder.

    Attributes:
        total: Bytes usable by applications.
        used: Bytes in use before the first segment.
        timeline: Segments in order of their start times.
        holders: Processes holding memory on top of the timeline.
        name: Device name.
        reserved: Bytes the simulated driver keeps for itself (reported only).
        report_holders: Whether ``memory_holders`` answers; ``None`` means "when some holder has
            a pid". When ``False`` it returns ``None`` (unknown).
        uuid: Device UUID; ``None`` gives ``SIM-<index>``.

    Raises:
        ConfigurationError: For out-of-order segments, negative sizes, or a timeline whose peak
            (largest level plus every holder) exceeds ``total``.
    """

    total: int
    used: int = 0
    timeline: tuple[Segment, ...] = ()
    holders: tuple[SimulatedHolder, ...] = ()
    name: str = "Simulated device"
    reserved: int = 0
    report_holders: bool | None = None
    uuid: str | None = None
    _starts: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _before: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "timeline", tuple(self.timeline))
        object.__setattr__(self, "holders", tuple(self.holders))
        check_size(self.total, "total")
        check_size(self.used, "used")
        check_size(self.reserved, "reserved")
        starts: list[float] = []
        before: list[int] = []
        level = self.used
        peak = level
        for i, seg in enumerate(self.timeline):
            if not isinstance(seg, (Step, Linear, LazyRelease)):
                raise ConfigurationError(f"timeline[{i}] is not a Step, Linear or LazyRelease")
            check_segment(seg, f"timeline[{i}]")
            if starts and seg.start < starts[-1]:
                raise ConfigurationError(
                    f"timeline[{i}] starts at {seg.start:g} s, before timeline[{i - 1}] "
                    f"({starts[-1]:g} s): list segments in time order"
                )
            if starts:  # the previous segment's value at this segment's start
                level = self.timeline[i - 1].value(seg.start, before[-1])
            starts.append(seg.start)
            before.append(level)
            origin = getattr(seg, "from_", None)
            highest = max(level, seg.used if isinstance(seg, Step) else seg.to)
            if origin is not None:
                highest = max(highest, origin)
            peak = max(peak, highest)
        held = 0
        for i, holder in enumerate(self.holders):
            if not isinstance(holder, SimulatedHolder):
                raise ConfigurationError(f"holders[{i}] is not a SimulatedHolder")
            check_holder(holder, f"holders[{i}]")
            held += holder.used
        if peak + held > self.total:
            raise ConfigurationError(
                f"used memory would exceed total ({self.total} bytes): the timeline peaks at "
                f"{peak} bytes and holders add {held} bytes"
            )
        object.__setattr__(self, "_starts", tuple(starts))
        object.__setattr__(self, "_before", tuple(before))

    def base_at(self, t: float) -> int:
        """Return the timeline's usage at ``t`` (holders not included)."""
        i = bisect.bisect_right(self._starts, t) - 1
        if i < 0:
            return self.used
        return self.timeline[i].value(t, self._before[i])

    def used_at(self, t: float) -> int:
        """Return bytes in use at ``t``: the timeline plus every active holder."""
        held = sum(h.used for h in self.holders if h.active(t))
        return min(self.total, self.base_at(t) + held)

    def holders_at(self, t: float) -> tuple[MemoryHolder, ...] | None:
        """Return the active holders with a pid, or ``None`` when holders are not reported."""
        report = self.report_holders
        if report is None:
            report = any(h.pid is not None for h in self.holders)
        if not report:
            return None
        return tuple(
            MemoryHolder(pid=h.pid, used_bytes=h.used, state=h.state, name=h.name)
            for h in self.holders
            if h.pid is not None and h.active(t)
        )

    def quiet_after(self) -> float:
        """Return a time after which usage never changes again (``0.0`` for a flat device)."""
        last = 0.0
        if self.timeline:
            seg = self.timeline[-1]
            if isinstance(seg, LazyRelease):
                last = seg.quiet_after(self._before[-1])
            else:
                last = seg.quiet_after()
        for h in self.holders:
            last = max(last, h.start if h.end is None else h.end)
        return last


DEFAULT_RELEASE = ReleaseProfile(lazy=False, stable_duration_s=0.0, settle_timeout_s=120.0)
DEFAULT_GRAPH = GraphSupport(False, None, "the simulated platform captures no graphs")


@dataclass(frozen=True)
class SimulatedSpec:
    """Everything a simulated platform is made of.

    Attributes:
        devices: The devices, in visible-index order.
        name: Platform name reported by ``Platform.name``.
        device_type: Torch device type it pretends to be.
        release: Release profile (lazy or not, window, timeout, idle floor).
        graph: Graph capability.
        default_memory_utilization: In ``(0, 1]``.
        preferred_start_method: ``"fork"``, ``"spawn"`` or ``"forkserver"``.
        clock: ``"real"`` (time passes) or ``"virtual"`` (a fresh :class:`SimulatedClock`, so
            waits finish instantly, even across a subprocess boundary such as the CLI).
    """

    devices: tuple[SimulatedDevice, ...]
    name: str = "simulated"
    device_type: str = "cuda"
    release: ReleaseProfile = DEFAULT_RELEASE
    graph: GraphSupport = DEFAULT_GRAPH
    default_memory_utilization: float = 0.92
    preferred_start_method: StartMethod = "fork"
    clock: Literal["real", "virtual"] = "real"

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))
        if len(self.devices) > MAX_DEVICES:
            raise ConfigurationError(
                f"a simulated platform has at most {MAX_DEVICES} devices, got {len(self.devices)}"
            )
        for i, dev in enumerate(self.devices):
            if not isinstance(dev, SimulatedDevice):
                raise ConfigurationError(f"devices[{i}] is not a SimulatedDevice")
        if not isinstance(self.name, str) or not NAME_RE.match(self.name):
            raise ConfigurationError(
                f"name must be 1-64 characters of a-z, 0-9, '_', '-', '.', got {self.name!r}"
            )
        check_text(self.device_type, "device_type")
        if not isinstance(self.release, ReleaseProfile):
            raise ConfigurationError("release must be a ReleaseProfile")
        if not isinstance(self.graph, GraphSupport):
            raise ConfigurationError("graph must be a GraphSupport")
        _validate.number(
            self.default_memory_utilization,
            "default_memory_utilization",
            above=0,
            maximum=1,
            expected="in (0, 1]",
        )
        if self.preferred_start_method not in ("fork", "spawn", "forkserver"):
            raise ConfigurationError(
                "preferred_start_method must be 'fork', 'spawn' or 'forkserver', got "
                f"{self.preferred_start_method!r}"
            )
        if self.clock not in ("real", "virtual"):
            raise ConfigurationError(f"clock must be 'real' or 'virtual', got {self.clock!r}")


# --------------------------------------------------------------------------------------------
# value checks shared by Python construction and spec parsing


def check_size(value: object, where: str) -> int:
    """Return ``value`` if it is an int number of bytes in ``[0, 1 PiB]``.

    Raises:
        ConfigurationError: Naming ``where``.
    """
    _validate.integer(
        value, where, minimum=0, expected=">= 0 bytes", not_an_int="a whole number of bytes"
    )
    return _validate.integer(value, where, maximum=MAX_DEVICE_BYTES, expected="at most 1 PiB")


def check_time(value: object, where: str, *, positive: bool = False) -> float:
    """Return ``value`` as seconds in ``[0, MAX_TIME_S]`` (``> 0`` when ``positive``).

    Raises:
        ConfigurationError: Naming ``where``.
    """
    number = _validate.number(
        value,
        where,
        minimum=0,
        maximum=MAX_TIME_S,
        expected=f"finite, in [0, {MAX_TIME_S:g}] s",
        not_a_number="a number of seconds",
    )
    if positive:
        _validate.number(value, where, above=0, expected="> 0 s")
    return number


FIELDS = _validate.JsonFields(
    "",
    max_items=MAX_SEGMENTS,
    max_text=MAX_TEXT,
    wording="must be",
    object_noun="a table/object",
    array_noun="a list",
)
"""Field checks of specs and of the model's own values (a spec is JSON or TOML, hence
"table/object" and "list")."""

check_text = FIELDS.text


def check_segment(seg: Segment, where: str) -> None:
    if isinstance(seg, Step):
        check_time(seg.at, f"{where}.at")
        check_size(seg.used, f"{where}.used")
        return
    check_time(seg.start, f"{where}.start")
    check_size(seg.to, f"{where}.to")
    if seg.from_ is not None:
        check_size(seg.from_, f"{where}.from")
    if isinstance(seg, Linear):
        check_time(seg.end, f"{where}.end")
        if seg.end < seg.start:
            raise ConfigurationError(
                f"{where}.end ({seg.end:g} s) must not be before start ({seg.start:g} s)"
            )
    else:
        check_time(seg.tau_s, f"{where}.tau", positive=True)
        check_time(seg.delay_s, f"{where}.delay")
        check_size(seg.granularity, f"{where}.granularity")
        if seg.granularity < 1:
            raise ConfigurationError(f"{where}.granularity must be >= 1 byte")


def check_holder(holder: SimulatedHolder, where: str) -> None:
    check_size(holder.used, f"{where}.used")
    check_time(holder.start, f"{where}.start")
    if holder.end is not None:
        check_time(holder.end, f"{where}.end")
        if holder.end < holder.start:
            raise ConfigurationError(f"{where}.end must not be before its start")
    if holder.pid is not None:
        _validate.integer(
            holder.pid,
            f"{where}.pid",
            minimum=1,
            maximum=2**31 - 1,
            expected="an integer in [1, 2**31)",
        )
    check_text(holder.name, f"{where}.name")
    if not isinstance(holder.state, HolderState):
        raise ConfigurationError(f"{where}.state must be a HolderState")

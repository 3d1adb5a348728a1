"""The simulated platform's model: timeline segments, holders, devices and the spec.

Each value is checked when its object is built; the limits bound what a spec may ask for.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Literal

from accelplat import _validate
from accelplat._platform import StartMethod
from accelplat._types import MIB, GraphSupport, HolderState, MemoryHolder, ReleaseProfile
from accelplat.errors import ConfigurationError

MAX_SPEC_BYTES = 1 * MIB
"""Largest spec file accepted."""

MAX_DEVICES = 256
"""Most devices a spec may declare (after ``count`` replication)."""

MAX_SEGMENTS = 10_000
MAX_HOLDERS = 1_000
MAX_DEVICE_BYTES = 2**50  # 1 PiB: the largest size accepted anywhere in a spec
MAX_TIME_S = 1e9  # about 31 years: the largest time or duration accepted


@dataclass(frozen=True)
class Step:
    """From ``at`` (seconds since the platform started) on, the device uses ``used`` bytes."""

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
    """A straight line from ``from_`` at ``start`` to ``to`` at ``end``, then ``to``.

    ``from_=None`` means the usage just before ``start``.
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

    Usage at ``t`` is ``to + trunc((from - to) * exp(-(t - start - delay_s) / tau_s))`` in whole
    ``granularity`` chunks, so the tail reaches ``to`` exactly, at
    ``start + delay_s + tau_s * ln(|from - to| / granularity)``. ``from_=None`` means the usage
    just before ``start``.
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
        return self.to + int(remaining / self.granularity) * self.granularity

    def quiet_after(self, before: int | None = None) -> float:
        """Return the time from which usage equals ``to`` (``before`` as in :meth:`value`)."""
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
    """A process holding ``used`` bytes on top of the timeline from ``start`` until ``end``.

    ``end=None`` never lets go (a stuck holder); ``pid=None`` keeps it anonymous (its bytes still
    count); ``name`` and ``state`` are what ``memory_holders`` reports with the pid.
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
    """One simulated device: usage at ``t`` is the timeline's value plus every active holder.

    ``used`` applies before the first segment; each segment rules from its start until the next
    one starts. ``reserved`` is reported only. ``report_holders=None`` means "when some holder has
    a pid" (``False``: ``memory_holders`` returns ``None``). ``uuid=None`` gives ``SIM-<index>``.

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
        for name in ("total", "used", "reserved"):
            check_size(getattr(self, name), name)
        starts: list[float] = []
        before: list[int] = []
        level = peak = self.used
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
            peak = max(peak, level, seg.used if isinstance(seg, Step) else seg.to, origin or 0)
        for i, holder in enumerate(self.holders):
            if not isinstance(holder, SimulatedHolder):
                raise ConfigurationError(f"holders[{i}] is not a SimulatedHolder")
            check_holder(holder, f"holders[{i}]")
        held = sum(h.used for h in self.holders)
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
        return self.used if i < 0 else self.timeline[i].value(t, self._before[i])

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
            last = (
                seg.quiet_after(self._before[-1])
                if isinstance(seg, LazyRelease)
                else seg.quiet_after()
            )
        for h in self.holders:
            last = max(last, h.start if h.end is None else h.end)
        return last


_EAGER = ReleaseProfile(lazy=False, stable_duration_s=0.0, settle_timeout_s=120.0)
_NO_GRAPHS = GraphSupport(False, None, "the simulated platform captures no graphs")


@dataclass(frozen=True)
class SimulatedSpec:
    """Everything a simulated platform is made of (the fields of the spec format).

    ``devices`` are in visible-index order; ``name`` is ``Platform.name``; ``clock`` is
    ``"real"`` (time passes) or ``"virtual"`` (a fresh :class:`SimulatedClock`, so waits finish
    instantly, even across a subprocess boundary such as the CLI).
    """

    devices: tuple[SimulatedDevice, ...]
    name: str = "simulated"
    device_type: str = "cuda"
    release: ReleaseProfile = _EAGER
    graph: GraphSupport = _NO_GRAPHS
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
        if not isinstance(self.name, str) or not _validate.NAME_RE.match(self.name):
            raise ConfigurationError(
                f"name must be 1-64 characters of a-z, 0-9, '_', '-', '.', got {self.name!r}"
            )
        check_text(self.device_type, "device_type")
        if not isinstance(self.release, ReleaseProfile):
            raise ConfigurationError("release must be a ReleaseProfile")
        if not isinstance(self.graph, GraphSupport):
            raise ConfigurationError("graph must be a GraphSupport")
        check_utilization(self.default_memory_utilization)
        if self.preferred_start_method not in ("fork", "spawn", "forkserver"):
            raise ConfigurationError(
                "preferred_start_method must be 'fork', 'spawn' or 'forkserver', got "
                f"{self.preferred_start_method!r}"
            )
        if self.clock not in ("real", "virtual"):
            raise ConfigurationError(f"clock must be 'real' or 'virtual', got {self.clock!r}")


# Value checks shared by Python construction and spec parsing; each raises a ConfigurationError
# naming ``where``.

FIELDS = _validate.JsonFields(
    "",
    max_items=MAX_SEGMENTS,
    max_text=256,
    wording="must be",
    object_noun="a table/object",  # a spec is JSON or TOML
    array_noun="a list",
)
check_text = FIELDS.text


def check_size(value: object, where: str) -> int:
    """Return ``value`` if it is an int number of bytes in ``[0, 1 PiB]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{where} must be a whole number of bytes, got {value!r}")
    _validate.integer(value, where, minimum=0, expected=">= 0 bytes")
    return _validate.integer(value, where, maximum=MAX_DEVICE_BYTES, expected="at most 1 PiB")


def check_time(value: object, where: str, *, positive: bool = False) -> float:
    """Return ``value`` as seconds in ``[0, MAX_TIME_S]`` (``> 0`` when ``positive``)."""
    number = _validate.number(
        value,
        where,
        minimum=0,
        maximum=MAX_TIME_S,
        expected=f"finite, in [0, {MAX_TIME_S:g}] s",
    )
    if positive:
        _validate.number(value, where, above=0, expected="> 0 s")
    return number


def check_utilization(value: object) -> float:
    """Return ``default_memory_utilization`` if it is in ``(0, 1]``."""
    return _validate.number(value, "default_memory_utilization", above=0, maximum=1)


def check_segment(seg: Segment, where: str) -> None:
    """Check a segment's fields."""
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
        return
    check_time(seg.tau_s, f"{where}.tau", positive=True)
    check_time(seg.delay_s, f"{where}.delay")
    check_size(seg.granularity, f"{where}.granularity")
    if seg.granularity < 1:
        raise ConfigurationError(f"{where}.granularity must be >= 1 byte")


def check_holder(holder: SimulatedHolder, where: str) -> None:
    """Check a holder's fields."""
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

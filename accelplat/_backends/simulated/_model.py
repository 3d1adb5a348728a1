"""The simulated platform's model: timeline segments, holders, devices and the spec.

Values are checked once, when built, named as the spec format names them (``tau``, ``from``).
"""

from __future__ import annotations

import bisect
import math
import numbers
from dataclasses import dataclass, field
from typing import Literal

from accelplat import _validate
from accelplat._platform import StartMethod
from accelplat._types import MIB, GraphSupport, HolderState, MemoryHolder, ReleaseProfile
from accelplat.errors import ConfigurationError

MAX_SPEC_BYTES = 1 * MIB
MAX_DEVICES = 256  # after count replication
MAX_SEGMENTS = 10_000
MAX_HOLDERS = 1_000
MAX_SLICES = 8  # per device: MIG makes at most 7 instances of a GPU, AMD's CPX mode 8 partitions
MAX_DEVICE_BYTES = 2**50  # 1 PiB: the largest size accepted anywhere in a spec
MAX_TIME_S = 1e9  # about 31 years: the largest time or duration accepted

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
        raise FIELDS.error(where, "a whole number of bytes", value)
    _validate.integer(value, where, minimum=0, expected=">= 0 bytes")
    return _validate.integer(value, where, maximum=MAX_DEVICE_BYTES, expected="at most 1 PiB")


def _real(value: object, where: str, expected: str) -> None:
    # Text or a list is shown shortened, however long (the number checks show all of it).
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise FIELDS.error(where, expected, value)


def check_time(value: object, where: str, *, positive: bool = False) -> float:
    """Return ``value`` as seconds in ``[0, MAX_TIME_S]`` (``> 0`` when ``positive``)."""
    expected = f"finite, in [0, {MAX_TIME_S:g}] s"
    _real(value, where, expected)
    number = _validate.number(value, where, minimum=0, maximum=MAX_TIME_S, expected=expected)
    if positive:
        _validate.number(value, where, above=0, expected="> 0 s")
    return number


@dataclass(frozen=True)
class Step:
    """From ``at`` (seconds since the platform started) on, the device uses ``used`` bytes."""

    at: float
    used: int

    def __post_init__(self) -> None:
        check_time(self.at, "at")
        check_size(self.used, "used")

    @property
    def start(self) -> float:
        return self.at

    def value(self, t: float, before: int) -> int:
        """Return usage at ``t >= start``; ``before`` is the usage just before ``start``."""
        return self.used

    def quiet_after(self, before: int) -> float:
        """Return the time after which this segment no longer changes usage."""
        return self.at


def _check_release(seg: Linear | LazyRelease) -> None:
    check_time(seg.start, "start")
    check_size(seg.to, "to")
    if seg.from_ is not None:
        check_size(seg.from_, "from")


@dataclass(frozen=True)
class Linear:
    """A straight line from ``from_`` (None: the usage before) at ``start`` to ``to`` at ``end``."""

    start: float
    end: float
    to: int
    from_: int | None = None

    def __post_init__(self) -> None:
        _check_release(self)
        check_time(self.end, "end")
        if self.end < self.start:
            raise ConfigurationError(
                f"end ({self.end:g} s) must not be before start ({self.start:g} s)"
            )

    def value(self, t: float, before: int) -> int:
        origin = before if self.from_ is None else self.from_
        if t >= self.end or self.end <= self.start:
            return self.to
        fraction = (t - self.start) / (self.end - self.start)
        return round(origin + (self.to - origin) * fraction)

    def quiet_after(self, before: int) -> float:
        return self.end


@dataclass(frozen=True)
class LazyRelease:
    """A lazy release: usage holds for ``delay_s``, then decays exponentially towards ``to``."""

    start: float
    to: int
    tau_s: float
    from_: int | None = None
    delay_s: float = 0.0
    granularity: int = MIB

    def __post_init__(self) -> None:
        _check_release(self)
        check_time(self.tau_s, "tau", positive=True)
        check_time(self.delay_s, "delay")
        # 0: the finest, one byte
        object.__setattr__(self, "granularity", check_size(self.granularity, "granularity") or 1)

    def value(self, t: float, before: int) -> int:
        # to + trunc((from - to) * exp(-elapsed / tau)) in whole granularity chunks: the tail
        # reaches to exactly, at start + delay + tau * ln(|from - to| / granularity)
        origin = before if self.from_ is None else self.from_
        elapsed = t - self.start - self.delay_s
        if elapsed <= 0:
            return origin
        remaining = (origin - self.to) * math.exp(-elapsed / self.tau_s)
        return self.to + int(remaining / self.granularity) * self.granularity

    def quiet_after(self, before: int) -> float:
        begin = self.start + self.delay_s
        gap = abs((before if self.from_ is None else self.from_) - self.to)
        if gap < self.granularity:
            return begin
        return begin + self.tau_s * math.log(gap / self.granularity)


Segment = Step | Linear | LazyRelease


@dataclass(frozen=True)
class SimulatedHolder:
    """A process holding ``used`` bytes on top of the timeline from ``start`` until ``end``."""

    used: int
    start: float = 0.0
    end: float | None = None  # None: never lets go (a stuck holder)
    pid: int | None = None  # None: anonymous, its bytes still count
    name: str = ""
    state: HolderState = HolderState.ALIVE  # or its value

    def __post_init__(self) -> None:
        check_size(self.used, "used")
        check_time(self.start, "start")
        if self.end is not None and check_time(self.end, "end") < self.start:
            raise ConfigurationError("end must not be before its start")
        if self.pid is not None:
            FIELDS.integer(self.pid, "pid", minimum=1, maximum=2**31 - 1)
        check_text(self.name, "name")
        try:
            object.__setattr__(self, "state", HolderState(self.state))
        except ValueError:
            names = ", ".join(s.value for s in HolderState)
            raise FIELDS.error("state", f"one of {names}", self.state) from None

    def active(self, t: float) -> bool:
        return self.start <= t and (self.end is None or t < self.end)


@dataclass(frozen=True)
class SimulatedDevice:
    """One simulated device: usage at ``t`` is the timeline's value plus every active holder."""

    total: int
    used: int = 0  # before the first segment; each segment rules until the next one starts
    timeline: tuple[Segment, ...] = ()
    holders: tuple[SimulatedHolder, ...] = ()
    name: str = "Simulated device"
    reserved: int = 0  # reported only
    report_holders: bool | None = None  # None: when some holder has a pid
    uuid: str | None = None  # None: SIM-<index> (a slice: MIG-SIM-<index>-<slice>)
    slices: tuple[SimulatedDevice, ...] = ()  # its memory carved into devices (MIG instances)
    _starts: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _before: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("timeline", "holders", "slices"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for name in ("total", "used", "reserved"):
            check_size(getattr(self, name), name)
        if len(self.slices) > MAX_SLICES or any(s.slices for s in self.slices):
            raise ConfigurationError(f"slices must be at most {MAX_SLICES} devices without slices")
        if sum(s.total for s in self.slices) > self.total:
            raise ConfigurationError(f"the slices' totals exceed total ({self.total} bytes)")
        check_text(self.name, "name")
        if self.uuid is not None:
            check_text(self.uuid, "uuid")
        if self.report_holders is not None:
            FIELDS.boolean(self.report_holders, "report_holders")
        if not all(isinstance(seg, (Step, Linear, LazyRelease)) for seg in self.timeline):
            raise ConfigurationError("timeline holds what is not a Step, Linear or LazyRelease")
        starts = tuple(seg.start for seg in self.timeline)
        before: list[int] = []  # each segment's usage just before its start
        level = peak = self.used
        for i, seg in enumerate(self.timeline):
            if i and seg.start < starts[i - 1]:
                raise ConfigurationError(
                    f"timeline[{i}] starts at {seg.start:g} s, before timeline[{i - 1}] "
                    f"({starts[i - 1]:g} s): list segments in time order"
                )
            if i:
                level = self.timeline[i - 1].value(seg.start, before[-1])
            before.append(level)
            origin = getattr(seg, "from_", None)
            peak = max(peak, level, seg.used if isinstance(seg, Step) else seg.to, origin or 0)
        held = sum(h.used for h in self.holders)
        if peak + held > self.total:
            raise ConfigurationError(
                f"total ({self.total} bytes) is below the timeline's peak ({peak} bytes) plus its "
                f"holders ({held} bytes): used memory would exceed total"
            )
        object.__setattr__(self, "_starts", starts)
        object.__setattr__(self, "_before", tuple(before))

    def used_at(self, t: float) -> int:
        """Return bytes in use at ``t``: the timeline plus every active holder."""
        i = bisect.bisect_right(self._starts, t) - 1
        base = self.used if i < 0 else self.timeline[i].value(t, self._before[i])
        return min(self.total, base + sum(h.used for h in self.holders if h.active(t)))

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
        last = self.timeline[-1].quiet_after(self._before[-1]) if self.timeline else 0.0
        for h in self.holders:
            last = max(last, h.start if h.end is None else h.end)
        return last


_EAGER = ReleaseProfile(lazy=False, stable_duration_s=0.0, settle_timeout_s=120.0)
_NO_GRAPHS = GraphSupport(False, None, "the simulated platform captures no graphs")


@dataclass(frozen=True)
class SimulatedSpec:
    """Everything a simulated platform is made of (the fields of the spec format).

    ``devices`` are in visible-index order; ``clock="virtual"`` gives a fresh
    :class:`SimulatedClock`: waits finish at once, even across a subprocess such as the CLI.
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
        if not isinstance(self.name, str) or not _validate.NAME_RE.match(self.name):
            raise FIELDS.error("name", "1-64 characters of a-z, 0-9, '_', '-', '.'", self.name)
        check_text(self.device_type, "device_type")
        where, utilization = "default_memory_utilization", self.default_memory_utilization
        _real(utilization, where, "a number in (0, 1]")
        _validate.number(utilization, where, above=0, maximum=1)
        if self.preferred_start_method not in ("fork", "spawn", "forkserver"):
            expected = "'fork', 'spawn' or 'forkserver'"
            raise FIELDS.error("preferred_start_method", expected, self.preferred_start_method)
        if self.clock not in ("real", "virtual"):
            raise FIELDS.error("clock", "'real' or 'virtual'", self.clock)

"""The ``simulated`` platform: devices whose used memory follows a scripted timeline.

It exists for tests and demos of everything that waits on memory: a timeline says how a device's
usage moves over time (a step, a linear release, a lazy release with an exponential tail, a holder
that never lets go), the release profile and graph capability make it behave like an eager
CUDA-like or a lazy ROCm-like platform, and an injectable clock makes every wait instantaneous and
deterministic.

Select it with ``ACCELPLAT_PLATFORM=simulated`` and ``ACCELPLAT_SIMULATED_SPEC=<file>`` (JSON, or
TOML when the name ends in ``.toml``); :meth:`SimulatedPlatform.probe` is available exactly when
that variable names a readable, valid spec. In Python, build it from a mapping, a file or a
:class:`SimulatedSpec`::

    clock = SimulatedClock()
    platform = SimulatedPlatform.from_spec(
        {"devices": [{"total": "80GiB", "used": "60GiB",
                      "timeline": [{"at": 1.0, "used": "2GiB"}]}]},
        clock=clock,
    )

The spec format is described in ``docs/memory.md``. Specs are treated as untrusted input: files
over :data:`MAX_SPEC_BYTES`, deep nesting, unknown keys, non-finite or enormous numbers, negative
sizes and timelines that would use more than a device's total are rejected with a
:class:`~accelplat.errors.ConfigurationError` naming the offending field.

Time on a timeline is seconds since the platform was constructed, read from its clock (the real
clock by default, so demos unfold in real time). Imports no framework; touches no device.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from accelplat import _files
from accelplat._clock import Clock, RealClock
from accelplat._compat import override
from accelplat._types import (
    MIB,
    DeviceInfo,
    GraphSupport,
    HolderState,
    MemoryHolder,
    MemoryInfo,
    ProbeResult,
    ReleaseProfile,
)
from accelplat.errors import ConfigurationError, FileTooLargeError
from accelplat.platform import BasePlatform, StartMethod
from accelplat.sizing import parse_size

__all__ = [
    "ENV_SPEC",
    "ENV_VISIBLE",
    "MAX_DEVICES",
    "MAX_SPEC_BYTES",
    "LazyRelease",
    "Linear",
    "RealClock",
    "Segment",
    "SimulatedClock",
    "SimulatedDevice",
    "SimulatedHolder",
    "SimulatedPlatform",
    "SimulatedSpec",
    "Step",
    "load_spec",
]

ENV_SPEC = "ACCELPLAT_SIMULATED_SPEC"
"""Variable naming the spec file that ``SimulatedPlatform()`` and its probe load."""

ENV_VISIBLE = "ACCELPLAT_SIMULATED_VISIBLE_DEVICES"
"""Comma-separated UUIDs (``SIM-0`` …) or spec indices of the devices this process sees; unset
means all of them. Parsed like ``CUDA_VISIBLE_DEVICES``: an unknown entry ends the list."""

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

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_MAX_TEXT = 256


# --------------------------------------------------------------------------------------------
# clocks


class SimulatedClock:
    """A virtual clock: :meth:`sleep` advances time instantly, so waits take no real time.

    Thread-safe. Every reading is deterministic: time only moves through :meth:`sleep` and
    :meth:`advance`.

    Args:
        start: The initial reading of :meth:`monotonic`.
        epoch: Wall-clock seconds (since 1970) that correspond to ``start``, for :meth:`time`.

    Raises:
        ConfigurationError: For non-finite ``start`` or ``epoch``.
    """

    def __init__(self, start: float = 0.0, *, epoch: float = 1_700_000_000.0) -> None:
        if not (_is_real(start) and math.isfinite(start)):
            raise ConfigurationError(f"SimulatedClock start must be a finite number, got {start!r}")
        if not (_is_real(epoch) and math.isfinite(epoch)):
            raise ConfigurationError(f"SimulatedClock epoch must be a finite number, got {epoch!r}")
        self._now = float(start)
        self._offset = float(epoch) - float(start)
        self._lock = threading.Lock()
        self.sleeps: list[float] = []
        """Every duration passed to :meth:`sleep`, in order (for tests)."""

    def monotonic(self) -> float:
        """Return the current virtual time."""
        with self._lock:
            return self._now

    def time(self) -> float:
        """Return the virtual wall-clock time, ``epoch`` plus the time elapsed since ``start``."""
        with self._lock:
            return self._now + self._offset

    def sleep(self, seconds: float) -> None:
        """Advance virtual time by ``seconds`` at once, and record the call in :attr:`sleeps`.

        Args:
            seconds: A finite duration ``>= 0``.

        Raises:
            ConfigurationError: For a negative, non-finite or non-numeric duration.
        """
        self.advance(seconds)
        with self._lock:
            self.sleeps.append(float(seconds))

    def advance(self, seconds: float) -> None:
        """Move virtual time forward by ``seconds`` without recording a sleep.

        Args:
            seconds: A finite duration ``>= 0``.

        Raises:
            ConfigurationError: For a negative, non-finite or non-numeric duration.
        """
        if not (_is_real(seconds) and math.isfinite(seconds) and seconds >= 0):
            raise ConfigurationError(f"a sleep must be a finite number >= 0, got {seconds!r}")
        with self._lock:
            self._now += float(seconds)

    def __repr__(self) -> str:
        return f"SimulatedClock(now={self.monotonic():g})"


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
        _check_size(self.total, "total")
        _check_size(self.used, "used")
        _check_size(self.reserved, "reserved")
        starts: list[float] = []
        before: list[int] = []
        level = self.used
        peak = level
        for i, seg in enumerate(self.timeline):
            if not isinstance(seg, (Step, Linear, LazyRelease)):
                raise ConfigurationError(f"timeline[{i}] is not a Step, Linear or LazyRelease")
            _check_segment(seg, f"timeline[{i}]")
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
            _check_holder(holder, f"holders[{i}]")
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


_DEFAULT_RELEASE = ReleaseProfile(lazy=False, stable_duration_s=0.0, settle_timeout_s=120.0)
_DEFAULT_GRAPH = GraphSupport(False, None, "the simulated platform captures no graphs")


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
    release: ReleaseProfile = _DEFAULT_RELEASE
    graph: GraphSupport = _DEFAULT_GRAPH
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
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise ConfigurationError(
                f"name must be 1-64 characters of a-z, 0-9, '_', '-', '.', got {self.name!r}"
            )
        _check_text(self.device_type, "device_type")
        if not isinstance(self.release, ReleaseProfile):
            raise ConfigurationError("release must be a ReleaseProfile")
        if not isinstance(self.graph, GraphSupport):
            raise ConfigurationError("graph must be a GraphSupport")
        util = self.default_memory_utilization
        if not (_is_real(util) and math.isfinite(util) and 0 < util <= 1):
            raise ConfigurationError(f"default_memory_utilization must be in (0, 1], got {util!r}")
        if self.preferred_start_method not in ("fork", "spawn", "forkserver"):
            raise ConfigurationError(
                "preferred_start_method must be 'fork', 'spawn' or 'forkserver', got "
                f"{self.preferred_start_method!r}"
            )
        if self.clock not in ("real", "virtual"):
            raise ConfigurationError(f"clock must be 'real' or 'virtual', got {self.clock!r}")


# --------------------------------------------------------------------------------------------
# value checks shared by Python construction and spec parsing


def _check_size(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigurationError(f"{where} must be a whole number of bytes, got {value!r}")
    if value < 0:
        raise ConfigurationError(f"{where} must be >= 0 bytes, got {value!r}")
    if value > MAX_DEVICE_BYTES:
        raise ConfigurationError(f"{where} must be at most 1 PiB, got {value!r} bytes")
    return value


def _check_time(value: object, where: str, *, positive: bool = False) -> float:
    if not _is_real(value):
        raise ConfigurationError(f"{where} must be a number of seconds, got {value!r}")
    number = float(value)  # type: ignore[arg-type]
    if not math.isfinite(number) or number < 0 or number > MAX_TIME_S:
        raise ConfigurationError(f"{where} must be finite, in [0, {MAX_TIME_S:g}] s, got {value!r}")
    if positive and number <= 0:
        raise ConfigurationError(f"{where} must be > 0 s, got {value!r}")
    return number


def _check_text(value: object, where: str) -> str:
    if not isinstance(value, str) or len(value) > _MAX_TEXT:
        raise ConfigurationError(f"{where} must be a string of at most {_MAX_TEXT} characters")
    return value


def _check_segment(seg: Segment, where: str) -> None:
    if isinstance(seg, Step):
        _check_time(seg.at, f"{where}.at")
        _check_size(seg.used, f"{where}.used")
        return
    _check_time(seg.start, f"{where}.start")
    _check_size(seg.to, f"{where}.to")
    if seg.from_ is not None:
        _check_size(seg.from_, f"{where}.from")
    if isinstance(seg, Linear):
        _check_time(seg.end, f"{where}.end")
        if seg.end < seg.start:
            raise ConfigurationError(
                f"{where}.end ({seg.end:g} s) must not be before start ({seg.start:g} s)"
            )
    else:
        _check_time(seg.tau_s, f"{where}.tau", positive=True)
        _check_time(seg.delay_s, f"{where}.delay")
        _check_size(seg.granularity, f"{where}.granularity")
        if seg.granularity < 1:
            raise ConfigurationError(f"{where}.granularity must be >= 1 byte")


def _check_holder(holder: SimulatedHolder, where: str) -> None:
    _check_size(holder.used, f"{where}.used")
    _check_time(holder.start, f"{where}.start")
    if holder.end is not None:
        _check_time(holder.end, f"{where}.end")
        if holder.end < holder.start:
            raise ConfigurationError(f"{where}.end must not be before its start")
    if holder.pid is not None and (
        not isinstance(holder.pid, int)
        or isinstance(holder.pid, bool)
        or not 0 < holder.pid < 2**31
    ):
        raise ConfigurationError(
            f"{where}.pid must be an integer in [1, 2**31), got {holder.pid!r}"
        )
    _check_text(holder.name, f"{where}.name")
    if not isinstance(holder.state, HolderState):
        raise ConfigurationError(f"{where}.state must be a HolderState")


# --------------------------------------------------------------------------------------------
# spec parsing


def _parse_size(value: object, where: str = "size") -> int:
    """Parse a byte count: an int, a JSON float (floored), or text in the one size grammar.

    Text goes through :func:`accelplat.sizing.parse_size` (``"4GiB"``, ``"512 MiB"``, ``"8GB"``).

    Raises:
        ConfigurationError: Naming ``where``, for anything else, negative or above 1 PiB.
    """
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigurationError(f"{where} must be finite, got {value!r}")
        if value < 0:
            raise ConfigurationError(f"{where} must be >= 0 bytes, got {value!r}")
        number = math.floor(value) if value <= MAX_DEVICE_BYTES else MAX_DEVICE_BYTES + 1
    elif isinstance(value, str) and len(value) > 64:
        raise ConfigurationError(f"{where} is not a size: {value[:64]!r}…")
    elif isinstance(value, (str, int)):
        number = parse_size(value, argument=where)
    else:
        raise ConfigurationError(f"{where} must be a size, got {value!r}")
    if number > MAX_DEVICE_BYTES:
        raise ConfigurationError(f"{where} must be at most 1 PiB, got {value!r}")
    return number


def _table(
    value: object, where: str, allowed: AbstractSet[str], required: AbstractSet[str] = frozenset()
) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"{where} must be a table/object, got {type(value).__name__}")
    for key in value:
        if not isinstance(key, str) or key not in allowed:
            raise ConfigurationError(
                f"{where}: unknown key {key!r} (allowed: {', '.join(sorted(allowed))})"
            )
    for key in sorted(required):
        if key not in value:
            raise ConfigurationError(f"{where}: missing required key {key!r}")
    return dict(value)


def _list(value: object, where: str, limit: int) -> list[Any]:
    if not isinstance(value, list):
        raise ConfigurationError(f"{where} must be a list, got {type(value).__name__}")
    if len(value) > limit:
        raise ConfigurationError(f"{where} has {len(value)} entries; at most {limit} are allowed")
    return value


def _bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{where} must be true or false, got {value!r}")
    return value


def _state(value: object, where: str) -> HolderState:
    try:
        return HolderState(value)
    except ValueError:
        names = ", ".join(s.value for s in HolderState)
        raise ConfigurationError(f"{where} must be one of {names}, got {value!r}") from None


def _parse_holder(raw: object, where: str, *, stuck: bool) -> SimulatedHolder:
    keys = {"used", "pid", "name", "state"} | ({"at"} if stuck else {"start", "end"})
    data = _table(raw, where, keys, {"used"})
    start_key = "at" if stuck else "start"
    end = None if stuck or data.get("end") is None else _check_time(data["end"], f"{where}.end")
    pid = data.get("pid")
    if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool)):
        raise ConfigurationError(f"{where}.pid must be an integer, got {pid!r}")
    return SimulatedHolder(
        used=_parse_size(data["used"], f"{where}.used"),
        start=_check_time(data.get(start_key, 0.0), f"{where}.{start_key}"),
        end=end,
        pid=pid,
        name=_check_text(data.get("name", ""), f"{where}.name"),
        state=_state(data.get("state", "alive"), f"{where}.state"),
    )


def _parse_segment(raw: object, where: str) -> Segment | SimulatedHolder:
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"{where} must be a table/object, got {type(raw).__name__}")
    if "linear" in raw:
        _table(raw, where, {"linear"})
        data = _table(raw["linear"], f"{where}.linear", {"from", "to", "start", "end"},
                      {"to", "start", "end"})  # fmt: skip
        return Linear(
            start=_check_time(data["start"], f"{where}.linear.start"),
            end=_check_time(data["end"], f"{where}.linear.end"),
            to=_parse_size(data["to"], f"{where}.linear.to"),
            from_=None if "from" not in data else _parse_size(data["from"], f"{where}.linear.from"),
        )
    if "lazy" in raw:
        _table(raw, where, {"lazy"})
        keys = {"from", "to", "start", "tau", "delay", "granularity"}
        data = _table(raw["lazy"], f"{where}.lazy", keys, {"to", "start", "tau"})
        return LazyRelease(
            start=_check_time(data["start"], f"{where}.lazy.start"),
            to=_parse_size(data["to"], f"{where}.lazy.to"),
            tau_s=_check_time(data["tau"], f"{where}.lazy.tau", positive=True),
            from_=None if "from" not in data else _parse_size(data["from"], f"{where}.lazy.from"),
            delay_s=_check_time(data.get("delay", 0.0), f"{where}.lazy.delay"),
            granularity=max(
                1, _parse_size(data.get("granularity", MIB), f"{where}.lazy.granularity")
            ),
        )
    if "stuck" in raw:
        _table(raw, where, {"stuck"})
        return _parse_holder(raw["stuck"], f"{where}.stuck", stuck=True)
    data = _table(raw, where, {"at", "used"}, {"at", "used"})
    return Step(
        at=_check_time(data["at"], f"{where}.at"), used=_parse_size(data["used"], f"{where}.used")
    )


def _parse_device(raw: object, where: str) -> tuple[SimulatedDevice, int]:
    keys = {"total", "used", "timeline", "holders", "name", "reserved", "report_holders", "uuid",
            "count"}  # fmt: skip
    data = _table(raw, where, keys, {"total"})
    segments: list[Segment] = []
    holders: list[SimulatedHolder] = []
    for i, item in enumerate(_list(data.get("timeline", []), f"{where}.timeline", MAX_SEGMENTS)):
        parsed = _parse_segment(item, f"{where}.timeline[{i}]")
        if isinstance(parsed, SimulatedHolder):
            holders.append(parsed)
        else:
            segments.append(parsed)
    for i, item in enumerate(_list(data.get("holders", []), f"{where}.holders", MAX_HOLDERS)):
        holders.append(_parse_holder(item, f"{where}.holders[{i}]", stuck=False))
    if len(holders) > MAX_HOLDERS:
        raise ConfigurationError(f"{where} has more than {MAX_HOLDERS} holders")
    count = data.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_DEVICES:
        raise ConfigurationError(f"{where}.count must be an integer in [1, {MAX_DEVICES}]")
    report = data.get("report_holders")
    uuid = data.get("uuid")
    kwargs: dict[str, Any] = {
        "total": _parse_size(data["total"], f"{where}.total"),
        "used": _parse_size(data.get("used", 0), f"{where}.used"),
        "timeline": tuple(segments),
        "holders": tuple(holders),
        "name": _check_text(data.get("name", "Simulated device"), f"{where}.name"),
        "reserved": _parse_size(data.get("reserved", 0), f"{where}.reserved"),
        "report_holders": None if report is None else _bool(report, f"{where}.report_holders"),
        "uuid": None if uuid is None else _check_text(uuid, f"{where}.uuid"),
    }
    try:
        device = SimulatedDevice(**kwargs)
    except ConfigurationError as exc:  # cross-field checks: name the device
        raise ConfigurationError(f"{where}: {exc}") from None
    return device, count


def _parse_release(raw: object, where: str) -> ReleaseProfile:
    keys = {"lazy", "stable_duration_s", "settle_timeout_s", "idle_floor"}
    data = _table(raw, where, keys)
    return ReleaseProfile(
        lazy=_bool(data.get("lazy", False), f"{where}.lazy"),
        stable_duration_s=_check_time(
            data.get("stable_duration_s", 0.0), f"{where}.stable_duration_s"
        ),
        settle_timeout_s=_check_time(
            data.get("settle_timeout_s", 120.0), f"{where}.settle_timeout_s"
        ),
        idle_floor_bytes=_parse_size(data.get("idle_floor", 0), f"{where}.idle_floor"),
    )


def _parse_graph(raw: object, where: str) -> GraphSupport:
    data = _table(raw, where, {"available", "api", "reason"})
    available = _bool(data.get("available", False), f"{where}.available")
    api = data.get("api")
    if api is not None:
        _check_text(api, f"{where}.api")
    default_reason = "configured by the simulated spec"
    reason = _check_text(data.get("reason", default_reason), f"{where}.reason")
    return GraphSupport(available, api, reason)


def spec_from_mapping(data: object, *, source: str = "spec") -> SimulatedSpec:
    """Build a :class:`SimulatedSpec` from parsed JSON or TOML.

    Args:
        data: The document's top-level table.
        source: Where it came from, for error messages.

    Returns:
        The validated spec.

    Raises:
        ConfigurationError: Naming ``source`` and the offending field.
    """
    try:
        return _spec_from_mapping(data)
    except ConfigurationError as exc:
        raise ConfigurationError(f"simulated spec {source}: {exc}") from None
    except RecursionError:
        raise ConfigurationError(f"simulated spec {source}: nested too deeply") from None


def _spec_from_mapping(data: object) -> SimulatedSpec:
    keys = {"version", "name", "device_type", "clock", "default_memory_utilization",
            "preferred_start_method", "release", "graph", "devices"}  # fmt: skip
    top = _table(data, "top level", keys, {"devices"})
    version = top.get("version", 1)
    if version != 1 or isinstance(version, bool):
        raise ConfigurationError(f"version must be 1, got {version!r}")
    raw_devices = _list(top["devices"], "devices", MAX_DEVICES)
    counts = [d.get("count", 1) if isinstance(d, dict) else 1 for d in raw_devices]
    valid = all(type(c) is int and 1 <= c <= MAX_DEVICES for c in counts)
    if valid and sum(counts) > MAX_DEVICES:
        # cheap check first: refuse before validating thousands of timeline segments
        raise ConfigurationError(f"a simulated platform has at most {MAX_DEVICES} devices")
    devices: list[SimulatedDevice] = []
    for i, raw in enumerate(raw_devices):
        device, count = _parse_device(raw, f"devices[{i}]")
        if len(devices) + count > MAX_DEVICES:
            raise ConfigurationError(f"a simulated platform has at most {MAX_DEVICES} devices")
        devices.extend([device] * count)
    if not devices:
        raise ConfigurationError("devices must list at least one device")
    util = top.get("default_memory_utilization", 0.92)
    if not _is_real(util):
        raise ConfigurationError(f"default_memory_utilization must be a number, got {util!r}")
    return SimulatedSpec(
        devices=tuple(devices),
        name=top.get("name", "simulated"),
        device_type=_check_text(top.get("device_type", "cuda"), "device_type"),
        release=_parse_release(top.get("release", {}), "release"),
        graph=_parse_graph(top.get("graph", {}), "graph"),
        default_memory_utilization=float(util),
        preferred_start_method=top.get("preferred_start_method", "fork"),
        clock=top.get("clock", "real"),
    )


def _reject_constant(token: str) -> float:
    raise ConfigurationError(f"{token} is not allowed in a simulated spec")


def load_spec(path: str | os.PathLike[str]) -> SimulatedSpec:
    """Read and validate a spec file: TOML when its name ends in ``.toml``, JSON otherwise.

    Args:
        path: The file.

    Returns:
        The validated spec.

    Raises:
        ConfigurationError: For a missing, unreadable, oversized or malformed file, naming it.
    """
    p = Path(path)
    try:
        raw = _files.read_bytes(p, limit=MAX_SPEC_BYTES)
    except FileTooLargeError:
        raise ConfigurationError(
            f"simulated spec {p}: larger than {MAX_SPEC_BYTES // MIB} MiB; refusing to read it"
        ) from None
    except OSError as exc:
        raise ConfigurationError(
            f"simulated spec {p}: cannot read it: {exc.strerror or exc}"
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigurationError(f"simulated spec {p}: not UTF-8 text") from None
    try:
        if p.suffix.lower() == ".toml":
            if sys.version_info >= (3, 11):
                import tomllib
            else:  # pragma: no cover - exercised on Python 3.10 only
                import tomli as tomllib
            data: object = tomllib.loads(text)
        else:
            data = json.loads(text, parse_constant=_reject_constant)
    except ConfigurationError as exc:
        raise ConfigurationError(f"simulated spec {p}: {exc}") from None
    except RecursionError:
        raise ConfigurationError(f"simulated spec {p}: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, TOMLDecodeError, int digit limits
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigurationError(f"simulated spec {p}: malformed: {first}") from None
    return spec_from_mapping(data, source=str(p))


# --------------------------------------------------------------------------------------------
# the platform


class SimulatedPlatform(BasePlatform):
    """A platform of scripted devices, for tests and demos.

    Args:
        spec: A :class:`SimulatedSpec`, a mapping in the spec format, or a path to a spec file;
            ``None`` loads the file named by ``ACCELPLAT_SIMULATED_SPEC``.
        clock: The clock timelines run on and waits sleep on (exposed as :attr:`clock`);
            ``None`` means the spec's choice (a :class:`RealClock` or a fresh
            :class:`SimulatedClock`). Timeline time 0 is the clock's reading at construction.

    Raises:
        ConfigurationError: For an invalid spec, or ``spec=None`` without the variable.

    Side effects:
        Reads the spec file; imports no framework; touches no device.
    """

    context_free: ClassVar[bool] = True

    def __init__(
        self,
        spec: SimulatedSpec | Mapping[str, Any] | str | os.PathLike[str] | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        if spec is None:
            path = os.environ.get(ENV_SPEC, "").strip()
            if not path:
                raise ConfigurationError(
                    f"SimulatedPlatform() needs a spec: set {ENV_SPEC} to a JSON or TOML spec "
                    "file, or pass one"
                )
            spec = path
        if isinstance(spec, SimulatedSpec):
            resolved = spec
        elif isinstance(spec, Mapping):
            resolved = spec_from_mapping(spec, source="mapping")
        elif isinstance(spec, (str, os.PathLike)):
            resolved = load_spec(spec)
        else:
            raise ConfigurationError(
                f"spec must be a SimulatedSpec, a mapping or a path, got {type(spec).__name__}"
            )
        if clock is None:
            clock = SimulatedClock() if resolved.clock == "virtual" else RealClock()
        elif not (
            callable(getattr(clock, "monotonic", None)) and callable(getattr(clock, "sleep", None))
        ):
            raise ConfigurationError(f"clock must have monotonic() and sleep(), got {clock!r}")
        self._spec = resolved
        self.clock: Clock = clock
        """The clock of the timelines; memory waits sleep on it by default."""
        self._t0 = clock.monotonic()

    @classmethod
    def from_spec(
        cls,
        spec: SimulatedSpec | Mapping[str, Any] | str | os.PathLike[str],
        *,
        clock: Clock | None = None,
    ) -> SimulatedPlatform:
        """Build a simulated platform from a spec (see the class for the arguments)."""
        return cls(spec, clock=clock)

    @classmethod
    @override
    def probe(cls) -> ProbeResult:
        """Say whether ``ACCELPLAT_SIMULATED_SPEC`` names a readable, valid spec.

        Returns:
            Available with the device count, or unavailable with the reason.

        Side effects:
            Reads and validates the spec file.
        """
        path = os.environ.get(ENV_SPEC, "").strip()
        if not path:
            return ProbeResult(
                False, f"{ENV_SPEC} is not set (point it at a JSON or TOML simulated spec)"
            )
        try:
            spec = load_spec(path)
        except ConfigurationError as exc:
            return ProbeResult(False, str(exc))
        return ProbeResult(True, f"{len(spec.devices)} simulated device(s) from {path}")

    @property
    def spec(self) -> SimulatedSpec:
        """The spec this platform follows."""
        return self._spec

    @property
    def name(self) -> str:  # type: ignore[override]
        """Platform name from the spec (``"simulated"`` by default)."""
        return self._spec.name

    @property
    def device_type(self) -> str:  # type: ignore[override]
        """Torch device type the spec pretends to be."""
        return self._spec.device_type

    @property
    def default_memory_utilization(self) -> float:  # type: ignore[override]
        """Default engine memory utilization from the spec."""
        return self._spec.default_memory_utilization

    @property
    def preferred_start_method(self) -> StartMethod:  # type: ignore[override]
        """Process start method from the spec."""
        return self._spec.preferred_start_method

    @property
    @override
    def release(self) -> ReleaseProfile:
        """Release profile from the spec."""
        return self._spec.release

    @property
    @override
    def graph(self) -> GraphSupport:
        """Graph capability from the spec."""
        return self._spec.graph

    def elapsed(self) -> float:
        """Return timeline time: seconds on :attr:`clock` since construction."""
        return self.clock.monotonic() - self._t0

    @property
    def visible_devices_env(self) -> str | None:  # type: ignore[override]
        """``ACCELPLAT_SIMULATED_VISIBLE_DEVICES``: the simulated devices this process sees."""
        return ENV_VISIBLE

    def _visible(self) -> list[int]:
        """Spec indices of the visible devices, in visible-index order (see :data:`ENV_VISIBLE`)."""
        everything = list(range(len(self._spec.devices)))
        raw = os.environ.get(ENV_VISIBLE)
        if raw is None:
            return everything
        uuids = [self._uuid(i) for i in everything]
        chosen: list[int] = []
        for token in (t.strip() for t in raw.split(",")):
            if token in uuids:
                index = uuids.index(token)
            elif token.isdecimal() and len(token) <= 6 and int(token) < len(uuids):
                index = int(token)
            else:  # as CUDA does: an unknown entry ends the list
                break
            if index in chosen:
                raise ConfigurationError(f"{ENV_VISIBLE}={raw!r} names device {token} twice")
            chosen.append(index)
        return chosen

    def _uuid(self, index: int) -> str:
        uuid = self._spec.devices[index].uuid
        return uuid if uuid is not None else f"SIM-{index}"

    @override
    def devices(self) -> Sequence[DeviceInfo]:
        """Return the visible simulated devices in visible-index order.

        Every device of the spec is visible unless ``ACCELPLAT_SIMULATED_VISIBLE_DEVICES`` lists
        some, by UUID or spec index; ``physical_index`` is the index in the spec.

        Raises:
            ConfigurationError: When the variable names a device twice.
        """
        return [
            DeviceInfo(
                index=i,
                physical_index=spec_index,
                name=self._spec.devices[spec_index].name,
                uuid=self._uuid(spec_index),
            )
            for i, spec_index in enumerate(self._visible())
        ]

    @override
    def device_count(self) -> int:
        """Return the number of visible simulated devices."""
        return len(self._visible())

    @override
    def _memory_info(self, device: int) -> MemoryInfo:
        dev = self._spec.devices[self._visible()[device]]
        used = dev.used_at(self.elapsed())
        return MemoryInfo(
            free=dev.total - used,
            total=dev.total,
            used=used,
            reserved=dev.reserved,
            source="simulated",
        )

    @override
    def memory_holders(self, device: int) -> Sequence[MemoryHolder] | None:
        """Return the holders active now, or ``None`` when the spec does not report holders.

        Args:
            device: Visible device index.

        Raises:
            DeviceNotFoundError: For an index that is not visible.
        """
        index = self.check_device(device)
        return self._spec.devices[self._visible()[index]].holders_at(self.elapsed())

    def __repr__(self) -> str:
        return (
            f"<SimulatedPlatform name={self.name!r} devices={self.device_count()} "
            f"clock={self.clock!r}>"
        )

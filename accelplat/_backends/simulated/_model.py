"""The simulated platform's model (timeline segments, holders, devices, the spec) and its reader.

Values are checked once, when built, named as the spec format names them (``tau``, ``from``);
spec files (JSON or TOML) and mappings are read as untrusted input.
"""

from __future__ import annotations

import bisect
import json
import math
import numbers
import os
from collections.abc import Callable, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from accelplat import _files, _validate
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


def check_time(value: object, where: str) -> float:
    """Return ``value`` as seconds in ``[0, MAX_TIME_S]``."""
    expected = f"finite, in [0, {MAX_TIME_S:g}] s"
    _real(value, where, expected)
    return _validate.number(value, where, minimum=0, maximum=MAX_TIME_S, expected=expected)


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
        check_time(self.tau_s, "tau")
        _validate.number(self.tau_s, "tau", above=0, expected="> 0 s")
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
        return begin + self.tau_s * math.log(max(1.0, gap / self.granularity))  # 0 within one chunk


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
            if i:
                if seg.start < starts[i - 1]:
                    raise ConfigurationError(
                        f"timeline[{i}] starts at {seg.start:g} s, before timeline[{i - 1}] "
                        f"({starts[i - 1]:g} s): list segments in time order"
                    )
                level = self.timeline[i - 1].value(seg.start, level)  # where the previous left it
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
        return max([last, *(h.start if h.end is None else h.end for h in self.holders)])


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


# -- reading a spec ------------------------------------------------------------------------------

_T = TypeVar("_T")
_list = FIELDS.array


def _size(value: object, where: str) -> int:
    """Read a byte count: an int, a JSON float (floored), or text (<= 64 characters) as a size."""
    if isinstance(value, str) and len(value) > 64:
        raise ConfigurationError(f"{where} is not a size: {value[:64]!r}…")
    if isinstance(value, float):
        return _validate.byte_count(value, where)
    if isinstance(value, str):
        return _validate.parse_size(value, argument=where)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise FIELDS.error(where, "a size", value)


def _table(
    value: object, where: str, allowed: Set[str], required: Set[str] = frozenset()
) -> dict[str, Any]:
    return dict(FIELDS.mapping(value, where, allowed, required))


_SIZES = frozenset({"total", "used", "reserved", "to", "from", "granularity"})  # read by _size
_FIELD_NAMES = {"from": "from_", "tau": "tau_s", "delay": "delay_s"}  # spec key: model field


def _build(where: str, make: Callable[..., _T], data: dict[str, Any]) -> _T:
    """Return ``make`` of the spec fields ``data``, sizes read; errors prefixed with the path."""
    fields = {
        _FIELD_NAMES.get(k, k): _size(v, f"{where}.{k}") if k in _SIZES else v
        for k, v in data.items()
    }
    try:
        return make(**fields)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}.{exc}") from None


def _holder(raw: object, where: str, *, stuck: bool) -> SimulatedHolder:
    keys = {"used", "pid", "name", "state"} | ({"at"} if stuck else {"start", "end"})
    data = _table(raw, where, keys, {"used"})
    if "at" in data:  # a stuck segment's start: checked here, where it is named
        data["start"] = check_time(data.pop("at"), f"{where}.at")
    return _build(where, SimulatedHolder, data)


def _segment(raw: object, where: str) -> Step | Linear | LazyRelease | SimulatedHolder:
    raw = FIELDS.mapping(raw, where)
    kind = next((k for k in ("linear", "lazy", "stuck") if k in raw), None)
    if kind is None:
        return _build(where, Step, _table(raw, where, {"at", "used"}, {"at", "used"}))
    body = _table(raw, where, {kind})[kind]
    where += f".{kind}"
    if kind == "stuck":
        return _holder(body, where, stuck=True)
    if kind == "linear":
        keys = {"from", "to", "start", "end"}
        return _build(where, Linear, _table(body, where, keys, {"to", "start", "end"}))
    keys = {"from", "to", "start", "tau", "delay", "granularity"}
    return _build(where, LazyRelease, _table(body, where, keys, {"to", "start", "tau"}))


def _device(raw: object, where: str, *, whole: bool = True) -> tuple[SimulatedDevice, int]:
    keys = {"total", "used", "timeline", "holders", "name", "reserved", "report_holders", "uuid"}
    data = _table(raw, where, keys | ({"count", "slices"} if whole else set()), {"total"})
    parts = _list(data.pop("slices", []), f"{where}.slices", MAX_SLICES)
    data["slices"] = [
        _device(s, f"{where}.slices[{i}]", whole=False)[0] for i, s in enumerate(parts)
    ]
    segments: list[Step | Linear | LazyRelease] = []
    holders: list[SimulatedHolder] = []
    for i, item in enumerate(_list(data.pop("timeline", []), f"{where}.timeline", MAX_SEGMENTS)):
        parsed = _segment(item, f"{where}.timeline[{i}]")
        if isinstance(parsed, SimulatedHolder):
            holders.append(parsed)
        else:
            segments.append(parsed)
    for i, item in enumerate(_list(data.pop("holders", []), f"{where}.holders", MAX_HOLDERS)):
        holders.append(_holder(item, f"{where}.holders[{i}]", stuck=False))
    if len(holders) > MAX_HOLDERS:
        raise ConfigurationError(f"{where} has more than {MAX_HOLDERS} holders")
    count = FIELDS.integer(data.pop("count", 1), f"{where}.count", minimum=1, maximum=MAX_DEVICES)
    return _build(where, SimulatedDevice, {**data, "timeline": segments, "holders": holders}), count


def _release(raw: object) -> ReleaseProfile:
    data = _table(raw, "release", {"lazy", "stable_duration_s", "settle_timeout_s", "idle_floor"})
    get, idle = data.get, "release.idle_floor"
    return ReleaseProfile(
        lazy=FIELDS.boolean(get("lazy", False), "release.lazy"),
        stable_duration_s=check_time(get("stable_duration_s", 0.0), "release.stable_duration_s"),
        settle_timeout_s=check_time(get("settle_timeout_s", 120.0), "release.settle_timeout_s"),
        idle_floor_bytes=check_size(_size(get("idle_floor", 0), idle), idle),
    )


def _graph(raw: object) -> GraphSupport:
    data = _table(raw, "graph", {"available", "api", "reason"})
    available = FIELDS.boolean(data.get("available", False), "graph.available")
    api = data.get("api")
    if api is not None:
        check_text(api, "graph.api")
    reason = check_text(data.get("reason", "configured by the simulated spec"), "graph.reason")
    return GraphSupport(available, api, reason)


def _spec(data: object) -> SimulatedSpec:
    keys = {"version", "name", "device_type", "clock", "default_memory_utilization",
            "preferred_start_method", "release", "graph", "devices"}  # fmt: skip
    top = _table(data, "top level", keys, {"devices"})
    version = top.pop("version", 1)
    if version != 1 or isinstance(version, bool):
        raise FIELDS.error("version", "1", version)
    raw_devices = _list(top.pop("devices"), "devices", MAX_DEVICES)
    counts = [d.get("count", 1) if isinstance(d, dict) else 1 for d in raw_devices]
    if sum(c for c in counts if type(c) is int and 0 < c <= MAX_DEVICES) > MAX_DEVICES:
        # before validating thousands of segments (SimulatedSpec counts the devices again)
        raise ConfigurationError(f"a simulated platform has at most {MAX_DEVICES} devices")
    devices: list[SimulatedDevice] = []
    for i, raw in enumerate(raw_devices):
        device, count = _device(raw, f"devices[{i}]")
        devices += [device] * count
    if not devices:
        raise ConfigurationError("devices must list at least one device")
    top["release"] = _release(top.get("release", {}))
    top["graph"] = _graph(top.get("graph", {}))
    return SimulatedSpec(devices=tuple(devices), **top)


def _reject_constant(token: str) -> float:
    raise ConfigurationError(f"{token} is not allowed in a simulated spec")


def spec_from_mapping(data: object, *, source: str = "spec") -> SimulatedSpec:
    """Build a :class:`SimulatedSpec` from parsed JSON or TOML; errors name ``source``."""
    return _read(lambda: data, source)


def load_spec(path: str | os.PathLike[str]) -> SimulatedSpec:
    """Read and validate a spec file: TOML when its name ends in ``.toml``, JSON otherwise.

    Raises:
        ConfigurationError: For a missing, unreadable, oversized or malformed file, naming it.
    """
    p = Path(path)
    raw = _files.read_document(
        p, limit=MAX_SPEC_BYTES, what="simulated spec", limit_text=f"{MAX_SPEC_BYTES // MIB} MiB"
    )
    return _read(lambda: _parse(raw.decode("utf-8"), toml=p.suffix.lower() == ".toml"), str(p))


def _parse(text: str, *, toml: bool) -> object:
    return _files.parse_toml(text) if toml else json.loads(text, parse_constant=_reject_constant)


def _read(parse: Callable[[], object], source: str) -> SimulatedSpec:
    """Return the spec ``parse()`` gives, its errors (any) as one naming ``source``."""
    try:
        return _spec(parse())
    except UnicodeDecodeError:
        words = "not UTF-8 text"
    except ConfigurationError as exc:
        words = str(exc)
    except RecursionError:
        words = "nested too deeply"
    except ValueError as exc:  # JSONDecodeError, TOMLDecodeError, int digit limits
        words = "malformed: " + (str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    raise ConfigurationError(f"simulated spec {source}: {words}") from None

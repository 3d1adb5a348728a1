"""Reading simulated-platform specs (JSON or TOML files, and mappings) as untrusted input.

Files go through the one reader (:mod:`accelplat._files`), sizes through the one size grammar;
a bad field is a ``ConfigurationError`` naming it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Set
from pathlib import Path
from typing import Any

from accelplat import _files, _validate
from accelplat._backends.simulated._model import (
    FIELDS,
    MAX_DEVICE_BYTES,
    MAX_DEVICES,
    MAX_HOLDERS,
    MAX_SEGMENTS,
    MAX_SPEC_BYTES,
    LazyRelease,
    Linear,
    Segment,
    SimulatedDevice,
    SimulatedHolder,
    SimulatedSpec,
    Step,
    check_size,
    check_text,
    check_time,
    check_utilization,
)
from accelplat._types import MIB, GraphSupport, HolderState, ReleaseProfile
from accelplat._validate import parse_size
from accelplat.errors import ConfigurationError

_list = FIELDS.array
_bool = FIELDS.boolean


def _size(value: object, where: str) -> int:
    """Parse a byte count: an int, a JSON float (floored), or text in the one size grammar."""
    if isinstance(value, float):
        number = _validate.byte_count(value, where)
    elif isinstance(value, str) and len(value) > 64:
        raise ConfigurationError(f"{where} is not a size: {value[:64]!r}…")
    elif isinstance(value, int) and not isinstance(value, bool):
        number = check_size(value, where)
    elif isinstance(value, (str, int)):
        number = parse_size(value, argument=where)
    else:
        raise ConfigurationError(f"{where} must be a size, got {value!r}")
    if number > MAX_DEVICE_BYTES:
        raise ConfigurationError(f"{where} must be at most 1 PiB, got {value!r}")
    return number


def _table(
    value: object, where: str, allowed: Set[str], required: Set[str] = frozenset()
) -> dict[str, Any]:
    return dict(FIELDS.mapping(value, where, allowed, required))


def _optional_size(data: dict[str, Any], key: str, where: str) -> int | None:
    return None if key not in data else _size(data[key], f"{where}.{key}")


def _state(value: object, where: str) -> HolderState:
    try:
        return HolderState(value)
    except ValueError:
        names = ", ".join(s.value for s in HolderState)
        raise ConfigurationError(f"{where} must be one of {names}, got {value!r}") from None


def _holder(raw: object, where: str, *, stuck: bool) -> SimulatedHolder:
    keys = {"used", "pid", "name", "state"} | ({"at"} if stuck else {"start", "end"})
    data = _table(raw, where, keys, {"used"})
    start_key = "at" if stuck else "start"
    end = None if stuck or data.get("end") is None else check_time(data["end"], f"{where}.end")
    pid = data.get("pid")
    if pid is not None:
        _validate.integer(pid, f"{where}.pid", expected="an integer")
    return SimulatedHolder(
        used=_size(data["used"], f"{where}.used"),
        start=check_time(data.get(start_key, 0.0), f"{where}.{start_key}"),
        end=end,
        pid=pid,
        name=check_text(data.get("name", ""), f"{where}.name"),
        state=_state(data.get("state", "alive"), f"{where}.state"),
    )


def _segment(raw: object, where: str) -> Segment | SimulatedHolder:
    raw = FIELDS.mapping(raw, where)
    if "linear" in raw:
        _table(raw, where, {"linear"})
        where += ".linear"
        data = _table(raw["linear"], where, {"from", "to", "start", "end"}, {"to", "start", "end"})
        return Linear(
            start=check_time(data["start"], f"{where}.start"),
            end=check_time(data["end"], f"{where}.end"),
            to=_size(data["to"], f"{where}.to"),
            from_=_optional_size(data, "from", where),
        )
    if "lazy" in raw:
        _table(raw, where, {"lazy"})
        where += ".lazy"
        keys = {"from", "to", "start", "tau", "delay", "granularity"}
        data = _table(raw["lazy"], where, keys, {"to", "start", "tau"})
        return LazyRelease(
            start=check_time(data["start"], f"{where}.start"),
            to=_size(data["to"], f"{where}.to"),
            tau_s=check_time(data["tau"], f"{where}.tau", positive=True),
            from_=_optional_size(data, "from", where),
            delay_s=check_time(data.get("delay", 0.0), f"{where}.delay"),
            granularity=max(1, _size(data.get("granularity", MIB), f"{where}.granularity")),
        )
    if "stuck" in raw:
        _table(raw, where, {"stuck"})
        return _holder(raw["stuck"], f"{where}.stuck", stuck=True)
    data = _table(raw, where, {"at", "used"}, {"at", "used"})
    return Step(at=check_time(data["at"], f"{where}.at"), used=_size(data["used"], f"{where}.used"))


def _device(raw: object, where: str) -> tuple[SimulatedDevice, int]:
    keys = {"total", "used", "timeline", "holders", "name", "reserved", "report_holders", "uuid",
            "count"}  # fmt: skip
    data = _table(raw, where, keys, {"total"})
    segments: list[Segment] = []
    holders: list[SimulatedHolder] = []
    for i, item in enumerate(_list(data.get("timeline", []), f"{where}.timeline", MAX_SEGMENTS)):
        parsed = _segment(item, f"{where}.timeline[{i}]")
        if isinstance(parsed, SimulatedHolder):
            holders.append(parsed)
        else:
            segments.append(parsed)
    for i, item in enumerate(_list(data.get("holders", []), f"{where}.holders", MAX_HOLDERS)):
        holders.append(_holder(item, f"{where}.holders[{i}]", stuck=False))
    if len(holders) > MAX_HOLDERS:
        raise ConfigurationError(f"{where} has more than {MAX_HOLDERS} holders")
    count = _validate.integer(
        data.get("count", 1),
        f"{where}.count",
        minimum=1,
        maximum=MAX_DEVICES,
        expected=f"an integer in [1, {MAX_DEVICES}]",
    )
    report, uuid = data.get("report_holders"), data.get("uuid")
    fields: dict[str, Any] = {
        "total": _size(data["total"], f"{where}.total"),
        "used": _size(data.get("used", 0), f"{where}.used"),
        "timeline": tuple(segments),
        "holders": tuple(holders),
        "name": check_text(data.get("name", "Simulated device"), f"{where}.name"),
        "reserved": _size(data.get("reserved", 0), f"{where}.reserved"),
        "report_holders": None if report is None else _bool(report, f"{where}.report_holders"),
        "uuid": None if uuid is None else check_text(uuid, f"{where}.uuid"),
    }
    try:
        device = SimulatedDevice(**fields)
    except ConfigurationError as exc:  # cross-field checks: name the device
        raise ConfigurationError(f"{where}: {exc}") from None
    return device, count


def _release(raw: object) -> ReleaseProfile:
    data = _table(raw, "release", {"lazy", "stable_duration_s", "settle_timeout_s", "idle_floor"})
    return ReleaseProfile(
        lazy=_bool(data.get("lazy", False), "release.lazy"),
        stable_duration_s=check_time(
            data.get("stable_duration_s", 0.0), "release.stable_duration_s"
        ),
        settle_timeout_s=check_time(
            data.get("settle_timeout_s", 120.0), "release.settle_timeout_s"
        ),
        idle_floor_bytes=_size(data.get("idle_floor", 0), "release.idle_floor"),
    )


def _graph(raw: object) -> GraphSupport:
    data = _table(raw, "graph", {"available", "api", "reason"})
    available = _bool(data.get("available", False), "graph.available")
    api = data.get("api")
    if api is not None:
        check_text(api, "graph.api")
    reason = check_text(data.get("reason", "configured by the simulated spec"), "graph.reason")
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
        return _spec(data)
    except ConfigurationError as exc:
        raise ConfigurationError(f"simulated spec {source}: {exc}") from None
    except RecursionError:
        raise ConfigurationError(f"simulated spec {source}: nested too deeply") from None


def _spec(data: object) -> SimulatedSpec:
    keys = {"version", "name", "device_type", "clock", "default_memory_utilization",
            "preferred_start_method", "release", "graph", "devices"}  # fmt: skip
    top = _table(data, "top level", keys, {"devices"})
    version = top.get("version", 1)
    if version != 1 or isinstance(version, bool):
        raise ConfigurationError(f"version must be 1, got {version!r}")
    raw_devices = _list(top["devices"], "devices", MAX_DEVICES)
    counts = [d.get("count", 1) if isinstance(d, dict) else 1 for d in raw_devices]
    too_many = f"a simulated platform has at most {MAX_DEVICES} devices"
    if all(type(c) is int and 1 <= c <= MAX_DEVICES for c in counts) and sum(counts) > MAX_DEVICES:
        raise ConfigurationError(too_many)  # before validating thousands of segments
    devices: list[SimulatedDevice] = []
    for i, raw in enumerate(raw_devices):
        device, count = _device(raw, f"devices[{i}]")
        if len(devices) + count > MAX_DEVICES:
            raise ConfigurationError(too_many)
        devices.extend([device] * count)
    if not devices:
        raise ConfigurationError("devices must list at least one device")
    util = check_utilization(top.get("default_memory_utilization", 0.92))
    return SimulatedSpec(
        devices=tuple(devices),
        name=top.get("name", "simulated"),
        device_type=check_text(top.get("device_type", "cuda"), "device_type"),
        release=_release(top.get("release", {})),
        graph=_graph(top.get("graph", {})),
        default_memory_utilization=util,
        preferred_start_method=top.get("preferred_start_method", "fork"),
        clock=top.get("clock", "real"),
    )


def _reject_constant(token: str) -> float:
    raise ConfigurationError(f"{token} is not allowed in a simulated spec")


def load_spec(path: str | os.PathLike[str]) -> SimulatedSpec:
    """Read and validate a spec file: TOML when its name ends in ``.toml``, JSON otherwise.

    Raises:
        ConfigurationError: For a missing, unreadable, oversized or malformed file, naming it.
    """
    p = Path(path)
    raw = _files.read_document(
        p, limit=MAX_SPEC_BYTES, what="simulated spec", limit_text=f"{MAX_SPEC_BYTES // MIB} MiB"
    )
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

"""Reading simulated-platform specs: JSON or TOML files and mappings, as untrusted input.

Files go through the one reader (:mod:`accelplat._files`), sizes through the one size grammar
(:func:`accelplat._sizing.parse_size`); a bad field is a ``ConfigurationError`` naming it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from accelplat import _files, _validate
from accelplat._backends._sim_model import (
    FIELDS as _FIELDS,
)
from accelplat._backends._sim_model import (
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
    check_text,
    check_time,
)
from accelplat._sizing import parse_size
from accelplat._types import MIB, GraphSupport, ReleaseProfile
from accelplat._usage import HolderState
from accelplat.errors import ConfigurationError

__all__ = []

# --------------------------------------------------------------------------------------------
# spec parsing


def _parse_size(value: object, where: str = "size") -> int:
    """Parse a byte count: an int, a JSON float (floored), or text in the one size grammar.

    Text goes through :func:`accelplat._sizing.parse_size` (``"4GiB"``, ``"512 MiB"``, ``"8GB"``).

    Raises:
        ConfigurationError: Naming ``where``, for anything else, negative or above 1 PiB.
    """
    if isinstance(value, float):
        number = _validate.byte_count(value, where)
    elif isinstance(value, str) and len(value) > 64:
        raise ConfigurationError(f"{where} is not a size: {value[:64]!r}…")
    elif isinstance(value, (str, int)):
        number = parse_size(value, argument=where)
    else:
        raise ConfigurationError(f"{where} must be a size, got {value!r}")
    if number > MAX_DEVICE_BYTES:
        raise ConfigurationError(f"{where} must be at most 1 PiB, got {value!r}")
    return number


_list = _FIELDS.array
_bool = _FIELDS.boolean


def _table(
    value: object, where: str, allowed: AbstractSet[str], required: AbstractSet[str] = frozenset()
) -> dict[str, Any]:
    return dict(_FIELDS.mapping(value, where, allowed, required))


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
    end = None if stuck or data.get("end") is None else check_time(data["end"], f"{where}.end")
    pid = data.get("pid")
    if pid is not None:
        _validate.integer(pid, f"{where}.pid", expected="an integer")
    return SimulatedHolder(
        used=_parse_size(data["used"], f"{where}.used"),
        start=check_time(data.get(start_key, 0.0), f"{where}.{start_key}"),
        end=end,
        pid=pid,
        name=check_text(data.get("name", ""), f"{where}.name"),
        state=_state(data.get("state", "alive"), f"{where}.state"),
    )


def _parse_segment(raw: object, where: str) -> Segment | SimulatedHolder:
    raw = _FIELDS.mapping(raw, where)
    if "linear" in raw:
        _table(raw, where, {"linear"})
        data = _table(raw["linear"], f"{where}.linear", {"from", "to", "start", "end"},
                      {"to", "start", "end"})  # fmt: skip
        return Linear(
            start=check_time(data["start"], f"{where}.linear.start"),
            end=check_time(data["end"], f"{where}.linear.end"),
            to=_parse_size(data["to"], f"{where}.linear.to"),
            from_=None if "from" not in data else _parse_size(data["from"], f"{where}.linear.from"),
        )
    if "lazy" in raw:
        _table(raw, where, {"lazy"})
        keys = {"from", "to", "start", "tau", "delay", "granularity"}
        data = _table(raw["lazy"], f"{where}.lazy", keys, {"to", "start", "tau"})
        return LazyRelease(
            start=check_time(data["start"], f"{where}.lazy.start"),
            to=_parse_size(data["to"], f"{where}.lazy.to"),
            tau_s=check_time(data["tau"], f"{where}.lazy.tau", positive=True),
            from_=None if "from" not in data else _parse_size(data["from"], f"{where}.lazy.from"),
            delay_s=check_time(data.get("delay", 0.0), f"{where}.lazy.delay"),
            granularity=max(
                1, _parse_size(data.get("granularity", MIB), f"{where}.lazy.granularity")
            ),
        )
    if "stuck" in raw:
        _table(raw, where, {"stuck"})
        return _parse_holder(raw["stuck"], f"{where}.stuck", stuck=True)
    data = _table(raw, where, {"at", "used"}, {"at", "used"})
    return Step(
        at=check_time(data["at"], f"{where}.at"), used=_parse_size(data["used"], f"{where}.used")
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
    count = _validate.integer(
        data.get("count", 1),
        f"{where}.count",
        minimum=1,
        maximum=MAX_DEVICES,
        expected=f"an integer in [1, {MAX_DEVICES}]",
    )
    report = data.get("report_holders")
    uuid = data.get("uuid")
    kwargs: dict[str, Any] = {
        "total": _parse_size(data["total"], f"{where}.total"),
        "used": _parse_size(data.get("used", 0), f"{where}.used"),
        "timeline": tuple(segments),
        "holders": tuple(holders),
        "name": check_text(data.get("name", "Simulated device"), f"{where}.name"),
        "reserved": _parse_size(data.get("reserved", 0), f"{where}.reserved"),
        "report_holders": None if report is None else _bool(report, f"{where}.report_holders"),
        "uuid": None if uuid is None else check_text(uuid, f"{where}.uuid"),
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
        stable_duration_s=check_time(
            data.get("stable_duration_s", 0.0), f"{where}.stable_duration_s"
        ),
        settle_timeout_s=check_time(
            data.get("settle_timeout_s", 120.0), f"{where}.settle_timeout_s"
        ),
        idle_floor_bytes=_parse_size(data.get("idle_floor", 0), f"{where}.idle_floor"),
    )


def _parse_graph(raw: object, where: str) -> GraphSupport:
    data = _table(raw, where, {"available", "api", "reason"})
    available = _bool(data.get("available", False), f"{where}.available")
    api = data.get("api")
    if api is not None:
        check_text(api, f"{where}.api")
    default_reason = "configured by the simulated spec"
    reason = check_text(data.get("reason", default_reason), f"{where}.reason")
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
    util = _validate.number(
        top.get("default_memory_utilization", 0.92),
        "default_memory_utilization",
        above=0,
        maximum=1,
        expected="in (0, 1]",
        not_a_number="a number",
    )
    return SimulatedSpec(
        devices=tuple(devices),
        name=top.get("name", "simulated"),
        device_type=check_text(top.get("device_type", "cuda"), "device_type"),
        release=_parse_release(top.get("release", {}), "release"),
        graph=_parse_graph(top.get("graph", {}), "graph"),
        default_memory_utilization=util,
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

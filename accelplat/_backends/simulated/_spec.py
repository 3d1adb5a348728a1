"""Reading simulated-platform specs (JSON or TOML files, and mappings) as untrusted input."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Set
from pathlib import Path
from typing import Any, TypeVar

from accelplat import _files, _validate
from accelplat._backends.simulated._model import (
    FIELDS,
    MAX_DEVICES,
    MAX_HOLDERS,
    MAX_SEGMENTS,
    MAX_SLICES,
    MAX_SPEC_BYTES,
    LazyRelease,
    Linear,
    SimulatedDevice,
    SimulatedHolder,
    SimulatedSpec,
    Step,
    check_size,
    check_text,
    check_time,
)
from accelplat._types import MIB, GraphSupport, ReleaseProfile
from accelplat._validate import parse_size
from accelplat.errors import ConfigurationError

_T = TypeVar("_T")
_list = FIELDS.array
_bool = FIELDS.boolean


def _size(value: object, where: str) -> int:
    """Read a byte count: an int, a JSON float (floored), or text (<= 64 characters) as a size."""
    if isinstance(value, str) and len(value) > 64:
        raise ConfigurationError(f"{where} is not a size: {value[:64]!r}…")
    if isinstance(value, float):
        return _validate.byte_count(value, where)
    if isinstance(value, str):
        return parse_size(value, argument=where)
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
        lazy=_bool(get("lazy", False), "release.lazy"),
        stable_duration_s=check_time(get("stable_duration_s", 0.0), "release.stable_duration_s"),
        settle_timeout_s=check_time(get("settle_timeout_s", 120.0), "release.settle_timeout_s"),
        idle_floor_bytes=check_size(_size(get("idle_floor", 0), idle), idle),
    )


def _graph(raw: object) -> GraphSupport:
    data = _table(raw, "graph", {"available", "api", "reason"})
    available = _bool(data.get("available", False), "graph.available")
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
    if not toml:
        return json.loads(text, parse_constant=_reject_constant)
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on Python 3.10 only
        import tomli as tomllib
    return tomllib.loads(text)


def _read(parse: Callable[[], object], source: str) -> SimulatedSpec:
    """Return the spec ``parse()`` gives, its errors (any) as one naming ``source``."""
    where = f"simulated spec {source}"
    try:
        return _spec(parse())
    except UnicodeDecodeError:
        raise ConfigurationError(f"{where}: not UTF-8 text") from None
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
    except RecursionError:
        raise ConfigurationError(f"{where}: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, TOMLDecodeError, int digit limits
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigurationError(f"{where}: malformed: {first}") from None

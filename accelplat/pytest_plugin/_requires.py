"""The ``accelplat_requires`` marker: parse its arguments, and say which requirements are unmet."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from accelplat._util import format_bytes
from accelplat.errors import ConfigurationError, MarkerError
from accelplat.pytest_plugin._shared import current

if TYPE_CHECKING:
    from accelplat._capabilities import Capability
    from accelplat._platform import Platform

MARKER = (
    "accelplat_requires(*capabilities, devices=None, device_memory=None, platforms=None, "
    "shm=None, shm_path='/dev/shm'): skip unless every named accelplat capability is available "
    "and every resource requirement is met (sizes with a unit: '40GiB'); the reason lists each "
    "unmet one"
)  # shown by pytest --markers

_KEYWORDS = ("devices", "device_memory", "platforms", "shm", "shm_path")


@dataclass(frozen=True)
class Requires:  # what one marker asks for
    names: tuple[str, ...]
    devices: int | None
    device_memory: int | None
    platforms: tuple[str, ...]
    shm: int | None
    shm_path: str | None


def _size(value: object, keyword: str) -> int:
    """A size a person typed: text with a unit; a bare number is refused, naming the units."""
    from accelplat._validate import parse_size

    what = f"accelplat_requires({keyword}=)"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise MarkerError(f"{what}: {value} has no unit; write {value}GiB, {value}GB or {value}B")
    if not isinstance(value, str):
        raise MarkerError(f"{what} must be a size such as '40GiB', got {value!r}")
    return parse_size(value, argument=what)


def _platform_names(value: object) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    names = items if isinstance(items, (list, tuple)) else ()
    if names and all(isinstance(n, str) and n.strip() for n in names):
        return tuple(n.strip().lower() for n in names)
    raise MarkerError(
        'accelplat_requires(platforms=) takes one or more platform names, e.g. ["cuda", "rocm"]'
    )


def parse(mark: pytest.Mark) -> Requires:
    """Check an ``accelplat_requires`` marker and return what it asks for, else MarkerError."""
    from accelplat._capabilities import BUILTIN, known_names, project_capabilities
    from accelplat._validate import integer

    names = []
    project = project_capabilities()
    for raw in mark.args:
        if not isinstance(raw, str) or not raw.strip():
            raise MarkerError(f"capability names must be strings, got {raw!r}")
        name = raw.strip().lower()
        if name not in BUILTIN and name not in project:
            raise MarkerError(
                f"unknown capability {raw!r} (known: {', '.join(known_names())}); define "
                "project capabilities in [tool.accelplat.capabilities] or with "
                "accelplat._capabilities.define_capability"
            )
        names.append(name)
    kw = mark.kwargs
    if unknown := sorted(set(kw) - set(_KEYWORDS)):
        raise MarkerError(f"unknown keyword(s) {', '.join(unknown)}; known: {', '.join(_KEYWORDS)}")
    memory, shm = kw.get("device_memory"), kw.get("shm")  # None: not asked for
    count = "accelplat_requires(devices=)"
    try:  # a ConfigurationError of the checks reads as a MarkerError
        need = Requires(
            names=tuple(names),
            devices=integer(kw["devices"], count, minimum=1) if "devices" in kw else None,
            device_memory=None if memory is None else _size(memory, "device_memory"),
            platforms=_platform_names(kw["platforms"]) if "platforms" in kw else (),
            shm=None if shm is None else _size(shm, "shm"),
            shm_path=str(kw["shm_path"]) if "shm_path" in kw else None,
        )
    except ConfigurationError as exc:
        raise MarkerError(str(exc)) from None
    if need == Requires((), None, None, (), None, need.shm_path):
        raise MarkerError("accelplat_requires needs at least one capability or requirement")
    return need


# capability tables decided this session, by (id(platform), device, project generation); each
# entry keeps its platform alive, so that the id cannot be reused while cached
_TABLES: dict[tuple[int, int, int], tuple[Platform, Mapping[str, Capability]]] = {}


def _table(platform: Platform, device: int) -> Mapping[str, Capability]:
    from accelplat._capabilities import capabilities, generation

    key = (id(platform), device, generation())
    if key not in _TABLES:
        _TABLES[key] = (platform, capabilities(device, platform=platform))
    return _TABLES[key][1]


def _need_device_memory(platform: Platform, need: int, devices: int) -> str | None:
    count = platform.device_count()
    if count < devices:
        what = "device" if devices == 1 else f"{devices} devices"
        need_text = format_bytes(need)
        return f"needs {need_text} device memory on {what}, {platform.name} has {count} visible"
    for device in range(devices):
        total = platform.memory_info(device).total
        if total < need:
            return (
                f"needs {format_bytes(need)} device memory, {platform.name} device {device} has "
                f"{format_bytes(total)} total"
            )
    return None


def _need_shm(need: int, path: str | None) -> str | None:
    from accelplat._host import DEFAULT_SHM_PATH, shm_info

    path = path or DEFAULT_SHM_PATH
    try:
        info = shm_info(path)
    except ConfigurationError as exc:
        return f"needs {format_bytes(need)} free in {path}: {exc}"
    if info.free >= need:
        return None
    return (
        f"needs {format_bytes(need)} free in {info.path}, found {format_bytes(info.free)} free of "
        f"{format_bytes(info.total)}"
    )


def _unmet(need: Requires, platform: Platform) -> list[str]:
    """Why each requirement of ``need`` is unmet, in the marker's order."""
    name, devices = platform.name, need.devices or 1
    unmet: list[str | None] = []
    if need.platforms and name not in need.platforms:
        unmet.append(f"runs only on {', '.join(need.platforms)}; the current platform is {name}")
    if need.devices is not None and (found := platform.device_count()) < need.devices:
        unmet.append(f"needs {need.devices} devices, {name} has {found} visible")
    for capability in need.names:
        for device in range(min(devices, platform.device_count()) or 1):
            cap = _table(platform, device)[capability]
            if not cap.available:
                where = f" on device {device}" if device else ""
                unmet.append(f"needs {capability}{where}: {cap.reason}")
                break
    if need.device_memory is not None:
        unmet.append(_need_device_memory(platform, need.device_memory, devices))
    if need.shm is not None:
        unmet.append(_need_shm(need.shm, need.shm_path))
    return [reason for reason in unmet if reason is not None]


def skip_reason(item: pytest.Item) -> str | None:
    """Why ``item``'s markers (all must hold) skip it, closest first, or ``None``; MarkerError."""
    marks = list(item.iter_markers("accelplat_requires"))
    if not marks:
        return None
    platform = current(item.config)
    reasons = [r for mark in marks for r in _unmet(parse(mark), platform)]
    return "; ".join(dict.fromkeys(reasons)) or None

"""The ``accelplat_requires`` marker: parse its arguments, and say which requirements are unmet."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

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
)
"""The marker's line registered with pytest (shown by ``pytest --markers``)."""

_GIB = 1024**3
_KEYWORDS = ("devices", "device_memory", "platforms", "shm", "shm_path")


@dataclass(frozen=True)
class Requires:
    """What one ``accelplat_requires`` marker asks for."""

    names: tuple[str, ...]
    devices: int | None
    device_memory: int | None
    platforms: tuple[str, ...]
    shm: int | None
    shm_path: str | None


def _fmt_gib(n: float) -> str:
    return f"{n / _GIB:.1f} GiB"


def _count(value: object) -> int:
    from accelplat import _validate

    try:
        return _validate.integer(value, "accelplat_requires(devices=)", minimum=1)
    except ConfigurationError as exc:
        raise MarkerError(str(exc)) from None


def _size(value: object, keyword: str) -> int:
    """A size a person typed: text with a unit; a bare number is refused, naming the units."""
    from accelplat._validate import parse_size

    what = f"accelplat_requires({keyword}=)"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise MarkerError(f"{what}: {value} has no unit; write {value}GiB, {value}GB or {value}B")
    if not isinstance(value, str):
        raise MarkerError(f"{what} must be a size such as '40GiB', got {value!r}")
    try:
        return parse_size(value, argument=what)
    except ConfigurationError as exc:
        raise MarkerError(str(exc)) from None


def _platform_names(value: object) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if (
        not isinstance(items, (list, tuple))
        or not items
        or not all(isinstance(n, str) and n.strip() for n in items)
    ):
        raise MarkerError(
            'accelplat_requires(platforms=) takes one or more platform names, e.g. ["cuda", "rocm"]'
        )
    return tuple(n.strip().lower() for n in items)


def parse(mark: pytest.Mark) -> Requires:
    """Check an ``accelplat_requires`` marker and return what it asks for.

    Raises:
        MarkerError: For an unknown capability name, an unknown keyword or a bad value.
    """
    from accelplat._capabilities import BUILTIN, known_names, project_capabilities

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
    unknown = sorted(set(kw) - set(_KEYWORDS))
    if unknown:
        raise MarkerError(f"unknown keyword(s) {', '.join(unknown)}; known: {', '.join(_KEYWORDS)}")
    memory, shm = kw.get("device_memory"), kw.get("shm")  # None: not asked for
    need = Requires(
        names=tuple(names),
        devices=_count(kw["devices"]) if "devices" in kw else None,
        device_memory=None if memory is None else _size(memory, "device_memory"),
        platforms=_platform_names(kw["platforms"]) if "platforms" in kw else (),
        shm=None if shm is None else _size(shm, "shm"),
        shm_path=str(kw["shm_path"]) if "shm_path" in kw else None,
    )
    if need == Requires((), None, None, (), None, need.shm_path):
        raise MarkerError("accelplat_requires needs at least one capability or requirement")
    return need


# Requirements: each answers "met" (None) or why not.


def _need_platforms(platform: Platform, names: tuple[str, ...]) -> str | None:
    if platform.name in names:
        return None
    return f"runs only on {', '.join(names)}; the current platform is {platform.name}"


def _need_devices(platform: Platform, needed: int) -> str | None:
    found = platform.device_count()
    if found >= needed:
        return None
    return f"needs {needed} devices, {platform.name} has {found} visible"


_TABLES: dict[tuple[int, int, int], tuple[Platform, Mapping[str, Capability]]] = {}
"""Capability tables already decided this session, by (platform, device, project generation);
each entry keeps its platform alive, so that its ``id`` cannot be reused while cached."""


def _table(platform: Platform, device: int) -> Mapping[str, Capability]:
    from accelplat._capabilities import capabilities, generation

    key = (id(platform), device, generation())
    entry = _TABLES.get(key)
    if entry is None:
        entry = _TABLES[key] = (platform, capabilities(device, platform=platform))
    return entry[1]


def _need_capability(platform: Platform, name: str, devices: int) -> str | None:
    for device in range(min(devices, platform.device_count()) or 1):
        cap = _table(platform, device)[name]
        if not cap.available:
            where = f" on device {device}" if device else ""
            return f"needs {name}{where}: {cap.reason}"
    return None


def _need_device_memory(platform: Platform, need: int, devices: int) -> str | None:
    count = platform.device_count()
    if count < devices:
        what = "device" if devices == 1 else f"{devices} devices"
        return (
            f"needs {_fmt_gib(need)} device memory on {what}, {platform.name} has {count} visible"
        )
    for device in range(devices):
        total = platform.memory_info(device).total
        if total < need:
            return (
                f"needs {_fmt_gib(need)} device memory, {platform.name} device {device} has "
                f"{_fmt_gib(total)} total"
            )
    return None


def _need_shm(need: int, path: str) -> str | None:
    from accelplat._host import shm_info

    try:
        info = shm_info(path)
    except ConfigurationError as exc:
        return f"needs {_fmt_gib(need)} free in {path}: {exc}"
    if info.free >= need:
        return None
    return (
        f"needs {_fmt_gib(need)} free in {info.path}, found {_fmt_gib(info.free)} free of "
        f"{_fmt_gib(info.total)}"
    )


def _unmet(need: Requires, platform: Platform) -> list[str]:
    from accelplat._host import DEFAULT_SHM_PATH

    devices = need.devices or 1
    unmet = [
        _need_platforms(platform, need.platforms) if need.platforms else None,
        _need_devices(platform, need.devices) if need.devices is not None else None,
        *(_need_capability(platform, name, devices) for name in need.names),
        (
            _need_device_memory(platform, need.device_memory, devices)
            if need.device_memory is not None
            else None
        ),
        _need_shm(need.shm, need.shm_path or DEFAULT_SHM_PATH) if need.shm is not None else None,
    ]
    return [reason for reason in unmet if reason is not None]


def skip_reason(item: pytest.Item) -> str | None:
    """Return why ``item`` must be skipped by its ``accelplat_requires`` markers, or ``None``.

    Every marker on the item (function, class, module, ``pytestmark``) must hold; the reasons of
    every unmet requirement are joined with ``"; "``, the closest marker's first.

    Args:
        item: A collected test.

    Returns:
        The reason, or ``None`` when the test may run (or has no such marker).

    Raises:
        MarkerError: For a marker with malformed arguments.

    Side effects:
        Detects the platform on the first marker found; reads memory figures for the memory
        requirements.
    """
    marks = list(item.iter_markers("accelplat_requires"))
    if not marks:
        return None
    platform = current(item.config)
    reasons = [r for mark in marks for r in _unmet(parse(mark), platform)]
    return "; ".join(dict.fromkeys(reasons)) or None

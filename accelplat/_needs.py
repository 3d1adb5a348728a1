"""What a test needs: requirements, devices, device memory, ``/dev/shm``; parsed and decided.

The one place the marker, ``accelplat.testing.requires`` and ``skip_module_unless`` decide
whether a test runs. Devices are accelerators only: the host CPU never counts as one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from accelplat._capabilities import capabilities, generation, judged_by, requirement
from accelplat._platform import optional
from accelplat._requirement import Requirement
from accelplat._util import format_bytes
from accelplat._validate import integer, parse_size
from accelplat.errors import ConfigurationError

if TYPE_CHECKING:
    from accelplat._platform import Platform
    from accelplat._requirement import Capability

KEYWORDS = ("devices", "device_memory", "platforms", "shm", "shm_path")


@dataclass(frozen=True)
class Needs:
    """What one marker (or ``requires`` call) asks for; sizes in bytes."""

    requirements: tuple[Requirement, ...]
    devices: int | None = None
    device_memory: int | None = None
    platforms: tuple[str, ...] = ()
    shm: int | None = None
    shm_path: str | None = None


def _size(value: object, keyword: str, what: str) -> int:
    """A size a person typed: text with a unit; a bare number is refused, naming the units."""
    where = f"{what}({keyword}=)"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ConfigurationError(
            f"{where}: {value} has no unit; write {value}GiB, {value}GB or {value}B"
        )
    if not isinstance(value, str):
        raise ConfigurationError(f"{where} must be a size such as '40GiB', got {value!r}")
    return parse_size(value, argument=where)


def _platform_names(value: object, what: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    names = items if isinstance(items, (list, tuple)) else ()
    if names and all(isinstance(n, str) and n.strip() for n in names):
        return tuple(n.strip().lower() for n in names)
    raise ConfigurationError(
        f'{what}(platforms=) takes one or more platform names, e.g. ["cuda", "rocm"]'
    )


def parse_needs(
    args: tuple[object, ...], kwargs: Mapping[str, object], what: str = "accelplat_requires"
) -> Needs:
    """Check a marker's or call's arguments and return what they ask for.

    Args:
        args: Requirements (``"fp8"``, ``"xpu or (cuda and capability>=90)"``).
        kwargs: ``devices``, ``device_memory`` and ``shm`` (sizes with a unit), ``platforms``,
            ``shm_path``.
        what: The name errors quote.

    Raises:
        ConfigurationError: A malformed requirement, an unknown word or keyword, a bare size.
    """
    requirements = []
    for raw in args:
        if not isinstance(raw, str) or not raw.strip():
            raise ConfigurationError(f"{what}: requirements must be strings, got {raw!r}")
        requirements.append(requirement(raw))
    if unknown := sorted(set(kwargs) - set(KEYWORDS)):
        raise ConfigurationError(
            f"{what}: unknown keyword(s) {', '.join(unknown)}; known: {', '.join(KEYWORDS)}"
        )
    devices, memory, shm = (kwargs.get(k) for k in ("devices", "device_memory", "shm"))
    need = Needs(
        requirements=tuple(requirements),
        devices=None if devices is None else integer(devices, f"{what}(devices=)", minimum=1),
        device_memory=None if memory is None else _size(memory, "device_memory", what),
        platforms=_platform_names(kwargs["platforms"], what) if "platforms" in kwargs else (),
        shm=None if shm is None else _size(shm, "shm", what),
        shm_path=str(kwargs["shm_path"]) if "shm_path" in kwargs else None,
    )
    if need == Needs((), shm_path=need.shm_path):
        raise ConfigurationError(f"{what} needs at least one requirement")
    return need


# capability tables decided this session, by (id(platform), device, project generation); each
# entry keeps its platform alive, so that the id cannot be reused while cached
_TABLES: dict[tuple[int, int, int], tuple[Platform, Mapping[str, Capability]]] = {}


def forget_tables() -> None:
    """Drop the cached capability tables (a new session, another platform)."""
    _TABLES.clear()


def _table(platform: Platform, device: int) -> Mapping[str, Capability]:
    key = (id(platform), device, generation())
    if key not in _TABLES:
        _TABLES[key] = (platform, capabilities(device, platform=platform))
    return _TABLES[key][1]


def accelerator_count(platform: Platform) -> int:
    """The platform's visible devices that are accelerators (the host CPU is none)."""
    return 0 if optional(platform, "is_accelerator") is False else platform.device_count()


def _accelerators(n: int) -> str:
    return "an accelerator" if n == 1 else f"{n} accelerators"


def _need_device_memory(platform: Platform, need: int, devices: int, count: int) -> str | None:
    if count < devices:
        return (
            f"needs {format_bytes(need)} device memory on {_accelerators(devices)}, "
            f"{platform.name} has {count} visible"
        )
    for device in range(devices):
        total = platform.memory_info(device).total
        if total < need:
            return (
                f"needs {format_bytes(need)} device memory, {platform.name} device {device} has "
                f"{format_bytes(total)} total"
            )
    return None


def _need_shm(need: int, path: str | None) -> str | None:
    from accelplat._shm import DEFAULT_SHM_PATH, shm_info

    path = path or DEFAULT_SHM_PATH
    try:
        info = shm_info(path)
    except ConfigurationError as exc:
        return f"needs {format_bytes(need)} free in {path}: {exc}"
    if info.free >= need:
        return None
    return (
        f"needs {format_bytes(need)} free in {info.path}, found {format_bytes(info.free)} free "
        f"of {format_bytes(info.total)}"
    )


def unmet(need: Needs, platform: Platform) -> list[str]:
    """Why each part of ``need`` is unmet on ``platform``, in the order asked; empty: all met.

    A requirement is decided on each of the first ``devices`` devices (device 0 by default).
    Creates no device context.
    """
    judge = judged_by(platform)  # vLLM's own platform where vLLM is installed
    name, count = platform.name, accelerator_count(platform)
    reasons: list[str | None] = []
    if need.platforms and judge.name not in need.platforms:
        runs = ", ".join(need.platforms)
        reasons.append(f"runs only on {runs}; the current platform is {judge.name}")
    if need.devices is not None and count < need.devices:
        reasons.append(f"needs {_accelerators(need.devices)}, {name} has {count} visible")
    visible = judge.device_count()
    infos = judge.devices() if visible else []
    for req in need.requirements:
        for device in range(min(need.devices or 1, visible) or 1):
            info = infos[device] if device < len(infos) else None
            held, why = req.evaluate(judge, info, _table(judge, device))
            if not held:
                where = f" on device {device}" if device else ""
                reasons.append(f"needs {req.text}{where}: {why}")
                break
    if need.device_memory is not None:
        reasons.append(_need_device_memory(platform, need.device_memory, need.devices or 1, count))
    if need.shm is not None:
        reasons.append(_need_shm(need.shm, need.shm_path))
    return list(dict.fromkeys(r for r in reasons if r is not None))

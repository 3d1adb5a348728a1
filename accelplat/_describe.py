"""The description of this machine that ``accelplat info`` prints and a capture records.

One JSON-ready dictionary (keys in ``docs/cli.md``): the platform chosen and why, its data, every
visible device and device 0's capabilities. Below the CLI so capture and replay share it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from accelplat._platform import optional
from accelplat.errors import AccelplatError

if TYPE_CHECKING:
    from accelplat._platform import Platform

# Version of every JSON document accelplat prints: a new key keeps it, a changed or removed one
# bumps it (2: `wait` lists its devices as `stats` does; docs/json.md).
SCHEMA_VERSION = 2


def driver_version(platform: Platform) -> str | None:
    """Return the vendor driver's version the platform reports, ``None`` when it cannot tell."""
    get = optional(platform, "driver_version")
    with contextlib.suppress(AccelplatError):
        version = get() if callable(get) else None
        return None if version is None else str(version)
    return None


def _device_entries(platform: Platform) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for dev in platform.devices():
        cc = dev.compute_capability
        entry = {**asdict(dev), "compute_capability": list(cc) if cc else None}
        try:
            entry.update(memory=asdict(platform.memory_info(dev.index)), error=None)
        except AccelplatError as exc:
            entry.update(memory=None, error=str(exc))
        entries.append(entry)
    return entries


def collect_info() -> dict[str, Any]:
    """Gather what ``accelplat info`` shows; probes everything, loads ./pyproject.toml's table."""
    from accelplat._registry import current_platform, detect

    report = detect()
    info: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "platform": report.chosen,
        "forced": report.forced,
        "error": report.error,
        "candidates": [asdict(c) for c in report.candidates],
    }
    if report.chosen is None:
        return info
    platform = current_platform()
    env = platform.visible_devices_env
    info.update(
        {
            "driver_version": driver_version(platform),
            "device_type": platform.device_type,
            "visible_devices_env": env,
            "visible_devices": os.environ.get(env) if env else None,
            "default_memory_utilization": platform.default_memory_utilization,
            "preferred_start_method": platform.preferred_start_method,
            "context_free": platform.context_free,
            "release": asdict(platform.release),
            "graph": asdict(platform.graph),
            "devices": _device_entries(platform),
            "lease_units": _unit_entries(platform),
            "requirements_judged_on": _judged_on(platform),
            "capabilities": _capability_entries(platform),
        }
    )
    return info


def _unit_entries(platform: Platform) -> list[dict[str, Any]]:
    """Each lease unit (a MIG slice of each GPU …) as a child given only it sees it."""
    units, restrict = optional(platform, "lease_units"), optional(platform, "restricted")
    entries: list[dict[str, Any]] = []
    try:
        for value in units() if callable(units) and callable(restrict) else ():
            # a unit that shows a child no device is left out (the lease says why)
            entries.extend({**e, "value": value} for e in _device_entries(restrict(value))[:1])
    except AccelplatError:  # the driver failed while listing units: none to offer
        return []
    return entries


def _judged_on(platform: Platform) -> dict[str, str] | None:
    """The platform requirements are judged on where it is not this one (vLLM's own), and why."""
    from accelplat.integrations._installed import choice

    chosen = choice(platform)
    return None if chosen is None else {"platform": chosen[0].name, "reason": chosen[1]}


def _capability_entries(platform: Platform) -> dict[str, dict[str, Any]]:
    """Device 0's capability table, with the project's from ``./pyproject.toml`` if any."""
    from accelplat._capabilities import capabilities, load_pyproject

    if os.path.isfile("pyproject.toml"):
        load_pyproject("pyproject.toml")
    if platform.device_count() == 0:
        return {}
    return {name: asdict(cap) for name, cap in capabilities(0, platform=platform).items()}

"""The description of this machine that ``accelplat info`` prints and a capture records.

The platform chosen and why (every candidate's reason), its data (release profile, graphs,
defaults, visible-devices variable), every visible device with identity and memory, and device
0's capability table: one JSON-ready dictionary (keys in ``docs/cli.md``). It lives below the
command line so that capture and replay record and compare the same document.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from accelplat.errors import AccelplatError

if TYPE_CHECKING:
    from accelplat._platform import Platform

SCHEMA_VERSION = 1
"""Version of the JSON documents accelplat prints (``accelplat info``'s and every ``--json``
output): adding a key keeps it, a key that changes meaning or disappears bumps it."""


def _device_entries(platform: Platform) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for dev in platform.devices():
        entry: dict[str, Any] = {
            "index": dev.index,
            "physical_index": dev.physical_index,
            "name": dev.name,
            "uuid": dev.uuid,
            "pci_bus_id": dev.pci_bus_id,
            "arch": dev.arch,
            "compute_capability": list(dev.compute_capability) if dev.compute_capability else None,
            "memory": None,
            "error": None,
        }
        try:
            mem = platform.memory_info(dev.index)
        except AccelplatError as exc:
            entry["error"] = str(exc)
        else:
            entry["memory"] = {
                "free": mem.free,
                "used": mem.used,
                "total": mem.total,
                "reserved": mem.reserved,
                "source": mem.source,
            }
        entries.append(entry)
    return entries


def collect_info() -> dict[str, Any]:
    """Gather everything ``accelplat info`` shows, as a JSON-ready dictionary.

    A capture (:mod:`accelplat.replay`) records this document; a replay answers it again.

    Returns:
        A dictionary with the keys documented in ``docs/cli.md``.

    Raises:
        AccelplatError: When detection itself fails (e.g. an unknown ``ACCELPLAT_PLATFORM``).

    Side effects:
        Probes every platform, queries memory, and loads ``./pyproject.toml``'s capability
        table if there is one.
    """
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
            "device_type": platform.device_type,
            "visible_devices_env": env,
            "visible_devices": os.environ.get(env) if env else None,
            "default_memory_utilization": platform.default_memory_utilization,
            "preferred_start_method": platform.preferred_start_method,
            "context_free": platform.context_free,
            "release": asdict(platform.release),
            "graph": asdict(platform.graph),
            "devices": _device_entries(platform),
            "capabilities": _capability_entries(platform),
        }
    )
    return info


def _capability_entries(platform: Platform) -> dict[str, dict[str, Any]]:
    """Device 0's capability table, with the project's from ``./pyproject.toml`` if any."""
    from pathlib import Path

    from accelplat._capabilities import capabilities, load_pyproject

    if Path("pyproject.toml").is_file():
        load_pyproject("pyproject.toml")
    if platform.device_count() == 0:
        return {}
    return {name: asdict(cap) for name, cap in capabilities(0, platform=platform).items()}

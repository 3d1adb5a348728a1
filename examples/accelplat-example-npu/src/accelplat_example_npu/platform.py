"""A fake NPU backend for accelplat, written against the ``Platform`` protocol alone.

The "hardware" is a JSON file named by ``EXAMPLE_NPU_CONFIG``::

    {
      "devices": [
        {"name": "Example NPU 16G", "total": 17179869184, "used": 0,
         "reserved": 268435456, "uuid": "NPU-0f3a",
         "holders": [{"pid": 4242, "used_bytes": 1073741824}]}
      ]
    }

``total`` is what applications can use (the reserved part already taken off), ``used`` is what
they hold, and free memory is ``total - used``. The file is read on every query, so a test can
change the "hardware" while a platform object exists. Devices listed in the file are the
physical devices, numbered from 0 in file order.

``EXAMPLE_NPU_VISIBLE_DEVICES`` selects and orders visible devices, like ``CUDA_VISIBLE_DEVICES``:
unset means all, ``"2,0"`` makes physical 2 visible as 0 and physical 0 visible as 1, and an
empty value hides every device. An entry that is not a physical index, or a repeated one, is an
error (:class:`accelplat.errors.ConfigurationError`) naming the variable.

Nothing here imports a framework or creates any context: every answer is a small file read.
"""

from __future__ import annotations

import json
import operator
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from accelplat.errors import ConfigurationError, DeviceNotFoundError
from accelplat.types import (
    DeviceInfo,
    GraphSupport,
    HolderState,
    MemoryHolder,
    MemoryInfo,
    ProbeResult,
    ReleaseProfile,
)

__all__ = ["ENV_CONFIG", "ENV_VISIBLE", "ExampleNpuPlatform"]

ENV_CONFIG = "EXAMPLE_NPU_CONFIG"
"""Variable naming the JSON file that describes the devices."""

ENV_VISIBLE = "EXAMPLE_NPU_VISIBLE_DEVICES"
"""Variable selecting visible devices by physical index."""


@dataclass(frozen=True)
class _Device:
    physical: int
    name: str
    total: int
    used: int
    reserved: int
    uuid: str | None
    holders: tuple[tuple[int, int | None], ...]


def _int_field(raw: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"{where}: {key!r} must be a non-negative integer of bytes")
    return value


def _load_devices(path: str) -> list[_Device]:
    """Read and validate the JSON description of the physical devices."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"{ENV_CONFIG}={path!r} cannot be read: {exc}") from None
    raw_devices = data.get("devices") if isinstance(data, dict) else None
    if not isinstance(raw_devices, list):
        raise ConfigurationError(f"{ENV_CONFIG}={path!r} has no 'devices' list")
    devices: list[_Device] = []
    for i, raw in enumerate(raw_devices):
        where = f"{path}: devices[{i}]"
        if not isinstance(raw, dict):
            raise ConfigurationError(f"{where} is not an object")
        total = _int_field(raw, "total", where)
        used = _int_field(raw, "used", where, 0)
        if used > total:
            raise ConfigurationError(f"{where}: used ({used}) exceeds total ({total})")
        holders = []
        for h in raw.get("holders", []):
            pid = h.get("pid") if isinstance(h, dict) else None
            if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
                raise ConfigurationError(f"{where}: holder {h!r} needs a positive 'pid'")
            held = h.get("used_bytes")
            holders.append((pid, held if isinstance(held, int) else None))
        uuid = raw.get("uuid")
        devices.append(
            _Device(
                physical=i,
                name=str(raw.get("name") or f"Example NPU {i}"),
                total=total,
                used=used,
                reserved=_int_field(raw, "reserved", where, 0),
                uuid=uuid if isinstance(uuid, str) else None,
                holders=tuple(holders),
            )
        )
    return devices


def _visible(physical_count: int) -> list[int]:
    """Apply ``EXAMPLE_NPU_VISIBLE_DEVICES``: visible index to physical index."""
    raw = os.environ.get(ENV_VISIBLE)
    if raw is None:
        return list(range(physical_count))
    chosen: list[int] = []
    for part in raw.split(","):
        entry = part.strip()
        if not entry:
            continue
        if not entry.isdigit() or int(entry) >= physical_count:
            raise ConfigurationError(
                f"{ENV_VISIBLE}={raw!r}: {entry!r} is not a physical device index "
                f"(0..{physical_count - 1})"
            )
        if int(entry) in chosen:
            raise ConfigurationError(f"{ENV_VISIBLE}={raw!r} names device {entry} twice")
        chosen.append(int(entry))
    return chosen


def _holder_state(pid: int) -> HolderState:
    if pid == os.getpid():
        return HolderState.SELF
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return HolderState.GONE
    except PermissionError:
        return HolderState.ALIVE
    return HolderState.ALIVE


class ExampleNpuPlatform:
    """The ``example-npu`` platform: fake NPUs described by ``EXAMPLE_NPU_CONFIG``.

    It satisfies :class:`accelplat.Platform` structurally, without inheriting from anything,
    to show that the protocol is all a backend needs. Construction is free: nothing is read
    until a query.
    """

    name: ClassVar[str] = "example-npu"
    device_type: ClassVar[str] = "npu"
    visible_devices_env: ClassVar[str | None] = ENV_VISIBLE
    visible_devices_empty_hides_all: ClassVar[bool] = True
    """Optional (not part of the protocol): tells the conformance kit that an empty
    ``EXAMPLE_NPU_VISIBLE_DEVICES`` hides every device, so it checks that too."""
    default_memory_utilization: ClassVar[float] = 0.9
    preferred_start_method: ClassVar[Literal["fork", "spawn", "forkserver"]] = "spawn"
    context_free: ClassVar[bool] = True
    release: ClassVar[ReleaseProfile] = ReleaseProfile(
        lazy=True, stable_duration_s=0.1, settle_timeout_s=30.0, idle_floor_bytes=0
    )
    graph: ClassVar[GraphSupport] = GraphSupport(
        False, None, "the example NPU has no graph capture"
    )

    @classmethod
    def probe(cls) -> ProbeResult:
        """Say whether fake devices are configured and visible; reads one small file.

        Returns:
            Unavailable when ``EXAMPLE_NPU_CONFIG`` is unset or invalid, or when
            ``EXAMPLE_NPU_VISIBLE_DEVICES`` hides every device; otherwise available. An
            installed but unconfigured plugin therefore never wins detection.
        """
        path = os.environ.get(ENV_CONFIG)
        if not path:
            return ProbeResult(False, f"{ENV_CONFIG} is not set")
        try:
            count = len(_visible(len(_load_devices(path))))
        except ConfigurationError as exc:
            return ProbeResult(False, str(exc))
        if count == 0:
            return ProbeResult(False, f"no example NPU is visible ({ENV_VISIBLE} hides all)")
        return ProbeResult(True, f"{count} example NPU(s) described by {path}")

    # -- devices ---------------------------------------------------------------------------

    def _visible_devices(self) -> list[_Device]:
        path = os.environ.get(ENV_CONFIG)
        if not path:
            return []
        physical = _load_devices(path)
        return [physical[i] for i in _visible(len(physical))]

    def device_count(self) -> int:
        """Return the number of visible example NPUs."""
        return len(self._visible_devices())

    def devices(self) -> Sequence[DeviceInfo]:
        """Return the visible example NPUs in visible order."""
        return tuple(
            DeviceInfo(index=i, physical_index=d.physical, name=d.name, uuid=d.uuid)
            for i, d in enumerate(self._visible_devices())
        )

    def _device(self, device: object) -> _Device:
        visible = self._visible_devices()
        if isinstance(device, bool):
            raise DeviceNotFoundError(device, len(visible), self.name)
        try:
            index = operator.index(device)  # type: ignore[arg-type]
        except TypeError:
            raise DeviceNotFoundError(device, len(visible), self.name) from None
        if not 0 <= index < len(visible):
            raise DeviceNotFoundError(device, len(visible), self.name)
        return visible[index]

    # -- memory ----------------------------------------------------------------------------

    def memory_info(self, device: int) -> MemoryInfo:
        """Return the memory of visible device ``device`` in bytes.

        Raises:
            DeviceNotFoundError: For an index that is not a visible device.
        """
        d = self._device(device)
        return MemoryInfo(
            free=d.total - d.used,
            total=d.total,
            used=d.used,
            reserved=d.reserved,
            source="example-npu-json",
        )

    def memory_holders(self, device: int) -> Sequence[MemoryHolder] | None:
        """Return the processes the JSON file says hold memory on ``device``.

        Raises:
            DeviceNotFoundError: For an index that is not a visible device.
        """
        d = self._device(device)
        return tuple(
            MemoryHolder(pid=pid, used_bytes=used, state=_holder_state(pid))
            for pid, used in d.holders
        )

    def __repr__(self) -> str:
        return f"<ExampleNpuPlatform {os.environ.get(ENV_CONFIG)!r}>"

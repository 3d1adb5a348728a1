"""A small, context-free reader of Level Zero Sysman through ctypes (layouts from ``zes_api.h``).

``zesInit`` starts Sysman alone (no ``zeInit``, no context, no queue); ``zesMemoryGetState`` gives
each memory module's (each tile's) free and total bytes. A fake fills the pointer out-parameters.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple, TypeVar

from accelplat import _boundary
from accelplat._vendor import facts
from accelplat.errors import LevelZeroError

ZE_RESULT_SUCCESS = 0
ZE_RESULT_ERROR_INVALID_SIZE = 0x78000008
ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES = 0x1
ZES_STRUCTURE_TYPE_PCI_PROPERTIES = 0x2
ZES_STRUCTURE_TYPE_MEM_PROPERTIES = 0xB
ZES_STRUCTURE_TYPE_PROCESS_STATE = 0x16
ZES_STRUCTURE_TYPE_MEM_STATE = 0x1E
ZE_DEVICE_TYPE_GPU = 1
ZE_DEVICE_PROPERTY_FLAG_INTEGRATED = 1 << 0
ZES_MEM_LOC_DEVICE = 1
INTEL_VENDOR_ID = 0x8086


def result_name(code: int) -> str:
    """Return the ``ZE_RESULT_*`` name of a result code, or its hex value."""
    return str(facts("level_zero_results").get(f"0x{code:08x}", f"ze_result_t 0x{code:08x}"))


_U32, _U64, _CHARS64 = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_char * 64
_HEADER = (("stype", _U32), ("pNext", ctypes.c_void_p))  # every Sysman structure begins so


def _each(kind: Any, *names: str) -> tuple[tuple[str, Any], ...]:
    """Consecutive fields of one C type, as a declaration ``uint32_t a, b, c;`` lists them."""
    return tuple((name, kind) for name in names)


class ZesPciAddress(ctypes.Structure):
    """``zes_pci_address_t``."""

    _fields_ = _each(_U32, "domain", "bus", "device", "function")


class ZesPciSpeed(ctypes.Structure):
    """``zes_pci_speed_t``."""

    _fields_ = (*_each(ctypes.c_int32, "gen", "width"), ("maxBandwidth", ctypes.c_int64))


class ZesPciProperties(ctypes.Structure):
    """``zes_pci_properties_t``."""

    _fields_ = (
        *_HEADER,
        ("address", ZesPciAddress),
        ("maxSpeed", ZesPciSpeed),
        *_each(ctypes.c_uint8, "haveBandwidthCounters", "havePacketCounters", "haveReplayCounters"),
    )


class ZeDeviceProperties(ctypes.Structure):
    """``ze_device_properties_t`` (the ``core`` member of ``zes_device_properties_t``)."""

    _fields_ = (
        *_HEADER,
        *_each(_U32, "type", "vendorId", "deviceId", "flags", "subdeviceId", "coreClockRate"),
        ("maxMemAllocSize", _U64),
        *_each(_U32, "maxHardwareContexts", "maxCommandQueuePriority", "numThreadsPerEU"),
        *_each(_U32, "physicalEUSimdWidth", "numEUsPerSubslice", "numSubslicesPerSlice"),
        ("numSlices", _U32),
        ("timerResolution", _U64),
        *_each(_U32, "timestampValidBits", "kernelTimestampValidBits"),
        ("uuid", ctypes.c_uint8 * 16),
        ("name", ctypes.c_char * 256),
    )


class ZesDeviceProperties(ctypes.Structure):
    """``zes_device_properties_t``."""

    _fields_ = (
        *_HEADER,
        ("core", ZeDeviceProperties),
        ("numSubdevices", _U32),
        *_each(_CHARS64, "serialNumber", "boardNumber", "brandName", "modelName"),
        *_each(_CHARS64, "vendorName", "driverVersion"),
    )


class ZesMemProperties(ctypes.Structure):
    """``zes_mem_properties_t``."""

    _fields_ = (
        *_HEADER,
        ("type", _U32),
        ("onSubdevice", ctypes.c_uint8),
        *_each(_U32, "subdeviceId", "location"),
        ("physicalSize", _U64),
        *_each(ctypes.c_int32, "busWidth", "numChannels"),
    )


class ZesMemState(ctypes.Structure):
    """``zes_mem_state_t``."""

    _fields_ = (*_HEADER, ("health", _U32), *_each(_U64, "free", "size"))


class ZesProcessState(ctypes.Structure):
    """``zes_process_state_t``."""

    _fields_ = (
        *_HEADER,
        ("processId", _U32),
        *_each(_U64, "memSize", "sharedSize"),
        ("engines", _U32),
    )


_Struct = TypeVar("_Struct", bound=ctypes.Structure)
_P = ctypes.POINTER
_SIGNATURES: dict[str, tuple[Any, ...]] = {
    "zesInit": (_U32,),
    "zesDriverGet": (_P(_U32), _P(ctypes.c_void_p)),
    "zesDeviceGet": (ctypes.c_void_p, _P(_U32), _P(ctypes.c_void_p)),
    "zesDeviceGetProperties": (ctypes.c_void_p, _P(ZesDeviceProperties)),
    "zesDevicePciGetProperties": (ctypes.c_void_p, _P(ZesPciProperties)),
    "zesDeviceEnumMemoryModules": (ctypes.c_void_p, _P(_U32), _P(ctypes.c_void_p)),
    "zesMemoryGetProperties": (ctypes.c_void_p, _P(ZesMemProperties)),
    "zesMemoryGetState": (ctypes.c_void_p, _P(ZesMemState)),
    "zesDeviceProcessesGetState": (ctypes.c_void_p, _P(_U32), _P(ZesProcessState)),
}


class SysmanDevice(NamedTuple):
    """One physical device as Sysman enumerates it."""

    handle: int  # zes_device_handle_t
    pci_bus_id: str | None  # None when the PCI properties could not be read
    name: str
    uuid: str
    integrated: bool
    num_subdevices: int  # tiles (0: none)
    device_id: int = 0  # the PCI device id (0: unknown)


class MemoryModule(NamedTuple):
    """One memory module's state, in bytes."""

    location: str  # "device" (local) or "system"
    on_subdevice: bool
    subdevice_id: int  # its tile when on_subdevice
    free: int
    size: int  # the physical size when the driver reports 0


def load_loader(name: str) -> Any:
    """Load the Level Zero loader (a name or path) through the vendor boundary; else ``OSError``."""

    def live() -> _boundary.Loaded:
        try:
            return ctypes.CDLL(name), "", ""
        except OSError as exc:
            return None, str(exc), "OSError"

    lib, reason, _ = _boundary.vendor("levelzero", live)
    if lib is None:
        raise OSError(reason)
    return lib


class Sysman:
    """Serialised Sysman queries over ``lib``: a ``ctypes.CDLL`` (signatures set here) or a fake."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self.after_fork()
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(lib, name, None)
            if fn is not None and hasattr(fn, "argtypes"):
                fn.argtypes = list(argtypes)
                fn.restype = ctypes.c_uint32

    def after_fork(self) -> None:
        """Forget the initialisation: "each forked process must call" ``zesInit`` (zes_api.h)."""
        self._lock = threading.Lock()
        self._initialised = False

    def _fn(self, name: str) -> Any:
        fn = getattr(self._lib, name, None)
        if fn is None:
            raise LevelZeroError(  # zesInit: spec 1.5, loader v1.9.4 (the loader's CHANGELOG.md)
                name,
                None,
                f"the Level Zero loader has no {name} (zesInit arrived with spec 1.5 in "
                f"loader v1.9.4; is the loader older?)",
            )
        return fn

    def _call(self, name: str, *args: Any) -> None:
        code = int(self._fn(name)(*args))
        if code != ZE_RESULT_SUCCESS:
            raise LevelZeroError(name, code, vendor_error=result_name(code))

    def init(self) -> None:
        """Initialise Sysman once (``zesInit(0)``; it loads the drivers); later calls do nothing."""
        with self._lock:
            if self._initialised:
                return
            self._call("zesInit", ctypes.c_uint32(0))
            self._initialised = True

    def _handles(self, name: str, *prefix: Any) -> list[int]:
        count = ctypes.c_uint32(0)
        self._call(name, *prefix, ctypes.pointer(count), None)
        if count.value == 0:
            return []
        array = (ctypes.c_void_p * count.value)()
        self._call(name, *prefix, ctypes.pointer(count), array)
        return [int(array[i] or 0) for i in range(count.value)]

    def devices(self) -> list[SysmanDevice]:
        """Return the Intel GPUs of every Sysman driver, in enumeration order."""
        # That order "is NOT affected by ZE_AFFINITY_MASK, ZE_ENABLE_PCI_ID_DEVICE_ORDER, or
        # ZE_FLAT_DEVICE_HIERARCHY" (zes_api.h): the caller applies them.
        self.init()
        found: list[SysmanDevice | None] = []
        with self._lock:
            for driver in self._handles("zesDriverGet"):
                found += map(self._describe, self._handles("zesDeviceGet", ctypes.c_void_p(driver)))
        return [device for device in found if device is not None]

    def _get(self, name: str, handle: int, out: _Struct) -> _Struct:
        self._call(name, ctypes.c_void_p(handle), ctypes.pointer(out))
        return out

    def _describe(self, handle: int) -> SysmanDevice | None:
        import uuid  # only once a device is found: not on the probe of a machine without one

        inner = ZeDeviceProperties(stype=0x3)  # ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES
        wanted = ZesDeviceProperties(stype=ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES, core=inner)
        props = self._get("zesDeviceGetProperties", handle, wanted)
        core = props.core
        if core.vendorId != INTEL_VENDOR_ID or core.type != ZE_DEVICE_TYPE_GPU:
            return None
        pci_bus_id: str | None = None
        with contextlib.suppress(LevelZeroError):
            pci = ZesPciProperties(stype=ZES_STRUCTURE_TYPE_PCI_PROPERTIES)
            a = self._get("zesDevicePciGetProperties", handle, pci).address
            pci_bus_id = f"{a.domain:04x}:{a.bus:02x}:{a.device:02x}.{a.function:x}"
        name = core.name.decode("utf-8", "replace").strip() or "Intel GPU"
        device_uuid = str(uuid.UUID(bytes=bytes(core.uuid)))
        integrated = bool(core.flags & ZE_DEVICE_PROPERTY_FLAG_INTEGRATED)
        tiles, device_id = int(props.numSubdevices), int(core.deviceId)
        return SysmanDevice(handle, pci_bus_id, name, device_uuid, integrated, tiles, device_id)

    def memory_modules(self, device: SysmanDevice) -> list[MemoryModule]:
        """Return the state of each memory module of ``device``."""
        modules: list[MemoryModule] = []
        with self._lock:
            for mem in self._handles("zesDeviceEnumMemoryModules", ctypes.c_void_p(device.handle)):
                props = ZesMemProperties(stype=ZES_STRUCTURE_TYPE_MEM_PROPERTIES)
                state = ZesMemState(stype=ZES_STRUCTURE_TYPE_MEM_STATE)
                self._get("zesMemoryGetProperties", mem, props)
                self._get("zesMemoryGetState", mem, state)
                # size is "DEPRECATED ... can no longer track the allocatable memory reliably"
                # (zes_api.h); physicalSize stands in when a driver leaves it 0.
                size = int(state.size) or int(props.physicalSize)
                where = "device" if props.location == ZES_MEM_LOC_DEVICE else "system"
                on_tile, tile = bool(props.onSubdevice), int(props.subdeviceId)
                modules.append(MemoryModule(where, on_tile, tile, int(state.free), size))
        return modules

    def processes(self, device: SysmanDevice) -> list[tuple[int, int]]:
        """Return ``(host pid, device memory it allocated)`` of each process using ``device``."""
        # Fails with INSUFFICIENT_PERMISSIONS for another user's processes without privileges,
        # UNSUPPORTED_FEATURE on some drivers.
        name = "zesDeviceProcessesGetState"
        with self._lock:
            handle = ctypes.c_void_p(device.handle)
            count = ctypes.c_uint32(0)
            self._call(name, handle, ctypes.pointer(count), None)
            # Processes may attach between the two calls: INVALID_SIZE then (zes_api.h).
            for _ in range(4):
                if count.value == 0:
                    return []
                array = (ZesProcessState * count.value)()
                for item in array:
                    item.stype = ZES_STRUCTURE_TYPE_PROCESS_STATE
                code = int(self._fn(name)(handle, ctypes.pointer(count), array))
                if code == ZE_RESULT_SUCCESS:
                    return [(int(p.processId), int(p.memSize)) for p in array]
                if code != ZE_RESULT_ERROR_INVALID_SIZE:
                    break
                count = ctypes.c_uint32(count.value * 2 + 4)
            raise LevelZeroError(name, code, vendor_error=result_name(code))


def sum_modules(modules: Sequence[MemoryModule], tiles: Sequence[int] | None) -> tuple[int, int]:
    """Return ``(free, size)`` in bytes over the modules of ``tiles`` (``None``: the whole card)."""
    # Local (device) memory counts when a card has any, else the system modules (an integrated
    # GPU: compute-runtime reports the host's MemFree/MemAvailable, not GPU memory). With tiles,
    # only modules on those tiles count, unless no module is tile-specific.
    local = [m for m in modules if m.location == "device"]
    pool = local or list(modules)
    if tiles is not None and any(m.on_subdevice for m in pool):
        wanted = set(tiles)
        pool = [m for m in pool if m.on_subdevice and m.subdevice_id in wanted]
    return sum(m.free for m in pool), sum(m.size for m in pool)

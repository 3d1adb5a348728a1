"""A fake ``pynvml`` module that behaves like nvidia-ml-py over a scripted set of GPUs.

Install it for one test with ``monkeypatch.setitem(sys.modules, "pynvml", fake)``; the CUDA
backend then talks to it exactly as it talks to nvidia-ml-py. Names, signatures, error classes
and values follow nvidia-ml-py 13.x (checked against its ``pynvml.py``):

* ``NVMLError(value)`` returns the subclass for ``value`` (``NVMLError_GpuIsLost`` …); each
  subclass can be raised bare; ``.value`` holds the code; instances compare by value and are not
  hashable. ``NVMLLibraryMismatchError`` is *not* an ``NVMLError``.
* Every device function raises ``NVMLError_Uninitialized`` unless ``nvmlInit`` is in effect
  (init is reference counted, ``nvmlShutdown`` decrements).
* ``nvmlDeviceGetMemoryInfo(handle)`` returns a ``c_nvmlMemory_t`` (total, free, used; ``used``
  includes the driver's reserved memory), ``nvmlDeviceGetMemoryInfo(handle,
  version=nvmlMemory_v2)`` a ``c_nvmlMemory_v2_t`` (version, total, reserved, free, used) —
  raising ``NVMLError_FunctionNotFound`` on a driver older than R510 (``memory_v2=False``).
* ``nvmlDeviceGetComputeRunningProcesses`` returns objects with ``pid``, ``usedGpuMemory`` (may
  be ``None``), ``gpuInstanceId``, ``computeInstanceId``; on an old driver
  (``processes_v3=False``) it raises ``NVMLLibraryMismatchError`` and only ``…_v2`` works.
  ``nvmlDeviceGetGraphicsRunningProcesses`` (and ``…_v2``) return the same kind of objects for
  graphics clients (``graphics``); a process in both lists reports the same memory in each, as
  NVML reports a process's memory on the device (``usedGpuMemory`` is ``None`` where NVML says
  ``NVML_VALUE_NOT_AVAILABLE``: Windows WDDM, or MIG without the privilege to see per-process
  accounting).
* Strings come back as ``str``, structures decode ``char`` arrays to ``str``, as nvidia-ml-py's
  wrappers do.

Faults: :meth:`FakeNvml.fail` makes a function raise (an NVML error by name or value, or any
exception), optionally only after ``after`` successful calls, only ``times`` times, or only for
calls ``when`` accepts. :meth:`FakeNvml.on_call` runs a hook inside a call (to hold a call in
flight). ``calls`` counts calls per function.
"""

from __future__ import annotations

import ctypes
import string
import threading
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

MIB = 1024**2
GIB = 1024**3

# Measured on an idle NVIDIA H200 (driver 580.159): v1 used == v2 reserved == this.
H200_RESERVED = 644_939_776
H200_TOTAL = 143_771 * MIB  # NVML total as nvidia-smi prints it (143771 MiB)

NVML_SUCCESS = 0
_ERROR_CODES: dict[str, tuple[int, str]] = {
    "UNINITIALIZED": (1, "Uninitialized"),
    "INVALID_ARGUMENT": (2, "Invalid Argument"),
    "NOT_SUPPORTED": (3, "Not Supported"),
    "NO_PERMISSION": (4, "Insufficient Permissions"),
    "ALREADY_INITIALIZED": (5, "Already Initialized"),
    "NOT_FOUND": (6, "Not Found"),
    "INSUFFICIENT_SIZE": (7, "Insufficient Size"),
    "INSUFFICIENT_POWER": (8, "Insufficient External Power"),
    "DRIVER_NOT_LOADED": (9, "Driver Not Loaded"),
    "TIMEOUT": (10, "Timeout"),
    "IRQ_ISSUE": (11, "Interrupt Request Issue"),
    "LIBRARY_NOT_FOUND": (12, "NVML Shared Library Not Found"),
    "FUNCTION_NOT_FOUND": (13, "Function Not Found"),
    "CORRUPTED_INFOROM": (14, "Corrupted infoROM"),
    "GPU_IS_LOST": (15, "GPU is lost"),
    "RESET_REQUIRED": (16, "GPU requires restart"),
    "OPERATING_SYSTEM": (17, "The operating system has blocked the request."),
    "LIB_RM_VERSION_MISMATCH": (18, "RM has detected an NVML/RM version mismatch."),
    "IN_USE": (19, "In use"),
    "MEMORY": (20, "Insufficient Memory"),
    "NO_DATA": (21, "No data"),
    "VGPU_ECC_NOT_SUPPORTED": (22, "vGPU ECC not supported"),
    "INSUFFICIENT_RESOURCES": (23, "Insufficient resources"),
    "FREQ_NOT_SUPPORTED": (24, "Frequency not supported"),
    "ARGUMENT_VERSION_MISMATCH": (25, "Argument version mismatch"),
    "DEPRECATED": (26, "Deprecated"),
    "NOT_READY": (27, "Not ready"),
    "GPU_NOT_FOUND": (28, "GPU not found"),
    "INVALID_STATE": (29, "Invalid state"),
    "RESET_TYPE_NOT_SUPPORTED": (30, "Reset type not supported"),
    "UNKNOWN": (999, "Unknown Error"),
}
_MESSAGES = dict(_ERROR_CODES.values())


class NVMLError(Exception):
    """Base of NVML errors; ``NVMLError(value)`` builds the subclass registered for ``value``."""

    _subclass_for: ClassVar[dict[int, type[NVMLError]]] = {}
    _code: ClassVar[int | None] = None
    value: int

    def __new__(cls, *args: Any) -> NVMLError:
        target = cls
        if cls is NVMLError:
            value = int(args[0])
            target = NVMLError._subclass_for.get(value, NVMLError)
        else:
            assert cls._code is not None
            value = cls._code
        obj = Exception.__new__(target)
        obj.value = value
        return obj

    def __init__(self, *args: Any) -> None:
        Exception.__init__(self, self.value)

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return self.value == getattr(other, "value", None)

    __hash__ = None  # type: ignore[assignment]  # nvidia-ml-py's errors are unhashable too


class NVMLLibraryMismatchError(Exception):
    """An unversioned function is missing from the driver (not an ``NVMLError``)."""


def _class_name(suffix: str) -> str:
    return "NVMLError_" + string.capwords(suffix, "_").replace("_", "")


ERROR_CLASSES: dict[str, type[NVMLError]] = {}
for _suffix, (_value, _message) in _ERROR_CODES.items():
    _cls = type(_class_name(_suffix), (NVMLError,), {"_code": _value})
    _cls.__module__ = "pynvml"
    NVMLError._subclass_for[_value] = _cls
    ERROR_CLASSES[_cls.__name__] = _cls
NVMLError.__module__ = "pynvml"
NVMLLibraryMismatchError.__module__ = "pynvml"


def error_class(name: str | int) -> type[NVMLError]:
    """Return the class for ``"GpuIsLost"``, ``"NVMLError_GpuIsLost"``, a constant or a value."""
    if isinstance(name, int):
        return NVMLError._subclass_for[name]
    if name.startswith("NVML_ERROR_"):
        return NVMLError._subclass_for[_ERROR_CODES[name[len("NVML_ERROR_") :]][0]]
    full = name if name.startswith("NVMLError_") else f"NVMLError_{name}"
    return ERROR_CLASSES[full]


class _DecodingStructure(ctypes.Structure):
    """ctypes structure whose ``char`` arrays read back as ``str``, as nvidia-ml-py's do."""

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if isinstance(value, bytes):
            return value.decode()
        return value


class c_nvmlMemory_t(_DecodingStructure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class c_nvmlMemory_v2_t(_DecodingStructure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


nvmlMemory_v2 = 0x02000028

NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32
NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = 16


class nvmlPciInfo_t(_DecodingStructure):
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE),
    ]


class nvmlFriendlyObject:
    """Plain attribute bag, what nvidia-ml-py returns for process entries."""

    def __init__(self, fields: dict[str, Any]) -> None:
        for key, value in fields.items():
            setattr(self, key, value)


@dataclass
class FakeMigDevice:
    """A MIG device (compute instance) of a fake GPU."""

    uuid: str
    name: str = "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
    total: int = 4864 * MIB
    reserved: int = 0
    used: int = 0
    gpu_instance_id: int = 1
    compute_instance_id: int = 0
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    slot: int | None = None
    """MIG index under the parent; defaults to its position in the parent's list."""


@dataclass
class FakeGpu:
    """One fake physical GPU.

    Memory: ``total`` is NVML's total; the driver keeps ``reserved``; applications hold ``used``.
    v2 reports them as they are; v1 reports ``used + reserved`` as used, as real drivers do.
    """

    name: str
    uuid: str
    pci_bus_id: str
    total: int = 80 * GIB
    reserved: int = 0
    used: int = 0
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    mig_capable: bool = False
    mig_mode: int = 0
    mig_pending: int | None = None
    max_mig_devices: int = 7
    mig_devices: list[FakeMigDevice] = field(default_factory=list)
    unified_memory: bool = False
    """GB10/Jetson-like: memory queries raise ``NVMLError_NotSupported``."""
    compute_capability: tuple[int, int] | None = (8, 0)
    """What ``nvmlDeviceGetCudaComputeCapability`` answers (A100: 8.0, H100/H200: 9.0, L4: 8.9,
    B200: 10.0); ``None`` makes the call raise ``NVMLError_NotSupported``."""
    pci_device_id: int = 0x233510DE
    """``nvmlPciInfo_t.pciDeviceId``: device id << 16 | vendor id 0x10DE (H200: 0x2335)."""
    pci_subsystem_id: int = 0


def h200(index: int = 0, *, uuid: str | None = None, used: int = 0) -> FakeGpu:
    """An H200 with the measured idle figures (reserved 644,939,776 B)."""
    return FakeGpu(
        name="NVIDIA H200",
        uuid=uuid or f"GPU-{index:08x}-1111-2222-3333-444444444444",
        pci_bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0",
        total=H200_TOTAL,
        reserved=H200_RESERVED,
        used=used,
        compute_capability=(9, 0),
    )


@dataclass
class _Fault:
    error: BaseException | type[BaseException] | int | str
    after: int
    times: int | None
    when: Callable[..., bool] | None
    seen: int = 0
    fired: int = 0


@dataclass(frozen=True)
class _Handle:
    owner: int
    gpu: int
    mig: int | None = None


class FakeNvml(types.ModuleType):
    """The fake module. Construct with GPUs (NVML order), then install in ``sys.modules``."""

    NVMLError = NVMLError
    NVMLLibraryMismatchError = NVMLLibraryMismatchError
    c_nvmlMemory_t = c_nvmlMemory_t
    c_nvmlMemory_v2_t = c_nvmlMemory_v2_t
    nvmlPciInfo_t = nvmlPciInfo_t
    nvmlFriendlyObject = nvmlFriendlyObject
    nvmlMemory_v2 = nvmlMemory_v2
    NVML_SUCCESS = NVML_SUCCESS
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE = NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE
    NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        driver_version: str = "580.159.03",
        memory_v2: bool = True,
        processes_v3: bool = True,
    ) -> None:
        super().__init__("pynvml", "Fake nvidia-ml-py for accelplat tests.")
        self.__file__ = __file__
        self.gpus: list[FakeGpu] = list(gpus or [])
        self.driver_version = driver_version
        self.memory_v2 = memory_v2
        self.processes_v3 = processes_v3
        self.refcount = 0
        self.calls: Counter[str] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self.shutdown_while_in_flight = False
        self._faults: dict[str, list[_Fault]] = {}
        self._hooks: dict[str, Callable[[], None]] = {}
        self._lock = threading.Lock()
        for name, cls in ERROR_CLASSES.items():
            setattr(self, name, cls)
        for suffix, (value, _) in _ERROR_CODES.items():
            setattr(self, f"NVML_ERROR_{suffix}", value)

    # -- test controls ----------------------------------------------------------------------

    def fail(
        self,
        function: str,
        error: BaseException | type[BaseException] | int | str,
        *,
        after: int = 0,
        times: int | None = None,
        when: Callable[..., bool] | None = None,
    ) -> None:
        """Make ``function`` raise ``error`` (an NVML error name/value or an exception).

        Args:
            function: The pynvml function name, e.g. ``"nvmlDeviceGetMemoryInfo"``.
            error: ``"GpuIsLost"``, ``"NVMLError_GpuIsLost"``, ``15``, or an exception.
            after: Let this many matching calls succeed first ("fail after N calls").
            times: Fail this many times, then succeed again (``None``: for ever).
            when: Only calls for which ``when(*args, **kwargs)`` is true count.
        """
        self._faults.setdefault(function, []).append(_Fault(error, after, times, when))

    def clear_faults(self) -> None:
        """Remove every injected fault."""
        self._faults.clear()

    def on_call(self, function: str, hook: Callable[[], None] | None) -> None:
        """Run ``hook`` inside every call of ``function`` (while it counts as in flight)."""
        if hook is None:
            self._hooks.pop(function, None)
        else:
            self._hooks[function] = hook

    def handle_of(self, gpu: int, mig: int | None = None) -> _Handle:
        """Return the handle the fake would give for a GPU (and MIG slot)."""
        return _Handle(id(self), gpu, mig)

    # -- plumbing ---------------------------------------------------------------------------

    def _raise(self, error: BaseException | type[BaseException] | int | str) -> None:
        if isinstance(error, (int, str)):
            raise error_class(error)()
        raise error

    def _enter(self, function: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        with self._lock:
            self.calls[function] += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            faults = list(self._faults.get(function, ()))
        try:
            for fault in faults:
                if fault.when is not None and not fault.when(*args, **kwargs):
                    continue
                with self._lock:
                    fault.seen += 1
                    due = fault.seen > fault.after and (
                        fault.times is None or fault.fired < fault.times
                    )
                    if due:
                        fault.fired += 1
                if due:
                    self._raise(fault.error)
            hook = self._hooks.get(function)
            if hook is not None:
                hook()
        except BaseException:
            self._leave()
            raise

    def _leave(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def _require_init(self) -> None:
        if self.refcount <= 0:
            raise NVMLError(_ERROR_CODES["UNINITIALIZED"][0])

    def _gpu(self, handle: object) -> FakeGpu:
        if not isinstance(handle, _Handle) or handle.owner != id(self):
            raise NVMLError(_ERROR_CODES["INVALID_ARGUMENT"][0])
        return self.gpus[handle.gpu]

    def _mig(self, handle: object) -> FakeMigDevice | None:
        gpu = self._gpu(handle)
        assert isinstance(handle, _Handle)
        if handle.mig is None:
            return None
        for pos, mig in enumerate(gpu.mig_devices):
            if (mig.slot if mig.slot is not None else pos) == handle.mig:
                return mig
        raise NVMLError(_ERROR_CODES["INVALID_ARGUMENT"][0])

    def _device_call(self, function: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._enter(function, args, kwargs)
        try:
            self._require_init()
        except BaseException:
            self._leave()
            raise

    # -- nvidia-ml-py API -------------------------------------------------------------------

    def nvmlInitWithFlags(self, flags: int) -> None:
        self._enter("nvmlInit", (), {})
        try:
            with self._lock:
                self.refcount += 1
        finally:
            self._leave()

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown", (), {})
        try:
            with self._lock:
                if self.in_flight > 1:  # the shutdown call itself is in flight
                    self.shutdown_while_in_flight = True
                if self.refcount <= 0:
                    raise NVMLError(_ERROR_CODES["UNINITIALIZED"][0])
                self.refcount -= 1
        finally:
            self._leave()

    def nvmlSystemGetDriverVersion(self) -> str:
        self._device_call("nvmlSystemGetDriverVersion", (), {})
        try:
            return self.driver_version
        finally:
            self._leave()

    def nvmlDeviceGetCount(self) -> int:
        self._device_call("nvmlDeviceGetCount", (), {})
        try:
            return len(self.gpus)
        finally:
            self._leave()

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._device_call("nvmlDeviceGetHandleByIndex", (index,), {})
        try:
            if not 0 <= int(index) < len(self.gpus):
                raise NVMLError(_ERROR_CODES["INVALID_ARGUMENT"][0])
            return _Handle(id(self), int(index))
        finally:
            self._leave()

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> _Handle:
        self._device_call("nvmlDeviceGetHandleByUUID", (uuid,), {})
        try:
            text = uuid.decode() if isinstance(uuid, bytes) else uuid
            for g, gpu in enumerate(self.gpus):
                if gpu.uuid == text:
                    return _Handle(id(self), g)
                for pos, mig in enumerate(gpu.mig_devices):
                    if mig.uuid == text:
                        return _Handle(id(self), g, mig.slot if mig.slot is not None else pos)
            raise NVMLError(_ERROR_CODES["NOT_FOUND"][0])
        finally:
            self._leave()

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str | bytes) -> _Handle:
        self._device_call("nvmlDeviceGetHandleByPciBusId", (bus_id,), {})
        try:
            text = (bus_id.decode() if isinstance(bus_id, bytes) else bus_id).upper()
            domain, _, rest = text.partition(":")
            wanted = f"{int(domain, 16):08X}:{rest}" if rest else text
            for g, gpu in enumerate(self.gpus):
                if gpu.pci_bus_id.upper() == wanted:
                    return _Handle(id(self), g)
            raise NVMLError(_ERROR_CODES["NOT_FOUND"][0])
        finally:
            self._leave()

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        self._device_call("nvmlDeviceGetName", (handle,), {})
        try:
            mig = self._mig(handle)
            return mig.name if mig is not None else self._gpu(handle).name
        finally:
            self._leave()

    def nvmlDeviceGetCudaComputeCapability(self, handle: _Handle) -> tuple[int, int]:
        self._device_call("nvmlDeviceGetCudaComputeCapability", (handle,), {})
        try:
            capability = self._gpu(handle).compute_capability
            if capability is None:
                raise NVMLError(_ERROR_CODES["NOT_SUPPORTED"][0])
            return capability
        finally:
            self._leave()

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        self._device_call("nvmlDeviceGetUUID", (handle,), {})
        try:
            mig = self._mig(handle)
            return mig.uuid if mig is not None else self._gpu(handle).uuid
        finally:
            self._leave()

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> Any:
        self._device_call("nvmlDeviceGetPciInfo", (handle,), {})
        try:
            gpu = self._gpu(handle)
            domain, bus, devfn = gpu.pci_bus_id.split(":")
            device = devfn.split(".")[0]
            info = nvmlPciInfo_t()
            info.busId = gpu.pci_bus_id.encode()
            info.busIdLegacy = f"{int(domain, 16):04X}:{bus}:{devfn}".encode()
            info.domain = int(domain, 16)
            info.bus = int(bus, 16)
            info.device = int(device, 16)
            info.pciDeviceId = gpu.pci_device_id
            info.pciSubSystemId = gpu.pci_subsystem_id
            return info
        finally:
            self._leave()

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:
        self._device_call("nvmlDeviceGetMemoryInfo", (handle,), {"version": version})
        try:
            gpu = self._gpu(handle)
            mig = self._mig(handle)
            if version:
                if not self.memory_v2:
                    raise NVMLError(_ERROR_CODES["FUNCTION_NOT_FOUND"][0])
                if version != nvmlMemory_v2:
                    raise NVMLError(_ERROR_CODES["ARGUMENT_VERSION_MISMATCH"][0])
            if gpu.unified_memory and mig is None:
                raise NVMLError(_ERROR_CODES["NOT_SUPPORTED"][0])
            src: FakeGpu | FakeMigDevice = mig if mig is not None else gpu
            free = max(0, src.total - src.reserved - src.used)
            if version:
                v2 = c_nvmlMemory_v2_t()
                v2.version = version
                v2.total, v2.reserved, v2.free, v2.used = src.total, src.reserved, free, src.used
                return v2
            v1 = c_nvmlMemory_t()
            v1.total, v1.free, v1.used = src.total, free, src.used + src.reserved
            return v1
        finally:
            self._leave()

    def _processes(self, function: str, handle: _Handle) -> list[Any]:
        gpu = self._gpu(handle)
        mig = self._mig(handle)
        src: FakeGpu | FakeMigDevice = mig if mig is not None else gpu
        gi = mig.gpu_instance_id if mig is not None else 0xFFFFFFFF
        ci = mig.compute_instance_id if mig is not None else 0xFFFFFFFF
        return [
            nvmlFriendlyObject(
                {"pid": pid, "usedGpuMemory": used, "gpuInstanceId": gi, "computeInstanceId": ci}
            )
            for pid, used in (src.graphics if "Graphics" in function else src.processes)
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        self._device_call("nvmlDeviceGetComputeRunningProcesses", (handle,), {})
        try:
            if not self.processes_v3:
                raise NVMLLibraryMismatchError(
                    "Unversioned function called and the pyNVML version does not match the "
                    "NVML lib version."
                )
            return self._processes("nvmlDeviceGetComputeRunningProcesses", handle)
        finally:
            self._leave()

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: _Handle) -> list[Any]:
        self._device_call("nvmlDeviceGetComputeRunningProcesses_v2", (handle,), {})
        try:
            return self._processes("nvmlDeviceGetComputeRunningProcesses_v2", handle)
        finally:
            self._leave()

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: _Handle) -> list[Any]:
        self._device_call("nvmlDeviceGetGraphicsRunningProcesses", (handle,), {})
        try:
            if not self.processes_v3:
                raise NVMLLibraryMismatchError(
                    "Unversioned function called and the pyNVML version does not match the "
                    "NVML lib version."
                )
            return self._processes("nvmlDeviceGetGraphicsRunningProcesses", handle)
        finally:
            self._leave()

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: _Handle) -> list[Any]:
        self._device_call("nvmlDeviceGetGraphicsRunningProcesses_v2", (handle,), {})
        try:
            return self._processes("nvmlDeviceGetGraphicsRunningProcesses_v2", handle)
        finally:
            self._leave()

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        self._device_call("nvmlDeviceGetMigMode", (handle,), {})
        try:
            gpu = self._gpu(handle)
            if not gpu.mig_capable:
                raise NVMLError(_ERROR_CODES["NOT_SUPPORTED"][0])
            pending = gpu.mig_mode if gpu.mig_pending is None else gpu.mig_pending
            return [gpu.mig_mode, pending]
        finally:
            self._leave()

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self._device_call("nvmlDeviceGetMaxMigDeviceCount", (handle,), {})
        try:
            gpu = self._gpu(handle)
            if not gpu.mig_capable:
                raise NVMLError(_ERROR_CODES["NOT_SUPPORTED"][0])
            return gpu.max_mig_devices
        finally:
            self._leave()

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        self._device_call("nvmlDeviceGetMigDeviceHandleByIndex", (handle, index), {})
        try:
            gpu = self._gpu(handle)
            if not gpu.mig_capable:
                raise NVMLError(_ERROR_CODES["NOT_SUPPORTED"][0])
            if not 0 <= index < gpu.max_mig_devices:
                raise NVMLError(_ERROR_CODES["INVALID_ARGUMENT"][0])
            for pos, mig in enumerate(gpu.mig_devices):
                if (mig.slot if mig.slot is not None else pos) == index and gpu.mig_mode:
                    return _Handle(id(self), handle.gpu, index)
            raise NVMLError(_ERROR_CODES["NOT_FOUND"][0])
        finally:
            self._leave()

    def nvmlDeviceIsMigDeviceHandle(self, handle: _Handle) -> ctypes.c_uint:
        self._device_call("nvmlDeviceIsMigDeviceHandle", (handle,), {})
        try:
            self._gpu(handle)
            return ctypes.c_uint(1 if handle.mig is not None else 0)
        finally:
            self._leave()

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: _Handle) -> _Handle:
        self._device_call("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", (handle,), {})
        try:
            self._gpu(handle)
            if handle.mig is None:
                raise NVMLError(_ERROR_CODES["INVALID_ARGUMENT"][0])
            return _Handle(id(self), handle.gpu)
        finally:
            self._leave()

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        self._device_call("nvmlDeviceGetGpuInstanceId", (handle,), {})
        try:
            mig = self._mig(handle)
            if mig is None:
                raise NVMLError(_ERROR_CODES["INVALID_ARGUMENT"][0])
            return mig.gpu_instance_id
        finally:
            self._leave()

    def nvmlDeviceGetComputeInstanceId(self, handle: _Handle) -> int:
        self._device_call("nvmlDeviceGetComputeInstanceId", (handle,), {})
        try:
            mig = self._mig(handle)
            if mig is None:
                raise NVMLError(_ERROR_CODES["INVALID_ARGUMENT"][0])
            return mig.compute_instance_id
        finally:
            self._leave()

    @staticmethod
    def nvmlExceptionClass(code: int) -> type[Exception]:
        if code not in NVMLError._subclass_for:
            raise ValueError(f"nvmlErrorCode {code} is not valid")
        return NVMLError._subclass_for[code]


def faked_cuda_platform() -> Any:
    """Install a two-H200 fake as ``pynvml`` in this process and return a ``CudaPlatform``.

    A zero-argument factory, so a fresh process can rebuild the platform from the reference
    ``"tests.fakes.nvml:faked_cuda_platform"`` (the conformance kit's ``child=``).
    """
    import sys

    from accelplat._backends.cuda import CudaPlatform

    if not isinstance(sys.modules.get("pynvml"), FakeNvml):
        sys.modules["pynvml"] = FakeNvml([h200(0, used=2 * GIB), h200(1)])
    return CudaPlatform()

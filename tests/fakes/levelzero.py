"""Fake Level Zero Sysman libraries: one in Python, one compiled from C.

Both follow ``zes_api.h``: ``zesInit(flags)``; the two-call enumeration pattern (``*pCount == 0``
or a null array asks for the count); ``zes_device_properties_t`` with its ``core``
``ze_device_properties_t`` (vendor ``0x8086``, type 1 = GPU, flag bit 0 = integrated);
``zes_pci_properties_t``; per memory module ``zes_mem_properties_t`` (``onSubdevice``,
``subdeviceId``, ``location`` 1 = device) and ``zes_mem_state_t`` (``free``, ``size`` bytes);
``zes_process_state_t``; results are ``ze_result_t`` codes (0 = success).

* :class:`FakeLevelZero` is an object whose ``zes*`` attributes are Python callables receiving
  the ctypes pointers and arrays :class:`accelplat._vendor.levelzero.Sysman` passes.

What the driver stack does underneath, reproduced here:

* **Hidden usage** (``FakeLevelZero(hides_usage=True)``): the kernel hides memory usage from a
  process that is not ``perfmon_capable()`` — always on i915 (``query_memregion_info`` reports
  ``unallocated_size = probed_size``), and on xe kernels before upstream commit 4d0b035fd6da
  (used reported as 0). Sysman computes ``free`` from that (``sysman_os_memory_imp.cpp``), so a
  device-local module then reads ``free == size`` whatever is allocated.
* **Integrated GPUs** (:func:`igpu`): compute-runtime answers ``zesMemoryGetState`` for an
  integrated device from the host's ``/proc/meminfo`` — ``free = MemFree``, ``size =
  MemAvailable`` — on one system-memory module; the fake computes them from the meminfo given.
* ``size`` of ``zes_mem_state_t`` is deprecated; the driver fills it with the physical size.
* :func:`build_c_library` writes the same devices as C, with the structures declared field by
  field as in the headers, compiles a shared library with the system C compiler and returns its
  path — so the ctypes structure layouts are checked against a real C compiler's.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import uuid as _uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GIB = 1024**3
ZE_RESULT_ERROR_UNINITIALIZED = 0x78000001
ZE_RESULT_ERROR_DEVICE_LOST = 0x70000001
ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS = 0x70010000
ZE_RESULT_ERROR_UNSUPPORTED_FEATURE = 0x78000003


@dataclass
class FakeModule:
    """One memory module."""

    size: int
    free: int
    on_subdevice: bool = False
    subdevice_id: int = 0
    location: int = 1  # ZES_MEM_LOC_DEVICE
    physical_size: int | None = None


@dataclass
class FakeZesDevice:
    """One Sysman device (a physical card)."""

    name: str = "Intel(R) Data Center GPU Max 1550"
    pci: tuple[int, int, int, int] = (0, 0x3A, 0, 0)
    modules: list[FakeModule] = field(default_factory=list)
    num_subdevices: int = 0
    vendor_id: int = 0x8086
    device_type: int = 1
    integrated: bool = False
    uuid: bytes = b""
    device_id: int = 0x0BD5  # Data Center GPU Max 1550 (Xe-HPC, "pvc")
    processes: list[tuple[int, int]] = field(default_factory=list)
    fail: dict[str, int] = field(default_factory=dict)
    host_meminfo: dict[str, int] | None = None
    """For an integrated GPU: ``MemFree``/``MemAvailable`` in bytes, which the driver reports."""

    def uuid_bytes(self) -> bytes:
        if self.uuid:
            return self.uuid
        d, b, dv, f = self.pci
        return bytes([0x86, 0x80, 0, 0, d & 0xFF, b & 0xFF, dv & 0xFF, f & 0xFF]) + bytes(8)

    @property
    def bus_id(self) -> str:
        d, b, dv, f = self.pci
        return f"{d:04x}:{b:02x}:{dv:02x}.{f:x}"


def pvc(bus: int, *, used: tuple[int, int] = (0, 0)) -> FakeZesDevice:
    """A Data Center GPU Max 1550: two tiles, one 64 GiB module per tile (``used`` per tile)."""
    return FakeZesDevice(
        pci=(0, bus, 0, 0),
        device_id=0x0BD5,
        num_subdevices=2,
        modules=[
            FakeModule(64 * GIB, 64 * GIB - used[0], on_subdevice=True, subdevice_id=0),
            FakeModule(64 * GIB, 64 * GIB - used[1], on_subdevice=True, subdevice_id=1),
        ],
    )


def arc(bus: int, *, used: int = 0, name: str = "Intel(R) Arc(TM) B580 Graphics") -> FakeZesDevice:
    """A single-tile discrete card with 12 GiB."""
    return FakeZesDevice(
        name=name,
        pci=(0, bus, 0, 0),
        modules=[FakeModule(12 * GIB, 12 * GIB - used)],
        device_id=0xE20B,  # Arc B580 (Xe2-HPG, "bmg")
    )


def igpu(
    *, mem_free: int = 20 * GIB, mem_available: int = 28 * GIB, name: str = "Intel(R) Graphics"
) -> FakeZesDevice:
    """An integrated GPU at ``0000:00:02.0``, whose memory the driver reports from the host's
    ``/proc/meminfo`` (``free = MemFree``, ``size = MemAvailable``)."""
    return FakeZesDevice(
        name=name,
        pci=(0, 0, 2, 0),
        integrated=True,
        device_id=0x7D55,
        modules=[FakeModule(mem_available, mem_free, location=0)],
        host_meminfo={"MemFree": mem_free, "MemAvailable": mem_available},
    )


class FakeLevelZero:
    """A Python stand-in for ``libze_loader.so.1`` (Sysman functions only).

    Args:
        devices: The devices of the single driver, in Sysman's enumeration order.
        init_result: What ``zesInit`` returns.
        missing: Function names the "loader" lacks (an old loader has no ``zesInit``).
        hides_usage: The kernel hides memory usage from this process (see the module docstring):
            device-local modules read ``free == size``.
    """

    def __init__(
        self,
        devices: list[FakeZesDevice],
        *,
        init_result: int = 0,
        missing: tuple[str, ...] = (),
        hides_usage: bool = False,
    ) -> None:
        self.devices = devices
        self.init_result = init_result
        self.missing = set(missing)
        self.hides_usage = hides_usage
        self.calls: list[str] = []
        self._mem: dict[int, tuple[FakeZesDevice, FakeModule]] = {}

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("zes") and name in object.__getattribute__(self, "missing"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    # handles are small integers dressed as addresses
    def _device(self, handle: Any) -> FakeZesDevice:
        value = handle.value if isinstance(handle, ctypes.c_void_p) else handle
        return self.devices[int(value) - 0x1000]

    def _fail(self, device: FakeZesDevice, name: str) -> int:
        self.calls.append(name)
        return device.fail.get(name, 0)

    @staticmethod
    def _fill(count: Any, array: Any, values: list[int]) -> int:
        if array is None or count.contents.value == 0:
            count.contents.value = len(values)
            return 0
        n = min(count.contents.value, len(values))
        for i in range(n):
            array[i] = values[i]
        count.contents.value = n
        return 0

    def zesInit(self, flags: Any) -> int:
        self.calls.append("zesInit")
        return self.init_result

    def zesDriverGet(self, count: Any, drivers: Any) -> int:
        self.calls.append("zesDriverGet")
        return self._fill(count, drivers, [0x500])

    def zesDeviceGet(self, driver: Any, count: Any, devices: Any) -> int:
        self.calls.append("zesDeviceGet")
        return self._fill(count, devices, [0x1000 + i for i in range(len(self.devices))])

    def zesDeviceGetProperties(self, handle: Any, props: Any) -> int:
        d = self._device(handle)
        if code := self._fail(d, "zesDeviceGetProperties"):
            return code
        p = props.contents
        p.numSubdevices = d.num_subdevices
        p.core.type = d.device_type
        p.core.vendorId = d.vendor_id
        p.core.deviceId = d.device_id
        p.core.flags = 1 if d.integrated else 0
        p.core.name = d.name.encode()
        for i, byte in enumerate(d.uuid_bytes()):
            p.core.uuid[i] = byte
        return 0

    def zesDevicePciGetProperties(self, handle: Any, props: Any) -> int:
        d = self._device(handle)
        if code := self._fail(d, "zesDevicePciGetProperties"):
            return code
        a = props.contents.address
        a.domain, a.bus, a.device, a.function = d.pci
        return 0

    def zesDeviceEnumMemoryModules(self, handle: Any, count: Any, mems: Any) -> int:
        d = self._device(handle)
        if code := self._fail(d, "zesDeviceEnumMemoryModules"):
            return code
        index = self.devices.index(d)
        values = []
        for j, module in enumerate(d.modules):
            key = 0x9000 + index * 16 + j
            self._mem[key] = (d, module)
            values.append(key)
        return self._fill(count, mems, values)

    def _module(self, handle: Any) -> tuple[FakeZesDevice, FakeModule]:
        value = handle.value if isinstance(handle, ctypes.c_void_p) else handle
        return self._mem[int(value)]

    def zesMemoryGetProperties(self, handle: Any, props: Any) -> int:
        d, m = self._module(handle)
        if code := self._fail(d, "zesMemoryGetProperties"):
            return code
        p = props.contents
        p.onSubdevice = int(m.on_subdevice)
        p.subdeviceId = m.subdevice_id
        p.location = m.location
        p.physicalSize = m.size if m.physical_size is None else m.physical_size
        p.busWidth = -1
        p.numChannels = -1
        return 0

    def zesMemoryGetState(self, handle: Any, state: Any) -> int:
        d, m = self._module(handle)
        if code := self._fail(d, "zesMemoryGetState"):
            return code
        s = state.contents
        s.size = m.size
        s.free = m.free
        if d.integrated and d.host_meminfo is not None:
            s.free = d.host_meminfo["MemFree"]
            s.size = d.host_meminfo["MemAvailable"]
        elif self.hides_usage and m.location == 1:
            s.free = m.size  # the kernel reported nothing allocated
        return 0

    def zesDeviceProcessesGetState(self, handle: Any, count: Any, procs: Any) -> int:
        d = self._device(handle)
        if code := self._fail(d, "zesDeviceProcessesGetState"):
            return code
        if procs is None or count.contents.value == 0:
            count.contents.value = len(d.processes)
            return 0
        if count.contents.value < len(d.processes):
            count.contents.value = len(d.processes)
            return 0x78000008  # ZE_RESULT_ERROR_INVALID_SIZE
        for i, (pid, mem) in enumerate(d.processes):
            procs[i].processId = pid
            procs[i].memSize = mem
            procs[i].sharedSize = 0
        count.contents.value = len(d.processes)
        return 0


# ---------------------------------------------------------------------------------------------
# The same, in C

_C_HEADER = r"""
#include <stdint.h>
#include <stddef.h>
#include <string.h>

typedef uint32_t ze_result_t;
typedef uint8_t ze_bool_t;
typedef void *zes_driver_handle_t, *zes_device_handle_t, *zes_mem_handle_t;

typedef struct { uint8_t id[16]; } ze_device_uuid_t;
typedef struct {
    uint32_t stype; void *pNext; uint32_t type; uint32_t vendorId; uint32_t deviceId;
    uint32_t flags; uint32_t subdeviceId; uint32_t coreClockRate; uint64_t maxMemAllocSize;
    uint32_t maxHardwareContexts; uint32_t maxCommandQueuePriority; uint32_t numThreadsPerEU;
    uint32_t physicalEUSimdWidth; uint32_t numEUsPerSubslice; uint32_t numSubslicesPerSlice;
    uint32_t numSlices; uint64_t timerResolution; uint32_t timestampValidBits;
    uint32_t kernelTimestampValidBits; ze_device_uuid_t uuid; char name[256];
} ze_device_properties_t;
typedef struct {
    uint32_t stype; void *pNext; ze_device_properties_t core; uint32_t numSubdevices;
    char serialNumber[64]; char boardNumber[64]; char brandName[64]; char modelName[64];
    char vendorName[64]; char driverVersion[64];
} zes_device_properties_t;
typedef struct { uint32_t domain, bus, device, function; } zes_pci_address_t;
typedef struct { int32_t gen; int32_t width; int64_t maxBandwidth; } zes_pci_speed_t;
typedef struct {
    uint32_t stype; void *pNext; zes_pci_address_t address; zes_pci_speed_t maxSpeed;
    ze_bool_t haveBandwidthCounters; ze_bool_t havePacketCounters; ze_bool_t haveReplayCounters;
} zes_pci_properties_t;
typedef struct {
    uint32_t stype; void *pNext; uint32_t type; ze_bool_t onSubdevice; uint32_t subdeviceId;
    uint32_t location; uint64_t physicalSize; int32_t busWidth; int32_t numChannels;
} zes_mem_properties_t;
typedef struct {
    uint32_t stype; const void *pNext; uint32_t health; uint64_t free; uint64_t size;
} zes_mem_state_t;
typedef struct {
    uint32_t stype; const void *pNext; uint32_t processId; uint64_t memSize; uint64_t sharedSize;
    uint32_t engines;
} zes_process_state_t;

typedef struct { uint64_t size, free; uint8_t on_sub; uint32_t sub_id; uint32_t loc; } fake_mem;
typedef struct {
    const char *name; uint32_t pci[4]; uint32_t nsub; uint32_t vendor; uint32_t type;
    uint32_t devid; uint32_t integrated; uint8_t uuid[16]; int nmem; fake_mem mem[8]; int nproc;
    uint32_t pid[8]; uint64_t pmem[8];
} fake_dev;

#define LAYOUT(T, F) size_t layout_##T##_##F(void) { return offsetof(T, F); }
#define SIZE(T) size_t size_##T(void) { return sizeof(T); }
SIZE(ze_device_properties_t) SIZE(zes_device_properties_t) SIZE(zes_pci_properties_t)
SIZE(zes_mem_properties_t) SIZE(zes_mem_state_t) SIZE(zes_process_state_t)
LAYOUT(ze_device_properties_t, uuid) LAYOUT(ze_device_properties_t, name)
LAYOUT(zes_device_properties_t, numSubdevices) LAYOUT(zes_pci_properties_t, address)
LAYOUT(zes_mem_properties_t, subdeviceId) LAYOUT(zes_mem_properties_t, physicalSize)
LAYOUT(zes_mem_state_t, free) LAYOUT(zes_process_state_t, memSize)
"""

_C_BODY = r"""
static int initialised = 0;
ze_result_t zesInit(uint32_t flags) { (void)flags; initialised = 1; return 0; }
static ze_result_t fill(uint32_t *count, void **out, int n, uintptr_t base) {
    if (!initialised) return 0x78000001;
    if (*count == 0 || out == NULL) { *count = (uint32_t)n; return 0; }
    if (*count > (uint32_t)n) *count = (uint32_t)n;
    for (uint32_t i = 0; i < *count; i++) out[i] = (void *)(base + i);
    return 0;
}
ze_result_t zesDriverGet(uint32_t *count, zes_driver_handle_t *d) {
    return fill(count, d, 1, 0x500);
}
ze_result_t zesDeviceGet(zes_driver_handle_t drv, uint32_t *count, zes_device_handle_t *d) {
    (void)drv; return fill(count, d, NDEV, 0x1000);
}
static fake_dev *dev(void *h) { return &DEVS[(uintptr_t)h - 0x1000]; }
ze_result_t zesDeviceGetProperties(zes_device_handle_t h, zes_device_properties_t *p) {
    fake_dev *d = dev(h);
    p->numSubdevices = d->nsub; p->core.type = d->type; p->core.vendorId = d->vendor;
    p->core.deviceId = d->devid;
    p->core.flags = d->integrated ? 1u : 0u;
    strncpy(p->core.name, d->name, 255); memcpy(p->core.uuid.id, d->uuid, 16);
    return 0;
}
ze_result_t zesDevicePciGetProperties(zes_device_handle_t h, zes_pci_properties_t *p) {
    fake_dev *d = dev(h);
    p->address.domain = d->pci[0]; p->address.bus = d->pci[1];
    p->address.device = d->pci[2]; p->address.function = d->pci[3];
    return 0;
}
ze_result_t zesDeviceEnumMemoryModules(zes_device_handle_t h, uint32_t *count, void **m) {
    uintptr_t i = (uintptr_t)h - 0x1000;
    return fill(count, m, dev(h)->nmem, 0x9000 + i * 16);
}
static fake_mem *mem(void *h) {
    uintptr_t v = (uintptr_t)h - 0x9000; return &DEVS[v / 16].mem[v % 16];
}
ze_result_t zesMemoryGetProperties(zes_mem_handle_t h, zes_mem_properties_t *p) {
    fake_mem *m = mem(h);
    p->onSubdevice = m->on_sub; p->subdeviceId = m->sub_id; p->location = m->loc;
    p->physicalSize = m->size; p->busWidth = -1; p->numChannels = -1;
    return 0;
}
ze_result_t zesMemoryGetState(zes_mem_handle_t h, zes_mem_state_t *s) {
    fake_mem *m = mem(h); s->free = m->free; s->size = m->size; s->health = 1; return 0;
}
ze_result_t zesDeviceProcessesGetState(zes_device_handle_t h, uint32_t *count,
                                       zes_process_state_t *p) {
    fake_dev *d = dev(h);
    if (*count == 0 || p == NULL) { *count = (uint32_t)d->nproc; return 0; }
    if (*count < (uint32_t)d->nproc) { *count = (uint32_t)d->nproc; return 0x78000008; }
    for (int i = 0; i < d->nproc; i++) {
        p[i].processId = d->pid[i]; p[i].memSize = d->pmem[i]; p[i].sharedSize = 0;
    }
    *count = (uint32_t)d->nproc;
    return 0;
}
"""


def c_compiler() -> str | None:
    """The system C compiler, or ``None``."""
    return shutil.which("cc") or shutil.which("gcc")


def _c_device(d: FakeZesDevice) -> str:
    mems = ", ".join(
        f"{{{m.size}ull, {m.free}ull, {int(m.on_subdevice)}, {m.subdevice_id}, {m.location}}}"
        for m in d.modules
    )
    pids = ", ".join(str(p) for p, _ in d.processes) or "0"
    pmem = ", ".join(f"{m}ull" for _, m in d.processes) or "0"
    uuid_bytes = ", ".join(str(b) for b in d.uuid_bytes())
    return (
        f'{{"{d.name}", {{{", ".join(str(x) for x in d.pci)}}}, {d.num_subdevices}, '
        f"{d.vendor_id}, {d.device_type}, {d.device_id}, {int(d.integrated)}, {{{uuid_bytes}}}, "
        f"{len(d.modules)}, {{{mems}}}, {len(d.processes)}, {{{pids}}}, {{{pmem}}}}}"
    )


def build_c_library(devices: list[FakeZesDevice], directory: Path) -> Path:
    """Compile a fake ``libze_loader`` serving ``devices``; return the shared library's path.

    Raises:
        RuntimeError: When no C compiler is available or compilation fails.
    """
    compiler = c_compiler()
    if compiler is None:
        raise RuntimeError("no C compiler")
    table = ",\n".join(_c_device(d) for d in devices)
    source = (
        _C_HEADER
        + f"#define NDEV {len(devices)}\nstatic fake_dev DEVS[] = {{\n{table}\n}};\n"
        + _C_BODY
    )
    directory.mkdir(parents=True, exist_ok=True)
    c_file = directory / "fake_ze_loader.c"
    lib = directory / "libfake_ze_loader.so"
    c_file.write_text(source)
    result = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O0", "-o", str(lib), str(c_file)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"compiling the fake loader failed:\n{result.stderr}")
    return lib


def uuid_text(device: FakeZesDevice) -> str:
    """The UUID as accelplat formats it."""
    return str(_uuid.UUID(bytes=device.uuid_bytes()))

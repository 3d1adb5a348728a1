"""The ``cuda`` platform: NVIDIA GPUs, read through NVML, never through a CUDA context.

Identity (names, UUIDs, bus ids, MIG devices) is enumerated once per NVML session; memory and
processes on every query. ``CUDA_VISIBLE_DEVICES``/``CUDA_DEVICE_ORDER`` apply as the driver
applies them; CUDA's fastest-first order is read in a subprocess (:func:`cuda_order_uuids`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

from accelplat import _boundary
from accelplat._backends._common import (
    checked_memory,
    host_meminfo,
    meminfo_path,
    never_raises,
    pci_address,
    pci_sort_key,
)
from accelplat._platform import BasePlatform, override
from accelplat._types import (
    DeviceInfo,
    FeatureRule,
    GraphSupport,
    MemoryHolder,
    MemoryInfo,
    ProbeResult,
)
from accelplat._util import clip
from accelplat._vendor import nvml as _nvml
from accelplat._vendor import vendor_int
from accelplat._vendor.versions import graph_support
from accelplat._visible.cuda import (
    ENV_CUDA_DEVICE_ORDER,
    ENV_CUDA_VISIBLE_DEVICES,
    EntryKind,
    GpuRecord,
    MigRecord,
    is_pci_bus_order,
    parse_cuda_visible_devices,
    resolve_cuda_visible_devices,
    uuid_digits,
)
from accelplat.errors import BackendError, DeviceNotFoundError, NvmlUnavailableError

OrderResolver = Callable[[Mapping[str, str]], Sequence[str]]  # env -> all UUIDs in CUDA's order

# A GPU without MIG (pre-Ampere, consumer boards) or a driver before R450 answers any of these.
_MIG_ABSENT_ERRORS = ("NotSupported", "FunctionNotFound", "InvalidArgument", "NotFound")
_FULL_MIG_DIGITS = len("MIG-") + 32
_NVML_VALUE_NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE, a process's unknown memory
# Bounds on counts NVML (or a replay bundle) answers, so that a wild one cannot start a loop
# of 2**63 queries: NVML numbers GPUs in an unsigned int, MIG allows 7 instances per GPU.
_MAX_GPUS = 4096
_MAX_MIG_SLOTS = 64

_CUDA_ORDER_SCRIPT = r"""
import ctypes, sys, uuid
try:
    lib = ctypes.CDLL("libcuda.so.1")
except OSError as exc:
    sys.exit("libcuda.so.1 cannot be loaded: %s" % exc)
def check(rc, what):
    if rc != 0:
        sys.exit("%s returned CUDA error %d" % (what, rc))
rc = lib.cuInit(0)
if rc == 100:  # CUDA_ERROR_NO_DEVICE: nothing visible
    sys.exit(0)
check(rc, "cuInit")
count, dev, raw = ctypes.c_int(0), ctypes.c_int(0), (ctypes.c_ubyte * 16)()
check(lib.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
for ordinal in range(count.value):
    check(lib.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
    check(lib.cuDeviceGetUuid(raw, dev), "cuDeviceGetUuid")
    print("GPU-%s" % uuid.UUID(bytes=bytes(raw)))
"""


def cuda_order_uuids(env: Mapping[str, str]) -> list[str]:
    """Return every GPU's UUID in CUDA's order, from a ctypes subprocess in ``env`` (no context)."""
    key = ("order", env.get(ENV_CUDA_DEVICE_ORDER))
    answer = _boundary.call("cuda", key, lambda: _cuda_order_live(env))
    if not isinstance(answer, list) or not all(isinstance(u, str) for u in answer):
        raise RuntimeError("the capture holds no CUDA enumeration order")
    return list(answer)


def _cuda_order_live(env: Mapping[str, str]) -> list[str]:
    import subprocess

    argv = [sys.executable, "-I", "-S", "-c", _CUDA_ORDER_SCRIPT]
    try:
        done = subprocess.run(
            argv, env=dict(env), capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"could not run the CUDA enumeration subprocess: {exc}") from exc
    if done.returncode != 0:
        detail = "".join(f": {line}" for line in done.stderr.strip().splitlines()[-1:])
        raise RuntimeError(f"the CUDA enumeration subprocess exited with {done.returncode}{detail}")
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


class _View(NamedTuple):
    key: tuple[int, str | None, str | None]
    devices: tuple[DeviceInfo, ...]
    handles: tuple[Any, ...]  # NVML's handle of each device (a MIG instance's own)
    notes: tuple[str, ...]
    units: tuple[str, ...]  # lease_units()


_lock = threading.RLock()  # guards the table and every platform's view
_table: tuple[int, tuple[GpuRecord, ...]] | None = None  # (NVML generation, GPUs in NVML order)


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _dashed(digits: str) -> str:
    """``"MIG-" + 32 digits`` → the 8-4-4-4-12 spelling NVML prints and accepts."""
    head, d = digits[:4], digits[4:]
    return f"{head}{d[:8]}-{d[8:12]}-{d[12:16]}-{d[16:20]}-{d[20:]}"


def _pci_order(gpus: Sequence[GpuRecord]) -> list[GpuRecord]:
    return sorted(gpus, key=lambda g: (pci_sort_key(g.pci_bus_id), g.nvml_index))


def _call(nv: Any, action: str, fn: str, *args: Any) -> Any:
    try:
        return getattr(nv, fn)(*args)
    except Exception as exc:
        raise _nvml.translate(exc, action) from exc


def _mig_devices(nv: Any, handle: Any, index: int) -> tuple[bool, tuple[MigRecord, ...]]:
    try:
        current = nv.nvmlDeviceGetMigMode(handle)[0]
    except Exception as exc:
        if _nvml.is_error(exc, *_MIG_ABSENT_ERRORS, "AttributeError"):
            return False, ()
        raise _nvml.translate(exc, f"reading the MIG mode of GPU {index}") from exc
    what = f"MIG of GPU {index}"
    if vendor_int("cuda", what, "the mode", current) != getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1):
        return False, ()
    action = f"counting MIG devices of GPU {index}"
    reported = _call(nv, action, "nvmlDeviceGetMaxMigDeviceCount", handle)
    slots = _count(reported, what, "the MIG device count", _MAX_MIG_SLOTS)
    migs: list[MigRecord] = []
    for slot in range(slots):
        try:
            mig_handle = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except Exception as exc:
            if _nvml.is_error(exc, "NotFound", "InvalidArgument"):
                continue  # an empty slot
            raise _nvml.translate(exc, f"reading MIG device {slot} of GPU {index}") from exc
        migs.append(_describe_mig(nv, mig_handle, f"MIG device {slot} of GPU {index}"))
    return True, tuple(migs)


def _describe_mig(nv: Any, mig_handle: Any, what: str) -> MigRecord:
    uuid = _text(_call(nv, f"reading the UUID of {what}", "nvmlDeviceGetUUID", mig_handle))
    name = _text(_call(nv, f"reading the name of {what}", "nvmlDeviceGetName", mig_handle))
    ids: list[int | None] = [None, None]
    for i, fn in enumerate(("nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId")):
        with contextlib.suppress(Exception):  # only needed for the legacy MIG-GPU-…/gi/ci form
            ids[i] = int(getattr(nv, fn)(mig_handle))
    return MigRecord(uuid, ids[0], ids[1], name, mig_handle)


def _count(value: object, where: str, name: str, limit: int) -> int:
    count = vendor_int("cuda", where, name, value)
    if not 0 <= count <= limit:
        raise BackendError("cuda", f"{where}: {name} is {count}, not in [0, {limit}]")
    return count


def _enumerate(nv: Any) -> tuple[GpuRecord, ...]:
    reported = _call(nv, "counting GPUs", "nvmlDeviceGetCount")
    count = _count(reported, "NVML", "the GPU count", _MAX_GPUS)
    gpus: list[GpuRecord] = []
    for index in range(count):
        handle = _call(nv, f"opening GPU {index}", "nvmlDeviceGetHandleByIndex", index)
        name = _text(_call(nv, f"reading the name of GPU {index}", "nvmlDeviceGetName", handle))
        uuid = _text(_call(nv, f"reading the UUID of GPU {index}", "nvmlDeviceGetUUID", handle))
        bus_id = None  # the bus id only orders GPUs; NVML's order is the fallback
        with contextlib.suppress(Exception):
            bus_id = pci_address(_text(nv.nvmlDeviceGetPciInfo(handle).busId))
        mig_enabled, migs = _mig_devices(nv, handle, index)
        capability = _compute_capability(nv, handle)
        gpus.append(GpuRecord(index, uuid, mig_enabled, migs, name, handle, bus_id, capability))
    return tuple(gpus)


def _compute_capability(nv: Any, handle: Any) -> tuple[int, int] | None:
    # An identity fact is optional: no capability rather than no GPU.
    with contextlib.suppress(Exception):
        major, minor = nv.nvmlDeviceGetCudaComputeCapability(handle)
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (major, minor))
        if ints and 0 <= major < 100 and 0 <= minor < 10:
            return int(major), int(minor)
    return None


def _physical_gpus(nv: Any) -> tuple[GpuRecord, ...]:
    """Every GPU NVML sees, in NVML order, enumerated once per NVML session."""
    global _table
    gen = _nvml.generation()
    with _lock:
        if _table is None or _table[0] != gen:
            _table = (gen, _enumerate(nv))
        return _table[1]


def _driver_version(nv: Any) -> str:
    with contextlib.suppress(Exception):
        return _text(nv.nvmlSystemGetDriverVersion())
    return "unknown"


class CudaPlatform(BasePlatform):
    """NVIDIA GPUs through NVML: memory, holders and visible devices without a CUDA context.

    Fork-safe (session, table and locks reset in the child). Memory is released eagerly: NVML
    shows freed memory within 0.2-0.9 s (measured on an H200), so waits use no stability window.
    """

    name: ClassVar[str] = "cuda"
    device_type: ClassVar[str] = "cuda"
    visible_devices_env: ClassVar[str | None] = ENV_CUDA_VISIBLE_DEVICES
    # NVML, KFD and Level Zero name processes by host pid: no pid-namespace support (NVML docs).
    holder_pids_are_host_pids: ClassVar[bool] = True
    # Tensor-core formats by compute capability, from NVIDIA's architecture documentation.
    FEATURES: ClassVar[Mapping[str, tuple[FeatureRule, ...]]] = {
        "bf16": (FeatureRule(min_compute_capability=(8, 0)),),  # Ampere
        "fp8": (FeatureRule(min_compute_capability=(8, 9), value="e4m3fn", note="native"),),
        "fp8-native": (FeatureRule(min_compute_capability=(8, 9), value="e4m3fn"),),  # Ada+
        "fp4": (FeatureRule(min_compute_capability=(10, 0), value="nvfp4,mxfp4"),),  # Blackwell
        "mxfp4": (FeatureRule(min_compute_capability=(10, 0)),),
    }

    def __init__(
        self,
        *,
        proc_root: str | os.PathLike[str] | None = None,
        order_resolver: OrderResolver | None = None,
        visible: str | None = None,
    ) -> None:
        self._proc_root = None if proc_root is None else os.fspath(proc_root)
        self._order_resolver: OrderResolver = order_resolver or cuda_order_uuids
        self._visible = visible  # restricted(): this value, not the environment's
        self._view_cache: _View | None = None
        self._order_cache: dict[tuple[str | None, tuple[str, ...]], tuple[list[str], str]] = {}

    @classmethod
    @override
    @never_raises
    def probe(cls) -> ProbeResult:
        """Return whether NVML works and shows a visible GPU (in PCI order; no subprocess)."""
        try:
            with _nvml.session() as nv:
                gpus = _physical_gpus(nv)
                driver = _driver_version(nv)
        except NvmlUnavailableError as exc:
            return ProbeResult(False, exc.reason)
        except BackendError as exc:
            return ProbeResult(False, f"NVML query failed: {exc}")
        if not gpus:
            return ProbeResult(False, f"NVML (driver {driver}) found no NVIDIA GPU")
        value = os.environ.get(ENV_CUDA_VISIBLE_DEVICES)
        resolution = resolve_cuda_visible_devices(value, _pci_order(gpus))
        if not resolution.targets:
            why = f"; {resolution.notes[0]}" if resolution.notes else ""
            return ProbeResult(
                False,
                f"NVML (driver {driver}) sees {len(gpus)} NVIDIA GPU(s), but "
                f"{ENV_CUDA_VISIBLE_DEVICES}={clip(repr(value), 80)} leaves none visible{why}",
            )
        names = sorted({g.name for g in gpus})
        return ProbeResult(
            True,
            f"NVML (driver {driver}): {len(resolution.targets)} of {len(gpus)} NVIDIA GPU(s) "
            f"visible ({', '.join(names)})",
        )

    @override
    @functools.cached_property
    def graph(self) -> GraphSupport:
        """CUDA graphs: ``torch.cuda.CUDAGraph`` from torch 1.10, in a build for CUDA (or any)."""
        return graph_support("torch.cuda.CUDAGraph", (1, 10), label="CUDA graphs", flavour="cu")

    @property
    def notes(self) -> tuple[str, ...]:
        """What applying ``CUDA_VISIBLE_DEVICES``/``CUDA_DEVICE_ORDER`` dropped or assumed."""
        return self._view().notes

    @override
    def driver_version(self) -> str:
        """Return the NVIDIA driver version NVML reports (``"unknown"`` if it cannot say)."""
        with _nvml.session() as nv:
            return _driver_version(nv)

    @override
    def devices(self) -> Sequence[DeviceInfo]:
        """Return the visible GPUs or MIG devices; ``physical_index``: NVML's (a MIG's parent's)."""
        return self._view().devices

    @override
    def lease_units(self) -> tuple[str, ...]:
        """Return a ``CUDA_VISIBLE_DEVICES`` value per unit a scheduler may hand a child.

        Each MIG device of each MIG-enabled GPU this process may use, and each other GPU, by
        UUID (a CUDA process sees at most one MIG device); ``()`` where the units are the
        visible devices.
        """
        return self._view().units

    @override
    def restricted(self, value: str) -> CudaPlatform:
        """Return this platform as a child started with ``CUDA_VISIBLE_DEVICES=value`` sees it."""
        return CudaPlatform(
            proc_root=self._proc_root, order_resolver=self._order_resolver, visible=value
        )

    def _view(self) -> _View:
        cvd = os.environ.get(ENV_CUDA_VISIBLE_DEVICES) if self._visible is None else self._visible
        order = os.environ.get(ENV_CUDA_DEVICE_ORDER)
        view = self._view_cache
        if view is not None and view.key == (_nvml.generation(), cvd, order):
            return view
        with _lock, _nvml.session() as nv:
            key = (_nvml.generation(), cvd, order)  # entering the session may start a new one
            view = self._view_cache
            if view is None or view.key != key:
                view = self._view_cache = self._build_view(nv, key)
            return view

    def _build_view(self, nv: Any, key: tuple[int, str | None, str | None]) -> _View:
        _, cvd, order = key
        gpus, notes = self._in_cuda_order(_physical_gpus(nv), order)
        spec = parse_cuda_visible_devices(cvd)
        gpus = self._with_named_migs(nv, gpus, spec.entries)
        resolution = resolve_cuda_visible_devices(spec, gpus)
        by_uuid: dict[str, tuple[GpuRecord, MigRecord | None]] = {}
        for gpu in gpus:
            by_uuid[gpu.uuid] = (gpu, None)
            by_uuid.update((m.uuid, (gpu, m)) for m in gpu.mig_devices)
        devices: list[DeviceInfo] = []
        handles: list[Any] = []
        for index, target in enumerate(resolution.targets):
            gpu, mig = by_uuid[target.uuid]
            one = mig or gpu
            cc = gpu.compute_capability
            arch = None if cc is None else f"sm_{cc[0]}{cc[1]}"  # (9, 0): sm_90
            info = DeviceInfo(index, gpu.nvml_index, one.name, one.uuid, gpu.pci_bus_id, arch, cc)
            devices.append(info)
            handles.append(one.handle)
        units: list[str] = []
        for named in resolution.named:  # what this process may use, slice by slice
            gpu = by_uuid[named.uuid][0]
            whole = named.mig or not gpu.mig_enabled
            units.extend([named.uuid] if whole else [m.uuid for m in gpu.mig_devices])
        if units == [d.uuid for d in devices]:
            units = []
        return _View(key, tuple(devices), tuple(handles), (*notes, *resolution.notes), tuple(units))

    def _in_cuda_order(
        self, gpus: tuple[GpuRecord, ...], order: str | None
    ) -> tuple[list[GpuRecord], tuple[str, ...]]:
        pci_sorted = _pci_order(gpus)
        if is_pci_bus_order(order) or len({g.name for g in gpus}) <= 1:
            return pci_sorted, ()
        by_uuid = {g.uuid: g for g in gpus}
        cache_key = (order, tuple(g.uuid for g in pci_sorted))
        cached = self._order_cache.get(cache_key)
        if cached is None:
            env = {k: v for k, v in os.environ.items() if k != ENV_CUDA_VISIBLE_DEVICES}
            try:
                uuids = [str(u) for u in self._order_resolver(env)]
                strangers = [u for u in uuids if u not in by_uuid]
                if strangers or not uuids:
                    why = f"CUDA listed {len(uuids)} device(s), {len(strangers)} unknown to NVML"
                    raise RuntimeError(why)
                cached = (uuids, "")
            except Exception as exc:
                cached = (
                    [g.uuid for g in pci_sorted],
                    f"GPUs of different models and CUDA_DEVICE_ORDER={order!r}: CUDA's "
                    f"fastest-first order could not be read ({exc}); PCI bus order is assumed. "
                    f"Set CUDA_DEVICE_ORDER=PCI_BUS_ID to make ordinals unambiguous",
                )
            self._order_cache[cache_key] = cached
        uuids, note = cached
        return [by_uuid[u] for u in uuids], ((note,) if note else ())

    def _with_named_migs(
        self, nv: Any, gpus: list[GpuRecord], entries: Sequence[Any]
    ) -> list[GpuRecord]:
        """Add MIG devices named by full UUID that enumeration did not list (NVML finds them)."""
        known = {uuid_digits(m.uuid) for g in gpus for m in g.mig_devices}
        result = list(gpus)
        for entry in entries:
            digits = entry.uuid_prefix or ""
            wanted = entry.kind is EntryKind.MIG_UUID and len(digits) == _FULL_MIG_DIGITS
            if not wanted or digits in known:
                continue
            uuid = _dashed(digits)
            try:
                mig_handle = nv.nvmlDeviceGetHandleByUUID(uuid)
                parent = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig_handle)
                parent_uuid = _text(nv.nvmlDeviceGetUUID(parent))
                mig = _describe_mig(nv, mig_handle, f"MIG device {uuid}")
            except Exception:  # not found: the entry stays invalid, as CUDA would find it
                continue
            for pos, gpu in enumerate(result):
                if gpu.uuid == parent_uuid:
                    migs = (*gpu.mig_devices, mig)
                    result[pos] = gpu._replace(mig_enabled=True, mig_devices=migs)
        return result

    def _target(self, index: int) -> tuple[DeviceInfo, Any, str]:
        """The device, its NVML handle, and how messages name it."""
        # memory_info checked the index against a view built from this call's variables:
        # reuse it rather than read them again (a newer view from another thread is as good).
        view = self._view_cache
        if view is None or view.key[0] != _nvml.generation():
            view = self._view()
        if index >= len(view.devices):  # the variables changed since the index was checked
            raise DeviceNotFoundError(index, len(view.devices), self.name)
        info = view.devices[index]
        where = f"cuda device {index} ({info.uuid}, NVML index {info.physical_index})"
        return info, view.handles[index], where

    @override
    def _memory_info(self, device: int) -> MemoryInfo:
        info, handle, where = self._target(device)
        nv = _nvml.acquire()  # not session(): the polling path of every wait
        try:
            figures = _nvml.memory(nv, handle, info.uuid or "", where)
        finally:
            _nvml.release()
        if figures is None:
            return self._host_memory(where)
        free, total, used, reserved, source = figures
        return checked_memory(
            "cuda", where, free=free, total=total, used=used, reserved=reserved, source=source
        )

    def _host_memory(self, where: str) -> MemoryInfo:
        """Memory of a GPU that shares the host's (GB10/DGX Spark, Jetson), as tools report it."""
        try:
            meminfo, why = host_meminfo(self._proc_root), "has no MemTotal/MemAvailable"
        except OSError as exc:
            meminfo, why = None, f"cannot be read: {exc.strerror or exc}"
        if meminfo is None:
            raise BackendError(
                "cuda",
                f"this GPU shares host memory (NVML reports no memory of its own), and "
                f"{meminfo_path(self._proc_root)} {why}",
                vendor_error="NVMLError_NotSupported",
            )
        # Judged as read: MemAvailable above MemTotal is an error, never clamped.
        total, free = meminfo.total, meminfo.available
        shared = f"{where}, sharing host memory ({meminfo.path})"
        used, source = max(0, total - free), _nvml.SOURCE_HOST
        return checked_memory("cuda", shared, free=free, total=total, used=used, source=source)

    @override
    def memory_holders(self, device: int) -> Sequence[MemoryHolder] | None:
        """Return NVML's compute and graphics processes on ``device`` (host PIDs), or ``None``.

        A process in both lists appears once, with the larger figure (NVML reports each
        process's memory on the device, not per list).
        """
        _, handle, where = self._target(self.check_device(device))
        with _nvml.session() as nv:
            compute = _process_list(nv, handle, where, "Compute")
            if compute is None:
                return None
            graphics = _process_list(nv, handle, where, "Graphics") or []
        from accelplat._vendor.procs import driver_holder

        merged: dict[int, MemoryHolder] = {}
        for proc in (*compute, *graphics):
            used = getattr(proc, "usedGpuMemory", None)
            known = None if used == _NVML_VALUE_NOT_AVAILABLE else used  # NVML: "not available"
            holder = driver_holder("cuda", where, getattr(proc, "pid", None), known)
            seen = merged.get(holder.pid)
            if seen is None or (holder.used_bytes or 0) > (seen.used_bytes or 0):
                merged[holder.pid] = holder
        return tuple(merged.values())


def _process_list(nv: Any, handle: Any, where: str, kind: str) -> list[Any] | None:
    """NVML's ``kind`` ("Compute", "Graphics") process list, ``None`` where it cannot tell."""
    # nvidia-ml-py asks for the v3 list, which drivers before R510 lack: then the v2 one.
    for name in (f"nvmlDeviceGet{kind}RunningProcesses", f"nvmlDeviceGet{kind}RunningProcesses_v2"):
        listing = getattr(nv, name, None)
        if listing is None:  # an nvidia-ml-py without this list
            return None
        try:
            procs = listing(handle)
        except Exception as exc:
            if _nvml.is_error(exc, "NVMLLibraryMismatchError"):
                continue
            if _nvml.is_error(exc, "NotSupported", "NoPermission", "FunctionNotFound"):
                return None
            raise _nvml.translate(exc, f"listing processes on {where}") from exc
        try:
            return list(procs)
        except TypeError:  # not a list at all
            return [procs]
    return None


def _after_fork_in_child() -> None:
    global _lock, _table
    # Another thread of the parent may have held the lock at fork time (enumerating GPUs,
    # building a view); in the child no thread will ever release it. The cached table holds
    # the parent's NVML handles, which the child must not use either (accelplat._vendor.nvml
    # starts a new session there).
    _lock = threading.RLock()
    _table = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

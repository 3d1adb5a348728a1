"""The ``cuda`` platform: NVIDIA GPUs, read through NVML, never through a CUDA context.

What it reads:
    NVML (``libnvidia-ml.so.1`` through the ``pynvml`` module of nvidia-ml-py), in one
    process-wide session (:mod:`accelplat._vendor.nvml`): device count, handles, names, UUIDs, PCI
    bus
    ids, MIG mode and MIG devices once per session; memory and the compute-process list on every
    query. NVML queries create no CUDA context and take no device memory, and torch is never
    imported: a process that only asks accelplat keeps the GPU free and stays safe to fork.

Memory (``MemoryInfo.source``):
    ``"nvml-v2"``: ``nvmlDeviceGetMemoryInfo(handle, version=nvmlMemory_v2)``. The driver keeps
        ``reserved`` bytes (about 615 MiB on an H200) that no application can use; NVML's v1
        struct counts them as used, so an idle GPU never looks idle. accelplat reports
        ``total = v2.total - v2.reserved`` (what CUDA and ``torch.cuda.mem_get_info`` call
        total), ``used = v2.used``, ``free = v2.free`` (equal to CUDA's free) and ``reserved``.
    ``"nvml-v1"``: drivers before R510 lack the v2 function (``NVMLError_FunctionNotFound``), and
        WSL answers it with ``NVMLError_Unknown``: the v1 struct is used, where ``total`` is
        NVML's total and ``used`` includes the reserved memory.
    ``"host-unified"``: GPUs that share host memory (GB10/DGX Spark, Jetson-class) answer
        ``NVMLError_NotSupported``; the host's ``MemTotal``/``MemAvailable`` from
        ``/proc/meminfo`` stand in, as monitoring tools do. ``/proc`` may be moved with the
        ``proc_root`` argument or ``ACCELPLAT_PROC_ROOT``. This is only for a GPU that has
        never reported memory of its own: once a GPU has answered through v2 or v1, a
        ``NotSupported`` from it is a :class:`~accelplat.errors.BackendError`, never a switch
        to host memory (which would say nothing about that GPU).
    Impossible figures (a wrapped-around counter, ``reserved`` above ``total``, ``free`` or
    ``used`` above ``total``) raise :class:`~accelplat.errors.ImplausibleReadingError`, by the
    rule all backends share (:mod:`accelplat._backends._readings`).
    Any other NVML error (``NVMLError_GpuIsLost`` in the middle of a wait, say) raises
    :class:`~accelplat.errors.BackendError` whose ``vendor_error`` names it.

Devices:
    Visible indices follow ``CUDA_VISIBLE_DEVICES`` exactly as CUDA applies it (ordinals, full or
    abbreviated ``GPU-`` UUIDs, ``MIG-`` UUIDs, the first invalid entry ending the list, a
    duplicate hiding everything; see :mod:`accelplat._visible.cuda`), and ordinals follow
    ``CUDA_DEVICE_ORDER``. NVML enumerates in PCI bus order; CUDA's default is fastest-first,
    which agrees with PCI order when all GPUs have the same name. For a machine with different
    GPU models (and no ``CUDA_DEVICE_ORDER=PCI_BUS_ID``) CUDA's order is read once per value of
    ``CUDA_DEVICE_ORDER`` in a throw-away subprocess that calls the CUDA driver API through
    ctypes (``cuInit``, ``cuDeviceGetCount``, ``cuDeviceGetUuid``: no context); when that fails,
    PCI order is assumed and :attr:`CudaPlatform.notes` says so. Both variables are read on every
    call, so changing them at run time takes effect at once.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

from typing_extensions import override

from accelplat import _boundary
from accelplat._backends._common import host_meminfo, proc_root
from accelplat._backends._readings import checked_memory
from accelplat._platform import BasePlatform, StartMethod
from accelplat._types import (
    DeviceInfo,
    FeatureRule,
    GraphSupport,
    MemoryInfo,
    ProbeResult,
    ReleaseProfile,
)
from accelplat._usage import MemoryHolder
from accelplat._vendor import nvml as _nvml
from accelplat._vendor.graphs import graph_support
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

__all__ = ["CudaPlatform", "cuda_order_uuids"]


OrderResolver = Callable[[Mapping[str, str]], Sequence[str]]
"""Returns the UUIDs of all GPUs in CUDA's enumeration order, given the environment to use."""

_SOURCE_V2 = "nvml-v2"
_SOURCE_V1 = "nvml-v1"
_SOURCE_HOST = "host-unified"

_V1_FALLBACK_ERRORS = (
    "FunctionNotFound",  # driver before R510: no nvmlDeviceGetMemoryInfo_v2
    "ArgumentVersionMismatch",  # driver that knows the function but not this struct version
    "Unknown",  # WSL
    "NotSupported",  # try v1 before concluding the device has no memory of its own
    "AttributeError",  # nvidia-ml-py too old to define nvmlMemory_v2
    "TypeError",  # nvidia-ml-py too old to accept version=
)
_HOLDERS_UNKNOWN_ERRORS = ("NotSupported", "NoPermission")
_MIG_ABSENT_ERRORS = ("NotSupported", "FunctionNotFound", "InvalidArgument", "NotFound")
_FULL_MIG_DIGITS = len("MIG-") + 32
_NVML_VALUE_NOT_AVAILABLE = 2**64 - 1
"""NVML's ``NVML_VALUE_NOT_AVAILABLE`` for a process's used memory (unsigned long long)."""

_CUDA_ORDER_SCRIPT = r"""
import ctypes, sys
try:
    lib = ctypes.CDLL("libcuda.so.1")
except OSError as exc:
    sys.stderr.write("libcuda.so.1 cannot be loaded: %s" % exc)
    sys.exit(2)
def check(rc, what):
    if rc != 0:
        sys.stderr.write("%s returned CUDA error %d" % (what, rc))
        sys.exit(3)
rc = lib.cuInit(0)
if rc == 100:  # CUDA_ERROR_NO_DEVICE: nothing visible
    sys.exit(0)
check(rc, "cuInit")
count = ctypes.c_int(0)
check(lib.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
for ordinal in range(count.value):
    dev = ctypes.c_int(0)
    check(lib.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
    raw = (ctypes.c_ubyte * 16)()
    check(lib.cuDeviceGetUuid(raw, dev), "cuDeviceGetUuid")
    h = bytes(raw).hex()
    print("GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:]))
"""


def cuda_order_uuids(env: Mapping[str, str]) -> list[str]:
    """Return every GPU's UUID in the CUDA driver's enumeration order.

    Runs a throw-away Python subprocess that loads ``libcuda.so.1`` with ctypes and calls
    ``cuInit``, ``cuDeviceGetCount``, ``cuDeviceGet`` and ``cuDeviceGetUuid`` — no context is
    created, and the subprocess exits at once.

    Args:
        env: The subprocess's environment; ``CUDA_VISIBLE_DEVICES`` should be absent so every GPU
            is listed, and ``CUDA_DEVICE_ORDER`` present as the caller has it.

    Returns:
        ``GPU-…`` UUIDs, CUDA ordinal 0 first; empty when CUDA sees no device. With
        ``CUDA_VISIBLE_DEVICES`` in ``env``, the devices CUDA makes visible under it.

    Raises:
        RuntimeError: When the subprocess fails (no ``libcuda``, a CUDA error, a timeout).

    Side effects:
        Asked through the vendor boundary: a capture records the order, a replay gives the
        captured host's (and starts no subprocess).
    """
    answer = _boundary.call(
        "cuda", ("order", env.get(ENV_CUDA_DEVICE_ORDER)), lambda: _cuda_order_live(env)
    )
    if not isinstance(answer, list) or not all(isinstance(u, str) for u in answer):
        raise RuntimeError("the capture holds no CUDA enumeration order")
    return list(answer)


def _cuda_order_live(env: Mapping[str, str]) -> list[str]:
    import subprocess

    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _CUDA_ORDER_SCRIPT],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"could not run the CUDA enumeration subprocess: {exc}") from exc
    if done.returncode != 0:
        detail = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        raise RuntimeError(
            f"the CUDA enumeration subprocess exited with {done.returncode}"
            + (f": {detail}" if detail else "")
        )
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


class _Mig(NamedTuple):
    handle: Any
    uuid: str
    name: str
    gpu_instance_id: int | None
    compute_instance_id: int | None


class _Gpu(NamedTuple):
    nvml_index: int
    handle: Any
    name: str
    uuid: str
    pci_bus_id: str | None
    mig_enabled: bool
    migs: tuple[_Mig, ...]
    compute_capability: tuple[int, int] | None = None


class _View(NamedTuple):
    key: tuple[int, str | None, str | None]
    devices: tuple[DeviceInfo, ...]
    handles: tuple[Any, ...]
    notes: tuple[str, ...]


_table_lock = threading.Lock()
_table: tuple[int, tuple[_Gpu, ...]] | None = None
"""``(NVML session generation, GPUs in NVML order)``, shared by the probe and every instance."""

_instances: weakref.WeakSet[CudaPlatform] = weakref.WeakSet()
"""Every live :class:`CudaPlatform`, so that a forked child can give each a fresh lock."""


def _read_visibility_env() -> tuple[str | None, str | None]:
    """Return ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` (compared to the cached view)."""
    return os.environ.get(ENV_CUDA_VISIBLE_DEVICES), os.environ.get(ENV_CUDA_DEVICE_ORDER)


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _dashed(digits: str) -> str:
    """``"MIG-" + 32 digits`` → the 8-4-4-4-12 spelling NVML prints and accepts."""
    head, d = digits[:4], digits[4:]
    return f"{head}{d[:8]}-{d[8:12]}-{d[12:16]}-{d[16:20]}-{d[20:]}"


def _normalize_bus_id(raw: str) -> str:
    """``"00000000:3B:00.0"`` → ``"0000:3b:00.0"`` (the sysfs spelling)."""
    text = raw.strip().lower()
    domain, sep, rest = text.partition(":")
    if sep and len(domain) > 4 and domain.lstrip("0") == domain[-4:].lstrip("0"):
        domain = domain[-4:]
    return f"{domain}{sep}{rest}" if sep else text


def _pci_key(gpu: _Gpu) -> tuple[int, tuple[int, ...]]:
    if gpu.pci_bus_id is None:
        return (1, (gpu.nvml_index,))
    try:
        domain, bus, devfn = gpu.pci_bus_id.split(":")
        dev, fn = devfn.split(".")
        return (0, (int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16), gpu.nvml_index))
    except ValueError:
        return (1, (gpu.nvml_index,))


def _call(nv: Any, action: str, fn: str, *args: Any, **kwargs: Any) -> Any:
    try:
        return getattr(nv, fn)(*args, **kwargs)
    except Exception as exc:
        raise _nvml.translate(exc, action) from exc


def _mig_devices(nv: Any, handle: Any, index: int) -> tuple[bool, tuple[_Mig, ...]]:
    try:
        current = nv.nvmlDeviceGetMigMode(handle)[0]
    except Exception as exc:
        if _nvml.is_error(exc, *_MIG_ABSENT_ERRORS, "AttributeError"):
            return False, ()
        raise _nvml.translate(exc, f"reading the MIG mode of GPU {index}") from exc
    if int(current) != int(getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1)):
        return False, ()
    slots = _call(
        nv, f"counting MIG devices of GPU {index}", "nvmlDeviceGetMaxMigDeviceCount", handle
    )
    migs: list[_Mig] = []
    for slot in range(int(slots)):
        try:
            mig_handle = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except Exception as exc:
            if _nvml.is_error(exc, "NotFound", "InvalidArgument"):
                continue  # an empty slot
            raise _nvml.translate(exc, f"reading MIG device {slot} of GPU {index}") from exc
        migs.append(_describe_mig(nv, mig_handle, f"MIG device {slot} of GPU {index}"))
    return True, tuple(migs)


def _describe_mig(nv: Any, mig_handle: Any, what: str) -> _Mig:
    uuid = _text(_call(nv, f"reading the UUID of {what}", "nvmlDeviceGetUUID", mig_handle))
    name = _text(_call(nv, f"reading the name of {what}", "nvmlDeviceGetName", mig_handle))
    ids: list[int | None] = []
    for fn in ("nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId"):
        try:
            ids.append(int(getattr(nv, fn)(mig_handle)))
        except Exception:  # only needed for the legacy MIG-GPU-…/gi/ci form
            ids.append(None)
    return _Mig(mig_handle, uuid, name, ids[0], ids[1])


def _enumerate(nv: Any) -> tuple[_Gpu, ...]:
    count = int(_call(nv, "counting GPUs", "nvmlDeviceGetCount"))
    gpus: list[_Gpu] = []
    for index in range(count):
        handle = _call(nv, f"opening GPU {index}", "nvmlDeviceGetHandleByIndex", index)
        name = _text(_call(nv, f"reading the name of GPU {index}", "nvmlDeviceGetName", handle))
        uuid = _text(_call(nv, f"reading the UUID of GPU {index}", "nvmlDeviceGetUUID", handle))
        try:
            bus_id: str | None = _normalize_bus_id(_text(nv.nvmlDeviceGetPciInfo(handle).busId))
        except Exception:  # the bus id only orders GPUs; NVML's order is the fallback
            bus_id = None
        mig_enabled, migs = _mig_devices(nv, handle, index)
        capability = _compute_capability(nv, handle)
        gpus.append(_Gpu(index, handle, name, uuid, bus_id, mig_enabled, migs, capability))
    return tuple(gpus)


def _compute_capability(nv: Any, handle: Any) -> tuple[int, int] | None:
    """Return ``nvmlDeviceGetCudaComputeCapability`` as ``(major, minor)``, or ``None``.

    Context-free (NVML only). ``None`` when the driver or binding lacks the call or answers
    with something that is not two small non-negative integers.
    """
    try:
        major, minor = nv.nvmlDeviceGetCudaComputeCapability(handle)
    except Exception:  # an identity fact is optional: no capability rather than no GPU
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (major, minor)):
        return None
    if not (0 <= major < 100 and 0 <= minor < 10):
        return None
    return int(major), int(minor)


def sm_arch(capability: tuple[int, int] | None) -> str | None:
    """Return the ``sm_XY`` name of a compute capability (``(9, 0)`` -> ``"sm_90"``)."""
    if capability is None:
        return None
    return f"sm_{capability[0]}{capability[1]}"


def _physical_gpus(nv: Any) -> tuple[_Gpu, ...]:
    """Every GPU NVML sees, in NVML order, enumerated once per NVML session."""
    global _table
    gen = _nvml.generation()
    cached = _table
    if cached is not None and cached[0] == gen:
        return cached[1]
    with _table_lock:
        cached = _table
        if cached is not None and cached[0] == gen:
            return cached[1]
        gpus = _enumerate(nv)
        _table = (gen, gpus)
        return gpus


def _records(gpus: Sequence[_Gpu]) -> list[GpuRecord]:
    return [
        GpuRecord(
            g.nvml_index,
            g.uuid,
            g.mig_enabled,
            tuple(MigRecord(m.uuid, m.gpu_instance_id, m.compute_instance_id) for m in g.migs),
        )
        for g in gpus
    ]


def _driver_version(nv: Any) -> str:
    try:
        return _text(nv.nvmlSystemGetDriverVersion())
    except Exception:
        return "unknown"


class CudaPlatform(BasePlatform):
    """NVIDIA GPUs through NVML: memory, holders and visible devices without a CUDA context.

    ``preferred_start_method`` is ``"fork"``: every query goes through NVML, which creates no
    CUDA context, so a process that used accelplat (and not torch) can still fork safely; the NVML
    session, the GPU table and every instance's lock are reset in the child (even when another
    thread of the parent was inside a query at fork time). (A process that itself created a
    CUDA context must use ``"spawn"`` for its workers whatever accelplat says; that is the
    framework's concern.)

    Memory is released eagerly: once a process frees memory or exits, NVML shows it free within
    a second (0.2–0.9 s measured on an H200), so waits use no stability window.

    Args:
        proc_root: Where ``/proc`` is, for the host memory of unified-memory GPUs; defaults to
            ``ACCELPLAT_PROC_ROOT`` or ``/proc``.
        order_resolver: Returns all GPU UUIDs in CUDA's order, for machines with different GPU
            models; defaults to :func:`cuda_order_uuids` (a throw-away subprocess).
    """

    name: ClassVar[str] = "cuda"
    device_type: ClassVar[str] = "cuda"
    visible_devices_env: ClassVar[str | None] = ENV_CUDA_VISIBLE_DEVICES
    default_memory_utilization: ClassVar[float] = 0.92
    preferred_start_method: ClassVar[StartMethod] = "fork"
    context_free: ClassVar[bool] = True
    RELEASE: ClassVar[ReleaseProfile] = ReleaseProfile(
        lazy=False, stable_duration_s=0.0, settle_timeout_s=120.0, idle_floor_bytes=0
    )
    FEATURES: ClassVar[Mapping[str, tuple[FeatureRule, ...]]] = {
        "bf16": (FeatureRule(min_compute_capability=(8, 0)),),  # Ampere
        "fp8": (FeatureRule(min_compute_capability=(8, 9), value="e4m3fn"),),  # Ada, Hopper
        "fp4": (FeatureRule(min_compute_capability=(10, 0), value="nvfp4,mxfp4"),),  # Blackwell
        "mxfp4": (FeatureRule(min_compute_capability=(10, 0)),),
    }
    """Tensor-core formats by compute capability, from NVIDIA's architecture documentation."""

    def __init__(
        self,
        *,
        proc_root: str | os.PathLike[str] | None = None,
        order_resolver: OrderResolver | None = None,
    ) -> None:
        self._proc_root = None if proc_root is None else os.fspath(proc_root)
        self._order_resolver: OrderResolver = order_resolver or cuda_order_uuids
        self._lock = threading.Lock()
        _instances.add(self)
        self._view_cache: _View | None = None
        self._view_raw: tuple[object, object] | None = None
        self._order_cache: dict[tuple[str | None, tuple[str, ...]], tuple[list[str], str]] = {}
        self._memory_source: dict[str, str] = {}
        self._own_memory: set[str] = set()  # GPUs that have reported memory of their own
        self._graph: GraphSupport | None = None

    # -- detection -------------------------------------------------------------------------

    @classmethod
    @override
    def probe(cls) -> ProbeResult:
        """Return whether NVML works here and shows at least one visible GPU; never raises.

        Returns:
            Available when ``pynvml`` imports, ``nvmlInit`` succeeds and at least one GPU is
            visible after ``CUDA_VISIBLE_DEVICES``; otherwise unavailable with the reason
            (nvidia-ml-py missing, shadowed ``pynvml`` module, no driver, driver not loaded,
            driver/library mismatch, no GPU, all GPUs hidden).

        Side effects:
            Imports ``pynvml`` and initialises NVML once per process. No CUDA context, no torch,
            no subprocess (ordinals are counted in PCI order, which cannot change the count).
        """
        try:
            with _nvml.session() as nv:
                gpus = _physical_gpus(nv)
                driver = _driver_version(nv)
            if not gpus:
                return ProbeResult(False, f"NVML (driver {driver}) found no NVIDIA GPU")
            value = os.environ.get(ENV_CUDA_VISIBLE_DEVICES)
            resolution = resolve_cuda_visible_devices(value, _records(sorted(gpus, key=_pci_key)))
            if not resolution.targets:
                why = f"; {resolution.notes[0]}" if resolution.notes else ""
                return ProbeResult(
                    False,
                    f"NVML (driver {driver}) sees {len(gpus)} NVIDIA GPU(s), but "
                    f"{ENV_CUDA_VISIBLE_DEVICES}={value!r} leaves none visible{why}",
                )
            names = sorted({g.name for g in gpus})
            return ProbeResult(
                True,
                f"NVML (driver {driver}): {len(resolution.targets)} of {len(gpus)} NVIDIA GPU(s) "
                f"visible ({', '.join(names)})",
            )
        except NvmlUnavailableError as exc:
            return ProbeResult(False, exc.reason)
        except BackendError as exc:
            return ProbeResult(False, f"NVML query failed: {exc}")
        except Exception as exc:  # a probe never raises
            return ProbeResult(False, f"NVML probe failed: {type(exc).__name__}: {exc}")

    # -- properties ------------------------------------------------------------------------

    @property
    @override
    def graph(self) -> GraphSupport:
        """CUDA graph capability, decided from the installed torch version (torch not imported).

        Available with ``api="torch.cuda.CUDAGraph"`` when torch ≥ 1.10 is installed and is not
        a build for another platform (``+cpu``, ``+rocm…``, ``+xpu``); unavailable with the
        reason otherwise. Shares :func:`accelplat._vendor.graphs.graph_support` with ROCm and XPU.
        """
        graph = self._graph
        if graph is None:
            graph = self._graph = graph_support(
                "torch.cuda.CUDAGraph", (1, 10), label="CUDA graphs", flavour="cu"
            )
        return graph

    @property
    def notes(self) -> tuple[str, ...]:
        """What applying ``CUDA_VISIBLE_DEVICES``/``CUDA_DEVICE_ORDER`` dropped or assumed.

        Raises:
            BackendError: When NVML fails.
        """
        return self._view().notes

    @override
    def driver_version(self) -> str:
        """Return the NVIDIA driver version NVML reports (``"unknown"`` if it cannot say).

        Raises:
            BackendError: When NVML is unavailable.
        """
        with _nvml.session() as nv:
            return _driver_version(nv)

    # -- devices ---------------------------------------------------------------------------

    @override
    def devices(self) -> Sequence[DeviceInfo]:
        """Return the visible GPUs (or MIG devices) in visible-index order.

        Returns:
            One :class:`DeviceInfo` per visible device: ``index`` is the visible index,
            ``physical_index`` the NVML index (of the parent GPU for a MIG device), with name,
            UUID and PCI bus id.

        Raises:
            BackendError: When NVML is unavailable or fails.

        Side effects:
            Reads ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` on every call. On a machine
            with different GPU models and no ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, the first call for
            a given order runs a throw-away subprocess (no CUDA context in this process).
        """
        return self._view().devices

    def _view(self) -> _View:
        raw = _read_visibility_env()
        view = self._view_cache
        if view is not None and self._view_raw == raw and view.key[0] == _nvml.generation():
            return view
        cvd = os.environ.get(ENV_CUDA_VISIBLE_DEVICES)
        order = os.environ.get(ENV_CUDA_DEVICE_ORDER)
        with self._lock, _nvml.session() as nv:
            key = (_nvml.generation(), cvd, order)
            view = self._view_cache
            if view is not None and view.key == key:
                return view
            view = self._build_view(nv, key)
            self._view_cache = view
            self._view_raw = raw
            return view

    def _build_view(self, nv: Any, key: tuple[int, str | None, str | None]) -> _View:
        _, cvd, order = key
        gpus, notes = self._in_cuda_order(_physical_gpus(nv), order)
        spec = parse_cuda_visible_devices(cvd)
        gpus = self._with_named_migs(nv, gpus, spec.entries)
        resolution = resolve_cuda_visible_devices(spec, _records(gpus))
        by_uuid: dict[str, tuple[_Gpu, _Mig | None]] = {}
        for gpu in gpus:
            by_uuid[gpu.uuid] = (gpu, None)
            for mig in gpu.migs:
                by_uuid[mig.uuid] = (gpu, mig)
        devices: list[DeviceInfo] = []
        handles: list[Any] = []
        for index, target in enumerate(resolution.targets):
            owner, instance = by_uuid[target.uuid]
            devices.append(
                DeviceInfo(
                    index=index,
                    physical_index=owner.nvml_index,
                    name=instance.name if instance is not None else owner.name,
                    uuid=target.uuid,
                    pci_bus_id=owner.pci_bus_id,
                    arch=sm_arch(owner.compute_capability),
                    compute_capability=owner.compute_capability,
                )
            )
            handles.append(instance.handle if instance is not None else owner.handle)
        return _View(key, tuple(devices), tuple(handles), (*notes, *resolution.notes))

    def _in_cuda_order(
        self, gpus: tuple[_Gpu, ...], order: str | None
    ) -> tuple[list[_Gpu], tuple[str, ...]]:
        pci_sorted = sorted(gpus, key=_pci_key)
        if is_pci_bus_order(order) or len({g.name for g in gpus}) <= 1:
            return pci_sorted, ()
        cache_key = (order, tuple(g.uuid for g in pci_sorted))
        cached = self._order_cache.get(cache_key)
        if cached is None:
            env = {k: v for k, v in os.environ.items() if k != ENV_CUDA_VISIBLE_DEVICES}
            try:
                uuids = [str(u) for u in self._order_resolver(env)]
                known = {g.uuid for g in gpus}
                strangers = [u for u in uuids if u not in known]
                if strangers or not uuids:
                    raise RuntimeError(
                        f"CUDA listed {len(uuids)} device(s), {len(strangers)} unknown to NVML"
                    )
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
        by_uuid = {g.uuid: g for g in gpus}
        return [by_uuid[u] for u in uuids], ((note,) if note else ())

    def _with_named_migs(self, nv: Any, gpus: list[_Gpu], entries: Sequence[Any]) -> list[_Gpu]:
        """Add MIG devices named by full UUID that enumeration did not list (NVML finds them)."""
        known = {uuid_digits(m.uuid) for g in gpus for m in g.migs}
        extra = [
            _dashed(e.uuid_prefix)
            for e in entries
            if e.kind is EntryKind.MIG_UUID
            and e.uuid_prefix is not None
            and len(e.uuid_prefix) == _FULL_MIG_DIGITS
            and e.uuid_prefix not in known
        ]
        if not extra:
            return gpus
        result = list(gpus)
        for uuid in extra:
            try:
                mig_handle = nv.nvmlDeviceGetHandleByUUID(uuid)
                parent = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig_handle)
                parent_uuid = _text(nv.nvmlDeviceGetUUID(parent))
                mig = _describe_mig(nv, mig_handle, f"MIG device {uuid}")
            except Exception:  # not found: the entry stays invalid, as CUDA would find it
                continue
            for pos, gpu in enumerate(result):
                if gpu.uuid == parent_uuid:
                    result[pos] = gpu._replace(mig_enabled=True, migs=(*gpu.migs, mig))
        return result

    # -- memory ----------------------------------------------------------------------------

    def _target(self, device: object) -> tuple[DeviceInfo, Any]:
        view = self._view()
        if type(device) is int and 0 <= device < len(view.devices):  # the common case, fast
            return view.devices[device], view.handles[device]
        index = self.check_device(device)  # raises DeviceNotFoundError, or accepts an index type
        view = self._view()
        if index >= len(view.devices):  # the variables changed between the two reads
            raise DeviceNotFoundError(device, len(view.devices), self.name)
        return view.devices[index], view.handles[index]

    @override
    def memory_info(self, device: int) -> MemoryInfo:
        """Return memory of visible device ``device`` in bytes (see the module docstring).

        Args:
            device: Visible device index.

        Returns:
            A :class:`MemoryInfo` with ``source`` ``"nvml-v2"``, ``"nvml-v1"`` or
            ``"host-unified"``.

        Raises:
            DeviceNotFoundError: For an index that is not visible.
            BackendError: For an NVML failure, naming the vendor error (e.g.
                ``NVMLError_GpuIsLost``), including ``NotSupported`` from a GPU that reported
                memory of its own before.
            ImplausibleReadingError: For figures that cannot be true (a ``BackendError``).

        Side effects:
            One or two NVML calls; no CUDA context, no torch. Thread-safe.
        """
        info, handle = self._target(device)
        key = info.uuid or ""
        source = self._memory_source.get(key, _SOURCE_V2)
        nv = _nvml.acquire()
        try:
            if source == _SOURCE_V2:
                try:
                    mem = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
                except Exception as exc:
                    if not _nvml.is_error(exc, *_V1_FALLBACK_ERRORS):
                        raise _nvml.translate(exc, _reading(info)) from exc
                    if key in self._own_memory and _nvml.is_error(exc, "NotSupported"):
                        raise _no_longer_reported(exc, info) from exc
                    if not _nvml.is_error(exc, "Unknown"):  # WSL: keep trying v2 first
                        self._memory_source[key] = _SOURCE_V1
                    source = _SOURCE_V1
                else:
                    # The hot path of every wait.
                    free, total, used, reserved = _nvml.memory_v2_figures(mem)
                    reading = checked_memory(
                        "cuda",
                        _describe(info),
                        free=free,
                        total=total - reserved,
                        used=used,
                        reserved=reserved,
                        source=_SOURCE_V2,
                    )
                    self._own_memory.add(key)
                    return reading
            if source == _SOURCE_V1:
                try:
                    mem = nv.nvmlDeviceGetMemoryInfo(handle)
                except Exception as exc:
                    if not _nvml.is_error(exc, "NotSupported"):
                        raise _nvml.translate(exc, _reading(info)) from exc
                    if key in self._own_memory:
                        raise _no_longer_reported(exc, info) from exc
                    self._memory_source[key] = _SOURCE_HOST
                else:
                    reading = checked_memory(
                        "cuda",
                        _describe(info),
                        free=int(mem.free),
                        total=int(mem.total),
                        used=int(mem.used),
                        source=_SOURCE_V1,
                    )
                    self._own_memory.add(key)
                    return reading
        finally:
            _nvml.release()
        return self._host_memory(info)

    def _host_memory(self, info: DeviceInfo) -> MemoryInfo:
        try:
            meminfo = host_meminfo(self._proc_root)
        except OSError as exc:
            path = proc_root(self._proc_root) / "meminfo"  # built for the error only
            raise BackendError(
                "cuda",
                f"this GPU shares host memory (NVML reports no memory of its own), and {path} "
                f"cannot be read: {exc.strerror or exc}",
                vendor_error="NVMLError_NotSupported",
            ) from exc
        if meminfo is None:
            path = proc_root(self._proc_root) / "meminfo"
            raise BackendError(
                "cuda",
                f"this GPU shares host memory, and {path} has no MemTotal/MemAvailable",
                vendor_error="NVMLError_NotSupported",
            )
        # The host's figures as read, through the one rule: a wrapped counter or MemAvailable
        # above MemTotal is an error naming them, never clamped into a plausible answer.
        return checked_memory(
            "cuda",
            f"{_describe(info)}, sharing host memory ({meminfo.path})",
            free=meminfo.available,
            total=meminfo.total,
            used=max(0, meminfo.total - meminfo.available),
            source=_SOURCE_HOST,
        )

    @override
    def memory_holders(self, device: int) -> Sequence[MemoryHolder] | None:
        """Return the processes holding memory on ``device``, from NVML's compute-process list.

        Args:
            device: Visible device index.

        Returns:
            One :class:`MemoryHolder` per process (``used_bytes`` is ``None`` where the driver
            does not say), or ``None`` when NVML cannot tell (``NotSupported``,
            ``NoPermission``). PIDs are host PIDs, even inside a container.

        Raises:
            DeviceNotFoundError: For an index that is not visible.
            BackendError: For other NVML failures, and for a malformed process entry (a pid
                that is not a process id, a negative or wrapped byte count).

        Side effects:
            One NVML call, then ``/proc`` reads (psutil, imported now) to classify each PID.
        """
        info, handle = self._target(device)
        with _nvml.session() as nv:
            try:
                procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
            except Exception as exc:
                if _nvml.is_error(exc, *_HOLDERS_UNKNOWN_ERRORS):
                    return None
                if not _nvml.is_error(exc, "NVMLLibraryMismatchError"):
                    raise _nvml.translate(exc, f"listing processes on {_describe(info)}") from exc
                procs = self._older_process_list(nv, handle, info)
                if procs is None:
                    return None
        from accelplat._vendor.procs import driver_holder

        where = _describe(info)
        try:
            entries = list(procs)
        except TypeError:  # not a list at all
            entries = [procs]
        return tuple(
            driver_holder(
                "cuda",
                where,
                getattr(proc, "pid", None),
                getattr(proc, "usedGpuMemory", None),
                not_available=_NVML_VALUE_NOT_AVAILABLE,
            )
            for proc in entries
        )

    @staticmethod
    def _older_process_list(nv: Any, handle: Any, info: DeviceInfo) -> Any:
        """Drivers before R510 lack the v3 process list nvidia-ml-py asks for; try v2."""
        older = getattr(nv, "nvmlDeviceGetComputeRunningProcesses_v2", None)
        if older is None:
            return None
        try:
            return older(handle)
        except Exception as exc:
            if _nvml.is_error(exc, *_HOLDERS_UNKNOWN_ERRORS, "FunctionNotFound"):
                return None
            raise _nvml.translate(exc, f"listing processes on {_describe(info)}") from exc


def _describe(info: DeviceInfo) -> str:
    return f"cuda device {info.index} ({info.uuid}, NVML index {info.physical_index})"


def _reading(info: DeviceInfo) -> str:
    return f"reading memory of {_describe(info)}"


def _no_longer_reported(exc: BaseException, info: DeviceInfo) -> BackendError:
    """The error for a GPU whose own memory query stopped working after it had worked."""
    return BackendError(
        "cuda",
        f"{_describe(info)} reported memory of its own before, and NVML now says its memory "
        f"query is not supported; not switching to host memory, which would not be this GPU's",
        vendor_error=_nvml.error_name(exc),
    )


def _after_fork_in_child() -> None:
    global _table_lock, _table
    # Another thread of the parent may have held these locks at fork time (enumerating GPUs,
    # building a view); in the child no thread will ever release them. The cached table holds
    # the parent's NVML handles, which the child must not use either (accelplat._vendor.nvml
    # starts a new session there).
    _table_lock = threading.Lock()
    _table = None
    for platform in list(_instances):
        platform._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

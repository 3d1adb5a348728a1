"""One NVML session per process, shared by every user of the CUDA backend, and its memory ladder.

``pynvml`` (nvidia-ml-py) is imported on first use, ``nvmlInit`` runs once per process under a
lock, and every call runs inside :func:`session`, which :func:`shutdown` waits for (accelplat
never shuts NVML down itself). A ``fork()``-ed child starts a new session. NVML failures become
:class:`~accelplat.errors.BackendError` naming the vendor error (:func:`translate`); a missing or
broken library is :class:`~accelplat.errors.NvmlUnavailableError`. :func:`memory` reads a
device's memory through the v2 -> v1 -> host-unified ladder, decided once per device and session.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from types import TracebackType
from typing import Any

from accelplat import _boundary
from accelplat._vendor import import_quietly
from accelplat.errors import BackendError, NvmlUnavailableError

MODULE_NAME = "pynvml"
"""The module nvidia-ml-py installs."""

PLATFORM = "cuda"

_DEPRECATED_PACKAGE_WARNING = r"The pynvml package is deprecated"

_HINTS: dict[str, str] = {
    "NVMLError_LibraryNotFound": (
        "libnvidia-ml.so.1 was not found: no NVIDIA driver is installed, or its library is not "
        "on the loader path"
    ),
    "NVMLError_DriverNotLoaded": "the NVIDIA kernel driver is not loaded",
    "NVMLError_LibRmVersionMismatch": (
        "the NVIDIA kernel module and libnvidia-ml.so differ in version (driver upgraded "
        "without reloading the module or rebooting)"
    ),
    "NVMLError_NoPermission": "this process lacks the permission NVML needs",
    "NVMLError_GpuIsLost": "the GPU is lost (fell off the bus or needs a reset)",
    "NVMLError_ResetRequired": "the GPU needs a reset",
    "NVMLError_Uninitialized": "NVML was shut down or never initialised",
    "NVMLError_Unknown": "NVML reported an unknown error",
    "NVMLError_NotSupported": "this device or driver does not support the query",
    "NVMLError_FunctionNotFound": "the driver is too old for this NVML function",
    "NVMLLibraryMismatchError": "nvidia-ml-py is newer than the installed driver supports",
}


class _State:
    """Mutable session state; replaced wholesale in a forked child."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.module: Any = None
        self.origin: Any = None
        self.initialized = False
        self.closing = False
        self.active = 0
        self.rungs: dict[str, str] = {}  # device UUID -> the memory query that works for it
        self.reported: set[str] = set()  # devices that have answered a memory query


_state = _State()
_generation = 0
"""Bumped on every ``nvmlInit`` and every fork: caches of NVML handles compare it."""


def import_pynvml() -> Any:
    """Return the ``pynvml`` module (``sys.modules``' when imported, so tests can install a fake).

    While a capture records or a replay answers, it comes through the vendor boundary.

    Raises:
        NvmlUnavailableError: When the module cannot be imported.

    Side effects:
        Imports ``pynvml`` (pure ctypes: no library until ``nvmlInit``) with anything it prints
        kept off standard output.
    """
    if _boundary.active() is None:
        return _import_live()
    module, reason, vendor_error = _boundary.vendor("nvml", _load_live)
    if module is None:
        raise NvmlUnavailableError(reason, vendor_error)
    return module


def _load_live() -> _boundary.Loaded:
    if MODULE_NAME not in sys.modules:
        missing = library_missing()
        if missing is not None:
            return None, missing, "NVMLError_LibraryNotFound"
    try:
        return _import_live(), "", ""
    except NvmlUnavailableError as exc:
        return None, exc.reason, exc.vendor_error


def _import_live() -> Any:
    module = sys.modules.get(MODULE_NAME)
    if module is not None:
        return module
    try:
        with warnings.catch_warnings():
            # The deprecated PyPI package "pynvml" re-exports nvidia-ml-py and warns on import.
            warnings.filterwarnings(
                "ignore", message=_DEPRECATED_PACKAGE_WARNING, category=FutureWarning
            )
            pynvml = import_quietly(MODULE_NAME)  # what it prints never reaches stdout
    except ImportError as exc:
        raise NvmlUnavailableError(
            f"the pynvml module is not installed ({exc}); install nvidia-ml-py "
            f"(pip install 'accelplat[nvidia]')",
            "ImportError",
        ) from exc
    except Exception as exc:  # a broken or shadowed module may fail in any way on import
        raise NvmlUnavailableError(
            f"importing pynvml failed ({type(exc).__name__}: {exc}); reinstall nvidia-ml-py",
            type(exc).__name__,
        ) from exc
    return pynvml


def error_name(exc: BaseException) -> str:
    """Return the vendor's name for an NVML exception (``"NVMLError_GpuIsLost"``).

    A bare ``NVMLError`` whose value has no subclass is ``"NVMLError(<value>)"``.
    """
    name = type(exc).__name__
    value = getattr(exc, "value", None)
    if name == "NVMLError" and value is not None:
        return f"NVMLError({value})"
    return name


def is_error(exc: BaseException, *names: str) -> bool:
    """Return whether ``exc``'s class is named ``NVMLError_<name>`` or ``<name>`` for a name.

    By name, not class: it works across module objects (a fake, a reloaded ``pynvml``).
    """
    cls_name = type(exc).__name__
    return any(cls_name in (n, f"NVMLError_{n}") for n in names)


def _vendor_exceptions(module: Any) -> tuple[type[BaseException], ...]:
    found: list[type[BaseException]] = []
    for attr in ("NVMLError", "NVMLLibraryMismatchError"):
        cls = getattr(module, attr, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    return tuple(found)


def translate(exc: BaseException, action: str) -> BackendError:
    """Return the :class:`~accelplat.errors.BackendError` for an NVML failure during ``action``.

    Args:
        exc: The exception a ``pynvml`` call raised.
        action: What was being done, e.g. ``"reading memory of GPU 0 (GPU-…)"``.
    """
    name = error_name(exc)
    hint = _HINTS.get(name)
    detail = str(exc) or name
    message = f"{action} failed: {detail}" + (f"; {hint}" if hint else "")
    return BackendError(PLATFORM, message, vendor_error=name)


SOURCE_V2 = "nvml-v2"
SOURCE_V1 = "nvml-v1"
SOURCE_HOST = "host-unified"

_V2_UNUSABLE = (
    "FunctionNotFound",  # drivers before R510 lack nvmlDeviceGetMemoryInfo_v2
    "ArgumentVersionMismatch",  # a driver that knows the function but not this struct version
    "Unknown",  # WSL answers v2 with NVML_ERROR_UNKNOWN (not remembered: v2 is asked again)
    "NotSupported",  # unified-memory GPUs (GB10, Jetson): try v1 before giving up on the GPU
    "AttributeError",  # nvidia-ml-py older than R510's: no nvmlMemory_v2
    "TypeError",  # nvidia-ml-py too old to accept version=
)


def memory(nv: Any, handle: Any, key: str, where: str) -> tuple[int, int, int, int, str] | None:
    """Read one device's memory: v2, else v1, else "no memory of its own" (host-unified).

    The rung that works is remembered per device for the session and each step logged once.
    A ``NotSupported`` from a device that has answered before is an error, never a step down:
    host memory would say nothing about that GPU.

    Args:
        nv: The ``pynvml`` module of the current :func:`session`.
        handle: The device's NVML handle.
        key: The device's UUID (what the ladder is remembered by).
        where: The device as messages name it, e.g. ``"cuda device 0 (GPU-…)"``.

    Returns:
        ``(free, total, used, reserved, source)`` as ``MemoryInfo`` takes them (unchecked), or
        ``None`` when the device has no memory of its own (the caller reads the host's).

    Raises:
        BackendError: For an NVML failure, naming the vendor error.
    """
    st = _state
    rung = st.rungs.get(key, SOURCE_V2)
    if rung == SOURCE_V2:
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
        except Exception as exc:
            rung = _step_down(exc, _V2_UNUSABLE, key, where, SOURCE_V1)
        else:
            st.reported.add(key)
            # v2 keeps the driver's reserved memory (~615 MiB on an H200) out of used; total less
            # reserved is what cuMemGetInfo and torch.cuda.mem_get_info call total.
            reserved = int(mem.reserved)
            return int(mem.free), int(mem.total) - reserved, int(mem.used), reserved, SOURCE_V2
    if rung == SOURCE_V1:
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(handle)
        except Exception as exc:
            _step_down(exc, ("NotSupported",), key, where, SOURCE_HOST)
        else:
            st.reported.add(key)
            # v1 counts reserved as used (v1 used = v2 used + reserved); total is NVML's total.
            return int(mem.free), int(mem.total), int(mem.used), 0, SOURCE_V1
    return None


def _step_down(exc: Exception, expected: tuple[str, ...], key: str, where: str, lower: str) -> str:
    """Take the next rung after ``exc`` (remembered unless it was WSL's ``Unknown``), or raise."""
    st = _state
    if not is_error(exc, *expected):
        raise translate(exc, f"reading memory of {where}") from exc
    if key in st.reported and is_error(exc, "NotSupported"):
        raise BackendError(
            PLATFORM,
            f"{where} reported memory of its own before, and NVML now says its memory query is "
            f"not supported; not switching to host memory, which would not be this GPU's",
            vendor_error=error_name(exc),
        ) from exc
    if not is_error(exc, "Unknown"):
        st.rungs[key] = lower
        import logging  # once per device and session

        logging.getLogger(__name__).info(
            "%s: the NVML memory query failed (%s); using %s from now on",
            where,
            error_name(exc),
            lower,
        )
    return lower


def unavailable_reason(exc: BaseException) -> str:
    """Return one sentence saying why NVML is unusable, for probe results.

    Args:
        exc: What ``nvmlInit`` (or an early query) raised.
    """
    name = error_name(exc)
    hint = _HINTS.get(name)
    if hint is not None:
        return f"NVML unavailable: {hint} ({name})"
    return f"NVML unavailable: {exc or name} ({name})"


LIBRARY = "libnvidia-ml.so.1"
"""The library nvidia-ml-py loads on Linux (``CDLL("libnvidia-ml.so.1")``, no other path)."""


def library_missing() -> str | None:
    """Say why NVML's library cannot be loaded, asking the loader as nvidia-ml-py would.

    Importing nvidia-ml-py (tens of milliseconds) only to learn that its library is absent
    would dominate detection on a host without the driver.

    Returns:
        The reason, worded as for ``NVMLError_LibraryNotFound``; ``None`` when the library loads
        or off Linux (where nvidia-ml-py looks elsewhere).

    Side effects:
        Loads ``libnvidia-ml.so.1`` when present (``pynvml`` would next).
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        ctypes.CDLL(LIBRARY)
    except OSError:
        name = "NVMLError_LibraryNotFound"
        return f"NVML unavailable: {_HINTS[name]} ({name})"
    return None


def unavailable_before_import() -> str | None:
    """Return :func:`library_missing` while ``pynvml`` is unimported and no replay is active.

    The first :func:`session` fails with this same reason, so the probe gives it too.
    """
    if MODULE_NAME in sys.modules or _boundary.active() is not None:
        return None
    return library_missing()


def _initialize_locked(st: _State) -> None:
    """Import pynvml and run ``nvmlInit``; ``st.cond`` is held.

    When ``pynvml`` is not imported yet and its library cannot load, fails without importing it.
    """
    global _generation
    missing = unavailable_before_import()
    if missing is not None:
        raise NvmlUnavailableError(missing, "NVMLError_LibraryNotFound")
    module = import_pynvml()
    try:
        init = module.nvmlInit
        vendor = _vendor_exceptions(module)
    except AttributeError as exc:
        raise NvmlUnavailableError(
            f"the pynvml module at {getattr(module, '__file__', '?')} is not nvidia-ml-py "
            f"(shadowed or incomplete: {exc})",
            "AttributeError",
        ) from exc
    try:
        init()
    except AttributeError as exc:
        raise NvmlUnavailableError(
            f"the pynvml module is shadowed or incomplete ({exc}); install nvidia-ml-py",
            "AttributeError",
        ) from exc
    except vendor as exc:
        raise NvmlUnavailableError(unavailable_reason(exc), error_name(exc)) from exc
    except Exception as exc:  # anything else from a broken installation: still "unavailable"
        raise NvmlUnavailableError(
            f"nvmlInit failed ({type(exc).__name__}: {exc})", type(exc).__name__
        ) from exc
    st.module = module
    st.origin = sys.modules.get(MODULE_NAME)
    st.initialized = True
    st.rungs.clear()  # a new session decides its memory ladder afresh
    st.reported.clear()
    _generation += 1


def acquire() -> Any:
    """Mark one call in flight and return the initialised ``pynvml`` module.

    Pair every call with :func:`release` (``try``/``finally``); :func:`session` does both.

    Raises:
        NvmlUnavailableError: When ``pynvml`` is missing or broken or ``nvmlInit`` fails.
    """
    st = _state
    with st.lock:  # the common case: initialised, not closing
        if st.initialized and not st.closing and sys.modules.get(MODULE_NAME) is st.origin:
            st.active += 1
            return st.module
    with st.cond:
        while st.closing:
            st.cond.wait()
        if not st.initialized or sys.modules.get(MODULE_NAME) is not st.origin:
            st.initialized = False
            _initialize_locked(st)
        st.active += 1
        return st.module


def release() -> None:
    """End one call started with :func:`acquire`."""
    st = _state
    with st.lock:
        st.active -= 1
        if st.active <= 0:
            st.active = 0
            if st.closing:
                st.cond.notify_all()


class _Session:
    """Context manager returned by :func:`session`: one call (or a few) in flight."""

    __slots__ = ()

    def __enter__(self) -> Any:
        return acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        release()


def session() -> _Session:
    """Return a context manager yielding the initialised ``pynvml`` module, around every call.

    Sessions nest and may be entered from any thread; :func:`shutdown` waits for them.

    Raises:
        NvmlUnavailableError: On entry, when ``pynvml`` is missing or broken or ``nvmlInit`` fails.

    Side effects:
        The first entry in a process imports ``pynvml`` and calls ``nvmlInit`` (once).
    """
    return _Session()


def initialized() -> bool:
    """Return whether NVML is initialised in this process (by accelplat)."""
    return _state.initialized


def generation() -> int:
    """Return a number that changes (each ``nvmlInit``, fork, forget) when handles may be stale."""
    return _generation


def shutdown() -> bool:
    """Shut NVML down once no call is in flight (for embedders and tests; accelplat never does).

    Returns:
        ``True`` when ``nvmlShutdown`` was called, ``False`` when NVML was not initialised.

    Side effects:
        Blocks new sessions until done; an error from ``nvmlShutdown`` is ignored.
    """
    global _generation
    st = _state
    with st.cond:
        while st.closing:
            st.cond.wait()
        if not st.initialized:
            return False
        st.closing = True
        try:
            while st.active > 0:
                st.cond.wait()
            module = st.module
            st.initialized = False
            _generation += 1
            with contextlib.suppress(Exception):  # a failing shutdown leaves nothing to undo
                module.nvmlShutdown()
        finally:
            st.closing = False
            st.cond.notify_all()
    return True


def forget() -> None:
    """Drop this process's NVML session without shutting NVML down; cached handles go stale.

    Called when a capture or replay starts or stops, and in a forked child (where the parent's
    lock may be held by a thread that does not exist and its handles are not to be trusted).
    """
    global _state, _generation
    _state = _State()
    _generation += 1


_boundary.on_reset(forget)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=forget)

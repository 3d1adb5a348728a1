"""One NVML session per process, shared by every user of the CUDA backend, and its memory ladder.

``nvmlInit`` runs once per process; every call runs inside :func:`session`, which :func:`shutdown`
waits for (accelplat never shuts NVML down itself); a forked child starts a new session.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from accelplat import _boundary
from accelplat._vendor import facts, import_quietly, vendor_int
from accelplat.errors import BackendError, NvmlUnavailableError

MODULE_NAME = "pynvml"  # the module nvidia-ml-py installs
PLATFORM = "cuda"
_DEPRECATED_PACKAGE_WARNING = r"The pynvml package is deprecated"

# Detection reads this one on every host without NVIDIA's library: kept here, not in the data file.
_NO_LIBRARY = (
    "libnvidia-ml.so.1 was not found: no NVIDIA driver is installed, or its library is not on the "
    "loader path"
)


def _hint(name: str) -> str:
    """The explanation of NVML error ``name`` (``vendor_facts.json``), or ``""``."""
    if name == "NVMLError_LibraryNotFound":
        return _NO_LIBRARY
    return str(facts("nvml_hints").get(name, ""))


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
_generation = 0  # bumped on every nvmlInit and fork: caches of NVML handles compare it


def _load_live() -> _boundary.Loaded:
    if MODULE_NAME not in sys.modules and (missing := library_missing()) is not None:
        return None, missing, "NVMLError_LibraryNotFound"
    try:
        return _import_live(), "", ""
    except NvmlUnavailableError as exc:
        return None, exc.reason, exc.vendor_error


def _import_live() -> Any:
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
        why = f"importing pynvml failed ({type(exc).__name__}: {exc}); reinstall nvidia-ml-py"
        raise NvmlUnavailableError(why, type(exc).__name__) from exc
    return pynvml


def error_name(exc: BaseException) -> str:
    """Return the vendor's name of an NVML error: ``NVMLError_GpuIsLost``, ``NVMLError(3)``."""
    name = type(exc).__name__
    value = getattr(exc, "value", None)
    if name == "NVMLError" and value is not None:
        return f"NVMLError({value})"
    return name


def is_error(exc: BaseException, *names: str) -> bool:
    """Whether ``exc``'s class is ``NVMLError_<name>`` or ``<name>`` (by name: fakes, reloads)."""
    cls_name = type(exc).__name__
    return any(cls_name in (n, f"NVMLError_{n}") for n in names)


def translate(exc: BaseException, action: str) -> BackendError:
    """Return the ``BackendError`` for an NVML failure during ``action`` (``"reading …"``)."""
    name = error_name(exc)
    hint = f"; {found}" if (found := _hint(name)) else ""
    return BackendError(PLATFORM, f"{action} failed: {str(exc) or name}{hint}", vendor_error=name)


SOURCE_V2, SOURCE_V1, SOURCE_HOST = "nvml-v2", "nvml-v1", "host-unified"
_V2_UNUSABLE = (
    "FunctionNotFound",  # drivers before R510 lack nvmlDeviceGetMemoryInfo_v2
    "ArgumentVersionMismatch",  # a driver that knows the function but not this struct version
    "Unknown",  # WSL answers v2 with NVML_ERROR_UNKNOWN (not remembered: v2 is asked again)
    "NotSupported",  # unified-memory GPUs (GB10, Jetson): try v1 before giving up on the GPU
    "AttributeError",  # nvidia-ml-py older than R510's: no nvmlMemory_v2
    "TypeError",  # nvidia-ml-py too old to accept version=
)


def memory(nv: Any, handle: Any, key: str, where: str) -> tuple[int, int, int, int, str] | None:
    """Return ``(free, total, used, reserved, source)`` of v2, else v1; ``None``: host-unified."""
    # The rung that works is remembered per device (key: its UUID), each step logged once.
    st = _state
    rung = st.rungs.get(key, SOURCE_V2)
    if rung == SOURCE_V2:
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
        except Exception as exc:
            rung = _step_down(exc, _V2_UNUSABLE, key, where, SOURCE_V1)
        else:
            # v2 keeps the driver's reserved memory (~615 MiB on an H200) out of used; total less
            # reserved is what cuMemGetInfo and torch.cuda.mem_get_info call total.
            free, total, used, reserved = _fields(mem, where, _V2_FIELDS)
            st.reported.add(key)
            return free, total - reserved, used, reserved, SOURCE_V2
    if rung == SOURCE_V1:
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(handle)
        except Exception as exc:
            _step_down(exc, ("NotSupported",), key, where, SOURCE_HOST)
        else:
            # v1 counts reserved as used (v1 used = v2 used + reserved); total is NVML's total.
            free, total, used = _fields(mem, where, _V2_FIELDS[:3])
            st.reported.add(key)
            return free, total, used, 0, SOURCE_V1
    return None


_V2_FIELDS = ("free", "total", "used", "reserved")  # v1 has the first three


def _fields(mem: Any, where: str, names: tuple[str, ...]) -> tuple[int, ...]:
    """Read a memory structure's fields (a replay bundle's may be missing or hold anything)."""
    what = f"the memory NVML reported for {where}"
    return tuple(vendor_int(PLATFORM, what, n, getattr(mem, n, None)) for n in names)


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

        message = "%s: the NVML memory query failed (%s); using %s from now on"
        logging.getLogger(__name__).info(message, where, error_name(exc), lower)
    return lower


def unavailable_reason(exc: BaseException) -> str:
    """Return one sentence saying why NVML is unusable after ``exc`` (from ``nvmlInit``)."""
    name = error_name(exc)
    return f"NVML unavailable: {_hint(name) or exc} ({name})"


LIBRARY = "libnvidia-ml.so.1"  # what nvidia-ml-py loads on Linux, by this name only


def library_missing() -> str | None:
    """Say why NVML's library cannot load; ``None`` if it does (it stays loaded) or off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        ctypes.CDLL(LIBRARY)
    except OSError:
        return f"NVML unavailable: {_NO_LIBRARY} (NVMLError_LibraryNotFound)"
    return None


def unavailable_before_import() -> str | None:
    """Return :func:`library_missing` while ``pynvml`` is unimported and no replay is active."""
    if MODULE_NAME in sys.modules or _boundary.active() is not None:
        return None
    return library_missing()


def _initialize_locked(st: _State) -> None:
    """Import pynvml (not when its library cannot load) and run ``nvmlInit``; ``st.cond`` held."""
    global _generation
    # pynvml: sys.modules' first, or the vendor boundary's; its library is checked before an import.
    module, reason, vendor_error = _boundary.vendor("nvml", _load_live)
    if module is None:
        raise NvmlUnavailableError(reason, vendor_error)
    try:
        module.nvmlInit()
    except Exception as exc:  # a broken, shadowed or incomplete module fails in any way
        if type(exc).__name__.startswith(("NVMLError", "NVMLLibraryMismatchError")):
            reason = unavailable_reason(exc)
        elif isinstance(exc, AttributeError):
            reason = f"the pynvml module is shadowed or incomplete ({exc}); install nvidia-ml-py"
        else:
            reason = f"nvmlInit failed ({type(exc).__name__}: {exc})"
        raise NvmlUnavailableError(reason, error_name(exc)) from exc
    st.module = module
    st.origin = sys.modules.get(MODULE_NAME)
    st.initialized = True
    st.rungs.clear()  # a new session decides its memory ladder afresh
    st.reported.clear()
    _generation += 1


def acquire() -> Any:
    """Mark one call in flight (pair with :func:`release`) and return ``pynvml``, initialised."""
    st = _state
    with st.cond:
        st.cond.wait_for(lambda: not st.closing)
        if not st.initialized or sys.modules.get(MODULE_NAME) is not st.origin:
            st.initialized = False
            _initialize_locked(st)
        st.active += 1
        return st.module


def release() -> None:
    """End one call started with :func:`acquire`."""
    st = _state
    with st.lock:
        st.active = max(0, st.active - 1)
        if st.active == 0 and st.closing:
            st.cond.notify_all()


@contextlib.contextmanager
def session() -> Iterator[Any]:
    """Return a context manager around :func:`acquire` and :func:`release` (nests, any thread)."""
    nv = acquire()
    try:
        yield nv
    finally:
        release()


def initialized() -> bool:
    """Return whether NVML is initialised in this process (by accelplat)."""
    return _state.initialized


def generation() -> int:
    """Return a number that changes (each ``nvmlInit``, fork, forget) when handles may be stale."""
    return _generation


def shutdown() -> bool:
    """Shut NVML down once no call is in flight (embedders, tests); ``False``: not initialised."""
    global _generation
    st = _state
    with st.cond:
        st.cond.wait_for(lambda: not st.closing)
        if not st.initialized:
            return False
        st.closing = True
        try:
            st.cond.wait_for(lambda: st.active <= 0)
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
    """Drop the NVML session without shutting NVML down (capture/replay changes, forked child)."""
    global _state, _generation
    _state = _State()
    _generation += 1


_boundary.on_reset(forget)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=forget)

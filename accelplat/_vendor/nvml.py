"""One NVML session per process, shared by every user of the CUDA backend.

NVML (``libnvidia-ml.so.1``, reached through the ``pynvml`` module of the ``nvidia-ml-py``
distribution) answers memory and process questions without creating a CUDA context. This
module owns the process's use of it:

* ``pynvml`` is imported lazily, on first use, with the ``FutureWarning`` of the deprecated
  ``pynvml`` PyPI package filtered out by its message (that package re-exports nvidia-ml-py and
  warns on import; accelplat never depends on it).
* ``nvmlInit`` runs once per process, under a lock, however many threads ask at once.
* Every NVML call happens inside :func:`session`, which counts calls in flight; :func:`shutdown`
  waits until none is in flight before calling ``nvmlShutdown``. accelplat itself never shuts
  NVML down: the process's exit does.
* In a ``fork()``-ed child the state is reset (``os.register_at_fork``), so the child calls
  ``nvmlInit`` again before its first query and never uses handles that belong to the parent.
* NVML failures become :class:`~accelplat.errors.BackendError` naming the vendor error
  (``vendor_error="NVMLError_GpuIsLost"``) through :func:`translate`; a missing or broken
  library becomes :class:`NvmlUnavailableError` with a sentence for ``accelplat info``.

Side effects: none at import. The first :func:`session` imports ``pynvml`` and initialises
NVML; nothing here imports torch or creates a device context.
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

__all__ = [
    "MODULE_NAME",
    "acquire",
    "error_name",
    "forget",
    "generation",
    "import_pynvml",
    "initialized",
    "is_error",
    "library_missing",
    "memory_v2_figures",
    "release",
    "session",
    "shutdown",
    "translate",
    "unavailable_before_import",
    "unavailable_reason",
]

MODULE_NAME = "pynvml"
"""The module nvidia-ml-py installs."""

PLATFORM = "cuda"

_DEPRECATED_PACKAGE_WARNING = r"The pynvml package is deprecated"
"""Start of the FutureWarning the deprecated ``pynvml`` PyPI package emits on import."""

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


_state = _State()
_generation = 0
"""Bumped on every ``nvmlInit`` and every fork: caches of NVML handles compare it."""


def import_pynvml() -> Any:
    """Return the ``pynvml`` module, importing it on first use.

    While a capture records or a replay answers (:mod:`accelplat._boundary`), the module comes
    through the boundary: a recording proxy of the real module, or a stand-in answering from
    the bundle (the real one is then not imported).

    Returns:
        The module (``sys.modules["pynvml"]`` when already imported, so tests may install a
        fake there).

    Raises:
        NvmlUnavailableError: When the module cannot be imported.

    Side effects:
        Imports ``pynvml`` (pure ctypes; loads no library until ``nvmlInit``), with the deprecated
        ``pynvml`` package's ``FutureWarning`` silenced by message for the duration of the import
        and anything it prints kept off standard output (:func:`accelplat._vendor.import_quietly`).
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


def memory_v2_figures(mem: Any) -> tuple[int, int, int, int]:
    """Return ``(free, total, used, reserved)`` of an ``nvmlMemory_v2`` result.

    Read through nvidia-ml-py's public attributes (no buffer offsets, no interpreter
    internals); each is converted to ``int``.

    Args:
        mem: What ``nvmlDeviceGetMemoryInfo(handle, version=nvmlMemory_v2)`` returned.

    Returns:
        The four figures in bytes, as NVML reported them.
    """
    return int(mem.free), int(mem.total), int(mem.used), int(mem.reserved)


def error_name(exc: BaseException) -> str:
    """Return the vendor's name for an NVML exception.

    Args:
        exc: An exception raised by a ``pynvml`` function.

    Returns:
        The class name (``"NVMLError_GpuIsLost"``); for a bare ``NVMLError`` whose value has no
        subclass, ``"NVMLError(<value>)"``.
    """
    name = type(exc).__name__
    value = getattr(exc, "value", None)
    if name == "NVMLError" and value is not None:
        return f"NVMLError({value})"
    return name


def is_error(exc: BaseException, *names: str) -> bool:
    """Return whether ``exc`` is one of the named NVML errors (by class name).

    Matching by name rather than class works across module objects (a test's fake, a reloaded
    ``pynvml``) and never touches an attribute the module might lack.

    Args:
        exc: The exception.
        *names: Suffixes such as ``"NotSupported"`` (for ``NVMLError_NotSupported``) or full
            class names such as ``"NVMLLibraryMismatchError"``.
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
    """Wrap an NVML failure in a :class:`~accelplat.errors.BackendError` naming it.

    Args:
        exc: The exception a ``pynvml`` call raised.
        action: What was being done, e.g. ``"reading memory of GPU 0 (GPU-…)"``.

    Returns:
        The error to raise (``raise translate(exc, …) from exc``).
    """
    name = error_name(exc)
    hint = _HINTS.get(name)
    detail = str(exc) or name
    message = f"{action} failed: {detail}" + (f"; {hint}" if hint else "")
    return BackendError(PLATFORM, message, vendor_error=name)


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
    """Say why NVML's library cannot be loaded, without importing ``pynvml``.

    On a machine without the NVIDIA driver, importing nvidia-ml-py (tens of milliseconds) only
    to learn that its library is absent dominates detection. This asks the dynamic loader the
    same question ``nvmlInit`` would, the way nvidia-ml-py asks it on Linux.

    Returns:
        ``None`` when the library loads (or on an operating system other than Linux, where
        nvidia-ml-py looks elsewhere and the question is left to it); otherwise the reason,
        worded as for ``NVMLError_LibraryNotFound``.

    Side effects:
        Loads ``libnvidia-ml.so.1`` into the process when present (``pynvml`` would next);
        imports ``ctypes``.
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
    """Say why NVML cannot work here when that is known without importing ``pynvml``.

    Returns:
        :func:`library_missing`'s reason while ``pynvml`` is not imported and no capture or
        replay is active (:mod:`accelplat._boundary`); ``None`` otherwise, and whenever the
        library loads. The first :func:`session` fails with this reason before importing
        ``pynvml``, so the CUDA backend's probe gives the same one.

    Side effects:
        May load ``libnvidia-ml.so.1`` (see :func:`library_missing`).
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
    """Return a context manager that yields the initialised ``pynvml`` module.

    Use it around every NVML call; while inside, :func:`shutdown` waits. Sessions nest and may be
    entered from any number of threads.

    Returns:
        A context manager; ``with session() as nvml: nvml.nvmlDeviceGetCount()``.

    Raises:
        NvmlUnavailableError: On entry, when ``pynvml`` is missing or broken or ``nvmlInit`` fails.

    Side effects:
        The first entry in a process imports ``pynvml`` and calls ``nvmlInit`` (once, whatever
        the number of threads). No CUDA context is created.
    """
    return _Session()


def initialized() -> bool:
    """Return whether NVML is initialised in this process (by accelplat)."""
    return _state.initialized


def generation() -> int:
    """Return a number that changes whenever NVML handles obtained earlier may be stale.

    It changes on every successful ``nvmlInit`` and in a forked child.
    """
    return _generation


def shutdown() -> bool:
    """Shut NVML down once no call is in flight; the next :func:`session` initialises it again.

    accelplat never calls this itself; it exists for embedders and tests.

    Returns:
        ``True`` when ``nvmlShutdown`` was called, ``False`` when NVML was not initialised.

    Side effects:
        Blocks new sessions and waits for the ones in flight to finish. An error from
        ``nvmlShutdown`` is ignored: the session counts as closed either way.
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
    """Drop this process's NVML session without shutting NVML down.

    The next :func:`session` imports (through the boundary) and initialises afresh, and every
    cached NVML handle becomes stale (:func:`generation` changes). Used when a capture starts
    recording or a replay starts or stops answering.
    """
    global _state, _generation
    _state = _State()
    _generation += 1


def _after_fork_in_child() -> None:
    global _state, _generation
    # The parent's lock may have been held by another thread at fork time, and the parent's
    # NVML handles and initialisation must not be trusted here: start afresh.
    _state = _State()
    _generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

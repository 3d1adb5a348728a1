"""Every error accelplat raises on purpose, in one place.

Errors a caller may already catch under a builtin name keep that name too; vendor exceptions are
wrapped in :class:`BackendError`, which names the vendor error and keeps it as ``__cause__``.
Every error pickles (a test run in a child process sends it back)::

    AccelplatError
    ├── ConfigurationError (ValueError)
    │   ├── BundleError ── BundleVersionError
    │   ├── LeaseUnsatisfiableError
    │   └── MarkerError
    ├── PlatformNotAvailableError (RuntimeError)
    ├── DeviceNotFoundError (IndexError)
    ├── BackendError (RuntimeError)
    │   ├── ImplausibleReadingError
    │   ├── NvmlUnavailableError
    │   └── LevelZeroError
    ├── UnreadableFileError (OSError) ── NotARegularFileError, FileTooLargeError
    ├── MemoryNotSettledError (TimeoutError) ── VllmMemoryNotFreeError (+ ValueError)
    ├── LeaseTimeoutError (TimeoutError)
    ├── InsufficientMemoryError (ValueError) ── KVCacheTooSmallError
    ├── InsufficientSharedMemoryError (RuntimeError)
    ├── VllmArgumentError (AssertionError)
    └── ChildTestError (AssertionError)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from accelplat import _util

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from accelplat._types import UsageSnapshot


def _rebuild(kind: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    error = kind.__new__(kind)
    error.args = args
    for name, value in state.items():  # setattr: an OSError's filename is no __dict__ entry
        setattr(error, name, value)
    return error


class AccelplatError(Exception):
    """Base class of every error accelplat raises on purpose."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Constructors take keywords and structured fields, which the default exception
        # pickling (``cls(*args)``) cannot rebuild: restore args and attributes directly.
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


class ConfigurationError(AccelplatError, ValueError):
    """Bad configuration or argument: an unknown platform name, a malformed variable or spec."""


class PlatformNotAvailableError(AccelplatError, RuntimeError):
    """The requested platform is known but not usable on this machine.

    Attributes:
        platform: The platform's name.
        reason: Why its probe found it unavailable.
    """

    def __init__(self, platform: str, reason: str) -> None:
        super().__init__(f"platform {platform!r} is not available: {reason}")
        self.platform = platform
        self.reason = reason


class DeviceNotFoundError(AccelplatError, IndexError):
    """A visible device index outside ``range(device_count())``.

    Attributes:
        device: The index asked for.
        count: How many devices are visible.
        platform: The platform's name.
    """

    def __init__(self, device: object, count: int, platform: str) -> None:
        valid = f"0..{count - 1}" if count > 0 else "none: no device is visible"
        super().__init__(
            f"device {_util.shorten(repr(device))} is not a visible {platform} device "
            f"(valid indices: {valid})"
        )
        self.device = device
        self.count = count
        self.platform = platform


class BackendError(AccelplatError, RuntimeError):
    """A vendor library or interface failed in a way accelplat cannot work around.

    Attributes:
        platform: The platform whose backend failed.
        vendor_error: The vendor's error name, e.g. ``"NVMLError_GpuIsLost"``.
    """

    def __init__(self, platform: str, message: str, vendor_error: str = "") -> None:
        super().__init__(f"{platform}: {message}" + (f" ({vendor_error})" if vendor_error else ""))
        self.platform = platform
        self.vendor_error = vendor_error


class ImplausibleReadingError(BackendError):
    """A driver reported memory figures that cannot be true (a wrapped counter, free > total …).

    Attributes:
        platform: The platform whose backend read them.
        where: What was read (the device).
        reason: What is impossible, e.g. ``"free is above 8 EiB (a wrapped-around counter)"``.
        figures: Every figure read, by name (``free``, ``total``, ``used``, ``reserved``).
        source: The memory source that gave them (``MemoryInfo.source``).
        vendor_error: ``"implausible reading"``.
    """

    def __init__(
        self, platform: str, where: str, reason: str, figures: dict[str, int], source: str
    ) -> None:
        shown = ", ".join(f"{name}={value}" for name, value in figures.items())
        super().__init__(
            platform,
            f"{source} reported impossible memory for {where}: {reason} ({shown}); not using it",
            vendor_error="implausible reading",
        )
        self.where = where
        self.reason = reason
        self.figures = dict(figures)
        self.source = source


class UnreadableFileError(AccelplatError, OSError):
    """A file accelplat reads (sysfs, procfs, cgroup, a spec, a trace) was refused.

    An ``OSError`` too, so code treating an unreadable file as "no information" keeps doing so.

    Attributes:
        filename: The path refused.
        reason: Why, in words.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.filename = path
        self.strerror = reason
        self.reason = reason

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self) -> tuple[Any, ...]:
        state = {**self.__dict__, "filename": self.filename, "strerror": self.strerror}
        return (_rebuild, (type(self), self.args, state))


class NotARegularFileError(UnreadableFileError):
    """The path is a FIFO, device, socket or directory, not a regular file; it was not read."""


class FileTooLargeError(UnreadableFileError):
    """The file holds more than the reader's limit (e.g. a sysfs attribute linked to ``/dev/zero``).

    Attributes:
        limit: The limit in bytes that was exceeded.
    """

    def __init__(self, path: str, limit: int) -> None:
        super().__init__(path, f"holds more than {limit} bytes; refusing to read it")
        self.limit = limit


class MemoryNotSettledError(AccelplatError, TimeoutError):
    """Device memory did not reach its target before the timeout (the message names who held it).

    Attributes:
        snapshot: The last sample taken.
        targets: Per device, the usage in bytes it had to reach.
        waited_s: Seconds waited.
        history: Per device, ``(first, min, max, last)`` used bytes seen during the wait.
        raised_targets: The targets the platform's idle floor raised, per device.
    """

    def __init__(
        self,
        message: str,
        *,
        snapshot: UsageSnapshot,
        targets: Mapping[int, int],
        waited_s: float,
        history: Mapping[int, Sequence[int]] | None = None,
        raised_targets: Mapping[int, int] | None = None,
    ) -> None:
        super().__init__(message)
        self.snapshot = snapshot
        self.targets = dict(targets)
        self.waited_s = waited_s
        self.history = {d: tuple(v) for d, v in (history or {}).items()}
        self.raised_targets = dict(raised_targets or {})


class InsufficientMemoryError(AccelplatError, ValueError):
    """A sizing check found that a budget does not fit (e.g. a KV cache)."""


class InsufficientSharedMemoryError(AccelplatError, RuntimeError):
    """``/dev/shm`` (or another shared-memory mount) is too small for a requested budget.

    Attributes:
        required: Bytes asked for.
        free: Bytes free on the mount.
        path: The mount checked.
    """

    def __init__(self, message: str, *, required: int, free: int, path: str) -> None:
        super().__init__(message)
        self.required = required
        self.free = free
        self.path = path


class BundleError(ConfigurationError):
    """A capture bundle (``accelplat capture``) cannot be used: unreadable, malformed, too large.

    Every problem the loader finds raises this type, never a ``KeyError`` or a ``tarfile`` error.

    Attributes:
        source: The bundle's path (or ``"<bytes>"``).
        field: The member or field at fault (``"host.json: records[3].key"``), or ``""``.
    """

    def __init__(self, source: str, message: str, *, field: str = "") -> None:
        where = f"{source}: {field}: " if field else f"{source}: "
        super().__init__(where + message)
        self.source = source
        self.field = field


class BundleVersionError(BundleError):
    """A bundle written in a format version this accelplat does not read (a newer one).

    Attributes:
        version: The format version the bundle declares.
        supported: The highest version this accelplat reads.
    """

    def __init__(self, source: str, version: int, supported: int) -> None:
        super().__init__(
            source,
            f"bundle format version {version} is newer than this accelplat reads "
            f"(up to {supported}); upgrade accelplat to replay it",
            field="host.json: format_version",
        )
        self.version = version
        self.supported = supported


class MarkerError(ConfigurationError):
    """An accelplat marker with malformed arguments; the test errors with this message."""


class NvmlUnavailableError(BackendError):
    """NVML cannot be used in this process: module missing or broken, or ``nvmlInit`` failed.

    Attributes:
        reason: One sentence saying why, for probe results and ``accelplat info``.
        vendor_error: The vendor's error name, ``"ImportError"`` or ``"AttributeError"``.
    """

    def __init__(self, reason: str, vendor_error: str = "") -> None:
        super().__init__("cuda", reason, vendor_error=vendor_error)
        self.reason = reason


class LevelZeroError(BackendError):
    """A Level Zero call failed, or the loader lacks a function.

    Attributes:
        function: The ``zes*`` function that failed.
        code: The ``ze_result_t`` it returned (``None`` when the function is missing).
    """

    def __init__(
        self, function: str, code: int | None, message: str | None = None, *, vendor_error: str = ""
    ) -> None:
        fallback = "missing function" if code is None else f"ze_result_t 0x{code:08x}"
        super().__init__(
            "xpu",
            message or f"Level Zero call {function} failed",
            vendor_error=vendor_error or fallback,
        )
        self.function = function
        self.code = code


class VllmMemoryNotFreeError(MemoryNotSettledError, ValueError):
    """Device memory did not come back in time; raised where vLLM's helpers raise ``ValueError``.

    Also a ``ValueError``, so vLLM's ``except ValueError`` blocks keep working; the message's first
    line is vLLM 0.32's: ``Memory of devices devices=[…] not free after dur_s=… (threshold=…)``.
    """


class VllmArgumentError(AccelplatError, AssertionError):
    """An argument vLLM's helpers check with ``assert``: raised where they raise AssertionError.

    Not a ``ValueError``: vLLM's clean-up fixture swallows those (timeouts), not wrong calls.
    """


class LeaseTimeoutError(AccelplatError, TimeoutError):
    """A lease's devices did not become free, or their memory did not come back, in time.

    Attributes:
        count: Devices asked for.
        timeout_s: The timeout that passed.
        reason: What was still in the way at the end.
    """

    def __init__(self, count: int, timeout_s: float, reason: str) -> None:
        super().__init__(f"could not lease {count} device(s) within {timeout_s:g} s: {reason}")
        self.count = count
        self.timeout_s = timeout_s
        self.reason = reason


class LeaseUnsatisfiableError(ConfigurationError):
    """No device this process may use can ever hold the lease asked for, however long it waits.

    More devices asked for than are visible, or a memory budget larger than every visible device:
    waiting cannot help. A packed test suite skips such a test; every other configuration error
    (a bad option, an unusable lock directory) stops the whole session instead.
    """


class KVCacheTooSmallError(InsufficientMemoryError):
    """The memory left for the KV cache cannot hold one request of ``max_model_len`` tokens.

    Attributes:
        needed: Bytes one request of ``max_model_len`` needs.
        available: Bytes available for the KV cache.
        max_model_len: The length asked for.
        estimated_max_model_len: The largest length that fits (whole blocks; ``0``: none fits).
    """

    def __init__(
        self,
        message: str,
        *,
        needed: int,
        available: int,
        max_model_len: int,
        estimated_max_model_len: int,
    ) -> None:
        super().__init__(message)
        self.needed = needed
        self.available = available
        self.max_model_len = max_model_len
        self.estimated_max_model_len = estimated_max_model_len


class ChildTestError(AccelplatError, AssertionError):
    """A function run in a new process failed in a way that cannot be re-raised as is.

    Its exception did not pickle, or it died without reporting (a signal, ``os._exit``, a native
    crash); the child's traceback, when there is one, is the ``__cause__``.
    """


__all__ = sorted(  # noqa: PLE0605 (every error defined above: the classes are the one list)
    name
    for name, value in globals().items()
    if isinstance(value, type) and issubclass(value, AccelplatError)
)

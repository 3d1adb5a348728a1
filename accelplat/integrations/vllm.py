"""Drop-in replacements for vLLM's test-suite memory helpers, and hooks for its runners.

vLLM's ``tests/utils.py`` and ``tests/conftest.py`` answer "is the device free yet?" with
platform branches: NVML on CUDA, amdsmi or torch on ROCm, torch on XPU, a 4 GiB floor on ROCm,
a settle wait on ROCm and XPU only, a 0.9 default utilization on XPU. The functions here accept
the same calls (names, keyword names, defaults, return shapes) so a test suite can switch with an
import change, and take every platform difference from the platform's data instead
(:class:`~accelplat._types.ReleaseProfile`, ``default_memory_utilization``,
``preferred_start_method``).

Where this module deliberately differs from vLLM's helpers:

* **Device indices** are visible (logical) indices, mapped to physical devices by the backend
  with every form the vendor accepts (UUIDs, MIG, ``CUDA_DEVICE_ORDER``); vLLM's remapping
  handles plain integers only.
* **Used memory** excludes memory the driver reserves for itself (NVML v2), so a ratio
  threshold can reach zero on an idle device; NVML v1 "used" never does.
* **Polling** is adaptive: the first samples come milliseconds apart and the interval grows up
  to ``poll_interval_s``, which is a *cap*, not a fixed sleep. A device that is already free
  returns at once instead of after a 5 s sleep.
* **Idle floor**: a ratio target below the platform's ``release.idle_floor_bytes`` is raised to
  it (vLLM raises ratios below 5 % to 4 GiB on ROCm only).
* **Timeouts** raise :class:`VllmMemoryNotFreeError`, which is both accelplat's
  :class:`~accelplat.errors.MemoryNotSettledError` and the ``ValueError`` vLLM's callers catch;
  its message keeps vLLM's first line and adds per-device history and the holding processes.
* **Progress** goes to the ``accelplat.integrations.vllm`` logger at INFO level (the same
  ``gpu memory used/total (GiB): 0=x/y; …`` text vLLM prints), at most once per
  ``poll_interval_s``; nothing is printed.

Nothing here imports torch, vLLM or a vendor library, and on context-free platforms nothing
creates a device context. pytest is imported only by the functions that build marks.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import math
import multiprocessing
import numbers
import os
import pickle
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from multiprocessing.connection import wait as _wait_for_sentinels
from typing import TYPE_CHECKING, Any, TypeVar, cast, get_args

from accelplat._types import GIB, MIB, SettleResult, UsageSnapshot
from accelplat.errors import AccelplatError, ConfigurationError, MemoryNotSettledError
from accelplat.platform import Platform, StartMethod, validate_utilization

if TYPE_CHECKING:
    import pytest

__all__ = [
    "DEFAULT_HF_TOLERANCE",
    "ChildTestError",
    "VllmMemoryNotFreeError",
    "after_engine_shutdown",
    "before_engine_start",
    "create_new_process_for_each_test",
    "engine_kwargs",
    "large_gpu_mark",
    "large_gpu_test",
    "memory_baseline",
    "multi_gpu_marks",
    "multi_gpu_test",
    "record_gpu_memory_usage_stats",
    "run_in_new_process",
    "start_method",
    "wait_for_gpu_memory_to_clear",
    "wait_for_memory_to_settle",
]

logger = logging.getLogger("accelplat.integrations.vllm")

DEFAULT_HF_TOLERANCE = 0.05
"""Fraction of device memory a HF-style runner may leave above its baseline (vLLM's 5 %)."""

_UTILIZATION_KEY = "gpu_memory_utilization"
_PARALLEL_KEYS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
_START_METHODS: tuple[str, ...] = get_args(StartMethod)
_DECIMAL_GB = 10**9
_MAX_GB = sys.float_info.max / _DECIMAL_GB
"""The largest ``min_gb`` whose byte count is still a float."""

_F = TypeVar("_F", bound=Callable[..., Any])


# --------------------------------------------------------------------------------------------
# errors


class VllmMemoryNotFreeError(MemoryNotSettledError, ValueError):
    """Device memory did not come back in time; raised where vLLM's helpers raise ``ValueError``.

    It is a :class:`~accelplat.errors.MemoryNotSettledError` (so a ``TimeoutError``) carrying the
    last snapshot, the per-device targets and the usage history, and a ``ValueError`` so that
    vLLM's existing ``except ValueError`` blocks keep working. The first line of the message is
    vLLM's: ``Memory of devices devices=[…] not free after dur_s=… (threshold=…)``.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only constructor arguments do not survive the default exception pickling;
        # a child process (create_new_process_for_each_test) must be able to send this back.
        return (
            _rebuild_not_free,
            (str(self), self.snapshot, self.targets, self.waited_s, self.history),
        )


def _rebuild_not_free(
    message: str,
    snapshot: UsageSnapshot,
    targets: Mapping[int, int],
    waited_s: float,
    history: Mapping[int, Sequence[int]],
) -> VllmMemoryNotFreeError:
    return VllmMemoryNotFreeError(
        message, snapshot=snapshot, targets=targets, waited_s=waited_s, history=history
    )


class ChildTestError(AccelplatError, AssertionError):
    """A test run in a new process failed in a way that cannot be re-raised as its own exception.

    Raised when the child's exception could not be pickled, or when the child died without
    reporting (a signal, ``os._exit``, a crash in native code). The child's traceback, when there
    is one, is chained as ``__cause__``.
    """


class _ChildTracebackError(Exception):
    """Carries a child process's formatted traceback as the ``__cause__`` of what is re-raised."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n\nTraceback in the child process:\n" + self.text


# --------------------------------------------------------------------------------------------
# helpers


def _platform(platform: Platform | None) -> Platform:
    if platform is not None:
        return platform
    from accelplat.registry import current_platform

    return current_platform()


def _describe_threshold(threshold_bytes: object, threshold_ratio: object) -> str:
    """Describe the threshold the way vLLM's message does (GiB for bytes, 2 decimals for ratios)."""
    parts: list[str] = []
    if threshold_bytes is not None:
        if isinstance(threshold_bytes, Mapping):
            inner = ", ".join(f"{d}: {b / GIB} GiB" for d, b in threshold_bytes.items())
            parts.append("{" + inner + "}")
        else:
            parts.append(f"{cast(float, threshold_bytes) / GIB} GiB")
    if threshold_ratio is not None:
        if isinstance(threshold_ratio, Mapping):
            inner = ", ".join(f"{d}: {r:.2f}" for d, r in threshold_ratio.items())
            parts.append("{" + inner + "}")
        else:
            parts.append(f"{cast(float, threshold_ratio):.2f}")
    return " or ".join(parts)


def _not_free(
    exc: MemoryNotSettledError, devices: Sequence[int], threshold: str
) -> VllmMemoryNotFreeError:
    head = (
        f"Memory of devices devices={list(devices)!r} not free after "
        f"dur_s={exc.waited_s:.02f} (threshold={threshold!r})"
    )
    return VllmMemoryNotFreeError(
        f"{head}\n{exc}",
        snapshot=exc.snapshot,
        targets=exc.targets,
        waited_s=exc.waited_s,
        history=exc.history,
    )


def _progress_logger(
    cap_s: float,
) -> Callable[[UsageSnapshot, Mapping[int, int]], None]:
    """Return an ``on_poll`` callback logging vLLM's progress line at most once per ``cap_s``."""
    last: list[float] = []

    def on_poll(snap: UsageSnapshot, targets: Mapping[int, int]) -> None:
        if last and snap.timestamp - last[0] < cap_s:
            return
        last[:] = [snap.timestamp]
        line = "; ".join(
            f"{d}={m.used / GIB:.02f}/{m.total / GIB:.02f}" for d, m in sorted(snap.memory.items())
        )
        logger.info("gpu memory used/total (GiB): %s", line)

    return on_poll


def _positive_seconds(value: object, argument: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigurationError(f"{argument} must be a number of seconds, got {value!r}")
    try:
        result = float(value)
    except OverflowError:  # an int beyond a float's range (not echoed: it may have no repr)
        raise ConfigurationError(
            f"{argument} must be a finite number > 0, got an int too large for a float"
        ) from None
    if not math.isfinite(result) or result <= 0:
        raise ConfigurationError(f"{argument} must be a finite number > 0, got {value!r}")
    return result


# --------------------------------------------------------------------------------------------
# vLLM's tests/utils.py helpers


def record_gpu_memory_usage_stats(*, devices: Sequence[int]) -> dict[int, tuple[float, float]]:
    """Return per visible device ``(used GiB, total GiB)``, as vLLM's helper does.

    Args:
        devices: Visible (logical) device indices.

    Returns:
        ``{device: (used / 2**30, total / 2**30)}``. "Used" excludes driver-reserved memory.

    Raises:
        ConfigurationError: For an empty or malformed device list.
        DeviceNotFoundError: For an index that is not visible.

    Side effects:
        Reads memory through the current platform; creates no device context and imports no
        framework on context-free platforms (vLLM's ROCm and XPU paths create one).
    """
    from accelplat.memory import record_usage_stats

    return record_usage_stats(devices)


def wait_for_gpu_memory_to_clear(
    *,
    devices: Sequence[int],
    threshold_bytes: int | Mapping[int, int] | None = None,
    threshold_ratio: float | Mapping[int, float] | None = None,
    timeout_s: float = 120,
    stable_duration_s: float = 0,
    stable_tolerance_bytes: int = 512 * MIB,
    poll_interval_s: float = 5,
) -> None:
    """Wait until used memory of ``devices`` is at or below a threshold, as vLLM's helper does.

    A device is clear when its used memory is at or below ``threshold_bytes``, or
    ``threshold_ratio × total``, or with both the larger of the two; a ratio target below the
    platform's idle floor is raised to the floor. With ``stable_duration_s`` the usage must also
    stay within ``stable_tolerance_bytes`` for that long.

    Args:
        devices: Visible (logical) device indices.
        threshold_bytes: Used bytes at or below which a device is clear; an int, or a mapping
            naming exactly ``devices``.
        threshold_ratio: Fraction of total in ``[0, 1]``; a float, or a mapping naming exactly
            ``devices``.
        timeout_s: Give up after this many seconds.
        stable_duration_s: How long usage must stay clear and steady.
        stable_tolerance_bytes: Movement that still counts as steady.
        poll_interval_s: The longest sleep between two samples (polling starts at a few
            milliseconds and grows up to this); vLLM sleeps this long between every sample.

    Raises:
        VllmMemoryNotFreeError: On timeout (a ``ValueError`` and a ``MemoryNotSettledError``).
        ConfigurationError: For a missing threshold or a malformed argument (a ``ValueError``).
        DeviceNotFoundError: For an index that is not visible.

    Side effects:
        Sleeps; logs progress to the ``accelplat.integrations.vllm`` logger. Creates no device
        context on context-free platforms.
    """
    from accelplat.memory import PollPolicy, wait_for_memory_to_clear

    if devices is None:
        raise ConfigurationError(
            "devices must be a sequence of visible device indices, got None "
            "(vLLM's helper has no default: name the devices to wait on)"
        )
    cap = _positive_seconds(poll_interval_s, "poll_interval_s")
    default = PollPolicy()
    poll = PollPolicy(initial_s=min(default.initial_s, cap), factor=default.factor, max_s=cap)
    try:
        result = wait_for_memory_to_clear(
            devices,
            threshold_bytes=threshold_bytes,
            threshold_ratio=threshold_ratio,
            timeout_s=timeout_s,
            stable_duration_s=stable_duration_s,
            stable_tolerance_bytes=stable_tolerance_bytes,
            poll=poll,
            on_poll=_progress_logger(cap),
        )
    except MemoryNotSettledError as exc:  # raised only after every argument was validated
        threshold = _describe_threshold(threshold_bytes, threshold_ratio)
        raise _not_free(exc, list(devices), threshold) from None
    logger.info(
        "Done waiting for free GPU memory on devices devices=%r (threshold=%r) dur_s=%.02f",
        list(devices),
        _describe_threshold(threshold_bytes, threshold_ratio),
        result.waited_s,
    )


def wait_for_memory_to_settle(
    *,
    threshold_ratio: float | Mapping[int, float] | None = 0.1,
    timeout_s: float = 240,
) -> None:
    """Wait for lazily released memory to come back on every device, as vLLM's helper does.

    On a platform whose ``release.lazy`` is false this returns at once without sampling (vLLM
    does nothing outside ROCm and XPU). On a lazy platform it waits until every visible device is
    at or below ``threshold_ratio`` of its total and has stayed there for the platform's
    ``release.stable_duration_s`` (vLLM hard-codes 2 s with 1 s polls).

    Args:
        threshold_ratio: Fraction of total in ``[0, 1]``, or a mapping naming every visible
            device. ``None`` is rejected, as in vLLM (no threshold to wait for).
        timeout_s: Give up after this many seconds.

    Raises:
        VllmMemoryNotFreeError: On timeout (a ``ValueError`` and a ``MemoryNotSettledError``).
        ConfigurationError: For ``threshold_ratio=None`` or a malformed argument, on every
            platform (checked as the wait checks them, before returning on an eager one).

    Side effects:
        On lazy platforms sleeps and logs progress; creates no device context on context-free
        platforms.
    """
    from accelplat.memory import PollPolicy, _check_wait_arguments, wait_for_memory_to_clear

    platform = _platform(None)
    if threshold_ratio is None:
        raise ConfigurationError("wait_for_memory_to_settle needs threshold_ratio, got None")
    # Checked as the wait would check them, even where nothing is waited for.
    devices = _check_wait_arguments(
        None, threshold_ratio=threshold_ratio, timeout_s=timeout_s, platform=platform
    ).devices
    if not platform.release.lazy:
        return
    threshold = _describe_threshold(None, threshold_ratio)
    try:
        wait_for_memory_to_clear(
            devices,
            threshold_ratio=threshold_ratio,
            timeout_s=timeout_s,
            stable_duration_s=platform.release.stable_duration_s,
            poll=PollPolicy(max_s=1.0),
            on_poll=_progress_logger(1.0),
            platform=platform,
        )
    except MemoryNotSettledError as exc:
        raise _not_free(exc, devices, threshold) from None


# --------------------------------------------------------------------------------------------
# runner hooks (VllmRunner / HfRunner)


def _utilization(kwargs: Mapping[str, Any], platform: Platform) -> float:
    if not isinstance(kwargs, Mapping):
        raise ConfigurationError(
            f"kwargs must be a mapping of engine keyword arguments, got {type(kwargs).__name__}"
        )
    value = kwargs.get(_UTILIZATION_KEY)
    if value is None:
        return validate_utilization(
            platform.default_memory_utilization,
            argument=f"{platform.name} platform's default_memory_utilization",
        )
    return validate_utilization(value, argument=_UTILIZATION_KEY)


def _free_ratio(kwargs: Mapping[str, Any], platform: Platform) -> float:
    """Return ``1 − utilization``, rounded so that ``1 − 0.9`` is exactly ``0.1``."""
    return max(0.0, round(1.0 - _utilization(kwargs, platform), 12))


def _engine_devices(kwargs: Mapping[str, Any], platform: Platform) -> list[int]:
    world = 1
    for key in _PARALLEL_KEYS:
        value = kwargs.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(f"{key} must be an int >= 1, got {value!r}")
        world *= value
    return list(range(min(world, platform.device_count())))


def engine_kwargs(kwargs: Mapping[str, Any], *, platform: Platform | None = None) -> dict[str, Any]:
    """Return engine keyword arguments with a memory utilization that suits this platform.

    Replaces the XPU branch of vLLM's ``VllmRunner``: when the caller gave no
    ``gpu_memory_utilization`` (or ``None``), the platform's ``default_memory_utilization`` is
    filled in (0.92 on CUDA and ROCm, 0.9 on XPU; on CPU a value computed from the memory
    available now, so the CPU engine's start-up check passes). A given value is validated.

    Args:
        kwargs: The keyword arguments meant for ``vllm.LLM``; not modified.
        platform: The platform; ``None`` means the current one.

    Returns:
        A new dict: ``kwargs`` with ``gpu_memory_utilization`` set.

    Raises:
        ValueError: When ``gpu_memory_utilization`` is not a number in ``(0, 1]``, or ``kwargs``
            is not a mapping (a ``ConfigurationError``).

    Side effects:
        Reads the platform's default (on CPU that reads host memory figures). Imports nothing.
    """
    p = _platform(platform)
    utilization = _utilization(kwargs, p)
    result = dict(kwargs)
    result[_UTILIZATION_KEY] = utilization
    return result


def before_engine_start(
    kwargs: Mapping[str, Any], *, platform: Platform | None = None
) -> SettleResult:
    """Make sure the engine's devices have the free memory its start-up check will ask for.

    An engine refuses to start when free memory is below ``total × gpu_memory_utilization``, so
    each device it uses (``tensor_parallel_size × pipeline_parallel_size ×
    data_parallel_size`` devices from index 0, at most all visible ones) must be at or below
    ``(1 − utilization) × total`` used. On lazy platforms this waits, with the platform's
    stability window and timeout, for memory a previous engine released; on eager platforms it
    checks once and fails at once with the holders named, instead of an engine error later.

    Args:
        kwargs: The engine keyword arguments (ideally from :func:`engine_kwargs`);
            ``gpu_memory_utilization`` defaults to the platform's.
        platform: The platform; ``None`` means the current one.

    Returns:
        The :class:`~accelplat._types.SettleResult` of the wait or check.

    Raises:
        VllmMemoryNotFreeError: When the devices do not have the room (a ``ValueError``).
        ValueError: For a bad utilization or parallel size.

    Side effects:
        May sleep (lazy platforms). Creates no device context on context-free platforms.
    """
    from accelplat.memory import wait_for_memory_to_clear

    p = _platform(platform)
    ratio = _free_ratio(kwargs, p)
    devices = _engine_devices(kwargs, p)
    if not devices:
        raise ConfigurationError(f"the {p.name} platform has no visible device to start on")
    profile = p.release
    try:
        return wait_for_memory_to_clear(
            devices,
            threshold_ratio=ratio,
            timeout_s=profile.settle_timeout_s if profile.lazy else 0.0,
            stable_duration_s=profile.stable_duration_s if profile.lazy else 0.0,
            on_poll=_progress_logger(1.0),
            platform=p,
        )
    except MemoryNotSettledError as exc:
        raise _not_free(exc, devices, _describe_threshold(None, ratio)) from None


def after_engine_shutdown(
    kwargs: Mapping[str, Any], *, platform: Platform | None = None
) -> SettleResult:
    """Wait, after an engine shut down, until its memory is back (``1 − utilization`` used).

    Uses :func:`accelplat.memory.wait_for_memory_to_settle`: on lazy platforms with the
    platform's stability window; on eager platforms it returns after one sample when memory is
    already back and otherwise waits (without a window) for the process that is exiting.

    Args:
        kwargs: The engine keyword arguments the engine was started with.
        platform: The platform; ``None`` means the current one.

    Returns:
        The :class:`~accelplat._types.SettleResult`.

    Raises:
        VllmMemoryNotFreeError: When memory does not come back before the platform's settle
            timeout (a ``ValueError``).

    Side effects:
        May sleep. Creates no device context on context-free platforms.
    """
    from accelplat.memory import wait_for_memory_to_settle as settle

    p = _platform(platform)
    ratio = _free_ratio(kwargs, p)
    devices = list(range(p.device_count()))
    try:
        return settle(threshold_ratio=ratio, platform=p, on_poll=_progress_logger(1.0))
    except MemoryNotSettledError as exc:
        raise _not_free(exc, devices, _describe_threshold(None, ratio)) from None


@contextmanager
def memory_baseline(
    tolerance: float = DEFAULT_HF_TOLERANCE,
    *,
    devices: Sequence[int] | None = None,
    timeout_s: float | None = None,
    platform: Platform | None = None,
) -> Iterator[UsageSnapshot]:
    """Record device usage on entry and, on exit, wait until it is back near that baseline.

    Replaces the branch of vLLM's ``HfRunner`` that records a baseline on ROCm and XPU and, on
    exit, waits until usage is at most ``baseline + tolerance × total``. The wait happens on
    platforms whose ``release.lazy`` is true, with their stability window; on eager platforms
    memory is back as soon as it is freed, so nothing is waited for (as in vLLM). When the body
    raises, no wait happens and the body's exception propagates unchanged.

    Args:
        tolerance: Fraction of each device's total usage may stay above the baseline, in
            ``[0, 1]``.
        devices: Visible device indices; ``None`` means every visible device.
        timeout_s: Limit of the exit wait; ``None`` means the platform's settle timeout.
        platform: The platform; ``None`` means the current one.

    Yields:
        The baseline :class:`~accelplat._types.UsageSnapshot`.

    Raises:
        VllmMemoryNotFreeError: On exit, when usage does not come back in time.
        ConfigurationError: On entry, for a tolerance outside ``[0, 1]`` or a negative or
            non-finite ``timeout_s`` (on every platform, lazy or not).

    Side effects:
        Samples memory on entry; may sleep on exit. Creates no device context on context-free
        platforms.
    """
    from accelplat.memory import _duration, _ratio, snapshot, wait_for_memory_to_clear

    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real):
        raise ConfigurationError(f"tolerance must be a fraction in [0, 1], got {tolerance!r}")
    fraction = _ratio(tolerance, "tolerance")
    if timeout_s is not None:  # checked here, as the exit wait would, even if it never runs
        _duration(timeout_s, "timeout_s")
    p = _platform(platform)
    baseline = snapshot(devices, platform=p, holders=False)
    yield baseline
    if not p.release.lazy:
        return
    targets = {
        d: info.used + math.floor(fraction * info.total) for d, info in baseline.memory.items()
    }
    try:
        wait_for_memory_to_clear(
            list(targets),
            threshold_bytes=targets,
            timeout_s=timeout_s,
            on_poll=_progress_logger(1.0),
            platform=p,
        )
    except MemoryNotSettledError as exc:
        raise _not_free(exc, list(targets), _describe_threshold(targets, None)) from None


# --------------------------------------------------------------------------------------------
# process isolation


def start_method(platform: Platform | None = None) -> StartMethod:
    """Return the process start method that is safe on the platform.

    ``"fork"`` where a child may inherit the parent's state (CUDA through NVML, CPU), ``"spawn"``
    where forking after device use breaks (ROCm, XPU) — the platform's
    ``preferred_start_method``.

    Args:
        platform: The platform; ``None`` means the current one.

    Returns:
        ``"fork"``, ``"spawn"`` or ``"forkserver"``.
    """
    return _platform(platform).preferred_start_method


@dataclass(frozen=True)
class _FunctionRef:
    """How a spawned child finds a test function: by module name, with the file as fallback."""

    module: str
    qualname: str
    path: str | None


def _function_ref(func: Callable[..., Any]) -> _FunctionRef:
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None)
    if not module or not qualname or "<locals>" in qualname or "<lambda>" in qualname:
        raise ConfigurationError(
            f"{func!r} cannot run in a spawned process: a spawned child imports the test "
            "function by name, so it must be defined at module or class level"
        )
    path = getattr(sys.modules.get(module), "__file__", None)
    return _FunctionRef(module, qualname, path)


def _import_module(ref: _FunctionRef) -> Any:
    if ref.module in sys.modules:
        return sys.modules[ref.module]
    try:
        return importlib.import_module(ref.module)
    except ImportError:
        if ref.path is None:
            raise
    spec = importlib.util.spec_from_file_location(ref.module, ref.path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {ref.module!r} from {ref.path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[ref.module] = module
    spec.loader.exec_module(module)
    return module


def _resolve_function(ref: _FunctionRef) -> Callable[..., Any]:
    obj: Any = _import_module(ref)
    for part in ref.qualname.split("."):
        obj = getattr(obj, part)
    # The module attribute is the decorated wrapper; unwrap to the function it isolates.
    seen = 0
    while seen < 100:
        target = getattr(obj, "_accelplat_isolated", None)
        if target is not None:
            return cast(Callable[..., Any], target)
        inner = getattr(obj, "__wrapped__", None)
        if inner is None:
            break
        obj = inner
        seen += 1
    return cast(Callable[..., Any], obj)


def _report(result_path: str, payload: tuple[Any, ...]) -> None:
    with open(result_path, "wb") as f:
        pickle.dump(payload, f)


def _child_main(
    target: Callable[..., Any] | _FunctionRef,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    result_path: str,
) -> None:
    """Body of the child process: run the test, write what happened to ``result_path``."""
    with suppress(OSError):  # own process group: what the test leaves behind ends with it
        os.setpgrp()
    try:
        func = _resolve_function(target) if isinstance(target, _FunctionRef) else target
        func(*args, **kwargs)
    except BaseException as exc:
        text = traceback.format_exc()
        outcome = _pytest_outcome(exc)
        if outcome is not None:
            _report(result_path, ("outcome", *outcome, text))
            return
        blob: bytes | None
        try:
            blob = pickle.dumps(exc)
            pickle.loads(blob)  # some exceptions pickle but cannot be rebuilt
        except Exception:
            blob = None
        _report(result_path, ("error", blob, type(exc).__qualname__, str(exc), text))
    else:
        _report(result_path, ("ok",))


def _pytest_outcome(exc: BaseException) -> tuple[str, str, bool, int] | None:
    """Describe pytest's skip/xfail/fail/exit exceptions, which do not pickle, as plain data."""
    pytest_module = sys.modules.get("pytest")
    if pytest_module is None:
        return None
    kinds: list[tuple[str, Any]] = [
        ("xfail", pytest_module.xfail),  # before "fail": an XFailed is a Failed
        ("skip", pytest_module.skip),
        ("fail", pytest_module.fail),
        ("exit", pytest_module.exit),
    ]
    for kind, function in kinds:
        if isinstance(exc, function.Exception):
            message = str(getattr(exc, "msg", None) or "")
            returncode = getattr(exc, "returncode", None)
            code = returncode if isinstance(returncode, int) else 1
            return kind, message, bool(getattr(exc, "pytrace", True)), code
    return None


def _raise_pytest_outcome(kind: str, message: str, pytrace: bool, code: int) -> None:
    import pytest

    if kind == "skip":
        pytest.skip(message)
    elif kind == "xfail":
        pytest.xfail(message)
    elif kind == "exit":
        pytest.exit(message, returncode=code)
    pytest.fail(message, pytrace=pytrace)


def _end_group(pgid: int) -> None:
    """Send SIGTERM to what is left of the child's process group (its own descendants)."""
    if pgid <= 0 or pgid == os.getpgrp():
        return
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)


def _exit_description(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code}"


def run_in_new_process(
    func: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    method: StartMethod | None = None,
) -> None:
    """Run ``func(*args, **kwargs)`` in a new process and re-raise its failure here.

    The child becomes the leader of its own process group; when it has exited, whatever it left
    running in that group (engine workers, servers) is sent SIGTERM. A child's exception is
    re-raised in the parent as the same exception (pytest's skip, xfail and fail outcomes
    included), chained to the child's formatted traceback; an exception that cannot be pickled,
    or a child that dies without reporting, raises :class:`ChildTestError`.

    With ``"spawn"`` or ``"forkserver"`` the child is a fresh interpreter, which brings
    constraints: ``func`` must be importable by ``module.qualname`` (defined at module or class
    level, not inside another function), and ``args``/``kwargs`` (for a test: its fixture values)
    must be picklable. Environment variables set before the call are inherited; changes made to
    modules in the parent (``monkeypatch.setattr``) are not. ``"fork"`` has none of these
    constraints and inherits everything.

    Args:
        func: The function; its return value is discarded.
        args: Positional arguments.
        kwargs: Keyword arguments.
        method: ``"fork"``, ``"spawn"`` or ``"forkserver"``; ``None`` means
            :func:`start_method` of the current platform.

    Raises:
        ConfigurationError: For an unknown method, a function a spawned child cannot import, or
            arguments that cannot be pickled.
        ChildTestError: When the child fails in a way that cannot be re-raised as is.
        BaseException: Whatever the child raised.

    Side effects:
        Starts one process and waits for it; a temporary file carries the outcome back.
    """
    chosen = method if method is not None else start_method()
    if chosen not in _START_METHODS:
        raise ConfigurationError(f"method must be one of {_START_METHODS}, got {chosen!r}")
    call_args = tuple(args)
    call_kwargs = dict(kwargs or {})
    name = getattr(func, "__qualname__", repr(func))
    target: Callable[..., Any] | _FunctionRef = func
    if chosen != "fork":
        target = _function_ref(func)
        try:
            pickle.dumps((call_args, call_kwargs))
        except Exception as exc:
            raise ConfigurationError(
                f"cannot run {name} in a {chosen}ed process: its arguments (for a test, its "
                f"fixture values) must be picklable, and they are not: {exc}"
            ) from exc
    fd, result_path = tempfile.mkstemp(prefix="accelplat-child-", suffix=".pickle")
    os.close(fd)
    try:
        ctx: Any = multiprocessing.get_context(chosen)
        process = ctx.Process(
            target=_child_main,
            args=(target, call_args, call_kwargs, result_path),
            name=f"accelplat-{name}",
        )
        process.start()
        pid = process.pid or 0
        try:
            _wait_for_sentinels([process.sentinel])
        except BaseException:
            process.terminate()
            process.join(5)
            if process.is_alive():
                process.kill()
            raise
        finally:
            # The exited child is not reaped yet, so its pid still names its process group.
            _end_group(pid)
            process.join()
        with open(result_path, "rb") as f:
            data = f.read()
    finally:
        with suppress(OSError):
            os.unlink(result_path)
    if not data:
        raise ChildTestError(
            f"{name} ran in a new {chosen} process that {_exit_description(process.exitcode)} "
            "without reporting a result"
        )
    outcome = pickle.loads(data)
    if outcome[0] == "ok":
        return
    if outcome[0] == "outcome":
        _raise_pytest_outcome(*outcome[1:5])
    _, blob, type_name, message, text = outcome
    cause = _ChildTracebackError(text)
    if blob is not None:
        original = pickle.loads(blob)
        if isinstance(original, BaseException):
            raise original from cause
    raise ChildTestError(f"{name} failed in a new {chosen} process: {type_name}: {message}") from (
        cause
    )


def create_new_process_for_each_test(
    method: StartMethod | None = None,
) -> Callable[[_F], _F]:
    """Return a decorator that runs each call of a test function in a new process.

    Used like vLLM's: ``@create_new_process_for_each_test()`` or ``("spawn")``. The start
    method is chosen when the test runs, not at import: ``None`` means the platform's
    :func:`start_method` (``"spawn"`` on ROCm and XPU, ``"fork"`` elsewhere), so
    ``--accelplat-platform`` and ``ACCELPLAT_PLATFORM`` apply. See :func:`run_in_new_process`
    for how failures come back and for what spawning asks of the test (importable function,
    picklable fixture values).

    Args:
        method: ``"fork"``, ``"spawn"``, ``"forkserver"`` or ``None``.

    Returns:
        A decorator; the wrapped function keeps the test's name and signature, so pytest still
        injects its fixtures.

    Raises:
        ConfigurationError: For an unknown method (at decoration time).
    """
    if method is not None and method not in _START_METHODS:
        raise ConfigurationError(f"method must be one of {_START_METHODS} or None, got {method!r}")

    def decorator(func: _F) -> _F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            run_in_new_process(func, args, kwargs, method=method)

        wrapper._accelplat_isolated = func  # type: ignore[attr-defined]
        return cast(_F, wrapper)

    return decorator


# --------------------------------------------------------------------------------------------
# marks


def large_gpu_mark(min_gb: float) -> pytest.MarkDecorator:
    """Return a mark that skips a test unless device 0 has at least ``min_gb`` GB of memory.

    As in vLLM, ``min_gb`` is in decimal gigabytes (``10**9`` bytes), not GiB: ``24`` asks for
    24,000,000,000 bytes (22.35 GiB). The check runs when the test is set up, through the
    ``accelplat_requires_device_memory`` marker of accelplat's pytest plugin, so it reads the
    platform chosen for the session. Unlike vLLM, the CPU platform is not skipped outright: its
    device is host memory, judged like any other.

    Args:
        min_gb: Minimum total memory of the device, in GB (``> 0``).

    Returns:
        A ``pytest.MarkDecorator``.

    Raises:
        ConfigurationError: For a non-positive or non-finite ``min_gb``, or one whose byte count
            is too large for a float.
    """
    import pytest

    if isinstance(min_gb, bool) or not isinstance(min_gb, numbers.Real):
        raise ConfigurationError(f"min_gb must be a number of GB, got {min_gb!r}")
    try:
        needed = float(min_gb) * _DECIMAL_GB
    except OverflowError:  # an int beyond a float's range (not echoed: it may have no repr)
        raise ConfigurationError(
            f"min_gb must be a number of GB in (0, {_MAX_GB:.3g}], got an int too large for a float"
        ) from None
    if not math.isfinite(needed) or min_gb <= 0:
        raise ConfigurationError(
            f"min_gb must be a number of GB in (0, {_MAX_GB:.3g}], got {min_gb!r}"
        )
    return pytest.mark.accelplat_requires_device_memory(
        bytes=math.ceil(needed), label=f"{min_gb:g} GB"
    )


def large_gpu_test(*, min_gb: float) -> Callable[[_F], _F]:
    """Return a decorator applying :func:`large_gpu_mark` (vLLM's ``large_gpu_test``).

    Args:
        min_gb: Minimum total device memory in decimal GB.

    Returns:
        A decorator.
    """
    mark = large_gpu_mark(min_gb)

    def decorator(func: _F) -> _F:
        return cast(_F, mark(func))

    return decorator


def multi_gpu_marks(*, num_gpus: int) -> list[pytest.MarkDecorator]:
    """Return the marks of vLLM's ``multi_gpu_test``: a selector and a skip.

    Args:
        num_gpus: Devices the test needs (``>= 1``).

    Returns:
        ``[pytest.mark.distributed(num_gpus=…), pytest.mark.accelplat_requires_devices(…)]``.
        ``distributed`` is vLLM's selector marker (``pytest -m distributed``); in a session run
        with ``--strict-markers`` that does not register it, it is left out.

    Raises:
        ConfigurationError: For a count that is not an int ``>= 1``.
    """
    import pytest

    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
        raise ConfigurationError(f"num_gpus must be an int >= 1, got {num_gpus!r}")
    marks = [pytest.mark.accelplat_requires_devices(num_gpus)]
    try:
        selector = pytest.mark.distributed
    except pytest.fail.Exception:  # --strict-markers and no `distributed` marker registered
        return marks
    return [selector(num_gpus=num_gpus), *marks]


def multi_gpu_test(*, num_gpus: int) -> Callable[[_F], _F]:
    """Return a decorator like vLLM's ``multi_gpu_test``: marks plus a new process per call.

    Args:
        num_gpus: Devices the test needs.

    Returns:
        A decorator that applies :func:`multi_gpu_marks` and
        :func:`create_new_process_for_each_test`.
    """
    marks = multi_gpu_marks(num_gpus=num_gpus)
    isolate = create_new_process_for_each_test()

    def decorator(func: _F) -> _F:
        result: Any = isolate(func)
        for mark in reversed(marks):
            result = mark(result)
        return cast(_F, result)

    return decorator

"""Drop-in replacements for vLLM's test helpers (``tests/utils.py``), and hooks for its runners.

Everything under a vLLM name accepts the same calls and behaves as vLLM 0.32/0.33 does wherever a
passing vLLM test could notice (accounting, arguments, messages, printed progress), so a suite
switches with an import change; platform differences are read from the platform's data, never
branched on. What is kept, what is better and ``strict=True`` are in
``docs/migrating-vllm-tests.md``. pytest is imported only by the functions that need it.
"""

from __future__ import annotations

import functools
import math
import numbers
import signal
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast

from accelplat import _validate
from accelplat._platform import Platform, StartMethod, optional, validate_utilization
from accelplat._types import (
    GIB,
    MIB,
    MemoryInfo,
    SettleResult,
    UsageSnapshot,
)
from accelplat.errors import (
    AccelplatError,
    ChildTestError,
    ConfigurationError,
    MemoryNotSettledError,
    VllmArgumentError,
    VllmMemoryNotFreeError,
)
from accelplat.testing._isolation import (
    ChildResult,
    ChildTracebackError,
    mark_isolated,
    run_child,
)

if TYPE_CHECKING:
    import pytest

DEFAULT_HF_TOLERANCE = 0.05  # memory a HF-style runner may leave above its baseline (vLLM's)
# before_engine_start's grace on eager platforms: NVML shows an exited group's memory 0.2-0.9 s on
EAGER_START_GRACE_S = 2.0
_VLLM_SETTLE_WINDOW_S = 2.0  # stability window of vLLM's wait_for_memory_to_settle

_UTILIZATION_KEY = "gpu_memory_utilization"
_PARALLEL_KEYS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
_DECIMAL_GB = 10**9

_F = TypeVar("_F", bound=Callable[..., Any])


# --- platform views


def _platform(platform: Platform | None) -> Platform:
    if platform is not None:
        return platform
    from accelplat._registry import current_platform

    return current_platform()


def _is_accelerator(platform: Platform) -> bool:
    return bool(optional(platform, "is_accelerator"))


def _accelerator_count(platform: Platform) -> int:
    return platform.device_count() if _is_accelerator(platform) else 0


def _as_vllm_reads(info: MemoryInfo) -> MemoryInfo:
    """NVML's v1 figures, which vLLM reads on CUDA: reserved memory counts as used and total."""
    if info.reserved <= 0:  # ROCm, XPU: what torch.accelerator reports, unchanged
        return info
    return MemoryInfo(
        free=info.free,
        total=info.total + info.reserved,
        used=info.used + info.reserved,
        reserved=0,
        source=f"{info.source}+reserved" if info.source else "reserved",
    )


def _vllm_reader(platform: Platform) -> Callable[[int], MemoryInfo]:
    return lambda device: _as_vllm_reads(platform.memory_info(device))


def _physical(platform: Platform, devices: Sequence[int]) -> list[int]:
    """The vendor's indices of visible ``devices``, as vLLM's messages name them."""
    try:
        infos = platform.devices()
        return [infos[d].physical_index for d in devices]
    except (AccelplatError, IndexError, TypeError):
        return list(devices)


# --- vLLM's tests/utils.py helpers


def record_gpu_memory_usage_stats(*, devices: Sequence[int]) -> dict[int, tuple[float, float]]:
    """Return per visible device ``(used GiB, total GiB)`` as vLLM's helper measures them.

    On NVIDIA driver-reserved memory counts as used and as total (NVML v1, as vLLM reads it);
    :func:`accelplat.record_usage_stats` leaves it out.

    Args:
        devices: Visible (logical) device indices; an empty list gives ``{}``.

    Returns:
        ``{device: (used / 2**30, total / 2**30)}``.

    Raises:
        DeviceNotFoundError: For an index that is not visible (an ``IndexError``).
    """
    read = _vllm_reader(_platform(None))
    infos = {d: read(d) for d in devices}
    return {d: (m.used / GIB, m.total / GIB) for d, m in infos.items()}


def _keyed(value: object, devices: Sequence[int], physical: Sequence[int], argument: str) -> Any:
    """Return a mapping threshold keyed by visible indices; vLLM asserts its keys are exact."""
    if not isinstance(value, Mapping):
        return value
    keys = set(value)
    if keys == set(devices):
        return dict(value)
    if keys == set(physical):
        return {d: value[p] for d, p in zip(devices, physical, strict=True)}
    raise VllmArgumentError(
        f"{argument} as a mapping must name exactly the devices waited on "
        f"(visible {sorted(devices)} or physical {sorted(physical)}), got keys "
        f"{sorted(keys, key=repr)}"
    )


def _clamped_ratio(value: object) -> Any:
    """Clamp a ratio above 1 to 1: vLLM compares ``used / total <= ratio``, met by any usage."""
    if isinstance(value, Mapping):
        return {k: _clamped_ratio(v) for k, v in value.items()}
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 1:
        return 1.0
    return value


def _describe_threshold(
    devices: Sequence[int],
    physical: Sequence[int],
    threshold_bytes: object,
    threshold_ratio: object,
    floored: Mapping[int, int],
) -> str:
    """Return vLLM 0.32's ``threshold`` text: ``device=0: 2.00 GiB``, ``device=0: 0.100``."""

    def pick(value: object, device: int) -> float:
        if isinstance(value, Mapping):
            return float(value[device])
        return float(cast(float, value))

    parts: list[str] = []
    for device, phys in zip(devices, physical, strict=True):
        gib: float | None = None
        if threshold_bytes is not None:
            gib = pick(threshold_bytes, device) / GIB
        if device in floored:
            gib = max(gib or 0.0, floored[device] / GIB)
        if threshold_ratio is None:
            parts.append(f"device={phys}: {gib:.2f} GiB")
        elif gib is None:
            parts.append(f"device={phys}: {pick(threshold_ratio, device):.3f}")
        else:
            parts.append(f"device={phys}: max({gib:.2f} GiB, {pick(threshold_ratio, device):.3f})")
    return "; ".join(parts)


def _printer(
    physical: Mapping[int, int], every_s: float
) -> Callable[[UsageSnapshot, Mapping[int, int]], None]:
    """Return an ``on_poll`` callback printing vLLM's progress line at most once per ``every_s``."""
    last: list[float] = []

    def on_poll(snap: UsageSnapshot, targets: Mapping[int, int]) -> None:
        if last and snap.timestamp - last[0] < every_s:
            return
        last[:] = [snap.timestamp]
        line = "".join(
            f"{physical.get(d, d)}={m.used / GIB:.02f}/{m.total / GIB:.02f}; "
            for d, m in snap.memory.items()
        )
        print(f"gpu memory used/total (GiB): {line}", flush=True)

    return on_poll


def _poll_policy(poll_interval_s: object) -> tuple[Any, float]:
    """The sampling policy and the print cadence for vLLM's ``poll_interval_s``."""
    from accelplat._memory import PollPolicy

    expected = "a finite number of seconds >= 0"
    cadence = _validate.number(poll_interval_s, "poll_interval_s", minimum=0, expected=expected)
    default = PollPolicy()
    if 0 < cadence < default.max_s:
        return PollPolicy(initial_s=min(default.initial_s, cadence), max_s=cadence), cadence
    return default, cadence


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

    Used memory is vLLM's accounting (:func:`record_gpu_memory_usage_stats`); with both
    thresholds the larger wins. vLLM's progress line is printed once per ``poll_interval_s``.

    Args:
        devices: Visible (logical) device indices; ``[]`` returns at once.
        threshold_bytes: Used bytes at or below which a device is clear; an int, or a mapping
            naming exactly ``devices`` (by visible or by physical index).
        threshold_ratio: Fraction of total; a float, or a mapping naming exactly ``devices``.
            A ratio above 1 is met by any usage, as in vLLM.
        timeout_s: Give up after this many seconds.
        stable_duration_s: How long usage must stay clear and steady.
        stable_tolerance_bytes: Movement that still counts as steady.
        poll_interval_s: How often progress is printed (vLLM also sleeps this long; here it
            only caps the 5-40 ms sampling interval).

    Raises:
        VllmArgumentError: For no threshold, or a mapping whose keys are not the devices (an
            ``AssertionError``, as vLLM's ``assert``).
        VllmMemoryNotFreeError: On timeout (a ``ValueError``), with vLLM 0.32's first line.
        ConfigurationError: For a malformed argument; ``DeviceNotFoundError`` for a bad index.

    Side effects:
        Sleeps; prints progress to stdout.
    """
    from accelplat._memory import wait_for_memory_to_clear

    if threshold_bytes is None and threshold_ratio is None:
        raise VllmArgumentError(
            "wait_for_gpu_memory_to_clear needs threshold_bytes or threshold_ratio (or both)"
        )
    if devices is None or isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
        raise ConfigurationError(
            f"devices must be a list of visible device indices, got {devices!r} "
            "(vLLM's helper has no default: name the devices to wait on)"
        )
    poll, cadence = _poll_policy(poll_interval_s)
    platform = _platform(None)
    wanted = list(devices)
    physical = _physical(platform, wanted) if wanted else []
    by_bytes = _keyed(threshold_bytes, wanted, physical, "threshold_bytes")
    by_ratio = _clamped_ratio(_keyed(threshold_ratio, wanted, physical, "threshold_ratio"))
    if not wanted:
        print(
            "Done waiting for free GPU memory on devices devices=[] (threshold='') dur_s=0.00",
            flush=True,
        )
        return
    try:
        result = wait_for_memory_to_clear(
            wanted,
            threshold_bytes=by_bytes,
            threshold_ratio=by_ratio,
            timeout_s=timeout_s,
            stable_duration_s=stable_duration_s,
            stable_tolerance_bytes=stable_tolerance_bytes,
            poll=poll,
            on_poll=_printer(dict(zip(wanted, physical, strict=True)), cadence),
            platform=platform,
            read=_vllm_reader(platform),
        )
    except MemoryNotSettledError as exc:  # raised only after every argument was validated
        raise _not_free(exc, wanted, physical, by_bytes, by_ratio) from None
    threshold = _describe_threshold(wanted, physical, by_bytes, by_ratio, result.raised_targets)
    stable = "stable " if float(stable_duration_s) > 0 else ""
    print(
        f"Done waiting for {stable}free GPU memory on devices devices={physical!r} "
        f"(threshold={threshold!r}) dur_s={result.waited_s:.02f}",
        flush=True,
    )


def _not_free(
    exc: MemoryNotSettledError,
    devices: Sequence[int],
    physical: Sequence[int],
    threshold_bytes: object,
    threshold_ratio: object,
) -> VllmMemoryNotFreeError:
    """Return the timeout error of vLLM's helpers: vLLM 0.32's first line, then the diagnosis."""
    threshold = _describe_threshold(
        devices, physical, threshold_bytes, threshold_ratio, exc.raised_targets
    )
    head = (
        f"Memory of devices devices={list(physical)!r} not free after "
        f"dur_s={exc.waited_s:.02f} (threshold={threshold!r})"
    )
    return VllmMemoryNotFreeError(
        f"{head}\n{exc}",
        snapshot=exc.snapshot,
        targets=exc.targets,
        waited_s=exc.waited_s,
        history=exc.history,
        raised_targets=exc.raised_targets,
    )


def wait_for_memory_to_settle(
    *,
    threshold_ratio: float | Mapping[int, float] | None = 0.1,
    timeout_s: float = 240,
) -> None:
    """Wait for lazily released memory to come back on every device, as vLLM's helper does.

    On an eager platform (vLLM: all but ROCm and XPU), or with no accelerator, this returns at
    once without looking at its arguments, as vLLM's does. On a lazy one every visible device
    must stay at or below ``threshold_ratio`` of its total for 2 s (or the profile's window).

    Args:
        threshold_ratio: Fraction of total, or a mapping naming every visible device; ``None``
            means ``0.1`` (vLLM's ``HfRunner.__exit__`` passes ``None`` on CUDA and CPU).
        timeout_s: Give up after this many seconds.

    Raises:
        VllmMemoryNotFreeError: On timeout (a ``ValueError``).
        VllmArgumentError: For a mapping whose keys are not the devices (lazy platforms only).

    Side effects:
        On lazy platforms sleeps and prints progress once a second.
    """
    platform = _platform(None)
    if not platform.release.lazy:
        return
    count = _accelerator_count(platform)
    if count == 0:
        return
    wait_for_gpu_memory_to_clear(
        devices=list(range(count)),
        threshold_ratio=0.1 if threshold_ratio is None else threshold_ratio,
        timeout_s=timeout_s,
        stable_duration_s=min(_VLLM_SETTLE_WINDOW_S, platform.release.stable_duration_s),
        poll_interval_s=1.0,
    )


# --- runner hooks (VllmRunner / HfRunner)


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
        world *= _validate.integer(value, key, minimum=1)
    return list(range(min(world, platform.device_count())))


def _nothing_to_do() -> SettleResult:
    """The result of a hook that had nothing to check: no sample, no wait."""
    return SettleResult(0.0, 0, UsageSnapshot(time.monotonic(), time.time(), {}), True, {})


def _check_strict(strict: object) -> bool:
    if not isinstance(strict, bool):
        raise ConfigurationError(f"strict must be True or False, got {strict!r}")
    return strict


def engine_kwargs(kwargs: Mapping[str, Any], *, platform: Platform | None = None) -> dict[str, Any]:
    """Return engine keyword arguments with a memory utilization that suits this platform.

    Replaces the XPU branch of vLLM's ``VllmRunner``: a missing (or ``None``)
    ``gpu_memory_utilization`` becomes the platform's ``default_memory_utilization`` (on CPU
    computed from the memory available now); a given value is validated.

    Args:
        kwargs: The keyword arguments meant for ``vllm.LLM``; not modified.
        platform: The platform; ``None`` means the current one.

    Returns:
        A new dict: ``kwargs`` with ``gpu_memory_utilization`` set.

    Raises:
        ValueError: When ``gpu_memory_utilization`` is not a number in ``(0, 1]``, or ``kwargs``
            is not a mapping (a ``ConfigurationError``).

    Side effects:
        Reads the platform's default (on CPU that reads host memory figures).
    """
    utilization = _utilization(kwargs, _platform(platform))  # refuses a kwargs that is no mapping
    return {**kwargs, _UTILIZATION_KEY: utilization}


def before_engine_start(
    kwargs: Mapping[str, Any], *, platform: Platform | None = None, strict: bool = False
) -> SettleResult:
    """Make sure the engine's devices have the free memory its start-up check will ask for.

    Each device the engine uses (the product of its parallel sizes, from index 0) must be at or
    below ``(1 − utilization) × total`` used, vLLM's accounting. Lazy platforms wait with the
    profile's window and timeout, as vLLM's runner does; eager ones check and give an exiting
    process :data:`EAGER_START_GRACE_S`; without an accelerator nothing is checked
    (docs/migrating-vllm-tests.md).

    Args:
        kwargs: The engine keyword arguments; ``gpu_memory_utilization`` defaults to the
            platform's.
        platform: The platform; ``None`` means the current one.
        strict: Check on every platform, CPU included, with accelplat's accounting, and on eager
            platforms wait up to the profile's timeout.

    Returns:
        The wait's :class:`~accelplat._types.SettleResult` (``polls == 0``: nothing checked).

    Raises:
        VllmMemoryNotFreeError: When the devices do not have the room (a ``ValueError``).
        ValueError: For a bad utilization or parallel size.

    Side effects:
        May sleep.
    """
    from accelplat._memory import wait_for_memory_to_clear

    p = _platform(platform)
    ratio = _free_ratio(kwargs, p)
    devices = _engine_devices(kwargs, p)
    if not _check_strict(strict) and not _is_accelerator(p):
        return _nothing_to_do()
    if not devices:
        if strict:
            raise ConfigurationError(f"the {p.name} platform has no visible device to start on")
        return _nothing_to_do()
    profile = p.release
    if profile.lazy:
        timeout, window = profile.settle_timeout_s, profile.stable_duration_s
    elif strict:
        timeout, window = profile.settle_timeout_s, 0.0
    else:
        timeout, window = min(EAGER_START_GRACE_S, profile.settle_timeout_s), 0.0
    physical = _physical(p, devices)
    try:
        return wait_for_memory_to_clear(
            devices,
            threshold_ratio=ratio,
            timeout_s=timeout,
            stable_duration_s=window,
            on_poll=_printer(dict(zip(devices, physical, strict=True)), 1.0),
            platform=p,
            read=None if strict else _vllm_reader(p),
        )
    except MemoryNotSettledError as exc:
        raise _not_free(exc, devices, physical, None, ratio) from None


def after_engine_shutdown(
    kwargs: Mapping[str, Any], *, platform: Platform | None = None, strict: bool = False
) -> SettleResult:
    """After an engine shut down, wait where vLLM's runner waits for its memory to come back.

    On lazy platforms every device must get to ``1 − utilization`` used, with the platform's
    stability window, as in vLLM's ``VllmRunner.__exit__``; elsewhere nothing happens.

    Args:
        kwargs: The engine keyword arguments the engine was started with.
        platform: The platform; ``None`` means the current one.
        strict: Opt in to accelplat's semantics: :func:`accelplat.wait_for_memory_to_settle` on
            every platform (on eager ones it waits, without a window, for the exiting process).

    Returns:
        The :class:`~accelplat._types.SettleResult` (``polls == 0`` when nothing was waited for).

    Raises:
        VllmMemoryNotFreeError: When memory is not back by the settle timeout (a ``ValueError``).

    Side effects:
        May sleep.
    """
    from accelplat._memory import wait_for_memory_to_clear
    from accelplat._memory import wait_for_memory_to_settle as settle

    p = _platform(platform)
    ratio = _free_ratio(kwargs, p)
    devices = list(range(p.device_count()))
    physical = _physical(p, devices)
    printer = _printer(dict(zip(devices, physical, strict=True)), 1.0)
    try:
        if _check_strict(strict):
            return settle(threshold_ratio=ratio, platform=p, on_poll=printer)
        if not p.release.lazy or _accelerator_count(p) == 0:
            return _nothing_to_do()
        return wait_for_memory_to_clear(
            devices,
            threshold_ratio=ratio,
            timeout_s=p.release.settle_timeout_s,
            stable_duration_s=p.release.stable_duration_s,
            on_poll=printer,
            platform=p,
            read=_vllm_reader(p),
        )
    except MemoryNotSettledError as exc:
        raise _not_free(exc, devices, physical, None, ratio) from None


@contextmanager
def memory_baseline(
    tolerance: float = DEFAULT_HF_TOLERANCE,
    *,
    devices: Sequence[int] | None = None,
    timeout_s: float | None = None,
    platform: Platform | None = None,
) -> Iterator[UsageSnapshot]:
    """Record device usage on entry and, on exit, wait until it is back near that baseline.

    Replaces vLLM's ``HfRunner`` branch that waits, on exit, until usage is at most ``baseline +
    tolerance × total``: on lazy platforms, with their stability window; on eager ones nothing
    is waited for (as in vLLM). When the body raises, no wait happens.

    Args:
        tolerance: Fraction of each device's total usage may stay above the baseline.
        devices: Visible device indices; ``None`` means every visible device.
        timeout_s: Limit of the exit wait; ``None`` means the platform's settle timeout.
        platform: The platform; ``None`` means the current one.

    Yields:
        The baseline :class:`~accelplat._types.UsageSnapshot` (empty without an accelerator).

    Raises:
        VllmMemoryNotFreeError: On exit, when usage does not come back in time.
        ConfigurationError: On entry (on every platform), for a tolerance outside ``[0, 1]`` or
            a bad ``timeout_s``.

    Side effects:
        Samples memory on entry; may sleep on exit.
    """
    from accelplat._memory import snapshot, wait_for_memory_to_clear

    fraction = _validate.ratio(tolerance, "tolerance")
    if timeout_s is not None:  # checked here, as the exit wait would, even if it never runs
        _validate.duration(timeout_s, "timeout_s")
    p = _platform(platform)
    if not _is_accelerator(p):
        yield _nothing_to_do().snapshot
        return
    read = _vllm_reader(p)
    baseline = snapshot(devices, platform=p, holders=False, read=read)
    yield baseline
    if not p.release.lazy:
        return
    targets = {
        d: info.used + math.floor(fraction * info.total) for d, info in baseline.memory.items()
    }
    wanted = list(targets)
    physical = _physical(p, wanted)
    try:
        wait_for_memory_to_clear(
            wanted,
            threshold_bytes=targets,
            timeout_s=timeout_s,
            on_poll=_printer(dict(zip(wanted, physical, strict=True)), 1.0),
            platform=p,
            read=read,
        )
    except MemoryNotSettledError as exc:
        raise _not_free(exc, wanted, physical, targets, None) from None


# --- process isolation (vLLM's names on top of accelplat.testing._isolation)


def requires_spawn_multiprocessing() -> bool:
    """Whether test processes must be spawned rather than forked here (vLLM: ROCm and XPU).

    Returns:
        ``True`` when the current platform's ``preferred_start_method`` is not ``"fork"``.
    """
    return _platform(None).preferred_start_method != "fork"


def _format_exit(code: int | None) -> str:
    """Render a child's exit as vLLM does: ``exit code 1``, ``killed by SIGKILL (-9)``."""
    if code is None:
        return "exit code None"
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name} ({code})"
    except ValueError:
        return f"exit code {code}"


def _failed(result: ChildResult) -> bool:
    """Whether the child failed; pytest's skip, xfail or fail in the child is raised here."""
    if result.status == "outcome":
        result.raise_pytest_outcome()
    return result.status != "ok"


def fork_new_process_for_each_test(func: _F) -> _F:
    """Run each call of a test in a forked child, as vLLM's decorator of this name does.

    The child leads its own process group (what it leaves running is sent ``SIGTERM``). A
    failure comes back as the child's own exception when it pickles, else as a
    :class:`~accelplat.errors.ChildTestError` (an ``AssertionError``) with the child's traceback.
    pytest's skip, xfail and fail in the child keep their meaning (vLLM's fork passes a skip).

    Args:
        func: The test function.

    Returns:
        The wrapper; it keeps the test's name and signature, so pytest still injects fixtures.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        result = run_child(func, args, kwargs, method="fork")
        if not _failed(result):
            return
        if isinstance(result.exception, Exception):
            raise result.exception from ChildTracebackError(result.traceback)
        call = (
            f"{getattr(func, '__name__', repr(func))} failed when called with args {args} and "
            f"kwargs {kwargs} (exit code: {result.exitcode}"
        )
        if result.traceback:
            raise ChildTestError(f"Test {call}):\n{result.traceback}") from None
        silent = f"; the child {result.describe_exit()} without reporting)"
        raise ChildTestError(f"function {call}{silent}") from None

    mark_isolated(wrapper, func)
    return cast(_F, wrapper)


def spawn_new_process_for_each_test(func: _F) -> _F:
    """Run each call of a test in a fresh interpreter, as vLLM's decorator of this name does.

    The child imports the test by module and qualified name; a failure comes back as
    ``RuntimeError("Test subprocess '<name>' failed (exit code N):``, then the child's traceback.

    Args:
        func: The test function, defined at module or class level.

    Returns:
        The wrapper; it keeps the test's name and signature.

    Raises:
        ConfigurationError: When the test is called, for a function a fresh interpreter cannot
            import or arguments that cannot be pickled.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        result = run_child(func, args, kwargs, method="spawn")
        if _failed(result):
            name = getattr(func, "__name__", repr(func))
            text = result.traceback or "<no Python traceback; see subprocess output above>"
            exit_ = _format_exit(result.exitcode)
            raise RuntimeError(f"Test subprocess '{name}' failed ({exit_}):\n{text}")

    mark_isolated(wrapper, func)
    return cast(_F, wrapper)


def create_new_process_for_each_test(
    method: StartMethod | None = None,
) -> Callable[[_F], _F]:
    """Return vLLM's fork or spawn decorator (see the two functions above).

    With ``None`` the method is chosen when the test runs, from the platform's
    ``preferred_start_method``, so ``--accelplat-platform`` and ``ACCELPLAT_PLATFORM`` apply.

    Args:
        method: ``"fork"``, ``"spawn"`` or ``None``.

    Returns:
        A decorator.

    Raises:
        VllmArgumentError: For another method (an ``AssertionError``, as vLLM's ``assert``).
    """
    if method == "fork":
        return fork_new_process_for_each_test
    if method == "spawn":
        return spawn_new_process_for_each_test
    if method is not None:
        raise VllmArgumentError(f"method must be 'spawn', 'fork' or None, got {method!r}")

    def decorator(func: _F) -> _F:
        forked = fork_new_process_for_each_test(func)
        spawned = spawn_new_process_for_each_test(func)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            chosen = spawned if requires_spawn_multiprocessing() else forked
            chosen(*args, **kwargs)

        mark_isolated(wrapper, func)
        return cast(_F, wrapper)

    return decorator


# --- marks (plain skipif marks, decided when built: they need no plugin)


def _device_zero_gb() -> float:
    """Return device 0's total memory in decimal GB as vLLM reads it; 0 without an accelerator."""
    try:
        platform = _platform(None)
        if _accelerator_count(platform) == 0:
            return 0
        return platform.memory_info(0).total / _DECIMAL_GB
    except AccelplatError as exc:
        warnings.warn(f"An error occurred when finding the available memory: {exc}", stacklevel=3)
        return 0


def large_gpu_mark(min_gb: float) -> pytest.MarkDecorator:
    """Return a ``skipif`` mark: skip unless device 0 has at least ``min_gb`` GB of memory.

    As in vLLM, ``min_gb`` is decimal (``10**9`` bytes), the decision is taken when the mark is
    built, and a host without an accelerator has 0 GB. The plugin marker
    ``accelplat_requires(device_memory="24GB")`` decides at set-up instead.

    Args:
        min_gb: Minimum total memory of device 0, in GB.

    Returns:
        A ``pytest.MarkDecorator``.

    Raises:
        ConfigurationError: For a ``min_gb`` that is not a number, or is NaN.

    Side effects:
        Reads device 0's memory once.
    """
    import pytest

    if isinstance(min_gb, bool) or not isinstance(min_gb, numbers.Real) or math.isnan(min_gb):
        raise ConfigurationError(f"min_gb must be a number of GB, got {min_gb!r}")
    memory_gb = _device_zero_gb()
    return pytest.mark.skipif(
        memory_gb < min_gb,
        reason=f"Need at least {min_gb}GB GPU memory to run the test (found {memory_gb}GB).",
    )


def large_gpu_test(*, min_gb: float) -> Callable[[_F], _F]:
    """Return a decorator applying :func:`large_gpu_mark` (vLLM's ``large_gpu_test``).

    Args:
        min_gb: Minimum total memory of device 0 in decimal GB.
    """
    mark = large_gpu_mark(min_gb)

    def decorator(func: _F) -> _F:
        return cast(_F, mark(func))

    return decorator


def multi_gpu_marks(*, num_gpus: int) -> list[pytest.MarkDecorator]:
    """Return the marks of vLLM's ``multi_gpu_test``: a selector and a ``skipif``.

    Args:
        num_gpus: Devices the test needs.

    Returns:
        ``[pytest.mark.distributed(num_gpus=…), pytest.mark.skipif(count < num_gpus, …)]``
        over visible accelerator devices; ``distributed`` is left out under
        ``--strict-markers`` when it is not registered.

    Raises:
        ConfigurationError: For a count that is not an int.
    """
    import pytest

    _validate.integer(num_gpus, "num_gpus", expected="an int")
    try:
        count = _accelerator_count(_platform(None))
    except AccelplatError as exc:
        warnings.warn(f"An error occurred when counting the devices: {exc}", stacklevel=2)
        count = 0
    skip = pytest.mark.skipif(
        count < num_gpus, reason=f"Need at least {num_gpus} GPUs to run the test."
    )
    try:
        selector = pytest.mark.distributed
    except pytest.fail.Exception:  # --strict-markers and no `distributed` marker registered
        return [skip]
    return [selector(num_gpus=num_gpus), skip]


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

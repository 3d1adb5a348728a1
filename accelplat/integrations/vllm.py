"""Drop-in replacements for vLLM's test helpers, and hooks for its runners.

vLLM's ``tests/utils.py`` and ``tests/conftest.py`` answer "is the device free yet?" with
platform branches: NVML on CUDA, torch on ROCm and XPU, a 4 GiB floor on ROCm, a settle wait on
ROCm and XPU only, a 0.9 default utilization on XPU. Everything here under a vLLM name accepts
the same calls and behaves as vLLM 0.32/0.33 does wherever a passing vLLM test could notice, so a
test suite can switch with an import change; every platform difference is taken from the
platform's data (:class:`~accelplat._types.ReleaseProfile`, ``default_memory_utilization``,
``preferred_start_method``, ``device_type``) instead of a branch.

What is kept from vLLM:

* **Accounting**: "used" and "total" are what vLLM reads: on NVIDIA the NVML v1 figures (memory
  the driver reserves for itself counts as used, and in the total), elsewhere what
  ``torch.accelerator.get_memory_info`` reports, both taken from accelplat's context-free
  sources. Thresholds written against vLLM's helpers keep their meaning.
* **Arguments**: ``threshold_ratio=None`` in :func:`wait_for_memory_to_settle` means 0.1;
  ``devices=[]`` returns; a mapping threshold whose keys are not the devices, or a missing
  threshold, is an ``AssertionError`` (:class:`VllmArgumentError`), as vLLM's ``assert`` is.
* **Timeouts** raise :class:`VllmMemoryNotFreeError`, a ``ValueError`` whose first line is
  vLLM's: ``Memory of devices devices=[…] not free after dur_s=… (threshold='device=0: 0.100')``
  with physical indices.
* **Progress** is printed to stdout as vLLM prints it (``gpu memory used/total (GiB): 0=x/y;``),
  once per ``poll_interval_s``.
* **Hosts without an accelerator** (a platform whose ``device_type`` is ``"cpu"``) have no
  device: :func:`large_gpu_mark` skips with "found 0GB", :func:`multi_gpu_marks` counts 0,
  :func:`wait_for_memory_to_settle` and the runner hooks do nothing.
* **Marks** are plain ``pytest.mark.skipif`` marks decided when they are built; they work with
  no plugin loaded (``-p no:accelplat``).
* **Process isolation**: :func:`fork_new_process_for_each_test`,
  :func:`spawn_new_process_for_each_test` and :func:`create_new_process_for_each_test` bring
  failures back as vLLM's do (the child's own exception, or ``AssertionError``, after a fork; a
  ``RuntimeError`` naming the exit code and carrying the child's traceback after a spawn; a
  skip in a spawned child skips), with ``cloudpickle`` for arguments and exceptions.

Where this module is better, in ways a passing vLLM test cannot notice:

* **Latency**: the device is sampled every 5-40 ms whatever ``poll_interval_s`` says (it sets
  how often progress is printed), so a wait returns within ~40 ms of the memory coming back
  instead of up to ``poll_interval_s`` later, and at once when it is already back.
* **Indices** are visible (logical) indices mapped by the backend with every form the vendor
  accepts (UUIDs, MIG, ``CUDA_DEVICE_ORDER``); mapping thresholds may be keyed by visible or
  physical indices. No device context is created on CUDA or ROCm.
* **Diagnosis**: the timeout message adds per-device history and the processes holding memory.
* **Idle floor**: on a lazy platform a ratio under 5 % whose target is below
  ``release.idle_floor_bytes`` is raised to the floor (vLLM: 4 GiB for ratios under 5 % on ROCm).

accelplat's stricter semantics (NVML v2 accounting, strict arguments, a settle wait on every
platform) are an explicit opt-in: call :func:`accelplat.wait_for_memory_to_clear`,
:func:`accelplat.wait_for_memory_to_settle` (``force=True``) and
:func:`accelplat.testing._isolation.run_in_new_process` directly, or pass ``strict=True`` to the
runner
hooks. The generic process isolation itself lives in :mod:`accelplat.testing._isolation`.

Nothing here imports torch, vLLM or a vendor library, and on context-free platforms nothing
creates a device context. pytest and cloudpickle are imported only by the functions that need
them.
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
from accelplat._platform import Platform, StartMethod, validate_utilization
from accelplat._types import GIB, MIB, DeviceInfo, GraphSupport, MemoryInfo, ReleaseProfile
from accelplat._usage import MemoryHolder, SettleResult, UsageSnapshot
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

__all__ = [
    "DEFAULT_HF_TOLERANCE",
    "VllmArgumentError",
    "VllmMemoryNotFreeError",
    "after_engine_shutdown",
    "before_engine_start",
    "create_new_process_for_each_test",
    "engine_kwargs",
    "fork_new_process_for_each_test",
    "large_gpu_mark",
    "large_gpu_test",
    "memory_baseline",
    "multi_gpu_marks",
    "multi_gpu_test",
    "record_gpu_memory_usage_stats",
    "requires_spawn_multiprocessing",
    "spawn_new_process_for_each_test",
    "wait_for_gpu_memory_to_clear",
    "wait_for_memory_to_settle",
]

DEFAULT_HF_TOLERANCE = 0.05
"""Fraction of device memory a HF-style runner may leave above its baseline (vLLM's 5 %)."""

EAGER_START_GRACE_S = 2.0
"""Longest wait of :func:`before_engine_start` on an eager platform before it reports memory as
not free: NVML shows memory of an exiting process group back 0.2-0.9 s after it ends."""

_VLLM_SETTLE_WINDOW_S = 2.0
"""Stability window of vLLM's ``wait_for_memory_to_settle``."""

_UTILIZATION_KEY = "gpu_memory_utilization"
_PARALLEL_KEYS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
_HOST_DEVICE_TYPE = "cpu"
"""The torch device type of platforms whose "device" is host memory: no accelerator."""
_DECIMAL_GB = 10**9

_F = TypeVar("_F", bound=Callable[..., Any])


# --------------------------------------------------------------------------------------------
# errors


# --------------------------------------------------------------------------------------------
# platform views


def _platform(platform: Platform | None) -> Platform:
    if platform is not None:
        return platform
    from accelplat._registry import current_platform

    return current_platform()


def _has_accelerator(platform: Platform) -> bool:
    """Whether the platform has accelerator devices (vLLM: anything but ``is_cpu()``)."""
    return platform.device_type != _HOST_DEVICE_TYPE


def _accelerator_count(platform: Platform) -> int:
    return platform.device_count() if _has_accelerator(platform) else 0


class _VllmAccounting:
    """A platform as vLLM's helpers measure it: reserved memory counts as used and as total.

    NVML's v1 figures (what vLLM reads on CUDA) are ``used = v2.used + reserved`` and ``total =
    v2.total``; accelplat reports ``used`` without and ``total`` less the reserved memory. On
    platforms that report no reserved memory (ROCm, XPU: what ``torch.accelerator`` reports)
    the figures are unchanged. Everything else is the wrapped platform's.
    """

    def __init__(self, inner: Platform) -> None:
        self._inner = inner
        clock = getattr(inner, "clock", None)
        if clock is not None:
            self.clock = clock

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def device_type(self) -> str:
        return self._inner.device_type

    @property
    def visible_devices_env(self) -> str | None:
        return self._inner.visible_devices_env

    @property
    def release(self) -> ReleaseProfile:
        return self._inner.release

    @property
    def graph(self) -> GraphSupport:
        return self._inner.graph

    @property
    def default_memory_utilization(self) -> float:
        return self._inner.default_memory_utilization

    @property
    def preferred_start_method(self) -> StartMethod:
        return self._inner.preferred_start_method

    @property
    def context_free(self) -> bool:
        return self._inner.context_free

    def device_count(self) -> int:
        return self._inner.device_count()

    def devices(self) -> Sequence[DeviceInfo]:
        return self._inner.devices()

    def memory_info(self, device: int) -> MemoryInfo:
        return _as_vllm_reads(self._inner.memory_info(device))

    def memory_holders(self, device: int) -> Sequence[MemoryHolder] | None:
        return self._inner.memory_holders(device)


def _as_vllm_reads(info: MemoryInfo) -> MemoryInfo:
    if info.reserved <= 0:
        return info
    return MemoryInfo(
        free=info.free,
        total=info.total + info.reserved,
        used=info.used + info.reserved,
        reserved=0,
        source=f"{info.source}+reserved" if info.source else "reserved",
    )


def _physical(platform: Platform, devices: Sequence[int]) -> list[int]:
    """The vendor's indices of visible ``devices``, as vLLM's messages name them."""
    try:
        infos = platform.devices()
        return [infos[d].physical_index for d in devices]
    except (AccelplatError, IndexError, TypeError):
        return list(devices)


# --------------------------------------------------------------------------------------------
# vLLM's tests/utils.py helpers


def record_gpu_memory_usage_stats(*, devices: Sequence[int]) -> dict[int, tuple[float, float]]:
    """Return per visible device ``(used GiB, total GiB)`` as vLLM's helper measures them.

    On NVIDIA the figures are NVML's v1 ones (driver-reserved memory counts as used and as
    total: 1 GiB allocated on an 80 GiB device with 615 MiB reserved reads ``(1.60, 80.0)``);
    elsewhere what ``torch.accelerator.get_memory_info`` reports. accelplat's own
    :func:`accelplat.record_usage_stats` leaves reserved memory out.

    Args:
        devices: Visible (logical) device indices; an empty list gives ``{}``.

    Returns:
        ``{device: (used / 2**30, total / 2**30)}``.

    Raises:
        DeviceNotFoundError: For an index that is not visible (an ``IndexError``).

    Side effects:
        Reads memory through the current platform; creates no device context and imports no
        framework on context-free platforms (vLLM's ROCm and XPU paths create one).
    """
    platform = _platform(None)
    output: dict[int, tuple[float, float]] = {}
    for device in devices:
        info = _as_vllm_reads(platform.memory_info(device))
        output[device] = (info.used / GIB, info.total / GIB)
    return output


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


def _floored_targets(
    snap: UsageSnapshot, targets: Mapping[int, int], threshold_bytes: object, ratio: object
) -> dict[int, int]:
    """Devices whose target the platform's idle floor raised above bytes and ratio."""
    if ratio is None:
        return {}
    raised: dict[int, int] = {}
    for device, target in targets.items():
        r = float(ratio[device] if isinstance(ratio, Mapping) else cast(float, ratio))
        info = snap.memory.get(device)
        if info is None:
            continue
        by_ratio = math.floor(r * info.total)
        by_bytes = 0
        if threshold_bytes is not None:
            by_bytes = int(
                threshold_bytes[device]
                if isinstance(threshold_bytes, Mapping)
                else cast(int, threshold_bytes)
            )
        if target > max(by_ratio, by_bytes):
            raised[device] = target
    return raised


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

    cadence = _validate.number(
        poll_interval_s,
        "poll_interval_s",
        minimum=0,
        expected="a finite number of seconds >= 0",
        not_a_number="a number of seconds",
    )
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

    A device is clear when its used memory (vLLM's accounting: see
    :func:`record_gpu_memory_usage_stats`) is at or below ``threshold_bytes``, or
    ``threshold_ratio × total``, or with both the larger of the two. With ``stable_duration_s``
    the usage must also stay within ``stable_tolerance_bytes`` for that long.

    Memory is sampled every 5-40 ms whatever ``poll_interval_s`` is, so the wait returns within
    about 40 ms of the memory coming back (vLLM: up to ``poll_interval_s`` later); the progress
    line ``gpu memory used/total (GiB): 0=x/y;`` is printed at the first sample and then once per
    ``poll_interval_s``, as vLLM prints it.

    Args:
        devices: Visible (logical) device indices; ``[]`` returns at once.
        threshold_bytes: Used bytes at or below which a device is clear; an int, or a mapping
            naming exactly ``devices`` (by visible or by physical index).
        threshold_ratio: Fraction of total; a float, or a mapping naming exactly ``devices``.
            A ratio above 1 is met by any usage, as in vLLM.
        timeout_s: Give up after this many seconds.
        stable_duration_s: How long usage must stay clear and steady.
        stable_tolerance_bytes: Movement that still counts as steady.
        poll_interval_s: How often progress is printed (vLLM also sleeps this long between
            samples; here it only caps the sampling interval when it is below 40 ms).

    Raises:
        VllmArgumentError: For no threshold at all, or a mapping whose keys are not the devices
            (an ``AssertionError``, as vLLM's ``assert``).
        VllmMemoryNotFreeError: On timeout (a ``ValueError``), with vLLM 0.32's first line.
        ConfigurationError: For a malformed argument (a ``ValueError``).
        DeviceNotFoundError: For an index that is not visible (an ``IndexError``).

    Side effects:
        Sleeps; prints progress to stdout. Creates no device context on context-free platforms.
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
    view = cast(Platform, _VllmAccounting(platform))
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
            platform=view,
        )
    except MemoryNotSettledError as exc:  # raised only after every argument was validated
        floored = _floored_targets(exc.snapshot, exc.targets, by_bytes, by_ratio)
        threshold = _describe_threshold(wanted, physical, by_bytes, by_ratio, floored)
        raise _not_free(exc, physical, threshold) from None
    floored = _floored_targets(result.snapshot, result.targets, by_bytes, by_ratio)
    threshold = _describe_threshold(wanted, physical, by_bytes, by_ratio, floored)
    stable = "stable " if float(stable_duration_s) > 0 else ""
    print(
        f"Done waiting for {stable}free GPU memory on devices devices={physical!r} "
        f"(threshold={threshold!r}) dur_s={result.waited_s:.02f}",
        flush=True,
    )


def _not_free(
    exc: MemoryNotSettledError, physical: Sequence[int], threshold: str
) -> VllmMemoryNotFreeError:
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
    )


def wait_for_memory_to_settle(
    *,
    threshold_ratio: float | Mapping[int, float] | None = 0.1,
    timeout_s: float = 240,
) -> None:
    """Wait for lazily released memory to come back on every device, as vLLM's helper does.

    On a platform whose ``release.lazy`` is false (vLLM: everything but ROCm and XPU), or with no
    accelerator device, this returns at once without looking at its arguments, as vLLM's does.
    On a lazy platform it waits until every visible device is at or below ``threshold_ratio`` of
    its total and has stayed there for 2 s (or the platform's shorter stability window).

    Args:
        threshold_ratio: Fraction of total, or a mapping naming every visible device; ``None``
            means ``0.1`` (vLLM's ``HfRunner.__exit__`` passes ``None`` on CUDA and CPU).
        timeout_s: Give up after this many seconds.

    Raises:
        VllmMemoryNotFreeError: On timeout (a ``ValueError``).
        VllmArgumentError: For a mapping whose keys are not the devices (lazy platforms only).

    Side effects:
        On lazy platforms sleeps and prints progress once a second; creates no device context on
        context-free platforms.
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
        world *= _validate.integer(value, key, minimum=1)
    return list(range(min(world, platform.device_count())))


def _nothing_to_do(clock: Callable[[], float] = time.monotonic) -> SettleResult:
    """The result of a hook that had nothing to check: no sample, no wait."""
    return SettleResult(0.0, 0, UsageSnapshot(clock(), time.time(), {}), True, {})


def _check_strict(strict: object) -> bool:
    if not isinstance(strict, bool):
        raise ConfigurationError(f"strict must be True or False, got {strict!r}")
    return strict


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
    kwargs: Mapping[str, Any], *, platform: Platform | None = None, strict: bool = False
) -> SettleResult:
    """Make sure the engine's devices have the free memory its start-up check will ask for.

    An engine refuses to start when free memory is below ``total × gpu_memory_utilization``, so
    each device it uses (``tensor_parallel_size × pipeline_parallel_size ×
    data_parallel_size`` devices from index 0, at most all visible ones) must be at or below
    ``(1 − utilization) × total`` used (vLLM's accounting). What happens is read from the
    platform's data, and never fails where vLLM's runner would go on to start the engine:

    * lazy platforms (``release.lazy``; vLLM: ROCm, XPU): wait, with the platform's stability
      window and timeout, for memory a previous engine released, as vLLM's runner does;
    * eager platforms (CUDA): check, and when memory is not back yet, wait a short grace
      (:data:`EAGER_START_GRACE_S`, at most the profile's timeout) for a process that is
      exiting; only then report it, with the holders named, instead of an engine error later;
    * no accelerator (CPU): nothing (vLLM's CPU engine checks host memory itself).

    Args:
        kwargs: The engine keyword arguments (ideally from :func:`engine_kwargs`);
            ``gpu_memory_utilization`` defaults to the platform's.
        platform: The platform; ``None`` means the current one.
        strict: Opt in to accelplat's semantics: check on every platform, CPU included, and on
            eager platforms wait up to the profile's timeout, with accelplat's accounting.

    Returns:
        The :class:`~accelplat._usage.SettleResult` of the wait or check (``polls == 0`` when
        nothing was checked).

    Raises:
        VllmMemoryNotFreeError: When the devices do not have the room (a ``ValueError``).
        ValueError: For a bad utilization or parallel size.

    Side effects:
        May sleep. Creates no device context on context-free platforms.
    """
    from accelplat._memory import wait_for_memory_to_clear

    p = _platform(platform)
    ratio = _free_ratio(kwargs, p)
    devices = _engine_devices(kwargs, p)
    if not _check_strict(strict) and not _has_accelerator(p):
        return _nothing_to_do()
    if not devices:
        if strict:
            raise ConfigurationError(f"the {p.name} platform has no visible device to start on")
        return _nothing_to_do()
    profile = p.release
    view = p if strict else cast(Platform, _VllmAccounting(p))
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
            platform=view,
        )
    except MemoryNotSettledError as exc:
        floored = _floored_targets(exc.snapshot, exc.targets, None, ratio)
        threshold = _describe_threshold(devices, physical, None, ratio, floored)
        raise _not_free(exc, physical, threshold) from None


def after_engine_shutdown(
    kwargs: Mapping[str, Any], *, platform: Platform | None = None, strict: bool = False
) -> SettleResult:
    """After an engine shut down, wait where vLLM's runner waits for its memory to come back.

    On lazy platforms (vLLM: ROCm, XPU) this waits until every device is at or below
    ``1 − utilization`` used, with the platform's stability window, as vLLM's
    ``VllmRunner.__exit__`` does. Elsewhere it does nothing, as vLLM does.

    Args:
        kwargs: The engine keyword arguments the engine was started with.
        platform: The platform; ``None`` means the current one.
        strict: Opt in to accelplat's semantics: :func:`accelplat.wait_for_memory_to_settle` on
            every platform (on eager ones it waits, without a window, for the exiting process).

    Returns:
        The :class:`~accelplat._usage.SettleResult` (``polls == 0`` when nothing was waited for).

    Raises:
        VllmMemoryNotFreeError: When memory does not come back before the platform's settle
            timeout (a ``ValueError``).

    Side effects:
        May sleep. Creates no device context on context-free platforms.
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
            platform=cast(Platform, _VllmAccounting(p)),
        )
    except MemoryNotSettledError as exc:
        floored = _floored_targets(exc.snapshot, exc.targets, None, ratio)
        threshold = _describe_threshold(devices, physical, None, ratio, floored)
        raise _not_free(exc, physical, threshold) from None


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
        The baseline :class:`~accelplat._usage.UsageSnapshot` (vLLM's accounting; empty on a
        platform without an accelerator).

    Raises:
        VllmMemoryNotFreeError: On exit, when usage does not come back in time.
        ConfigurationError: On entry, for a tolerance outside ``[0, 1]`` or a negative or
            non-finite ``timeout_s`` (on every platform, lazy or not).

    Side effects:
        Samples memory on entry; may sleep on exit. Creates no device context on context-free
        platforms.
    """
    from accelplat._memory import snapshot, wait_for_memory_to_clear

    fraction = _validate.ratio(tolerance, "tolerance", not_a_number="a fraction in [0, 1]")
    if timeout_s is not None:  # checked here, as the exit wait would, even if it never runs
        _validate.duration(timeout_s, "timeout_s")
    p = _platform(platform)
    if not _has_accelerator(p):
        yield _nothing_to_do().snapshot
        return
    view = cast(Platform, _VllmAccounting(p))
    baseline = snapshot(devices, platform=view, holders=False)
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
            platform=view,
        )
    except MemoryNotSettledError as exc:
        threshold = _describe_threshold(wanted, physical, targets, None, {})
        raise _not_free(exc, physical, threshold) from None


# --------------------------------------------------------------------------------------------
# process isolation (vLLM's names on top of accelplat.testing._isolation)


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


def _raise_as_after_fork(
    result: ChildResult, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Surface a forked child's failure as vLLM's fork decorator does."""
    if result.status == "ok":
        return
    if result.status == "outcome":
        result.raise_pytest_outcome()
    name = getattr(func, "__name__", repr(func))
    if isinstance(result.exception, Exception):
        raise result.exception from ChildTracebackError(result.traceback)
    if result.traceback:
        raise ChildTestError(
            f"Test {name} failed when called with args {args} and kwargs {kwargs} "
            f"(exit code: {result.exitcode}):\n{result.traceback}"
        ) from None
    raise ChildTestError(
        f"function {name} failed when called with args {args} and kwargs {kwargs} "
        f"(exit code: {result.exitcode}; the child {result.describe_exit()} without reporting)"
    ) from None


def _raise_as_after_spawn(result: ChildResult, func: Callable[..., Any]) -> None:
    """Surface a spawned child's failure as vLLM's spawn decorator does."""
    if result.status == "ok":
        return
    if result.status == "outcome":
        result.raise_pytest_outcome()
    name = getattr(func, "__name__", repr(func))
    text = result.traceback or "<no Python traceback; see subprocess output above>"
    raise RuntimeError(
        f"Test subprocess '{name}' failed ({_format_exit(result.exitcode)}):\n{text}"
    )


def fork_new_process_for_each_test(func: _F) -> _F:
    """Run each call of a test in a forked child, as vLLM's decorator of this name does.

    The child leads its own process group (what it leaves running is sent ``SIGTERM``). A
    failure comes back as the child's own exception when it pickles (with ``cloudpickle``),
    and otherwise as an ``AssertionError``
    (:class:`~accelplat.testing._isolation.ChildTestError`) carrying the child's traceback.
    pytest's skip, xfail and fail in the child keep their meaning here (vLLM's fork reports a
    skip in the child as a pass).

    Args:
        func: The test function.

    Returns:
        The wrapper; it keeps the test's name and signature, so pytest still injects fixtures.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        result = run_child(func, args, kwargs, method="fork")
        _raise_as_after_fork(result, func, args, kwargs)

    mark_isolated(wrapper, func)
    return cast(_F, wrapper)


def spawn_new_process_for_each_test(func: _F) -> _F:
    """Run each call of a test in a fresh interpreter, as vLLM's decorator of this name does.

    The child imports the test by module and qualified name and receives its arguments with
    ``cloudpickle``. A failure comes back as ``RuntimeError("Test subprocess '<name>' failed
    (exit code N):`` followed by the child's traceback; ``pytest.skip`` in the child skips the
    test here.

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
        _raise_as_after_spawn(result, func)

    mark_isolated(wrapper, func)
    return cast(_F, wrapper)


def create_new_process_for_each_test(
    method: StartMethod | None = None,
) -> Callable[[_F], _F]:
    """Return vLLM's fork or spawn decorator (see the two functions above).

    Used like vLLM's: ``@create_new_process_for_each_test()`` or ``("spawn")``. With ``None``
    the method is chosen when the test runs, from the platform's ``preferred_start_method``
    (``"spawn"`` on ROCm and XPU, ``"fork"`` elsewhere), so ``--accelplat-platform`` and
    ``ACCELPLAT_PLATFORM`` apply.

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


# --------------------------------------------------------------------------------------------
# marks (plain skipif marks, decided when built: they need no plugin)


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

    As in vLLM, ``min_gb`` is in decimal gigabytes (``10**9`` bytes), memory is device 0's
    total (what torch calls total), the decision is taken when the mark is built, and a host
    without an accelerator has 0 GB (reason: ``Need at least 24GB GPU memory to run the test
    (found 0GB).``). It is a plain ``pytest.mark.skipif``: it works with no plugin loaded.
    accelplat's plugin marker ``accelplat_requires_device_memory`` decides at set-up instead.

    Args:
        min_gb: Minimum total memory of device 0, in GB.

    Returns:
        A ``pytest.MarkDecorator``.

    Raises:
        ConfigurationError: For a ``min_gb`` that is not a number, or is NaN.

    Side effects:
        Reads device 0's memory once; creates no device context on context-free platforms.
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

    Returns:
        A decorator.
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
        where ``count`` is the number of visible accelerator devices (0 on a host without
        one). ``distributed`` is vLLM's selector marker; in a session run with
        ``--strict-markers`` that does not register it, it is left out.

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

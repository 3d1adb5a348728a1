"""Drop-in replacements for vLLM's test helpers (``tests/utils.py``), and hooks for its runners.

Everything under a vLLM name accepts the same calls and behaves as vLLM 0.32/0.33 does wherever a
passing test could notice, so a suite switches with an import change; platform differences are
data, never branches (docs/migrating-vllm-tests.md). pytest is imported only where needed.
"""

from __future__ import annotations

import math
import os
import signal
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, TypeVar, cast

from accelplat import _memory, _validate
from accelplat._leasing import ENV_MEMORY_BYTES
from accelplat._memory import PollPolicy, resolve_platform
from accelplat._platform import Platform, StartMethod, optional, validate_utilization
from accelplat._sizing import KVCacheShape
from accelplat._types import GIB, MIB, MemoryInfo, SettleResult, UsageSnapshot
from accelplat._util import format_bytes
from accelplat.errors import (
    AccelplatError,
    ChildTestError,
    ConfigurationError,
    KVCacheTooSmallError,
    MemoryNotSettledError,
    VllmArgumentError,
    VllmMemoryNotFreeError,
)
from accelplat.integrations._installed import VLLM_DEFAULT_UTILIZATION, unset_utilization
from accelplat.testing._isolation import ChildResult, ChildTracebackError, mark_isolated, run_child

if TYPE_CHECKING:
    import pytest

DEFAULT_HF_TOLERANCE = 0.05  # memory a HF-style runner may leave above its baseline (vLLM's)
# before_engine_start's grace on eager platforms: NVML shows an exited group's memory back
# 0.2-0.9 s after the exit (measured on an H200)
EAGER_START_GRACE_S = 2.0
_VLLM_SETTLE_WINDOW_S = 2.0  # stability window of vLLM's wait_for_memory_to_settle

_UTILIZATION_KEY = "gpu_memory_utilization"
_KV_KEY = "kv_cache_memory_bytes"  # vLLM's fixed KV-cache size; it then ignores the utilization
_PARALLEL_KEYS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")

_F = TypeVar("_F", bound=Callable[..., Any])


def _accelerator_count(platform: Platform) -> int:
    return platform.device_count() if optional(platform, "is_accelerator") else 0


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


def record_gpu_memory_usage_stats(*, devices: Sequence[int]) -> dict[int, tuple[float, float]]:
    """Return per visible device ``(used GiB, total GiB)`` as vLLM's helper measures them.

    Driver-reserved memory counts as used and total (NVML v1, as vLLM reads it).

    Raises:
        DeviceNotFoundError: For an index that is not visible (an ``IndexError``).
    """
    read = _vllm_reader(resolve_platform(None))
    return {d: (m.used / GIB, m.total / GIB) for d, m in ((d, read(d)) for d in devices)}


def _keyed(value: object, devices: Sequence[int], physical: Sequence[int], argument: str) -> Any:
    """Return a mapping threshold keyed by visible indices; vLLM asserts its keys are exact."""
    if not isinstance(value, Mapping):
        return value
    keys = set(value)
    if keys == set(devices):
        return dict(value)
    if keys == set(physical):
        return {d: value[p] for d, p in zip(devices, physical, strict=True)}
    shown = sorted(keys, key=repr)
    raise VllmArgumentError(
        f"{argument} as a mapping must name exactly the devices waited on "
        f"(visible {sorted(devices)} or physical {sorted(physical)}), got keys "
        f"{shown[:10]}" + (f" … ({len(shown)} keys)" if len(shown) > 10 else "")
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
        return float(value[device] if isinstance(value, Mapping) else cast(float, value))

    parts: list[str] = []
    for device, phys in zip(devices, physical, strict=True):
        gib = None if threshold_bytes is None else pick(threshold_bytes, device) / GIB
        if device in floored:
            gib = max(gib or 0.0, floored[device] / GIB)
        shown = [] if gib is None else [f"{gib:.2f} GiB"]
        shown += [] if threshold_ratio is None else [f"{pick(threshold_ratio, device):.3f}"]
        text = ", ".join(shown)
        parts.append(f"device={phys}: " + (f"max({text})" if len(shown) > 1 else text))
    return "; ".join(parts)


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

    vLLM's accounting, thresholds and progress line (docs/migrating-vllm-tests.md); a mapping
    threshold may name physical indices. ``poll_interval_s`` caps the sampling interval, and
    with a stability window sets it, as vLLM samples.

    Raises:
        VllmArgumentError: For no threshold, or mapping keys that are not the devices.
        VllmMemoryNotFreeError: On timeout (a ``ValueError``), with vLLM 0.32's first line.
        ConfigurationError: For a malformed argument; ``DeviceNotFoundError`` for a bad index.
    """
    if threshold_bytes is None and threshold_ratio is None:
        raise VllmArgumentError(
            "wait_for_gpu_memory_to_clear needs threshold_bytes or threshold_ratio (or both)"
        )
    if devices is None or isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
        raise ConfigurationError(
            f"devices must be a list of visible device indices, got {devices!r:.200} "
            "(vLLM's helper has no default: name the devices to wait on)"
        )
    expected = "a finite number of seconds >= 0"
    cadence = _validate.number(poll_interval_s, "poll_interval_s", minimum=0, expected=expected)
    poll = PollPolicy()
    if cadence > 0 and _validate.duration(stable_duration_s, "stable_duration_s") > 0:
        # vLLM judges stability on its own samples, poll_interval_s apart: a swing between two
        # of them never restarts its window, so a window is judged on samples taken as vLLM's
        poll = PollPolicy.fixed(cadence)
    elif 0 < cadence < poll.max_s:
        poll = PollPolicy(initial_s=min(poll.initial_s, cadence), max_s=cadence)
    platform = resolve_platform(None)
    wanted = list(devices)
    physical = _physical(platform, wanted)
    by_bytes = _keyed(threshold_bytes, wanted, physical, "threshold_bytes")
    by_ratio = _clamped_ratio(_keyed(threshold_ratio, wanted, physical, "threshold_ratio"))
    if not wanted:
        print(
            "Done waiting for free GPU memory on devices devices=[] (threshold='') dur_s=0.00",
            flush=True,
        )
        return
    result = _clear(
        platform,
        wanted,
        cadence,
        physical=physical,
        threshold_bytes=by_bytes,
        threshold_ratio=by_ratio,
        timeout_s=timeout_s,
        stable_duration_s=stable_duration_s,
        stable_tolerance_bytes=stable_tolerance_bytes,
        poll=poll,
        read=_vllm_reader(platform),
    )
    threshold = _describe_threshold(wanted, physical, by_bytes, by_ratio, result.raised_targets)
    stable = "stable " if float(stable_duration_s) > 0 else ""
    print(
        f"Done waiting for {stable}free GPU memory on devices devices={physical!r} "
        f"(threshold={threshold!r}) dur_s={result.waited_s:.02f}",
        flush=True,
    )


def _clear(
    p: Platform,
    devices: list[int],
    every_s: float = 1.0,
    *,
    physical: list[int] | None = None,
    settle: bool = False,
    **wait: Any,
) -> SettleResult:
    """Run accelplat's clear (or settle) wait printing vLLM's progress line, raising its error.

    ``physical``: the vendor's indices of ``devices`` where the caller has them already.
    """
    physical = _physical(p, devices) if physical is None else physical
    names = dict(zip(devices, physical, strict=True))
    last: list[float] = []

    def on_poll(snap: UsageSnapshot, targets: Mapping[int, int]) -> None:
        if last and snap.timestamp - last[0] < every_s:  # at most once per every_s
            return
        last[:] = [snap.timestamp]
        line = "".join(
            f"{names.get(d, d)}={m.used / GIB:.02f}/{m.total / GIB:.02f}; "
            for d, m in snap.memory.items()
        )
        print(f"gpu memory used/total (GiB): {line}", flush=True)

    try:
        if settle:  # whole devices, as vLLM judges them: the owner-aware rule is accelplat's
            return _memory.wait_for_memory_to_settle(
                on_poll=on_poll, platform=p, owners="all", **wait
            )
        return _memory.wait_for_memory_to_clear(devices, on_poll=on_poll, platform=p, **wait)
    except MemoryNotSettledError as exc:  # raised only after every argument was validated
        by_bytes, by_ratio = wait.get("threshold_bytes"), wait.get("threshold_ratio")
        threshold = _describe_threshold(devices, physical, by_bytes, by_ratio, exc.raised_targets)
        head = (  # vLLM 0.32's first line, then accelplat's diagnosis
            f"Memory of devices devices={list(physical)!r} not free after "
            f"dur_s={exc.waited_s:.02f} (threshold={threshold!r})"
        )
        raise VllmMemoryNotFreeError(f"{head}\n{exc}", **vars(exc)) from None  # the same fields


def wait_for_memory_to_settle(
    *, threshold_ratio: float | Mapping[int, float] | None = 0.1, timeout_s: float = 240
) -> None:
    """Wait for lazily released memory to come back on every device, as vLLM's helper does.

    Returns at once on an eager platform (vLLM: all but ROCm and XPU) or with no accelerator;
    on a lazy one waits for a 2 s window at ``threshold_ratio`` (``None``: ``0.1``).

    Raises:
        VllmMemoryNotFreeError: On timeout (a ``ValueError``).
        VllmArgumentError: For a mapping whose keys are not the devices (lazy platforms only).
    """
    platform = resolve_platform(None)
    if not platform.release.lazy or (count := _accelerator_count(platform)) == 0:
        return
    wait_for_gpu_memory_to_clear(
        devices=list(range(count)),
        threshold_ratio=0.1 if threshold_ratio is None else threshold_ratio,
        timeout_s=timeout_s,
        stable_duration_s=min(_VLLM_SETTLE_WINDOW_S, platform.release.stable_duration_s),
        poll_interval_s=1.0,
    )


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


def _nothing_to_do() -> SettleResult:
    return SettleResult(0.0, 0, UsageSnapshot(time.monotonic(), time.time(), {}), True, {})


def engine_kwargs(
    kwargs: Mapping[str, Any],
    *,
    platform: Platform | None = None,
    budget_bytes: int | None = None,
    model_bytes: int | None = None,
    kv_cache_shape: KVCacheShape | None = None,
) -> dict[str, Any]:
    """Return a new dict of engine keyword arguments with a utilization that suits this platform.

    A missing ``gpu_memory_utilization`` becomes the platform's ``default_memory_utilization``
    (vLLM's XPU branch), except where the installed vLLM (0.34 and later) resolves a default
    itself no lower than it: there the key stays unset (``docs/migrating-vllm-tests.md``).
    Under a memory budget (a share lease: ``lease(memory=)``, ``--accelplat-pack``) the engine
    is kept inside it instead: ``gpu_memory_utilization`` (vLLM's per-instance limit) becomes
    the budget's fraction of device 0, and with ``model_bytes`` the rest of the budget becomes
    ``kv_cache_memory_bytes``.

    Args:
        kwargs: The engine's keyword arguments (not changed).
        platform: The platform; ``None``: the current one.
        budget_bytes: Bytes the engine may use on each device; ``None``: the memory lease's
            (``ACCELPLAT_LEASE_MEMORY_BYTES``), else no budget.
        model_bytes: Under a budget: what the engine needs besides its KV cache (weights,
            activations, graphs).
        kv_cache_shape: Under a budget, with ``model_bytes``: the model's KV-cache shape, to
            refuse a budget whose KV cache cannot hold one request of ``kwargs["max_model_len"]``.

    Raises:
        ValueError: For a utilization not in ``(0, 1]`` or a ``kwargs`` that is no mapping; a
            ``ConfigurationError`` for a bad budget, or a utilization above the budget.
        KVCacheTooSmallError: When the budget's KV cache cannot hold ``max_model_len``; the
            message says what budget would.
    """
    p = resolve_platform(platform)
    utilization = _utilization(kwargs, p)  # refuses a kwargs that is no mapping
    budget = _budget(budget_bytes)
    if budget is None or p.device_count() == 0:
        # left unset where the installed vLLM (0.34+) picks its own default, no lower than ours
        unset = kwargs.get(_UTILIZATION_KEY) is None and unset_utilization() is None
        if unset and utilization >= VLLM_DEFAULT_UTILIZATION:
            return dict(kwargs)
        return {**kwargs, _UTILIZATION_KEY: utilization}
    total = p.memory_info(0).total
    if budget > total:
        raise ConfigurationError(
            f"the memory budget ({format_bytes(budget)}) is larger than {p.name} device 0 "
            f"({format_bytes(total)})"
        )
    share = math.floor(budget / total * 10_000) / 10_000  # never above the budget
    if kwargs.get(_UTILIZATION_KEY) is not None and utilization > share + 1e-9:
        raise ConfigurationError(
            f"{_UTILIZATION_KEY}={utilization:g} asks for {format_bytes(utilization * total)} of "
            f"{p.name} device 0, beyond this test's memory budget of {format_bytes(budget)}: leave "
            f"{_UTILIZATION_KEY} out (engine_kwargs sets {share:g} from the budget) or raise "
            "the budget (accelplat_requires(device_memory=…), lease(memory=…))"
        )
    result = {**kwargs, _UTILIZATION_KEY: min(utilization, share)}
    if model_bytes is None:
        return result
    model = _validate.integer(model_bytes, "model_bytes", minimum=0)
    given = kwargs.get(_KV_KEY)
    kv = budget - model if given is None else _validate.integer(given, _KV_KEY, minimum=0)
    if kv_cache_shape is not None and kwargs.get("max_model_len") is not None:
        _check_budget_kv(kv_cache_shape, kwargs["max_model_len"], kv, model, budget)
    if model + kv > budget or kv <= 0:
        raise ConfigurationError(
            f"model_bytes ({format_bytes(model)}) and {_KV_KEY} ({format_bytes(max(kv, 0))}) do "
            f"not fit in this test's memory budget of {format_bytes(budget)}: raise the budget "
            "(accelplat_requires(device_memory=…), lease(memory=…))"
        )
    result[_KV_KEY] = kv
    return result


def _budget(budget_bytes: int | None) -> int | None:
    """The engine's budget: the argument, else the memory lease's variable, else ``None``."""
    if budget_bytes is not None:
        return _validate.integer(budget_bytes, "budget_bytes", minimum=1)
    raw = os.environ.get(ENV_MEMORY_BYTES, "").strip()
    if not raw:
        return None
    return _validate.integer(
        raw, ENV_MEMORY_BYTES, minimum=1, expected="a number of bytes", from_text=True
    )


def _check_budget_kv(
    shape: KVCacheShape, max_model_len: object, kv: int, model: int, budget: int
) -> None:
    """Refuse a KV cache of ``kv`` bytes that cannot hold one request of ``max_model_len``."""
    length = _validate.integer(max_model_len, "max_model_len", minimum=1)
    needed = shape.bytes_for(length)
    if needed <= kv:
        return
    left = max(kv, 0)
    estimate = shape.longest_that_fits(left)
    raise KVCacheTooSmallError(
        f"To serve one request at max_model_len={length}, {format_bytes(needed)} KV cache is "
        f"needed, but this test's memory budget of {format_bytes(budget)} leaves "
        f"{format_bytes(left)} for it after the model's {format_bytes(model)}. Raise the budget "
        f"to at least {format_bytes(model + needed)} (accelplat_requires(device_memory=…), "
        f"lease(memory=…)), or set max_model_len to at most {estimate}.",
        needed=needed,
        available=left,
        max_model_len=length,
        estimated_max_model_len=estimate,
    )


def before_engine_start(
    kwargs: Mapping[str, Any], *, platform: Platform | None = None, strict: bool = False
) -> SettleResult:
    """Make sure the engine's devices have the free memory its start-up check will ask for.

    Lazy platforms wait as vLLM's runner does; eager ones give an exiting process
    :data:`EAGER_START_GRACE_S`; ``strict=True`` checks everywhere (docs/migrating-vllm-tests.md).

    Returns:
        The wait's :class:`~accelplat._types.SettleResult` (``polls == 0``: nothing checked).

    Raises:
        VllmMemoryNotFreeError: When the devices do not have the room (a ``ValueError``).
        ValueError: For a bad utilization or parallel size.
    """
    p = resolve_platform(platform)
    ratio = _free_ratio(kwargs, p)
    world = 1  # the engine uses the product of its parallel sizes, from device 0
    for key in _PARALLEL_KEYS:
        if (value := kwargs.get(key)) is not None:
            world *= _validate.integer(value, key, minimum=1)
    devices = list(range(min(world, p.device_count())))
    if not _validate.flag(strict, "strict") and not optional(p, "is_accelerator"):
        return _nothing_to_do()
    if not devices:
        if strict:
            raise ConfigurationError(f"the {p.name} platform has no visible device to start on")
        return _nothing_to_do()
    profile = p.release
    timeout = profile.settle_timeout_s
    if not profile.lazy and not strict:
        timeout = min(EAGER_START_GRACE_S, timeout)
    return _clear(
        p,
        devices,
        threshold_ratio=ratio,
        timeout_s=timeout,
        stable_duration_s=profile.stable_duration_s if profile.lazy else 0.0,
        read=None if strict else _vllm_reader(p),
    )


def after_engine_shutdown(
    kwargs: Mapping[str, Any], *, platform: Platform | None = None, strict: bool = False
) -> SettleResult:
    """After an engine shut down, wait where vLLM's runner waits for its memory to come back.

    Lazy platforms only, as vLLM's ``VllmRunner.__exit__``; ``strict=True`` settles everywhere.

    Returns:
        The :class:`~accelplat._types.SettleResult` (``polls == 0`` when nothing was waited for).

    Raises:
        VllmMemoryNotFreeError: When memory is not back by the settle timeout (a ``ValueError``).
    """
    p = resolve_platform(platform)
    ratio = _free_ratio(kwargs, p)
    devices = list(range(p.device_count()))
    if _validate.flag(strict, "strict"):
        return _clear(p, devices, settle=True, threshold_ratio=ratio)
    if not p.release.lazy or _accelerator_count(p) == 0:
        return _nothing_to_do()
    return _clear(
        p,
        devices,
        threshold_ratio=ratio,
        timeout_s=p.release.settle_timeout_s,
        stable_duration_s=p.release.stable_duration_s,
        read=_vllm_reader(p),
    )


@contextmanager
def memory_baseline(
    tolerance: float = DEFAULT_HF_TOLERANCE,
    *,
    devices: Sequence[int] | None = None,
    timeout_s: float | None = None,
    platform: Platform | None = None,
) -> Iterator[UsageSnapshot]:
    """Record device usage on entry and, on exit, wait until it is back near that baseline.

    vLLM's ``HfRunner`` wait for ``baseline + tolerance × total``: on lazy platforms only, and
    not when the body raised.

    Yields:
        The baseline :class:`~accelplat._types.UsageSnapshot` (empty without an accelerator).

    Raises:
        VllmMemoryNotFreeError: On exit, when usage does not come back in time.
        ConfigurationError: On entry, for a tolerance outside ``[0, 1]`` or a bad ``timeout_s``.
    """
    fraction = _validate.ratio(tolerance, "tolerance")
    if timeout_s is not None:  # checked here, as the exit wait would, even if it never runs
        _validate.duration(timeout_s, "timeout_s")
    p = resolve_platform(platform)
    if not optional(p, "is_accelerator"):
        yield _nothing_to_do().snapshot
        return
    read = _vllm_reader(p)
    baseline = _memory.snapshot(devices, platform=p, holders=False, read=read)
    yield baseline
    if not p.release.lazy:
        return
    targets = {
        d: info.used + math.floor(fraction * info.total) for d, info in baseline.memory.items()
    }
    _clear(p, list(targets), threshold_bytes=targets, timeout_s=timeout_s, read=read)


def requires_spawn_multiprocessing() -> bool:
    """Whether the platform's ``preferred_start_method`` is not ``"fork"`` (vLLM: ROCm, XPU)."""
    return resolve_platform(None).preferred_start_method != "fork"


def _failed(result: ChildResult) -> bool:
    """Whether the child failed, once its memory is back; pytest's outcomes are raised here.

    The driver frees an exited child's memory asynchronously (0.2-0.9 s on an H200), so the next
    test could allocate before it is back (vllm#57362): wait for the release first, each device
    whole where the driver does not attribute memory per process.
    """
    platform = resolve_platform(None)
    if result.pid > 0 and _accelerator_count(platform) > 0:
        try:
            _memory.wait_for_release([result.pid], platform=platform)
        except MemoryNotSettledError as exc:  # a passing test stays passing, as in vLLM
            warnings.warn(f"the test's child process left memory held: {exc}", stacklevel=3)
    result.raise_pytest_outcome()  # status "outcome"; no-op for the others
    return result.status != "ok"


def fork_new_process_for_each_test(func: _F) -> _F:
    """Run each call of a test in a forked child, as vLLM's decorator of this name does.

    A failure comes back as the child's exception when it pickles, else as a ``ChildTestError``
    (an ``AssertionError``) with its traceback; pytest's skip, xfail and fail keep their meaning.
    """

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

    return mark_isolated(wrapper, func)


def spawn_new_process_for_each_test(func: _F) -> _F:
    """Run each call of a test in a fresh interpreter, as vLLM's decorator of this name does.

    A failure comes back as vLLM's ``RuntimeError("Test subprocess '<name>' failed …")``.

    Raises:
        ConfigurationError: On a call, for a function that cannot be imported or unpicklable args.
    """

    def wrapper(*args: Any, **kwargs: Any) -> None:
        result = run_child(func, args, kwargs, method="spawn")
        if _failed(result):
            name = getattr(func, "__name__", repr(func))
            text = result.traceback or "<no Python traceback; see subprocess output above>"
            code = result.exitcode
            exit_ = f"exit code {code}"  # vLLM's: exit code 1, killed by SIGKILL (-9)
            if code is not None and code < 0:
                with suppress(ValueError):
                    exit_ = f"killed by {signal.Signals(-code).name} ({code})"
            raise RuntimeError(f"Test subprocess '{name}' failed ({exit_}):\n{text}")

    return mark_isolated(wrapper, func)


def create_new_process_for_each_test(method: StartMethod | None = None) -> Callable[[_F], _F]:
    """Return vLLM's fork or spawn decorator; ``None``: the platform's choice, at each call.

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

        def wrapper(*args: Any, **kwargs: Any) -> None:
            (spawned if requires_spawn_multiprocessing() else forked)(*args, **kwargs)

        return mark_isolated(wrapper, func)

    return decorator


def large_gpu_mark(min_gb: float) -> pytest.MarkDecorator:
    """Return a ``skipif`` mark: skip unless device 0 has at least ``min_gb`` (decimal) GB.

    As in vLLM, device 0 is read when the mark is built; no accelerator means 0 GB.

    Raises:
        ConfigurationError: For a ``min_gb`` that is not a number, is NaN or beyond any float.
    """
    import pytest

    if min_gb not in (math.inf, -math.inf):  # vLLM compares an infinite minimum too
        _validate.number(min_gb, "min_gb", expected="a number of GB")
    memory_gb: float = 0
    try:
        platform = resolve_platform(None)
        if _accelerator_count(platform) > 0:
            memory_gb = platform.memory_info(0).total / 10**9  # decimal GB, as vLLM's
    except AccelplatError as exc:
        warnings.warn(f"An error occurred when finding the available memory: {exc}", stacklevel=2)
    return pytest.mark.skipif(
        memory_gb < min_gb,
        reason=f"Need at least {min_gb}GB GPU memory to run the test (found {memory_gb}GB).",
    )


def large_gpu_test(*, min_gb: float) -> Callable[[_F], _F]:
    """Return a decorator applying :func:`large_gpu_mark` (vLLM's ``large_gpu_test``)."""
    return cast(Callable[[_F], _F], large_gpu_mark(min_gb))


def multi_gpu_marks(*, num_gpus: int) -> list[pytest.MarkDecorator]:
    """Return the marks of vLLM's ``multi_gpu_test``: ``distributed(num_gpus=…)`` and a ``skipif``.

    ``distributed`` is left out when ``--strict-markers`` does not know it.

    Raises:
        ConfigurationError: For a count that is not an int below 2**63.
    """
    import pytest

    _validate.integer(num_gpus, "num_gpus", maximum=2**63 - 1, expected="an int below 2**63")
    try:
        count = _accelerator_count(resolve_platform(None))
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
    """Return vLLM's ``multi_gpu_test``: :func:`multi_gpu_marks` plus a new process per call."""
    marks = multi_gpu_marks(num_gpus=num_gpus)
    isolate = create_new_process_for_each_test()

    def decorator(func: _F) -> _F:
        result: Any = isolate(func)
        for mark in reversed(marks):
            result = mark(result)
        return cast(_F, result)

    return decorator

"""Platform discovery: built-in backends, entry-point plugins, overrides and detection.

Rules, in the order they apply:

1. ``ACCELPLAT_PLATFORM=<name>`` (or :func:`set_current_platform`) forces a registered platform.
   An unknown name is a :class:`~accelplat.errors.ConfigurationError` listing the valid names;
   a known platform whose probe says it is absent raises
   :class:`~accelplat.errors.PlatformNotAvailableError` with the probe's reason.
2. Otherwise third-party platforms (entry points in the ``accelplat.platforms`` group and
   :func:`register_platform` calls) are probed. A single available one wins over the built-ins;
   two or more available is a ``ConfigurationError`` naming them. A plugin whose import or probe
   fails, or whose probe takes longer than ``ACCELPLAT_PROBE_TIMEOUT_S`` seconds (default 10), is
   skipped, and the reason appears in :func:`detect` and ``accelplat info``.
   ``ACCELPLAT_PLUGINS`` (comma-separated entry-point names; empty means none) limits which
   entry points load.
3. Otherwise the built-ins are probed in the fixed order ``cuda``, ``rocm``, ``xpu``, ``cpu``; the
   first available wins. ``cpu`` is always available. ``simulated`` is only used when forced.

Importing this module loads no backend and no plugin. Probes import no framework (never torch)
and create no device context.
"""

from __future__ import annotations

import importlib
import math
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from accelplat._types import Candidate, ProbeResult
from accelplat.errors import AccelplatError, ConfigurationError, PlatformNotAvailableError
from accelplat.platform import Platform

__all__ = [
    "BUILTIN_ORDER",
    "ENTRY_POINT_GROUP",
    "DetectionReport",
    "available_platforms",
    "current_platform",
    "detect",
    "get_platform",
    "register_platform",
    "reset",
    "set_current_platform",
    "unregister_platform",
    "use_platform",
]

ENTRY_POINT_GROUP = "accelplat.platforms"
"""Entry-point group third-party backends advertise themselves in."""

ENV_PLATFORM = "ACCELPLAT_PLATFORM"
ENV_PLUGINS = "ACCELPLAT_PLUGINS"
ENV_PROBE_TIMEOUT = "ACCELPLAT_PROBE_TIMEOUT_S"

BUILTIN_ORDER: tuple[str, ...] = ("cuda", "rocm", "xpu", "cpu")
"""Order in which built-in platforms are probed when nothing is forced."""

_BUILTINS: dict[str, str] = {
    "cuda": "accelplat.backends.cuda:CudaPlatform",
    "rocm": "accelplat.backends.rocm:RocmPlatform",
    "xpu": "accelplat.backends.xpu:XpuPlatform",
    "cpu": "accelplat.backends.cpu:CpuPlatform",
    "simulated": "accelplat.backends.simulated:SimulatedPlatform",
}

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")

PlatformFactory = Callable[[], Any]
_Source = str | PlatformFactory


@dataclass(frozen=True)
class DetectionReport:
    """Every platform detection considered, and the outcome.

    Attributes:
        chosen: Name of the platform detection selects, or ``None`` when detection fails.
        candidates: One entry per platform considered, in probe order.
        forced: The forced name (``ACCELPLAT_PLATFORM`` or :func:`set_current_platform`), if any.
        error: Why detection failed, when ``chosen`` is ``None``.
    """

    chosen: str | None
    candidates: tuple[Candidate, ...]
    forced: str | None = None
    error: str | None = None


@dataclass
class _Entry:
    name: str
    source: _Source
    builtin: bool
    from_entry_point: bool = False
    loaded: PlatformFactory | None = None


_lock = threading.RLock()
_registered: dict[str, _Entry] = {}
_entry_points_loaded = False
_current: Platform | None = None
_forced_override: str | Platform | None = None
_instances: dict[str, Platform] = {}


def _builtin_entries() -> dict[str, _Entry]:
    return {n: _Entry(n, s, builtin=True) for n, s in _BUILTINS.items()}


def _validate_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigurationError(
            f"platform name must be 1-64 characters of a-z, 0-9, '_', '-', '.', "
            f"starting with a letter or digit; got {name!r}"
        )
    return name


def _plugin_filter() -> set[str] | None:
    raw = os.environ.get(ENV_PLUGINS)
    if raw is None:
        return None
    return {p.strip() for p in raw.split(",") if p.strip()}


def _discover_entry_points() -> None:
    """Record (not load) the entry points of the ``accelplat.platforms`` group."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    try:
        eps = entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # a broken distribution's metadata must not break detection
        return
    for ep in eps:
        if ep.name in _registered or not _NAME_RE.match(ep.name):
            continue
        _registered[ep.name] = _Entry(ep.name, ep.value, builtin=False, from_entry_point=True)


def _entries() -> dict[str, _Entry]:
    with _lock:
        if not _registered:
            _registered.update(_builtin_entries())
        _discover_entry_points()
        allowed = _plugin_filter()
        return {
            n: e
            for n, e in _registered.items()
            if not e.from_entry_point or allowed is None or n in allowed
        }


def _load(entry: _Entry) -> PlatformFactory:
    if entry.loaded is not None:
        return entry.loaded
    if isinstance(entry.source, str):
        module_name, _, attr = entry.source.partition(":")
        obj: Any = importlib.import_module(module_name)
        for part in attr.split(".") if attr else []:
            obj = getattr(obj, part)
    else:
        obj = entry.source
    if not callable(obj):
        raise ConfigurationError(
            f"platform {entry.name!r} points at {obj!r}, which is neither a class nor a factory"
        )
    factory: PlatformFactory = obj
    entry.loaded = factory
    return factory


def _probe_timeout() -> float:
    raw = os.environ.get(ENV_PROBE_TIMEOUT, "10")
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(
            f"{ENV_PROBE_TIMEOUT} must be a positive number of seconds, got {raw!r}"
        ) from None
    if not (value > 0 and math.isfinite(value)):
        raise ConfigurationError(
            f"{ENV_PROBE_TIMEOUT} must be a positive finite number, got {raw!r}"
        )
    return value


def _run_probe(factory: PlatformFactory, *, bounded: bool) -> ProbeResult:
    probe = getattr(factory, "probe", None)
    if probe is None:
        return ProbeResult(True, "no probe offered; assumed available")
    if not bounded:
        result = probe()
    else:
        box: list[Any] = []

        def target() -> None:
            try:
                box.append(probe())
            except BaseException as exc:  # reported below, never raised in the thread
                box.append(exc)

        timeout = _probe_timeout()
        thread = threading.Thread(target=target, name="accelplat-probe", daemon=True)
        thread.start()
        thread.join(timeout)
        if not box:
            return ProbeResult(False, f"probe did not finish within {timeout:g} s; skipped")
        result = box[0]
        if isinstance(result, BaseException):
            raise result
    if not isinstance(result, ProbeResult):
        if isinstance(result, bool):
            return ProbeResult(result, "probe returned " + str(result))
        raise ConfigurationError(f"probe() returned {result!r}, not a ProbeResult")
    return result


def _construct(name: str, factory: PlatformFactory) -> Platform:
    instance = factory()
    if not isinstance(instance, Platform):
        missing = [
            m
            for m in (
                "name",
                "device_type",
                "visible_devices_env",
                "release",
                "graph",
                "default_memory_utilization",
                "preferred_start_method",
                "context_free",
                "device_count",
                "devices",
                "memory_info",
                "memory_holders",
            )
            if not hasattr(instance, m)
        ]
        raise ConfigurationError(
            f"platform {name!r} does not satisfy the Platform protocol (missing: "
            f"{', '.join(missing) or 'unknown'})"
        )
    return instance


def _describe_failure(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _consider(name: str, entry: _Entry) -> tuple[Candidate, PlatformFactory | None]:
    """Load and probe one platform, turning every failure into an unavailable candidate."""
    try:
        factory = _load(entry)
        result = _run_probe(factory, bounded=not entry.builtin)
    except Exception as exc:
        reason = f"failed to load or probe: {_describe_failure(exc)}"
        return Candidate(name, False, False, reason, entry.builtin), None
    return Candidate(name, result.available, False, result.reason, entry.builtin), factory


def _forced_name() -> str | None:
    if isinstance(_forced_override, str):
        return _forced_override
    raw = os.environ.get(ENV_PLATFORM, "").strip()
    return raw or None


def _unknown(name: str, entries: Mapping[str, _Entry]) -> ConfigurationError:
    return ConfigurationError(
        f"unknown platform {name!r} in {ENV_PLATFORM}; valid names: {', '.join(sorted(entries))}"
    )


def _detect(*, exhaustive: bool) -> tuple[DetectionReport, Platform | None]:
    entries = _entries()
    forced = _forced_name()
    if forced is not None:
        if forced not in entries:
            raise _unknown(forced, entries)
        cand, factory = _consider(forced, entries[forced])
        if factory is None or not cand.available:
            raise PlatformNotAvailableError(forced, cand.reason)
        platform = _instances.get(forced) or _construct(forced, factory)
        chosen = Candidate(forced, True, True, f"forced by {ENV_PLATFORM}: {cand.reason}")
        return DetectionReport(forced, (chosen,), forced=forced), platform

    candidates: list[Candidate] = []
    third = [n for n, e in entries.items() if not e.builtin]
    available_third: list[tuple[str, PlatformFactory]] = []
    for name in third:
        cand, factory = _consider(name, entries[name])
        candidates.append(cand)
        if cand.available and factory is not None:
            available_third.append((name, factory))
    if len(available_third) > 1:
        names = ", ".join(n for n, _ in available_third)
        raise ConfigurationError(
            f"several third-party platforms are available ({names}); choose one with "
            f"{ENV_PLATFORM}=<name> or limit plugins with {ENV_PLUGINS}=<name>"
        )
    chosen_name: str | None = None
    chosen_factory: PlatformFactory | None = None
    if available_third:
        chosen_name, chosen_factory = available_third[0]
    for name in BUILTIN_ORDER:
        if chosen_name is not None and not exhaustive:
            break
        cand, factory = _consider(name, entries[name])
        candidates.append(cand)
        if chosen_name is None and cand.available and factory is not None:
            chosen_name, chosen_factory = name, factory
    final = tuple(
        Candidate(c.name, c.available, c.name == chosen_name, c.reason, c.builtin)
        for c in candidates
    )
    if chosen_name is None or chosen_factory is None:
        return DetectionReport(None, final, error="no platform is available"), None
    platform = _instances.get(chosen_name) or _construct(chosen_name, chosen_factory)
    return DetectionReport(chosen_name, final), platform


def detect() -> DetectionReport:
    """Probe every platform and report which one detection chooses, and why.

    Unlike :func:`current_platform`, this probes all candidates (so ``accelplat info`` can show
    why each was or was not chosen) and never raises for a broken plugin.

    Returns:
        A :class:`DetectionReport`.

    Raises:
        ConfigurationError: For an unknown forced name or several available third-party platforms.

    Side effects:
        Loads backend modules and plugins and runs their probes; imports no framework and
        creates no device context. Does not change the cached current platform.
    """
    with _lock:
        if isinstance(_forced_override, Platform):
            c = Candidate(_forced_override.name, True, True, "set by set_current_platform()")
            return DetectionReport(_forced_override.name, (c,), forced=_forced_override.name)
        try:
            report, _ = _detect(exhaustive=True)
        except PlatformNotAvailableError as exc:
            cand = Candidate(exc.platform, False, False, exc.reason)
            return DetectionReport(None, (cand,), forced=exc.platform, error=str(exc))
        return report


def current_platform() -> Platform:
    """Return the platform of this process, detecting it on the first call.

    Returns:
        The cached :class:`~accelplat.platform.Platform` instance.

    Raises:
        ConfigurationError: For an unknown ``ACCELPLAT_PLATFORM`` or several available plugins.
        PlatformNotAvailableError: When a forced platform is absent.

    Side effects:
        Thread-safe; the first call loads the backends it must probe (stopping at the first
        available one) and caches the result. Never imports torch, never creates a device context.
    """
    global _current
    current = _current
    if current is not None:
        return current
    with _lock:
        if _current is not None:
            return _current
        if isinstance(_forced_override, Platform):
            _current = _forced_override
            return _current
        report, platform = _detect(exhaustive=False)
        if platform is None:
            raise AccelplatError(f"no platform detected: {report.error}")
        assert report.chosen is not None
        _instances.setdefault(report.chosen, platform)
        _current = platform
        return platform


def get_platform(name: str) -> Platform:
    """Return the platform registered as ``name``, whether or not it is the current one.

    Args:
        name: A registered platform name.

    Returns:
        The (cached) platform instance.

    Raises:
        ConfigurationError: For an unknown name.
        PlatformNotAvailableError: When its probe says it is absent here.
    """
    with _lock:
        entries = _entries()
        if name not in entries:
            raise _unknown(name, entries)
        if name in _instances:
            return _instances[name]
        cand, factory = _consider(name, entries[name])
        if factory is None or not cand.available:
            raise PlatformNotAvailableError(name, cand.reason)
        platform = _construct(name, factory)
        _instances[name] = platform
        return platform


def available_platforms() -> tuple[str, ...]:
    """Return every registered platform name: built-ins, entry points and registrations.

    Side effects:
        Reads entry-point metadata; loads no plugin.
    """
    return tuple(_entries())


def register_platform(
    name: str, cls_or_factory: PlatformFactory, *, override: bool = False
) -> None:
    """Register a platform class or zero-argument factory under ``name``.

    Args:
        name: Lower-case name (letters, digits, ``_``, ``-``, ``.``); ``ACCELPLAT_PLATFORM``
            selects it.
        cls_or_factory: A class satisfying :class:`~accelplat.platform.Platform`, or a callable
            returning one. A ``probe()`` attribute, when present, is used for detection.
        override: Replace an existing registration (a built-in included) instead of failing.

    Raises:
        ConfigurationError: For a bad name, a non-callable, or a duplicate without ``override``.

    Side effects:
        Clears the cached current platform so the next :func:`current_platform` re-detects.
    """
    _validate_name(name)
    if not callable(cls_or_factory):
        raise ConfigurationError(
            f"register_platform({name!r}, …) needs a class or a zero-argument factory, "
            f"got {cls_or_factory!r}"
        )
    with _lock:
        entries = _entries()
        if name in entries and not override:
            raise ConfigurationError(
                f"platform {name!r} is already registered; pass override=True to replace it"
            )
        builtin = name in _BUILTINS  # an override keeps a built-in's place in the order
        _registered[name] = _Entry(name, cls_or_factory, builtin=builtin)
        _instances.pop(name, None)
        _clear_current()


def unregister_platform(name: str) -> None:
    """Remove a platform added with :func:`register_platform`; built-ins are restored.

    Args:
        name: The registered name.

    Raises:
        ConfigurationError: If nothing is registered under ``name``.
    """
    with _lock:
        entries = _entries()
        if name not in entries:
            raise _unknown(name, entries)
        if name in _BUILTINS:
            _registered[name] = _Entry(name, _BUILTINS[name], builtin=True)
        else:
            del _registered[name]
        _instances.pop(name, None)
        _clear_current()


def set_current_platform(platform: str | Platform | None) -> None:
    """Force the current platform, overriding ``ACCELPLAT_PLATFORM``; ``None`` undoes it.

    Args:
        platform: A registered name, a platform instance, or ``None``.

    Raises:
        ConfigurationError: For an unknown name or an object that is not a Platform.
    """
    global _forced_override
    with _lock:
        if isinstance(platform, str):
            entries = _entries()
            if platform not in entries:
                raise _unknown(platform, entries)
        elif platform is not None and not isinstance(platform, Platform):
            raise ConfigurationError(f"{platform!r} does not satisfy the Platform protocol")
        _forced_override = platform
        _clear_current()


@contextmanager
def use_platform(platform: str | Platform) -> Iterator[Platform]:
    """Make ``platform`` current inside a ``with`` block, restoring the previous state after.

    Args:
        platform: A registered name or a platform instance.

    Yields:
        The platform now current.
    """
    global _forced_override, _current
    with _lock:
        saved = (_forced_override, _current)
    set_current_platform(platform)
    try:
        yield current_platform()
    finally:
        with _lock:
            _forced_override, _current = saved


def _clear_current() -> None:
    global _current
    _current = None


def reset() -> None:
    """Forget the detected platform, cached instances, registrations and discovered plugins.

    Meant for tests and for forked children; the next call detects afresh.
    """
    global _current, _forced_override, _entry_points_loaded
    with _lock:
        _current = None
        _forced_override = None
        _instances.clear()
        _registered.clear()
        _entry_points_loaded = False


def _after_fork_in_child() -> None:
    global _lock, _current
    # The parent's lock may have been held by another thread at fork time.
    _lock = threading.RLock()
    _current = None
    _instances.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

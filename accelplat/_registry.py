"""Platform discovery: built-in backends, entry-point plugins, overrides and detection.

Forcing beats a single available third-party platform, which beats the built-ins in the order
of ``BUILTINS`` (one row per built-in backend). Loads and probes that may talk to a driver (and
construction of untrusted platforms) run in a worker thread bounded by
``ACCELPLAT_PROBE_TIMEOUT_S``; the rules are in docs/writing-a-backend.md ("Registry rules").
A forked child forgets cached instances.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from accelplat import _boundary, _files, _validate
from accelplat._platform import Platform
from accelplat._types import Candidate, ProbeResult
from accelplat._vendor import import_quietly, quiet_stdout
from accelplat.errors import (
    AccelplatError,
    ConfigurationError,
    NotARegularFileError,
    PlatformNotAvailableError,
)

ENTRY_POINT_GROUP = "accelplat.platforms"
ENV_PLATFORM = "ACCELPLAT_PLATFORM"
ENV_PLUGINS = "ACCELPLAT_PLUGINS"  # loadable plugins (comma-separated; empty: none; unset: all)
ENV_PROBE_TIMEOUT = "ACCELPLAT_PROBE_TIMEOUT_S"
DEFAULT_PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Builtin:
    """One built-in backend: everything the registry knows of it, in one row.

    Attributes:
        name: The platform name.
        target: ``"module:Class"``, imported only when the backend is considered.
        absent: ``"module:function"`` returning why the backend is certainly absent, or
            ``None`` when it may be present (``_backends/_presence.py``); it lists directories
            and asks the loader for a library, talking to no driver, so it runs in the
            caller's thread before the backend is imported.
        in_caller: Probed in the caller's thread (it reads host files only).
        variables: The environment variables that shape what it finds (visible devices, their
            order, the roots of the host's file systems), separated by spaces: a capture
            records them and a replay applies them. A path to a user's file or to a library is
            not one of them: a replay must never choose it.
        detected: Probed, in the rows' order, when no platform is forced.
    """

    name: str
    target: str
    absent: str | None = None
    in_caller: bool = False
    variables: str = ""
    detected: bool = True


BUILTINS: tuple[Builtin, ...] = (
    Builtin(
        "cuda",
        "accelplat._backends.cuda:CudaPlatform",
        "accelplat._vendor.nvml:unavailable_before_import",
        variables="CUDA_VISIBLE_DEVICES CUDA_DEVICE_ORDER ACCELPLAT_PROC_ROOT",
    ),
    Builtin(
        "rocm",
        "accelplat._backends.rocm:RocmPlatform",
        "accelplat._backends._presence:rocm_absent",
        variables="HIP_VISIBLE_DEVICES ROCR_VISIBLE_DEVICES CUDA_VISIBLE_DEVICES "
        "ACCELPLAT_SYSFS_ROOT ACCELPLAT_DEV_ROOT",
    ),
    Builtin(
        "xpu",
        "accelplat._backends.xpu:XpuPlatform",
        "accelplat._backends._presence:xpu_absent",
        variables="ZE_AFFINITY_MASK ONEAPI_DEVICE_SELECTOR ZE_FLAT_DEVICE_HIERARCHY "
        "ZE_ENABLE_PCI_ID_DEVICE_ORDER ACCELPLAT_XPU_INTEGRATED ACCELPLAT_XPU_ALLOW_TORCH "
        "ACCELPLAT_SYSFS_ROOT",
    ),
    Builtin(
        "cpu",
        "accelplat._backends.cpu:CpuPlatform",
        in_caller=True,
        variables="ACCELPLAT_PROC_ROOT ACCELPLAT_SYSFS_ROOT ACCELPLAT_CGROUP_ROOT",
    ),
    Builtin(
        "simulated",
        "accelplat._backends.simulated:SimulatedPlatform",
        variables="ACCELPLAT_SIMULATED_VISIBLE_DEVICES",
        detected=False,
    ),
)
_BUILTINS = {row.name: row for row in BUILTINS}


def host_variables() -> tuple[str, ...]:
    """Every variable the built-ins declare, and ``ACCELPLAT_PLATFORM``: what a capture keeps."""
    names = " ".join(row.variables for row in BUILTINS).split()
    return tuple(dict.fromkeys([*names, ENV_PLATFORM]))


PlatformFactory = Callable[[], Any]  # a platform class or a zero-argument factory


@dataclass(frozen=True, slots=True)
class DetectionReport:
    """Every platform detection considered, and the outcome.

    Attributes:
        chosen: Name of the platform detection selects, or ``None`` when detection fails.
        candidates: Each platform considered, in probe order; unusable plugins and discovery
            problems (a malformed entry point) are listed with ``available=False`` and the reason.
        forced: The forced name (``ACCELPLAT_PLATFORM`` or :func:`set_current_platform`), if any.
        error: Why detection failed, when ``chosen`` is ``None``.
    """

    chosen: str | None
    candidates: tuple[Candidate, ...]
    forced: str | None = None
    error: str | None = None


@dataclass(slots=True)
class _Entry:
    """One registered platform and what is known about loading it."""

    name: str  # a built-in's (or an override of one) takes part in the built-in order
    origin: str
    row: Builtin | None = None  # accelplat's own: trusted, built only when chosen, unchecked
    entry_point: Any = None
    loaded: PlatformFactory | None = None  # a registered factory is loaded from the start
    pending: threading.Thread | None = None


# What considering one platform gave: its candidate line (available: its factory is loaded in
# the entry), and the instance built and checked where it is untrusted
_Considered = tuple[Candidate, Platform | None]


_lock = threading.RLock()
_registered: dict[str, _Entry] = {}
_problems: list[Candidate] = []
_entry_points_loaded = False
_current: Platform | None = None
_forced_override: str | Platform | None = None
_instances: dict[str, Platform] = {}


def _plugin_filter() -> frozenset[str] | None:
    raw = os.environ.get(ENV_PLUGINS)
    return None if raw is None else frozenset(p.strip() for p in raw.split(",") if p.strip())


def _probe_timeout() -> float:
    raw = os.environ.get(ENV_PROBE_TIMEOUT)
    if raw is None or not raw.strip():
        return DEFAULT_PROBE_TIMEOUT_S
    return _validate.number(raw, ENV_PROBE_TIMEOUT, above=0, from_text=True)


def _forced_name() -> str | None:
    if isinstance(_forced_override, str):
        return _forced_override
    return os.environ.get(ENV_PLATFORM, "").strip().lower() or None


def _may_declare_platforms() -> bool:
    """Return ``False`` only when no distribution on ``sys.path`` can declare a platform.

    Importing ``importlib.metadata`` costs about 27 ms, a third of detection on a CPU host, so
    the ``entry_points.txt`` of ``*.dist-info``/``*.egg-info`` folders are read first (regular
    files only, bounded). What this cannot see through (an archive, a custom finder, an
    unreadable file) answers ``True``, and ``importlib.metadata`` decides.
    """
    header = f"[{ENTRY_POINT_GROUP}]".encode()
    standard = {"BuiltinImporter", "FrozenImporter", "PathFinder"}
    if any(
        (f if isinstance(f, type) else type(f)).__name__ not in standard
        and hasattr(f, "find_distributions")
        for f in sys.meta_path
    ):
        return True
    for folder in sys.path:
        try:
            names = os.listdir(folder or ".")
        except (FileNotFoundError, NotADirectoryError):
            if os.path.isfile(folder):
                return True  # a zip archive
            continue
        except OSError:
            return True
        for name in names:
            if name.endswith((".dist-info", ".egg-info")):
                path = os.path.join(folder or ".", name, "entry_points.txt")
                try:
                    if header in _files.read_live(path, limit=4 * 1024 * 1024):
                        return True
                except (FileNotFoundError, NotADirectoryError, NotARegularFileError):
                    continue
                except OSError:
                    return True
    return False


def _discover_entry_points() -> None:
    """Record (not load) the entry points of the ``accelplat.platforms`` group, once."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    if not _may_declare_platforms():
        return
    from importlib.metadata import entry_points

    try:
        eps = list(entry_points(group=ENTRY_POINT_GROUP))
    except Exception as exc:  # a broken distribution's metadata must not break detection
        reason = f"skipped: could not read entry points: {_describe_failure(exc)}"
        _problems.append(Candidate(ENTRY_POINT_GROUP, False, False, reason, builtin=False))
        return
    for ep in eps:
        dist = getattr(getattr(ep, "dist", None), "name", None) or "an unknown distribution"
        origin = f"entry point {ep.value!r} from {dist}"
        existing = _registered.get(ep.name)
        if existing is not None and existing.entry_point is not None and existing.entry_point == ep:
            continue  # seen by an earlier discovery
        if not _validate.NAME_RE.match(ep.name):
            problem = (
                f"skipped: {origin}: the name is not a valid platform name (lower-case letters, "
                "digits, '_', '-', '.')"
            )
        elif existing is not None:
            problem = f"skipped: {origin}: the name is already taken by {existing.origin}"
        else:
            _registered[ep.name] = _Entry(ep.name, origin, entry_point=ep)
            continue
        cand = Candidate(ep.name, False, False, problem, builtin=False)
        if cand not in _problems:
            _problems.append(cand)


def _all_entries(*, discover: bool = True) -> dict[str, _Entry]:
    if not _registered:
        _registered.update((row.name, _Entry(row.name, "built-in", row)) for row in BUILTINS)
    if discover:
        _discover_entry_points()
    return _registered


def _entries() -> dict[str, _Entry]:
    """Return the usable entries: all registrations less the plugins ``ACCELPLAT_PLUGINS`` omits."""
    allowed = _plugin_filter()
    # With ACCELPLAT_PLUGINS empty no plugin may load, so there is no need to read metadata.
    entries = _all_entries(discover=allowed != frozenset())
    return {
        n: e for n, e in entries.items() if allowed is None or e.entry_point is None or n in allowed
    }


def _filter_problems() -> list[Candidate]:
    allowed = _plugin_filter()
    if not allowed:
        return []
    names = {n for n, e in _registered.items() if e.entry_point is not None}
    why = f"{ENV_PLUGINS} names {{!r}}, but no installed plugin has that name"
    return [Candidate(n, False, False, why.format(n), False) for n in sorted(allowed - names)]


def _lookup_error(name: str) -> ConfigurationError:
    """Explain why ``name`` is not usable: excluded by ``ACCELPLAT_PLUGINS``, or unknown."""
    if name in _all_entries():  # registered, yet not usable: a plugin left out
        return ConfigurationError(
            f"platform {name!r} is an installed plugin, but {ENV_PLUGINS}="
            f"{os.environ.get(ENV_PLUGINS, '')!r} leaves it out; add it to {ENV_PLUGINS} or "
            f"unset {ENV_PLUGINS}"
        )
    return ConfigurationError(
        f"unknown platform {name!r} (set by {ENV_PLATFORM}, set_current_platform() or "
        f"get_platform()); valid names: {', '.join(sorted(_entries()))}"
    )


def _entry(name: str) -> _Entry:
    """The usable entry registered as ``name``; ``ConfigurationError`` (why not) if none."""
    entry = _entries().get(name)
    if entry is None:
        raise _lookup_error(name)
    return entry


def _describe_failure(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _certainly_absent(entry: _Entry) -> str | None:
    """Run a built-in's quick absence check; a check that fails means "may be present"."""
    absent = entry.row.absent if entry.row is not None else None
    try:
        reason = _target(absent)() if absent else None
    except Exception:
        return None
    return reason if isinstance(reason, str) else None


def _target(spelled: str, load: Callable[[str], Any] = importlib.import_module) -> Any:
    """The object a ``"module:name"`` string names, its module imported by ``load``."""
    module_name, _, attr = spelled.partition(":")
    return getattr(load(module_name), attr)


def _load(entry: _Entry) -> PlatformFactory:
    if entry.loaded is not None:
        return entry.loaded
    if entry.row is not None:
        obj = _target(entry.row.target, import_quietly)
    else:
        with quiet_stdout():  # a plugin that prints on import must not corrupt --json output
            obj = entry.entry_point.load()
    if not callable(obj):
        raise ConfigurationError(
            f"{entry.origin} points at {obj!r}, which is neither a class nor a factory"
        )
    entry.loaded = obj
    return obj  # type: ignore[no-any-return]


def _probe(factory: PlatformFactory) -> ProbeResult:
    probe = getattr(factory, "probe", None)
    if probe is None:
        return ProbeResult(True, "offers no probe(); assumed available")
    if not callable(probe):
        raise ConfigurationError(f"its probe attribute is {probe!r}, not a callable")
    result = probe()
    if isinstance(result, ProbeResult):
        if not isinstance(result.available, bool) or not isinstance(result.reason, str):
            raise ConfigurationError(f"probe() returned a malformed {result!r}")
        return result
    if isinstance(result, bool):
        return ProbeResult(result, f"probe() returned {result}")
    raise ConfigurationError(f"probe() returned {result!r}, not a ProbeResult")


def protocol_problems(obj: object) -> tuple[str, ...]:
    """Say how instance ``obj`` fails the Platform protocol (members read once); never raises."""
    members = {n: v for n, v in vars(Platform).items() if not n.startswith("_")}
    props = [n for n, v in members.items() if isinstance(v, property)]
    methods = [n for n, v in members.items() if n not in props and callable(v)]
    missing: list[str] = []
    problems: list[str] = []
    for name in (*props, *methods):
        try:
            value = getattr(obj, name)
        except AttributeError:
            missing.append(name)
        except Exception as exc:
            problems.append(f"{name} raised {_describe_failure(exc)}")
        else:
            if name in methods and not callable(value):
                problems.append(f"{name} is not callable")
    if missing:
        problems.insert(0, f"missing: {', '.join(missing)}")
    return tuple(problems)


def _run_bounded(entry: _Entry, work: Callable[[], _Considered], timeout: float) -> _Considered:
    """Run ``work`` in a daemon thread, giving up after ``timeout`` seconds."""
    if entry.pending is not None and entry.pending.is_alive():
        reason = (
            "skipped: its load or probe from an earlier detection is still running "
            f"(did not finish within {timeout:g} s)"
        )
    else:
        box: list[_Considered] = []  # work() reports its own errors as an unavailable outcome
        name = f"accelplat-probe-{entry.name}"
        thread = threading.Thread(target=lambda: box.append(work()), name=name, daemon=True)
        thread.start()
        thread.join(timeout)
        if box and not thread.is_alive():
            return box[0]
        entry.pending = thread
        reason = (
            f"skipped: load or probe did not finish within {timeout:g} s "
            f"(raise {ENV_PROBE_TIMEOUT} if it is merely slow)"
        )
    return Candidate(entry.name, False, False, reason, entry.name in _BUILTINS), None


def _consider(entry: _Entry, timeout: float) -> Candidate:
    """Load and probe one platform (untrusted ones built, checked and kept); failures: unavailable.

    Available: its factory is loaded in ``entry``.
    """
    name, builtin = entry.name, entry.name in _BUILTINS
    if (absent := _certainly_absent(entry)) is not None:
        return Candidate(name, False, False, absent, builtin)

    def work() -> _Considered:
        step = "import"
        try:
            factory = _load(entry)
            step = "probe"
            result = _probe(factory)
            instance: Platform | None = None
            if result.available and entry.row is None and name not in _instances:
                step = "construction"
                instance = factory()
                if isinstance(instance, type):
                    raise ConfigurationError(
                        f"platform {name!r}: its factory returned a class, not an instance"
                    )
                if problems := protocol_problems(instance):
                    why = "; ".join(problems)
                    raise ConfigurationError(f"does not satisfy the Platform protocol ({why})")
        except (Exception, SystemExit) as exc:
            if isinstance(exc, ConfigurationError) and step != "import":
                reason = f"skipped: {exc}"
            else:
                reason = f"skipped: {step} failed: {_describe_failure(exc)}"
            return Candidate(name, False, False, reason, builtin), None
        return Candidate(name, result.available, False, result.reason, builtin), instance

    in_caller = entry.row is not None and entry.row.in_caller
    cand, instance = work() if in_caller else _run_bounded(entry, work, timeout)
    if instance is not None:
        _instances.setdefault(name, instance)
    return cand


def _usable(entry: _Entry, timeout: float) -> Candidate:
    """Consider ``entry``, raising ``PlatformNotAvailableError`` unless it is available."""
    cand = _consider(entry, timeout)
    if not cand.available:
        raise PlatformNotAvailableError(entry.name, cand.reason.removeprefix("skipped: "))
    return cand


def _instance_for(name: str) -> Platform:
    """Return the cached or checked instance of an available platform, constructing it if needed."""
    if name not in _instances:  # _consider keeps the instance it built and checked
        factory = _registered[name].loaded
        assert factory is not None
        # Only a built-in comes unbuilt (_consider builds and checks the others): a BasePlatform
        # subclass held to the protocol by its tests, whose properties would put real work
        # (version look-ups) on detection.
        _instances[name] = factory()
    return _instances[name]


def _detect(*, exhaustive: bool) -> DetectionReport:
    """Apply the detection rules; the report's ``chosen`` is available (``None``: none is)."""
    timeout = _probe_timeout()
    forced = _forced_name()
    if forced is not None:
        cand = _usable(_entry(forced), timeout)
        source = "set_current_platform()" if isinstance(_forced_override, str) else ENV_PLATFORM
        picked = Candidate(forced, True, True, f"forced by {source}: {cand.reason}", cand.builtin)
        return DetectionReport(forced, (picked,), forced=forced)

    entries = _entries()
    candidates = [_consider(e, timeout) for n, e in entries.items() if n not in _BUILTINS]
    available = [c.name for c in candidates if c.available]
    candidates.extend([*_problems, *_filter_problems()])
    if len(available) > 1:
        names = ", ".join(repr(n) for n in available)
        raise ConfigurationError(
            f"several third-party platforms are available ({names}); choose one with "
            f"{ENV_PLATFORM}=<name>, or load only one with {ENV_PLUGINS}=<name>"
        )
    chosen = available[0] if available else None
    for row in (r for r in BUILTINS if r.detected):
        if chosen is not None and not exhaustive:
            break
        cand = _consider(entries[row.name], timeout)  # a built-in, or its override
        candidates.append(cand)
        if chosen is None and cand.available:
            chosen = row.name
    if chosen is None:
        return DetectionReport(None, tuple(candidates), error="no platform is available")
    final = tuple(replace(c, chosen=c.name == chosen and c.available) for c in candidates)
    return DetectionReport(chosen, final)


def detect() -> DetectionReport:
    """Probe every platform and report which one detection chooses, and why.

    Unlike :func:`current_platform` it probes all candidates, caches nothing and never raises
    for a configuration problem: the report then has ``chosen=None`` and the message in
    ``error``.

    Returns:
        A :class:`DetectionReport`.
    """
    with _lock:
        if _forced_override is not None and not isinstance(_forced_override, str):
            name = _forced_override.name
            c = Candidate(name, True, True, "set by set_current_platform()", name in _BUILTINS)
            return DetectionReport(name, (c,), forced=name)
        try:
            return _detect(exhaustive=True)
        except PlatformNotAvailableError as exc:
            cand = Candidate(exc.platform, False, False, exc.reason, exc.platform in _BUILTINS)
            return DetectionReport(None, (cand,), forced=exc.platform, error=str(exc))
        except ConfigurationError as exc:
            return DetectionReport(None, (), forced=_forced_name(), error=str(exc))


def current_platform() -> Platform:
    """Return the platform of this process, detecting it on the first call (thread-safe).

    Returns:
        The cached :class:`~accelplat._platform.Platform` instance.

    Raises:
        ConfigurationError: For an unknown or excluded ``ACCELPLAT_PLATFORM``, a malformed
            ``ACCELPLAT_PROBE_TIMEOUT_S``, or several available plugins.
        PlatformNotAvailableError: When a forced platform is absent or fails to load.
        AccelplatError: When no platform at all is available.
    """
    global _current
    if (current := _current) is not None:
        return current
    with _lock:
        if _current is not None:
            return _current
        if _forced_override is not None and not isinstance(_forced_override, str):
            _current = _forced_override
            return _current
        _boundary.check()  # a replay bundle that could not load: its error, not a CPU fallback
        report = _detect(exhaustive=False)
        if report.chosen is None:
            details = "; ".join(f"{c.name}: {c.reason}" for c in report.candidates)
            raise AccelplatError(f"no platform detected ({details})")
        _current = _instance_for(report.chosen)
        return _current


def get_platform(name: str) -> Platform:
    """Return the platform registered as ``name``, whether or not it is the current one.

    Args:
        name: A registered platform name.

    Returns:
        The (cached) platform instance.

    Raises:
        ConfigurationError: For an unknown name, or a plugin ``ACCELPLAT_PLUGINS`` leaves out.
        PlatformNotAvailableError: When its probe says it is absent here, or it fails to load.
    """
    with _lock:
        entry = _entry(name)
        if name not in _instances:
            _usable(entry, _probe_timeout())
        return _instance_for(name)


def available_platforms() -> tuple[str, ...]:
    """Return every usable platform name: built-ins, allowed entry points and registrations."""
    with _lock:
        return tuple(_entries())


def register_platform(
    name: str, cls_or_factory: PlatformFactory, *, override: bool = False
) -> None:
    """Register a platform class or zero-argument factory under ``name``; loads nothing.

    A new name makes a third-party platform; a built-in's name (with ``override``) replaces that
    built-in in its place in the probe order. The next :func:`current_platform` detects again.

    Args:
        name: Lower-case name (letters, digits, ``_``, ``-``, ``.``).
        cls_or_factory: A class satisfying :class:`~accelplat._platform.Platform`, or a callable
            returning one; its ``probe()``, when present, is used for detection.
        override: Replace an existing registration (a built-in or plugin included).

    Raises:
        ConfigurationError: For a bad name, a non-callable, or a duplicate without ``override``.
    """
    global _current
    if not isinstance(name, str) or not _validate.NAME_RE.match(name):
        raise ConfigurationError(
            f"platform name must be 1-64 characters of a-z, 0-9, '_', '-', '.', "
            f"starting with a letter or digit; got {name!r}"
        )
    if not callable(cls_or_factory):
        raise ConfigurationError(
            f"register_platform({name!r}, …) needs a class or a zero-argument factory, "
            f"got {cls_or_factory!r}"
        )
    with _lock:
        existing = _all_entries().get(name)
        if existing is not None and not override:
            raise ConfigurationError(
                f"platform {name!r} is already registered ({existing.origin}); pass "
                "override=True to replace it"
            )
        qualname = (
            getattr(cls_or_factory, "__qualname__", None) or type(cls_or_factory).__qualname__
        )
        origin = f"register_platform({name!r}, {qualname})"
        _registered[name] = _Entry(name, origin, loaded=cls_or_factory)
        _instances.pop(name, None)
        _current = None


def unregister_platform(name: str) -> None:
    """Remove a platform; a built-in's name goes back to the built-in backend."""
    global _current
    with _lock:
        if name not in _all_entries():
            raise _lookup_error(name)
        if name in _BUILTINS:
            _registered[name] = _Entry(name, "built-in", _BUILTINS[name])
        else:
            del _registered[name]
        _instances.pop(name, None)
        _current = None


def set_current_platform(platform: str | Platform | None) -> None:
    """Force the current platform (a name or an instance) over the variable; ``None`` undoes it."""
    global _forced_override, _current
    with _lock:
        if isinstance(platform, str):
            platform = platform.strip().lower()
            _entry(platform)
        elif platform is not None:
            problems = protocol_problems(platform)
            if problems or isinstance(platform, type):
                why = "; ".join(problems) or "it is a class, not an instance"
                raise ConfigurationError(
                    f"{platform!r} does not satisfy the Platform protocol ({why})"
                )
        _forced_override = platform
        _current = None


def forced_platform() -> str | Platform | None:
    """Return what :func:`set_current_platform` forced (not ``ACCELPLAT_PLATFORM``), or ``None``."""
    return _forced_override


@contextmanager
def use_platform(platform: str | Platform) -> Iterator[Platform]:
    """Make ``platform`` (a registered name or an instance) current inside a ``with`` block.

    Yields:
        The platform now current.

    Raises:
        ConfigurationError: As :func:`set_current_platform`.
        PlatformNotAvailableError: When a named platform is not usable here.
    """
    global _forced_override, _current
    with _lock:
        saved = (_forced_override, _current)
    try:
        set_current_platform(platform)
        yield current_platform()
    finally:
        with _lock:
            _forced_override, _current = saved


def reset() -> None:
    """Forget detection, instances, registrations, plugins (tests); running probes are abandoned."""
    global _current, _forced_override, _entry_points_loaded
    with _lock:
        _current = None
        _forced_override = None
        _instances.clear()
        _registered.clear()
        _problems.clear()
        _entry_points_loaded = False


_boundary.on_reset(reset)  # a capture or a replay starting or ending: detect again


def _after_fork_in_child() -> None:
    global _lock, _current
    # The parent's lock may have been held by another thread at fork time; worker threads do
    # not exist in the child, and instances may hold handles (NVML) that must be made afresh.
    _lock = threading.RLock()
    _current = None
    _instances.clear()
    for entry in _registered.values():
        entry.pending = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def factory_for(name: str) -> PlatformFactory:
    """Return the loaded factory registered as ``name``, unprobed and unbounded (for the kit)."""
    with _lock:
        return _load(_entry(name))

"""Platform discovery: built-in backends, entry-point plugins, overrides and detection.

Rules, in the order they apply:

1. ``ACCELPLAT_PLATFORM=<name>`` (or :func:`set_current_platform`) forces any registered
   platform, built-in or plugin. The name is matched after stripping blanks and lower-casing. An
   unknown name is a :class:`~accelplat.errors.ConfigurationError` listing the valid names; a
   plugin that ``ACCELPLAT_PLUGINS`` leaves out is a ``ConfigurationError`` saying so; a known
   platform whose probe says it is absent, or that fails to load, raises
   :class:`~accelplat.errors.PlatformNotAvailableError` with the reason.
2. Otherwise every third-party platform (entry points of the ``accelplat.platforms`` group and
   :func:`register_platform` calls under a new name) is loaded and probed. A single available
   one wins over the built-ins; two or more available is a ``ConfigurationError`` naming them
   and saying how to choose. A plugin whose import, probe or construction raises, whose probe
   takes longer than ``ACCELPLAT_PROBE_TIMEOUT_S`` seconds (default 10), or whose object does
   not satisfy the :class:`~accelplat._platform.Platform` protocol is skipped; the reason appears
   in :func:`detect` and ``accelplat info``.
3. Otherwise the built-ins are probed in the order ``cuda``, ``rocm``, ``xpu``, ``cpu``; the first
   available wins. ``cpu`` is always available. ``simulated`` is used only when forced.

``ACCELPLAT_PLUGINS`` is a comma-separated list of entry-point names that may load; empty means
none, unset means all. It limits entry points only, not :func:`register_platform` calls.

Plugins load lazily: importing accelplat (or this module) loads no backend and no plugin and
does not even read entry-point metadata; detection loads only what the rules need (every
plugin, then built-ins up to the first available one). Every probe, built-in or plugin, runs in a
worker thread bounded by ``ACCELPLAT_PROBE_TIMEOUT_S`` (a driver call that hangs makes that
platform unavailable with the reason, and detection moves on); a probe still running from an
earlier detection is not started again. No probe imports a framework (never
torch) or creates a device context. The detected platform is cached; all state is guarded by one
lock, and a forked child forgets cached instances (the forcing and registrations stay).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from accelplat import _boundary, _files, _validate
from accelplat._platform import Platform
from accelplat._types import Candidate, ProbeResult, value_type
from accelplat._vendor import import_quietly, quiet_stdout
from accelplat.errors import (
    AccelplatError,
    ConfigurationError,
    NotARegularFileError,
    PlatformNotAvailableError,
)

__all__ = [
    "BUILTIN_ORDER",
    "DEFAULT_PROBE_TIMEOUT_S",
    "ENTRY_POINT_GROUP",
    "ENV_PLATFORM",
    "ENV_PLUGINS",
    "ENV_PROBE_TIMEOUT",
    "DetectionReport",
    "available_platforms",
    "current_platform",
    "detect",
    "factory_for",
    "forced_platform",
    "get_platform",
    "protocol_problems",
    "register_platform",
    "reset",
    "set_current_platform",
    "unregister_platform",
    "use_platform",
]

ENTRY_POINT_GROUP = "accelplat.platforms"
"""Entry-point group third-party backends advertise themselves in."""

ENV_PLATFORM = "ACCELPLAT_PLATFORM"
"""Variable that forces a platform by name."""

ENV_PLUGINS = "ACCELPLAT_PLUGINS"
"""Variable listing the entry-point plugins allowed to load (comma-separated; empty: none)."""

ENV_PROBE_TIMEOUT = "ACCELPLAT_PROBE_TIMEOUT_S"
"""Variable bounding each platform's load and probe (built-ins too), in seconds."""

DEFAULT_PROBE_TIMEOUT_S = 10.0
"""Time limit for one plugin's import, probe and construction when the variable is unset."""

BUILTIN_ORDER: tuple[str, ...] = ("cuda", "rocm", "xpu", "cpu")
"""Order in which built-in platforms are probed when nothing is forced."""

_BUILTINS: dict[str, str] = {
    "cuda": "accelplat._backends.cuda:CudaPlatform",
    "rocm": "accelplat._backends.rocm:RocmPlatform",
    "xpu": "accelplat._backends.xpu:XpuPlatform",
    "cpu": "accelplat._backends.cpu:CpuPlatform",
    "simulated": "accelplat._backends.simulated:SimulatedPlatform",
}

_QUICK_ABSENCE: dict[str, str] = {
    "cuda": "accelplat._backends._presence:cuda",
    "rocm": "accelplat._backends._presence:rocm",
    "xpu": "accelplat._backends._presence:xpu",
}
"""For a built-in, a function saying why it is certainly absent (``None``: it may be present),
asked before its backend module is imported, so that a host without the driver never loads it.
These checks list directories, read small files and ask the dynamic loader for a library; they
talk to no driver, so they run in the caller's thread (no worker thread is started for a
platform they rule out)."""

_IN_CALLER: frozenset[str] = frozenset({"cpu"})
"""Built-ins whose import and probe touch no vendor library and no driver (host files only):
loaded and probed in the caller's thread. Every other platform gets a bounded worker thread."""

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")

PlatformFactory = Callable[[], Any]
"""A platform class or a zero-argument callable returning a platform instance."""


@value_type(frozen=True)
class DetectionReport:
    """Every platform detection considered, and the outcome.

    Attributes:
        chosen: Name of the platform detection selects, or ``None`` when detection fails.
        candidates: One entry per platform considered, in probe order; plugins that could not be
            used (and discovery problems such as a malformed entry point) are listed with
            ``available=False`` and the reason.
        forced: The forced name (``ACCELPLAT_PLATFORM`` or :func:`set_current_platform`), if any.
        error: Why detection failed, when ``chosen`` is ``None``.
    """

    chosen: str | None
    candidates: tuple[Candidate, ...]
    forced: str | None = None
    error: str | None = None

    def __init__(
        self,
        chosen: str | None,
        candidates: tuple[Candidate, ...],
        forced: str | None = None,
        error: str | None = None,
    ) -> None:
        object.__setattr__(self, "chosen", chosen)
        object.__setattr__(self, "candidates", candidates)
        object.__setattr__(self, "forced", forced)
        object.__setattr__(self, "error", error)


class _Entry:
    """One registered platform and what is known about loading it.

    ``shipped`` is true only for accelplat's own backends: they are loaded and probed in a
    bounded worker thread and constructed only when chosen. Everything else is untrusted: also
    constructed in that thread and checked against the protocol before it can be chosen.
    ``ordered`` entries take part in the built-in order (a built-in, or an override of one).
    ``absence`` names a built-in's quick absence check (see ``_QUICK_ABSENCE``); ``in_caller``
    marks a built-in loaded and probed without a worker thread (see ``_IN_CALLER``).

    A plain class, not a dataclass: detection builds the table on a host's first query, where
    each dataclass definition would cost about half a millisecond at import.
    """

    __slots__ = (
        "absence",
        "entry_point",
        "in_caller",
        "loaded",
        "name",
        "obj",
        "ordered",
        "origin",
        "pending",
        "shipped",
        "target",
    )

    def __init__(
        self,
        name: str,
        shipped: bool,
        ordered: bool,
        *,
        target: str | None = None,
        obj: PlatformFactory | None = None,
        entry_point: Any = None,
        origin: str = "",
        absence: str | None = None,
        in_caller: bool = False,
    ) -> None:
        self.name = name
        self.shipped = shipped
        self.ordered = ordered
        self.target = target
        self.obj = obj
        self.entry_point = entry_point
        self.origin = origin
        self.absence = absence
        self.in_caller = in_caller
        self.loaded: PlatformFactory | None = None
        self.pending: threading.Thread | None = None


class _Outcome:
    """What considering one platform gave: its candidate line, and its factory or instance."""

    __slots__ = ("candidate", "factory", "instance")

    def __init__(
        self,
        candidate: Candidate,
        factory: PlatformFactory | None = None,
        instance: Platform | None = None,
    ) -> None:
        self.candidate = candidate
        self.factory = factory
        self.instance = instance


_lock = threading.RLock()
_registered: dict[str, _Entry] = {}
_problems: list[Candidate] = []
_entry_points_loaded = False
_current: Platform | None = None
_forced_override: str | Platform | None = None
_instances: dict[str, Platform] = {}


# -- names, variables -----------------------------------------------------------------------


def _validate_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigurationError(
            f"platform name must be 1-64 characters of a-z, 0-9, '_', '-', '.', "
            f"starting with a letter or digit; got {name!r}"
        )
    return name


def _plugin_filter() -> frozenset[str] | None:
    raw = os.environ.get(ENV_PLUGINS)
    if raw is None:
        return None
    return frozenset(p.strip() for p in raw.split(",") if p.strip())


def _probe_timeout() -> float:
    raw = os.environ.get(ENV_PROBE_TIMEOUT)
    if raw is None or not raw.strip():
        return DEFAULT_PROBE_TIMEOUT_S
    return _validate.number(
        raw,
        ENV_PROBE_TIMEOUT,
        above=0,
        expected="a positive, finite number of seconds",
        from_text=True,
    )


def _forced_name() -> str | None:
    if isinstance(_forced_override, str):
        return _forced_override
    raw = os.environ.get(ENV_PLATFORM, "").strip().lower()
    return raw or None


# -- the table of registered platforms ----------------------------------------------------------


def _builtin_entry(name: str) -> _Entry:
    return _Entry(
        name,
        shipped=True,
        ordered=True,
        target=_BUILTINS[name],
        origin="built-in",
        absence=_QUICK_ABSENCE.get(name),
        in_caller=name in _IN_CALLER,
    )


def _ensure_builtins() -> None:
    if not _registered:
        for name in _BUILTINS:
            _registered[name] = _builtin_entry(name)


def _dist_name(ep: Any) -> str:
    dist = getattr(ep, "dist", None)
    name = getattr(dist, "name", None) if dist is not None else None
    return str(name) if name else "an unknown distribution"


_STANDARD_FINDERS = frozenset({"BuiltinImporter", "FrozenImporter", "PathFinder"})

_ENTRY_POINTS_LIMIT = 4 * 1024 * 1024
"""The largest ``entry_points.txt`` the pre-check reads; a larger one is left to the full scan."""


def _may_declare_platforms() -> bool:
    """Return ``False`` only when no installed distribution can declare a platform plugin.

    Importing ``importlib.metadata`` and scanning every distribution costs tens of
    milliseconds, more than the whole NVML detection. This pre-check reads only the
    ``entry_points.txt`` files of ``*.dist-info`` / ``*.egg-info`` folders on ``sys.path``
    (through :func:`accelplat._files.read_live`: regular files only, bounded; a FIFO or device
    there is passed over unread) and looks for the group's header. Anything it cannot see
    through — an archive or a file on ``sys.path``, a meta-path finder that can supply
    distributions, an unreadable or oversized file — makes it answer ``True``, so the full
    scan decides.
    """
    header = f"[{ENTRY_POINT_GROUP}]".encode()
    for finder in sys.meta_path:
        cls = finder if isinstance(finder, type) else type(finder)
        if cls.__name__ not in _STANDARD_FINDERS and hasattr(finder, "find_distributions"):
            return True
    for entry in sys.path:
        folder = entry or "."
        try:
            names = os.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            if os.path.isfile(folder):
                return True  # a zip archive on sys.path: let importlib.metadata look inside
            continue
        except OSError:
            return True
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            path = os.path.join(folder, name, "entry_points.txt")
            try:
                if header in _files.read_live(path, limit=_ENTRY_POINTS_LIMIT):
                    return True
            except (FileNotFoundError, NotADirectoryError, NotARegularFileError):
                continue  # none, or a FIFO or device that must not be read (it could block)
            except OSError:  # unreadable or too large: the full scan decides
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
        _problems.append(
            Candidate(
                ENTRY_POINT_GROUP,
                False,
                False,
                f"skipped: could not read entry points: {_describe_failure(exc)}",
                builtin=False,
            )
        )
        return
    for ep in eps:
        origin = f"entry point {ep.value!r} from {_dist_name(ep)}"
        existing = _registered.get(ep.name)
        if existing is not None and existing.entry_point is not None and existing.entry_point == ep:
            continue  # seen by an earlier discovery
        problem: str | None = None
        if not _NAME_RE.match(ep.name):
            problem = (
                f"skipped: {origin}: the name is not a valid platform name (lower-case letters, "
                "digits, '_', '-', '.')"
            )
        elif existing is not None:
            problem = f"skipped: {origin}: the name is already taken by {existing.origin}"
        if problem is not None:
            cand = Candidate(ep.name, False, False, problem, builtin=False)
            if cand not in _problems:
                _problems.append(cand)
            continue
        _registered[ep.name] = _Entry(
            ep.name, shipped=False, ordered=False, entry_point=ep, target=ep.value, origin=origin
        )


def _all_entries(*, discover: bool = True) -> dict[str, _Entry]:
    _ensure_builtins()
    if discover:
        _discover_entry_points()
    return _registered


def _excluded(entry: _Entry, allowed: frozenset[str] | None) -> bool:
    return entry.entry_point is not None and allowed is not None and entry.name not in allowed


def _entries() -> dict[str, _Entry]:
    """Return the usable entries: all registrations less the plugins ``ACCELPLAT_PLUGINS`` omits."""
    allowed = _plugin_filter()
    # With ACCELPLAT_PLUGINS empty no plugin may load, so there is no need to read metadata.
    entries = _all_entries(discover=allowed != frozenset())
    return {n: e for n, e in entries.items() if not _excluded(e, allowed)}


def _filter_problems() -> list[Candidate]:
    allowed = _plugin_filter()
    if not allowed:
        return []
    names = {n for n, e in _registered.items() if e.entry_point is not None}
    return [
        Candidate(
            name,
            False,
            False,
            f"{ENV_PLUGINS} names {name!r}, but no installed plugin has that name",
            builtin=False,
        )
        for name in sorted(allowed - names)
    ]


def _lookup_error(name: str) -> ConfigurationError:
    """Explain why ``name`` is not usable: excluded by ``ACCELPLAT_PLUGINS``, or unknown."""
    allowed = _plugin_filter()
    entries = _all_entries()
    entry = entries.get(name)
    if entry is not None and _excluded(entry, allowed):
        return ConfigurationError(
            f"platform {name!r} is an installed plugin, but {ENV_PLUGINS}="
            f"{os.environ.get(ENV_PLUGINS, '')!r} leaves it out; add it to {ENV_PLUGINS} or "
            f"unset {ENV_PLUGINS}"
        )
    valid = sorted(n for n, e in entries.items() if not _excluded(e, allowed))
    return ConfigurationError(
        f"unknown platform {name!r} (set by {ENV_PLATFORM}, set_current_platform() or "
        f"get_platform()); valid names: {', '.join(valid)}"
    )


# -- loading, probing, constructing ------------------------------------------------------------


def _describe_failure(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _certainly_absent(entry: _Entry) -> str | None:
    """Run a built-in's quick absence check; ``None`` (load and probe it) when it has none.

    A check that fails counts as "may be present": the backend's own probe then decides.
    """
    if entry.absence is None:
        return None
    module_name, _, attr = entry.absence.partition(":")
    try:
        reason = getattr(importlib.import_module(module_name), attr)()
    except Exception:
        return None
    return reason if isinstance(reason, str) else None


def _load(entry: _Entry) -> PlatformFactory:
    if entry.loaded is not None:
        return entry.loaded
    obj: Any
    if entry.obj is not None:
        obj = entry.obj
    elif entry.entry_point is not None:
        with quiet_stdout():  # a plugin that prints on import must not corrupt --json output
            obj = entry.entry_point.load()
    else:
        assert entry.target is not None
        module_name, _, attr = entry.target.partition(":")
        obj = import_quietly(module_name)
        for part in attr.split(".") if attr else []:
            obj = getattr(obj, part)
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


def _protocol_members() -> tuple[tuple[str, ...], tuple[str, ...]]:
    props: list[str] = []
    methods: list[str] = []
    for name, value in vars(Platform).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            props.append(name)
        elif callable(value):
            methods.append(name)
    return tuple(props), tuple(methods)


def _has_static(obj: object, name: str) -> bool:
    """Whether ``obj`` has ``name`` in its instance dict or its classes' (runs no descriptor)."""
    inst = getattr(obj, "__dict__", None)
    if isinstance(inst, dict) and name in inst:
        return True
    return any(name in vars(klass) for klass in type(obj).__mro__)


def protocol_problems(obj: object, *, evaluate: bool = True) -> tuple[str, ...]:
    """Say how ``obj`` fails the :class:`~accelplat._platform.Platform` protocol.

    Unlike ``isinstance(obj, Platform)``, this never raises (a property that raises is a
    problem, reported) and says what is wrong. Only presence is checked: attribute types and
    values are the conformance kit's job (:mod:`accelplat.testing`).

    Args:
        obj: A platform instance (not a class).
        evaluate: Read every attribute (properties run, so one that raises is reported). With
            ``False`` only presence on the instance or its classes is checked and no property
            runs — detection uses this for accelplat's own backends, whose properties may do
            real work (``graph`` looks up installed versions).

    Returns:
        One line per problem, e.g. ``"missing: memory_holders"``; empty when none.

    Side effects:
        With ``evaluate=True``, reads every protocol attribute of ``obj`` once.
    """
    props, methods = _protocol_members()
    missing: list[str] = []
    problems: list[str] = []
    for name in (*props, *methods):
        if not evaluate:
            if not _has_static(obj, name):
                missing.append(name)
            continue
        try:
            value = getattr(obj, name)
        except AttributeError:
            missing.append(name)
            continue
        except Exception as exc:
            problems.append(f"{name} raised {_describe_failure(exc)}")
            continue
        if name in methods and not callable(value):
            problems.append(f"{name} is not callable")
    if missing:
        problems.insert(0, f"missing: {', '.join(missing)}")
    return tuple(problems)


def _construct_checked(name: str, factory: PlatformFactory) -> Platform:
    instance = factory()
    if isinstance(instance, type):
        raise ConfigurationError(
            f"platform {name!r}: its factory returned a class, not an instance"
        )
    # accelplat's own backends are held to the protocol by their tests and the conformance
    # kit; running their properties here would put real work (version look-ups) on detection.
    shipped = type(instance).__module__.startswith("accelplat._backends.")
    problems = protocol_problems(instance, evaluate=not shipped)
    if problems:
        raise ConfigurationError(f"does not satisfy the Platform protocol ({'; '.join(problems)})")
    return instance  # type: ignore[no-any-return]


def _run_bounded(entry: _Entry, work: Callable[[], _Outcome], timeout: float) -> _Outcome:
    """Run ``work`` in a daemon thread, giving up after ``timeout`` seconds."""
    if entry.pending is not None:
        if entry.pending.is_alive():
            reason = (
                "skipped: its load or probe from an earlier detection is still running "
                f"(did not finish within {timeout:g} s)"
            )
            return _Outcome(Candidate(entry.name, False, False, reason, entry.ordered))
        entry.pending = None
    box: list[_Outcome | BaseException] = []

    def target() -> None:
        try:
            box.append(work())
        except BaseException as exc:  # reported by the caller, never raised in the thread
            box.append(exc)

    thread = threading.Thread(target=target, name=f"accelplat-probe-{entry.name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive() or not box:
        entry.pending = thread
        reason = (
            f"skipped: load or probe did not finish within {timeout:g} s "
            f"(raise {ENV_PROBE_TIMEOUT} if it is merely slow)"
        )
        return _Outcome(Candidate(entry.name, False, False, reason, entry.ordered))
    result = box[0]
    if isinstance(result, BaseException):
        raise result
    return result


def _consider(entry: _Entry, timeout: float) -> _Outcome:
    """Load and probe one platform; every failure becomes an unavailable candidate.

    A built-in's quick absence check runs first, in the caller's thread; a platform it rules
    out is neither loaded nor given a thread. Shipped backends are only loaded and probed.
    Anything else is also constructed (when its probe says available) and checked against the
    protocol, all within ``timeout``, in a worker thread; so are the shipped GPU backends,
    whose probes talk to drivers.
    """
    name, builtin = entry.name, entry.ordered
    absent = _certainly_absent(entry)
    if absent is not None:
        return _Outcome(Candidate(name, False, False, absent, builtin))

    def work() -> _Outcome:
        step = "import"
        try:
            factory = _load(entry)
            step = "probe"
            result = _probe(factory)
            instance: Platform | None = None
            if result.available and not entry.shipped:
                step = "construction"
                instance = _instances.get(name)
                if instance is None:
                    instance = _construct_checked(name, factory)
        except (Exception, SystemExit) as exc:
            if isinstance(exc, ConfigurationError) and step != "import":
                reason = f"skipped: {exc}"
            else:
                reason = f"skipped: {step} failed: {_describe_failure(exc)}"
            return _Outcome(Candidate(name, False, False, reason, builtin))
        cand = Candidate(name, result.available, False, result.reason, builtin)
        return _Outcome(cand, factory, instance)

    try:
        outcome = work() if entry.in_caller else _run_bounded(entry, work, timeout)
    except (Exception, SystemExit) as exc:  # pragma: no cover - work() reports its own errors
        reason = f"skipped: {_describe_failure(exc)}"
        return _Outcome(Candidate(name, False, False, reason, builtin))
    if outcome.instance is not None:
        _instances.setdefault(name, outcome.instance)
    return outcome


def _unavailable(name: str, reason: str) -> PlatformNotAvailableError:
    return PlatformNotAvailableError(name, reason.removeprefix("skipped: "))


def _instance_for(name: str, outcome: _Outcome) -> Platform:
    """Return the cached or checked instance of a chosen platform, constructing it if needed."""
    cached = _instances.get(name)
    if cached is not None:
        return cached
    instance = outcome.instance
    if instance is None:
        assert outcome.factory is not None
        try:
            instance = _construct_checked(name, outcome.factory)
        except ConfigurationError as exc:
            raise ConfigurationError(f"platform {name!r} {exc}") from None
    _instances[name] = instance
    return instance


# -- detection ------------------------------------------------------------------------------


def _detect(*, exhaustive: bool) -> tuple[DetectionReport, _Outcome | None]:
    """Apply the detection rules.

    Returns:
        The report and the chosen outcome (``None`` when nothing is available).

    Raises:
        ConfigurationError: Unknown or excluded forced name, bad timeout, several plugins.
        PlatformNotAvailableError: A forced platform that cannot be used here.
    """
    timeout = _probe_timeout()
    entries = _entries()
    forced = _forced_name()
    if forced is not None:
        if forced not in entries:
            raise _lookup_error(forced)
        outcome = _consider(entries[forced], timeout)
        cand = outcome.candidate
        if outcome.factory is None or not cand.available:
            raise _unavailable(forced, cand.reason)
        source = "set_current_platform()" if isinstance(_forced_override, str) else ENV_PLATFORM
        picked = Candidate(forced, True, True, f"forced by {source}: {cand.reason}", cand.builtin)
        return DetectionReport(forced, (picked,), forced=forced), outcome

    candidates: list[Candidate] = []
    available: list[tuple[str, _Outcome]] = []
    for name, entry in entries.items():
        if entry.ordered:
            continue
        outcome = _consider(entry, timeout)
        candidates.append(outcome.candidate)
        if outcome.candidate.available and outcome.factory is not None:
            available.append((name, outcome))
    candidates.extend(_problems)
    candidates.extend(_filter_problems())
    if len(available) > 1:
        names = ", ".join(repr(n) for n, _ in available)
        raise ConfigurationError(
            f"several third-party platforms are available ({names}); choose one with "
            f"{ENV_PLATFORM}=<name>, or load only one with {ENV_PLUGINS}=<name>"
        )
    chosen: tuple[str, _Outcome] | None = available[0] if available else None
    for name in BUILTIN_ORDER:
        if chosen is not None and not exhaustive:
            break
        builtin_entry = entries.get(name)
        if builtin_entry is None:
            continue
        outcome = _consider(builtin_entry, timeout)
        candidates.append(outcome.candidate)
        if chosen is None and outcome.candidate.available and outcome.factory is not None:
            chosen = (name, outcome)
    chosen_name = chosen[0] if chosen is not None else None
    final = tuple(
        Candidate(c.name, c.available, c.name == chosen_name and c.available, c.reason, c.builtin)
        for c in candidates
    )
    if chosen is None:
        return DetectionReport(None, final, error="no platform is available"), None
    return DetectionReport(chosen[0], final), chosen[1]


def detect() -> DetectionReport:
    """Probe every platform and report which one detection chooses, and why.

    Unlike :func:`current_platform`, this probes all candidates (so ``accelplat info`` can show
    why each was or was not chosen) and never raises for a configuration problem: an unknown or
    unavailable forced platform, several available plugins or a malformed variable yield a
    report with ``chosen=None`` and the message in ``error``.

    Returns:
        A :class:`DetectionReport`.

    Side effects:
        Loads backend modules and plugins and runs their probes; constructs plugins whose probe
        says available (to check them against the protocol); imports no framework and creates
        no device context. Does not change the cached current platform. Applies
        ``ACCELPLAT_REPLAY`` first, when set (see :mod:`accelplat.replay`).
    """
    _boundary.active()
    with _lock:
        if _forced_override is not None and not isinstance(_forced_override, str):
            name = _forced_override.name
            c = Candidate(name, True, True, "set by set_current_platform()", name in _BUILTINS)
            return DetectionReport(name, (c,), forced=name)
        try:
            report, _ = _detect(exhaustive=True)
        except PlatformNotAvailableError as exc:
            entry = _registered.get(exc.platform)
            builtin = entry.ordered if entry is not None else True
            cand = Candidate(exc.platform, False, False, exc.reason, builtin)
            return DetectionReport(None, (cand,), forced=exc.platform, error=str(exc))
        except ConfigurationError as exc:
            return DetectionReport(None, (), forced=_forced_name(), error=str(exc))
        return report


def current_platform() -> Platform:
    """Return the platform of this process, detecting it on the first call.

    Returns:
        The cached :class:`~accelplat._platform.Platform` instance.

    Raises:
        ConfigurationError: For an unknown or excluded ``ACCELPLAT_PLATFORM``, a malformed
            ``ACCELPLAT_PROBE_TIMEOUT_S``, or several available plugins.
        PlatformNotAvailableError: When a forced platform is absent or fails to load.
        AccelplatError: When no platform at all is available.

    Side effects:
        Thread-safe; the first call loads what the rules need (every allowed plugin, then the
        built-ins up to the first available one) and caches the result. Never imports torch,
        never creates a device context.
    """
    global _current
    current = _current
    if current is not None:
        return current
    _boundary.active()  # applies ACCELPLAT_REPLAY before anything reads the environment
    with _lock:
        if _current is not None:
            return _current
        if _forced_override is not None and not isinstance(_forced_override, str):
            _current = _forced_override
            return _current
        report, outcome = _detect(exhaustive=False)
        if outcome is None or report.chosen is None:
            details = "; ".join(f"{c.name}: {c.reason}" for c in report.candidates)
            raise AccelplatError(f"no platform detected ({details})")
        platform = _instance_for(report.chosen, outcome)
        _current = platform
        return platform


def get_platform(name: str) -> Platform:
    """Return the platform registered as ``name``, whether or not it is the current one.

    Args:
        name: A registered platform name.

    Returns:
        The (cached) platform instance.

    Raises:
        ConfigurationError: For an unknown name, or a plugin ``ACCELPLAT_PLUGINS`` leaves out.
        PlatformNotAvailableError: When its probe says it is absent here, or it fails to load.

    Side effects:
        Loads and probes that one platform on the first call; imports no framework.
    """
    with _lock:
        entries = _entries()
        if name not in entries:
            raise _lookup_error(name)
        if name in _instances:
            return _instances[name]
        outcome = _consider(entries[name], _probe_timeout())
        if outcome.factory is None or not outcome.candidate.available:
            raise _unavailable(name, outcome.candidate.reason)
        return _instance_for(name, outcome)


def available_platforms() -> tuple[str, ...]:
    """Return every usable platform name: built-ins, allowed entry points and registrations.

    Side effects:
        Reads entry-point metadata; loads no plugin.
    """
    with _lock:
        return tuple(_entries())


def register_platform(
    name: str, cls_or_factory: PlatformFactory, *, override: bool = False
) -> None:
    """Register a platform class or zero-argument factory under ``name``.

    A new name makes a third-party platform (it competes with plugins, and wins over the
    built-ins when it is the only one available); overriding a built-in's name replaces that
    built-in in its place in the probe order.

    Args:
        name: Lower-case name (letters, digits, ``_``, ``-``, ``.``); ``ACCELPLAT_PLATFORM``
            selects it.
        cls_or_factory: A class satisfying :class:`~accelplat._platform.Platform`, or a callable
            returning one. A ``probe()`` attribute, when present, is used for detection.
        override: Replace an existing registration (a built-in or plugin included) instead of
            failing.

    Raises:
        ConfigurationError: For a bad name, a non-callable, or a duplicate without ``override``.

    Side effects:
        Clears the cached current platform so the next :func:`current_platform` re-detects.
        Loads nothing.
    """
    _validate_name(name)
    if not callable(cls_or_factory):
        raise ConfigurationError(
            f"register_platform({name!r}, …) needs a class or a zero-argument factory, "
            f"got {cls_or_factory!r}"
        )
    with _lock:
        entries = _all_entries()
        existing = entries.get(name)
        if existing is not None and not override:
            raise ConfigurationError(
                f"platform {name!r} is already registered ({existing.origin}); pass "
                "override=True to replace it"
            )
        _registered[name] = _Entry(
            name,
            shipped=False,
            ordered=name in _BUILTINS,
            obj=cls_or_factory,
            origin=f"register_platform({name!r}, {_qualname(cls_or_factory)})",
        )
        _instances.pop(name, None)
        _clear_current()


def _qualname(obj: object) -> str:
    return str(getattr(obj, "__qualname__", None) or type(obj).__qualname__)


def unregister_platform(name: str) -> None:
    """Remove a platform; a built-in's name goes back to the built-in backend.

    Args:
        name: The registered name.

    Raises:
        ConfigurationError: If nothing is registered under ``name``.

    Side effects:
        Clears the cached current platform.
    """
    with _lock:
        entries = _all_entries()
        if name not in entries:
            raise _lookup_error(name)
        if name in _BUILTINS:
            _registered[name] = _builtin_entry(name)
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

    Side effects:
        Clears the cached current platform; the platform itself is loaded on the next
        :func:`current_platform` call.
    """
    global _forced_override
    with _lock:
        if isinstance(platform, str):
            platform = platform.strip().lower()
            if platform not in _entries():
                raise _lookup_error(platform)
        elif platform is not None:
            problems = protocol_problems(platform)
            if problems or isinstance(platform, type):
                why = "; ".join(problems) or "it is a class, not an instance"
                raise ConfigurationError(
                    f"{platform!r} does not satisfy the Platform protocol ({why})"
                )
        _forced_override = platform
        _clear_current()


def forced_platform() -> str | Platform | None:
    """Return what :func:`set_current_platform` forced (a name or an instance), or ``None``.

    ``ACCELPLAT_PLATFORM`` is not reflected here; read the environment for that.
    """
    return _forced_override


@contextmanager
def use_platform(platform: str | Platform) -> Iterator[Platform]:
    """Make ``platform`` current inside a ``with`` block, restoring the previous state after.

    Args:
        platform: A registered name or a platform instance.

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


def _clear_current() -> None:
    global _current
    _current = None


def reset() -> None:
    """Forget the detected platform, cached instances, registrations and discovered plugins.

    Meant for tests; the next call detects afresh and re-reads entry-point metadata. A plugin
    probe still running in its worker thread is abandoned, not stopped.
    """
    global _current, _forced_override, _entry_points_loaded
    with _lock:
        _current = None
        _forced_override = None
        _instances.clear()
        _registered.clear()
        _problems.clear()
        _entry_points_loaded = False


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
    """Return the loaded class or factory registered as ``name``, without probing or building it.

    Used by :mod:`accelplat.testing` to probe a platform on its own. Unbounded: the caller
    accepts a plugin import that hangs.

    Raises:
        ConfigurationError: For an unknown or excluded name, or a target that is not callable.
    """
    with _lock:
        entries = _entries()
        if name not in entries:
            raise _lookup_error(name)
        return _load(entries[name])

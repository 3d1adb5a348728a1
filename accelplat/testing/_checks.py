"""The conformance checks: what every accelplat backend, built-in or third-party, must do.

The kit is behavioural: it calls the platform the way accelplat's memory waits, sizing helpers
and ``accelplat info`` will, and judges the answers. :func:`run_conformance` runs every check
and returns a :class:`ConformanceReport`; no check raises, a failure is a ``"fail"`` verdict with
a detail that says what was expected and what came back.

The checks (:data:`CHECK_NAMES`, in order):

``protocol``
    The object satisfies :class:`~accelplat._platform.Platform` and its identity attributes have
    the right types (``name`` a valid platform name, equal to the registered name when the kit
    knows it; ``device_type`` a non-empty string; ``visible_devices_env`` ``None`` or a
    non-empty string; ``context_free`` a bool).
``probe``
    The class (or factory) offers ``probe() -> ProbeResult`` with a non-empty reason, it says
    available (unless no device is visible), and it answers within ``probe_budget_s``.
``devices``
    ``device_count()`` is an int equal to ``len(devices())``; devices are
    :class:`~accelplat._types.DeviceInfo` with indices ``0..n-1`` in order, distinct physical
    indices and non-empty names; two calls agree.
``memory_values``
    For every device, :class:`~accelplat._types.MemoryInfo` fields are ``int`` (not ``bool``)
    byte counts: ``0 <= used <= total``, ``0 <= free <= total``, ``reserved >= 0``,
    ``total >= min_total_bytes`` (a total below 1 MiB almost always means the backend reports
    MiB or GiB instead of bytes), and ``used + free`` is within ``sum_tolerance`` of ``total``,
    or ``used + free + reserved`` is (for backends whose total includes the reserved part).
``memory_stable``
    Two back-to-back reads agree: ``total`` and ``reserved`` exactly, ``used`` and ``free``
    within ``stability_tolerance`` (other processes may allocate in between).
``bad_index``
    ``memory_info`` and ``memory_holders`` raise :class:`~accelplat.errors.DeviceNotFoundError`
    for ``-1``, ``n``, ``n + 1``, ``"0"``, ``True``, ``False``, ``1.5`` and ``None``.
``memory_holders``
    ``None`` (unknown) or a sequence of :class:`~accelplat._usage.MemoryHolder` with positive
    int pids, ``used_bytes`` ``None`` or a non-negative int, and a
    :class:`~accelplat._usage.HolderState`.
``release``, ``graph``, ``default_memory_utilization``, ``preferred_start_method``
    Well-formed: a :class:`~accelplat._types.ReleaseProfile` whose stability window fits in its
    timeout and whose idle floor fits in a device; a :class:`~accelplat._types.GraphSupport`
    with a reason (and an ``api`` when available); a number in ``(0, 1]``; one of ``"fork"``,
    ``"spawn"``, ``"forkserver"``.
``no_framework_import``
    Importing the backend, probing it, constructing it and every query import none of
    :data:`~accelplat.testing._child.FRAMEWORK_MODULES` (torch, jax, tensorflow, paddle, …). The
    probe is held to this always; construction and queries unless the platform declares
    ``context_free = False``. Runs in a fresh subprocess, so a torch the caller already imported
    cannot mask an import.
``no_device_context``
    In that subprocess, after every query, no device lists the process among its memory holders
    (pid equal, or state ``SELF``) and no device runtime library (``libcuda.so``,
    ``libcudart.so``, ``libamdhip64.so``, ``libsycl.so``) was newly loaded. Skipped for
    ``context_free = False``.
``settle_idle``
    ``accelplat._memory.wait_for_memory_to_settle(platform=..., threshold_ratio=1.0,
    timeout_s=...)`` returns a :class:`~accelplat._usage.SettleResult` covering every device,
    within the platform's stability window (lazy platforms) plus one second.
``visible_devices``
    With ``visible_devices_env`` set to ``"0"`` in a fresh process, one device is visible; with
    ``"0,1"``, two (when at least three are); with ``""``, none, when the caller says the vendor
    documents that (``empty_visible_hides_all=True``, or the platform's optional attribute
    ``visible_devices_empty_hides_all = True``). Variables the platform lists in its optional
    ``visible_devices_shadowed_by`` (ones that would take precedence) are set to ``""`` meanwhile.
    Skipped when the platform has no such variable or fewer than two devices.

Subprocess or in-process: the subprocess checks rebuild the platform in a fresh interpreter from
its registered name or from an importable ``module:attr`` reference (``child=``), and use it only
when the fresh process sees the same devices as the caller. Otherwise (a backend built over a
fake sysfs tree, say) they fall back to the caller's process, using ``factory`` to build fresh
instances, and say so in their detail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Literal

from accelplat import _validate
from accelplat._platform import Platform, validate_utilization
from accelplat._types import MIB, DeviceInfo, GraphSupport, MemoryInfo, ProbeResult, ReleaseProfile
from accelplat._usage import HolderState, MemoryHolder
from accelplat.errors import ConfigurationError, DeviceNotFoundError, PlatformNotAvailableError
from accelplat.testing._child import BOOTSTRAP, frameworks_in

__all__ = [
    "CHECK_NAMES",
    "STABILITY_TOLERANCE",
    "SUM_TOLERANCE",
    "CheckResult",
    "ConformanceReport",
    "Tolerance",
    "Verdict",
    "run_conformance",
]

Verdict = Literal["pass", "fail", "skip"]


START_METHODS = frozenset({"fork", "spawn", "forkserver"})


@dataclass(frozen=True)
class Tolerance:
    """An allowance in bytes that grows with the device: ``max(min_bytes, ratio × total)``.

    Attributes:
        min_bytes: The allowance for small devices.
        ratio: The allowance as a fraction of the device's total.
    """

    min_bytes: int
    ratio: float

    def allowed(self, total: int) -> int:
        """Return the allowance for a device of ``total`` bytes."""
        return max(self.min_bytes, int(self.ratio * max(0, total)))


SUM_TOLERANCE = Tolerance(min_bytes=64 * MIB, ratio=0.005)
"""How far ``used + free`` may be from ``total``: 64 MiB or 0.5 %, whichever is more.

Some sources read ``used`` and ``total`` from separate counters (two sysfs files) or round to
MiB, so the identity need not be exact; a gap beyond this means the fields disagree in meaning
(e.g. ``used`` excluding caches that ``free`` also excludes)."""

STABILITY_TOLERANCE = Tolerance(min_bytes=256 * MIB, ratio=0.02)
"""How much ``used``/``free`` may move between two back-to-back reads: 256 MiB or 2 %.

Other processes share the device (and the host, for ``cpu``) and allocate meanwhile."""


@dataclass(frozen=True)
class CheckResult:
    """The verdict of one check.

    Attributes:
        name: The check's name, one of :data:`CHECK_NAMES`.
        verdict: ``"pass"``, ``"fail"`` or ``"skip"``.
        detail: What was found (for a failure: expected versus got; for a skip: why).
    """

    name: str
    verdict: Verdict
    detail: str = ""

    @property
    def ok(self) -> bool:
        """``True`` unless the check failed."""
        return self.verdict != "fail"


@dataclass(frozen=True)
class ConformanceReport:
    """Every check's verdict for one platform.

    Attributes:
        platform: The platform's name.
        results: One :class:`CheckResult` per check run, in order.
    """

    platform: str
    results: tuple[CheckResult, ...]

    @property
    def passed(self) -> bool:
        """``True`` when no check failed (skips do not count against it)."""
        return all(r.ok for r in self.results)

    @property
    def failures(self) -> tuple[CheckResult, ...]:
        """The failed checks."""
        return tuple(r for r in self.results if r.verdict == "fail")

    @property
    def skipped(self) -> tuple[CheckResult, ...]:
        """The skipped checks."""
        return tuple(r for r in self.results if r.verdict == "skip")

    def result(self, name: str) -> CheckResult:
        """Return the result of check ``name``.

        Raises:
            KeyError: If that check was not run.
        """
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(name)

    def summary(self) -> str:
        """Return one line per check, e.g. ``"FAIL memory_values: device 0: used > total"``."""
        head = f"conformance of {self.platform!r}: {'passed' if self.passed else 'FAILED'}"
        lines = [head]
        for r in self.results:
            lines.append(f"  {r.verdict.upper():4} {r.name}: {r.detail}")
        return "\n".join(lines)

    def assert_passed(self) -> None:
        """Raise ``AssertionError`` with :meth:`summary` when a check failed."""
        if not self.passed:
            raise AssertionError(self.summary())


class _CheckFailedError(Exception):
    """Raised inside a check to fail it with a message."""


class _CheckSkippedError(Exception):
    """Raised inside a check to skip it with a reason."""


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_env_lock = threading.Lock()


@contextmanager
def _patched_env(changes: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the block (process-wide; not for concurrent tests)."""
    with _env_lock:
        saved = {name: os.environ.get(name) for name in changes}
        os.environ.update(changes)
        try:
            yield
        finally:
            for name, old in saved.items():
                if old is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = old


@dataclass
class _Options:
    registered_name: str | None
    factory: Callable[[], Any] | None
    child: str | None
    isolation: Literal["auto", "subprocess", "inprocess"]
    sum_tolerance: Tolerance
    stability_tolerance: Tolerance
    min_total_bytes: int
    probe_budget_s: float
    settle_timeout_s: float | None
    settle_clock: Any
    empty_visible_hides_all: bool | None
    subprocess_timeout_s: float
    env: Mapping[str, str]


@dataclass
class _ChildRun:
    spec: tuple[str, str]
    answer: dict[str, Any]


@dataclass
class _Kit:
    """The state one conformance run shares between its checks."""

    platform: Any
    opts: _Options
    _count: int | None = None
    _devices: tuple[DeviceInfo, ...] | None = None
    _baseline: _ChildRun | None = None
    _baseline_note: str | None = None
    _baseline_done: bool = False
    notes: list[str] = field(default_factory=list)

    # -- shared facts --------------------------------------------------------------------------

    def count(self) -> int:
        if self._count is None:
            try:
                count = self.platform.device_count()
            except Exception as exc:
                raise _CheckFailedError(f"device_count() raised {_describe(exc)}") from None
            if not _is_int(count) or count < 0:
                raise _CheckFailedError(f"device_count() returned {count!r}, not an int >= 0")
            self._count = count
        return self._count

    def devices(self) -> tuple[DeviceInfo, ...]:
        if self._devices is None:
            try:
                devs = self.platform.devices()
            except Exception as exc:
                raise _CheckFailedError(f"devices() raised {_describe(exc)}") from None
            if not isinstance(devs, Sequence) or isinstance(devs, str):
                raise _CheckFailedError(f"devices() returned {type(devs).__name__}, not a sequence")
            self._devices = tuple(devs)
        return self._devices

    def need_devices(self) -> int:
        n = self.count()
        if n == 0:
            raise _CheckSkippedError("no device is visible")
        return n

    def memory(self, device: int) -> MemoryInfo:
        try:
            info = self.platform.memory_info(device)
        except Exception as exc:
            raise _CheckFailedError(f"memory_info({device}) raised {_describe(exc)}") from None
        if not isinstance(info, MemoryInfo):
            raise _CheckFailedError(
                f"memory_info({device}) returned {type(info).__name__}, not MemoryInfo"
            )
        return info

    def probe_owner(self) -> Any:
        """Return the object whose ``probe`` the registry would call."""
        if self.opts.factory is not None and hasattr(self.opts.factory, "probe"):
            return self.opts.factory
        if self.opts.registered_name is not None:
            from accelplat import _registry as registry

            try:
                return registry.factory_for(self.opts.registered_name)
            except ConfigurationError:
                pass
        return type(self.platform)

    def probe_describes_platform(self) -> bool:
        """Whether the probe speaks of the same configuration as the platform under test.

        A probe takes no arguments: it describes the platform as the registry would build it.
        That is the platform under test when it came by name, when ``factory`` has the probe,
        or when building the class without arguments gives the same devices; not when the
        caller built it with arguments (e.g. over a fake sysfs root).
        """
        if self.opts.registered_name is not None:
            return True
        if self.opts.factory is not None and hasattr(self.opts.factory, "probe"):
            return True
        try:
            fresh = type(self.platform)()
            got = [(d.name, d.physical_index) for d in fresh.devices()]
        except Exception:
            return False
        return got == [(d.name, d.physical_index) for d in self.devices()]

    # -- the subprocess --------------------------------------------------------------------------

    def _child_specs(self) -> list[tuple[str, str]]:
        specs: list[tuple[str, str]] = []
        if self.opts.child is not None:
            kind = "ref" if ":" in self.opts.child else "name"
            specs.append((kind, self.opts.child))
            return specs
        if self.opts.isolation == "inprocess":
            return specs
        if self.opts.registered_name is not None:
            specs.append(("name", self.opts.registered_name))
        cls = type(self.platform)
        module, qualname = cls.__module__, cls.__qualname__
        if module != "__main__" and "<" not in qualname:
            specs.append(("ref", f"{module}:{qualname}"))
        return specs

    def run_child(
        self, spec: tuple[str, str], *, env: Mapping[str, str] | None = None, queries: bool = True
    ) -> dict[str, Any]:
        fd, out = tempfile.mkstemp(prefix="accelplat-conformance-", suffix=".json")
        os.close(fd)
        job = {"kind": spec[0], "value": spec[1], "queries": queries, "out": out}
        child_env = dict(os.environ)
        child_env.update(self.opts.env)
        if env:
            child_env.update(env)
        paths = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
        old = child_env.get("PYTHONPATH")
        child_env["PYTHONPATH"] = os.pathsep.join([*paths, *([old] if old else [])])
        try:
            proc = subprocess.run(
                [sys.executable, "-c", BOOTSTRAP, json.dumps(job)],
                env=child_env,
                capture_output=True,
                text=True,
                timeout=self.opts.subprocess_timeout_s,
                check=False,
            )
            try:
                with open(out, encoding="utf-8") as f:
                    text = f.read()
                answer: dict[str, Any] = json.loads(text) if text else {}
            except (OSError, ValueError):
                answer = {}
        except subprocess.TimeoutExpired:
            answer = {"error": f"timed out after {self.opts.subprocess_timeout_s:g} s"}
            proc = None
        finally:
            with suppress(OSError):
                os.unlink(out)
        if not answer:
            tail = (proc.stderr if proc is not None else "").strip().splitlines()[-3:]
            rc = proc.returncode if proc is not None else None
            answer = {"ok": False, "error": f"the child exited {rc} without an answer: {tail}"}
        return answer

    def baseline(self) -> _ChildRun | None:
        """Return a subprocess run that reproduces the caller's platform, or ``None``."""
        if self._baseline_done:
            return self._baseline
        self._baseline_done = True
        tried: list[str] = []
        want = [(d.name, d.physical_index) for d in self.devices()]
        for spec in self._child_specs():
            answer = self.run_child(spec)
            label = f"{spec[0]} {spec[1]!r}"
            if not answer.get("ok"):
                tried.append(f"{label}: {answer.get('error')}")
                continue
            got = [(d["name"], d["physical_index"]) for d in answer.get("devices", [])]
            if answer.get("device_count") != len(want) or got != want:
                tried.append(f"{label}: sees {got} instead of {want}")
                continue
            self._baseline = _ChildRun(spec, answer)
            return self._baseline
        if not tried:
            self._baseline_note = "no way to rebuild the platform in a subprocess"
        else:
            self._baseline_note = "a fresh process could not reproduce it (" + "; ".join(tried)
            self._baseline_note += ")"
        return None

    def inprocess_note(self) -> str:
        return f"in-process: {self._baseline_note}; pass child='module:attr' to isolate"


# -- the checks ------------------------------------------------------------------------------


def _check_protocol(kit: _Kit) -> str:
    from accelplat._registry import _NAME_RE, protocol_problems

    p = kit.platform
    if isinstance(p, type):
        raise _CheckFailedError(f"got the class {p.__qualname__}, not an instance")
    problems = list(protocol_problems(p))
    if problems:
        raise _CheckFailedError("does not satisfy the Platform protocol: " + "; ".join(problems))
    if not isinstance(p, Platform):
        raise _CheckFailedError("isinstance(platform, Platform) is False")
    name = p.name
    if not isinstance(name, str) or not _NAME_RE.match(name):
        problems.append(f"name is {name!r}, not a valid platform name")
    elif kit.opts.registered_name is not None and name != kit.opts.registered_name:
        problems.append(f"name is {name!r} but it is registered as {kit.opts.registered_name!r}")
    if not isinstance(p.device_type, str) or not p.device_type:
        problems.append(f"device_type is {p.device_type!r}, not a non-empty str")
    env = p.visible_devices_env
    if env is not None and (not isinstance(env, str) or not env):
        problems.append(f"visible_devices_env is {env!r}, not None or a non-empty str")
    if not isinstance(p.context_free, bool):
        problems.append(f"context_free is {p.context_free!r}, not a bool")
    if problems:
        raise _CheckFailedError("; ".join(problems))
    return f"name={name!r}, device_type={p.device_type!r}, context_free={p.context_free}"


def _check_probe(kit: _Kit) -> str:
    owner = kit.probe_owner()
    probe = getattr(owner, "probe", None)
    if probe is None or not callable(probe):
        raise _CheckFailedError(
            f"{getattr(owner, '__qualname__', owner)!r} offers no callable probe()"
        )
    start = time.perf_counter()
    try:
        result = probe()
    except Exception as exc:
        raise _CheckFailedError(f"probe() raised {_describe(exc)}") from None
    took = time.perf_counter() - start
    if not isinstance(result, ProbeResult):
        raise _CheckFailedError(f"probe() returned {result!r}, not a ProbeResult")
    if not isinstance(result.available, bool):
        raise _CheckFailedError(f"ProbeResult.available is {result.available!r}, not a bool")
    if not isinstance(result.reason, str) or not result.reason.strip():
        raise _CheckFailedError(f"ProbeResult.reason is {result.reason!r}, not a non-empty str")
    note = ""
    if not result.available and kit.count() > 0:
        if kit.probe_describes_platform():
            raise _CheckFailedError(
                f"probe() says unavailable ({result.reason}) while {kit.count()} device(s) answer"
            )
        note = " (the platform was built with arguments, so the probe describes another setup)"
    if took > kit.opts.probe_budget_s:
        raise _CheckFailedError(f"probe() took {took:.2f} s; a probe must be cheap")
    return f"available={result.available} in {took * 1000:.1f} ms: {result.reason}{note}"


def _check_devices(kit: _Kit) -> str:
    n = kit.count()
    devs = kit.devices()
    problems: list[str] = []
    if len(devs) != n:
        problems.append(f"device_count() is {n} but devices() lists {len(devs)}")
    seen_physical: set[int] = set()
    for i, d in enumerate(devs):
        if not isinstance(d, DeviceInfo):
            problems.append(f"devices()[{i}] is {type(d).__name__}, not DeviceInfo")
            continue
        if not _is_int(d.index) or d.index != i:
            problems.append(f"devices()[{i}].index is {d.index!r}, expected {i}")
        if not _is_int(d.physical_index) or d.physical_index < 0:
            problems.append(f"device {i}: physical_index {d.physical_index!r} is not an int >= 0")
        elif d.physical_index in seen_physical:
            problems.append(f"device {i}: physical_index {d.physical_index} appears twice")
        else:
            seen_physical.add(d.physical_index)
        if not isinstance(d.name, str) or not d.name:
            problems.append(f"device {i}: name {d.name!r} is not a non-empty str")
        for attr in ("uuid", "pci_bus_id"):
            value = getattr(d, attr)
            if value is not None and not isinstance(value, str):
                problems.append(f"device {i}: {attr} {value!r} is neither None nor a str")
    try:
        again = kit.platform.device_count()
    except Exception as exc:
        raise _CheckFailedError(f"a second device_count() raised {_describe(exc)}") from None
    if again != n:
        problems.append(f"device_count() changed between two calls: {n} then {again}")
    if problems:
        raise _CheckFailedError("; ".join(problems))
    return f"{n} device(s): " + ", ".join(f"{d.index}={d.name}" for d in devs)


def _check_memory_values(kit: _Kit) -> str:
    n = kit.need_devices()
    problems: list[str] = []
    shown: list[str] = []
    for d in range(n):
        m = kit.memory(d)
        fields = {"free": m.free, "total": m.total, "used": m.used, "reserved": m.reserved}
        bad = [f"{k}={v!r}" for k, v in fields.items() if not _is_int(v)]
        if bad:
            problems.append(f"device {d}: not int byte counts: {', '.join(bad)}")
            continue
        if not isinstance(m.source, str):
            problems.append(f"device {d}: source {m.source!r} is not a str")
        if m.total < kit.opts.min_total_bytes:
            problems.append(
                f"device {d}: total={m.total} is below {kit.opts.min_total_bytes} bytes; are "
                "the values in bytes?"
            )
        if not 0 <= m.used <= m.total:
            problems.append(f"device {d}: used={m.used} is not within 0..total={m.total}")
        if not 0 <= m.free <= m.total:
            problems.append(f"device {d}: free={m.free} is not within 0..total={m.total}")
        if m.reserved < 0:
            problems.append(f"device {d}: reserved={m.reserved} is negative")
        allowed = kit.opts.sum_tolerance.allowed(m.total)
        gap = m.used + m.free - m.total
        gap_reserved = gap + m.reserved
        if abs(gap) > allowed and abs(gap_reserved) > allowed:
            extra = f" (with reserved: {gap_reserved:+d})" if m.reserved else ""
            problems.append(
                f"device {d}: used + free - total = {gap:+d} bytes{extra}, beyond the "
                f"tolerance of {allowed} bytes"
            )
        shown.append(f"{d}: used={m.used} free={m.free} total={m.total} [{m.source}]")
    if problems:
        raise _CheckFailedError("; ".join(problems))
    return "; ".join(shown)


def _check_memory_stable(kit: _Kit) -> str:
    n = kit.need_devices()
    problems: list[str] = []
    for d in range(n):
        a = kit.memory(d)
        b = kit.memory(d)
        if a.total != b.total:
            problems.append(f"device {d}: total changed from {a.total} to {b.total}")
        if a.reserved != b.reserved:
            problems.append(f"device {d}: reserved changed from {a.reserved} to {b.reserved}")
        allowed = kit.opts.stability_tolerance.allowed(max(a.total, 0))
        for attr in ("used", "free"):
            x, y = getattr(a, attr), getattr(b, attr)
            if _is_int(x) and _is_int(y) and abs(x - y) > allowed:
                problems.append(
                    f"device {d}: {attr} moved {y - x:+d} bytes between two back-to-back reads "
                    f"(tolerance {allowed})"
                )
    if problems:
        raise _CheckFailedError("; ".join(problems))
    return f"{n} device(s) stable across two reads"


def _bad_indices(n: int) -> list[object]:
    return [-1, n, n + 1, "0", True, False, 1.5, None]


def _check_bad_index(kit: _Kit) -> str:
    n = kit.count()
    problems: list[str] = []
    for method in ("memory_info", "memory_holders"):
        fn = getattr(kit.platform, method)
        for bad in _bad_indices(n):
            try:
                got = fn(bad)
            except DeviceNotFoundError:
                continue
            except Exception as exc:
                problems.append(f"{method}({bad!r}) raised {_describe(exc)}")
                continue
            problems.append(f"{method}({bad!r}) returned {got!r}")
    if problems:
        raise _CheckFailedError("expected DeviceNotFoundError: " + "; ".join(problems))
    return f"{len(_bad_indices(n)) * 2} bad calls raised DeviceNotFoundError"


def _check_memory_holders(kit: _Kit) -> str:
    n = kit.need_devices()
    problems: list[str] = []
    shown: list[str] = []
    for d in range(n):
        try:
            holders = kit.platform.memory_holders(d)
        except Exception as exc:
            problems.append(f"memory_holders({d}) raised {_describe(exc)}")
            continue
        if holders is None:
            shown.append(f"{d}: unknown")
            continue
        if not isinstance(holders, Sequence) or isinstance(holders, str):
            problems.append(f"memory_holders({d}) returned {type(holders).__name__}")
            continue
        for h in holders:
            if not isinstance(h, MemoryHolder):
                problems.append(f"device {d}: {h!r} is not a MemoryHolder")
                continue
            if not _is_int(h.pid) or h.pid <= 0:
                problems.append(f"device {d}: pid {h.pid!r} is not a positive int")
            if h.used_bytes is not None and (not _is_int(h.used_bytes) or h.used_bytes < 0):
                problems.append(f"device {d}: used_bytes {h.used_bytes!r} is not None or >= 0")
            if not isinstance(h.state, HolderState):
                problems.append(f"device {d}: state {h.state!r} is not a HolderState")
        shown.append(f"{d}: {len(holders)} holder(s)")
    if problems:
        raise _CheckFailedError("; ".join(problems))
    return "; ".join(shown)


def _check_release(kit: _Kit) -> str:
    r = kit.platform.release
    if not isinstance(r, ReleaseProfile):
        raise _CheckFailedError(f"release is {type(r).__name__}, not ReleaseProfile")
    problems: list[str] = []
    if not isinstance(r.lazy, bool):
        problems.append(f"lazy is {r.lazy!r}, not a bool")
    for attr in ("stable_duration_s", "settle_timeout_s"):
        try:
            _validate.number(getattr(r, attr), attr, minimum=0)
        except ConfigurationError as exc:
            problems.append(str(exc))
    if not problems and r.stable_duration_s > r.settle_timeout_s:
        problems.append(
            f"stable_duration_s={r.stable_duration_s} exceeds settle_timeout_s="
            f"{r.settle_timeout_s}: a settle wait could never succeed"
        )
    if not _is_int(r.idle_floor_bytes) or r.idle_floor_bytes < 0:
        problems.append(f"idle_floor_bytes is {r.idle_floor_bytes!r}, not an int >= 0")
    elif kit.count() > 0:
        try:
            totals = [kit.memory(d).total for d in range(kit.count())]
        except _CheckFailedError:  # memory_values reports that; the floor cannot be compared
            totals = []
        if totals and r.idle_floor_bytes > max(totals):
            problems.append(
                f"idle_floor_bytes={r.idle_floor_bytes} exceeds every device's total "
                f"(largest {max(totals)})"
            )
    if problems:
        raise _CheckFailedError("; ".join(problems))
    return repr(r)


def _check_graph(kit: _Kit) -> str:
    g = kit.platform.graph
    if not isinstance(g, GraphSupport):
        raise _CheckFailedError(f"graph is {type(g).__name__}, not GraphSupport")
    problems: list[str] = []
    if not isinstance(g.available, bool):
        problems.append(f"available is {g.available!r}, not a bool")
    if not isinstance(g.reason, str) or not g.reason.strip():
        problems.append(f"reason is {g.reason!r}, not a non-empty str")
    if g.api is not None and (not isinstance(g.api, str) or not g.api):
        problems.append(f"api is {g.api!r}, not None or a non-empty str")
    if g.available is True and g.api is None:
        problems.append("available is True but api is None: name the capture API")
    if problems:
        raise _CheckFailedError("; ".join(problems))
    return repr(g)


def _check_utilization(kit: _Kit) -> str:
    u = kit.platform.default_memory_utilization
    try:
        validate_utilization(u, argument="default_memory_utilization")
    except ValueError as exc:  # the rule every engine argument is held to
        raise _CheckFailedError(str(exc)) from None
    return f"{u!r}"


def _check_start_method(kit: _Kit) -> str:
    m = kit.platform.preferred_start_method
    if m not in START_METHODS:
        raise _CheckFailedError(
            f"preferred_start_method is {m!r}, not one of {sorted(START_METHODS)}"
        )
    return repr(m)


def _exercise(platform: Any) -> None:
    n = platform.device_count()
    platform.devices()
    for d in range(n):
        platform.memory_info(d)
        platform.memory_holders(d)
    for attr in ("release", "graph", "default_memory_utilization", "preferred_start_method"):
        getattr(platform, attr)


def _check_no_framework_import(kit: _Kit) -> str:
    context_free = kit.platform.context_free is not False
    run = kit.baseline()
    if run is not None:
        fw: dict[str, list[str]] = run.answer.get("frameworks", {})
        stages = ("import", "probe", "construct", "queries") if context_free else ("probe",)
        bad = {s: fw.get(s, []) for s in stages if fw.get(s)}
        if bad:
            text = "; ".join(f"{s} imported {', '.join(v)}" for s, v in bad.items())
            raise _CheckFailedError(f"in a fresh process ({run.spec[0]} {run.spec[1]!r}): {text}")
        scope = "import, probe, construction and queries" if context_free else "the probe"
        note = "" if context_free else " (context_free = False: only the probe is held to it)"
        return f"fresh process ({run.spec[0]} {run.spec[1]!r}): {scope} imported no framework{note}"
    before = set(sys.modules)
    masked = frameworks_in(before)
    owner = kit.probe_owner()
    probe = getattr(owner, "probe", None)
    if callable(probe):
        probe()
    after_probe = set(sys.modules)
    if context_free:
        target = kit.opts.factory() if kit.opts.factory is not None else kit.platform
        _exercise(target)
    new_probe = frameworks_in(after_probe - before)
    new_rest = frameworks_in(set(sys.modules) - after_probe)
    if new_probe or new_rest:
        raise _CheckFailedError(
            f"{kit.inprocess_note()}: the probe imported {new_probe or 'nothing'}, the "
            f"queries imported {new_rest or 'nothing'}"
        )
    if masked:
        raise _CheckSkippedError(
            f"{kit.inprocess_note()}; {', '.join(masked)} already imported, so an import "
            "of it could not be seen"
        )
    return f"{kit.inprocess_note()}: nothing imported a framework"


def _check_no_device_context(kit: _Kit) -> str:
    if kit.platform.context_free is False:
        raise _CheckSkippedError("the platform declares context_free = False")
    run = kit.baseline()
    if run is not None:
        problems: list[str] = []
        if run.answer.get("self_holders"):
            problems.append(
                "the process is listed among the memory holders of device(s) "
                f"{run.answer['self_holders']}"
            )
        if problems:
            raise _CheckFailedError(
                f"in a fresh process ({run.spec[0]} {run.spec[1]!r}): " + "; ".join(problems)
            )
        # A mapped runtime library is reported, not failed: mapping creates no context, and
        # management libraries map runtimes themselves (nvmlInit maps libcuda.so on R580
        # drivers, with no context and no device memory taken).
        libraries = run.answer.get("libraries")
        loaded = f"; mapped {libraries} without holding memory" if libraries else ""
        return f"fresh process ({run.spec[0]} {run.spec[1]!r}): not a memory holder{loaded}"
    n = kit.count()
    me = os.getpid()
    held = []
    for d in range(n):
        holders = kit.platform.memory_holders(d) or ()
        if any(h.pid == me or h.state == HolderState.SELF for h in holders):
            held.append(d)
    if held:
        raise _CheckFailedError(
            f"{kit.inprocess_note()}: this process holds memory on device(s) {held} (if an "
            "earlier test created that context, isolate the kit)"
        )
    return f"{kit.inprocess_note()}: this process holds no device memory"


def _check_settle_idle(kit: _Kit) -> str:
    n = kit.need_devices()
    try:
        from accelplat._memory import wait_for_memory_to_settle
    except ImportError as exc:
        raise _CheckSkippedError(f"accelplat._memory is not available ({_describe(exc)})") from None
    from accelplat._usage import SettleResult

    release = kit.platform.release
    window = release.stable_duration_s if release.lazy else 0.0
    timeout = kit.opts.settle_timeout_s
    if timeout is None:
        timeout = window + 5.0
    kwargs: dict[str, Any] = {
        "platform": kit.platform,
        "threshold_ratio": 1.0,
        "timeout_s": timeout,
    }
    if kit.opts.settle_clock is not None:
        kwargs["clock"] = kit.opts.settle_clock
    start = time.monotonic()
    try:
        result = wait_for_memory_to_settle(**kwargs)
    except Exception as exc:
        raise _CheckFailedError(f"wait_for_memory_to_settle raised {_describe(exc)}") from None
    elapsed = time.monotonic() - start
    if not isinstance(result, SettleResult):
        raise _CheckFailedError(f"returned {type(result).__name__}, not SettleResult")
    problems: list[str] = []
    covered = set(result.snapshot.memory)
    if covered != set(range(n)):
        problems.append(f"the snapshot covers devices {sorted(covered)}, not 0..{n - 1}")
    limit = window + 1.0
    if result.waited_s > limit or elapsed > timeout + 1.0:
        problems.append(
            f"took {result.waited_s:.2f} s ({elapsed:.2f} s real) on an idle device; expected "
            f"at most {limit:.2f} s"
        )
    if problems:
        raise _CheckFailedError("; ".join(problems))
    return f"settled in {result.waited_s:.3f} s after {result.polls} poll(s)"


def _visible_env(kit: _Kit, env_name: str, value: str) -> dict[str, str]:
    """The variables to set so that ``env_name=value`` decides visibility.

    A platform may name variables that take precedence over its own when non-empty (ROCm:
    ``HIP_VISIBLE_DEVICES`` over ``CUDA_VISIBLE_DEVICES``) in ``visible_devices_shadowed_by``;
    they are set to ``""``, which the runtime reads as unset.
    """
    shadows = getattr(kit.platform, "visible_devices_shadowed_by", ())
    changes = {name: "" for name in shadows if isinstance(name, str) and name != env_name}
    changes[env_name] = value
    return changes


def _count_with_env(kit: _Kit, env_name: str, value: str) -> tuple[int | None, str]:
    """Return the device count a fresh platform sees with ``env_name=value``, and how."""
    changes = _visible_env(kit, env_name, value)
    run = kit.baseline()
    if run is not None:
        answer = kit.run_child(run.spec, env=changes, queries=False)
        if not answer.get("ok"):
            return None, f"the child failed: {answer.get('error')}"
        count = answer.get("device_count")
        return (count if isinstance(count, int) else None), "subprocess"
    if kit.platform.context_free is False:
        raise _CheckSkippedError(
            f"{kit.inprocess_note()}; and the platform declares context_free = False: its "
            f"framework reads {env_name} once, when it starts, so changing it in this process "
            "shows nothing"
        )
    factory = kit.opts.factory
    if factory is None:
        raise _CheckSkippedError(
            f"{kit.inprocess_note()}; and no factory= to rebuild the platform with "
            f"{env_name} changed"
        )
    with _patched_env(changes):
        try:
            probe = getattr(factory, "probe", None)
            if callable(probe):
                result = probe()
                if isinstance(result, ProbeResult) and not result.available:
                    return 0, "in-process (probe says unavailable)"
            fresh = factory()
            return int(fresh.device_count()), "in-process"
        except PlatformNotAvailableError:
            return 0, "in-process (not available)"
        except Exception as exc:
            return None, f"in-process: raised {_describe(exc)}"


def _check_visible_devices(kit: _Kit) -> str:
    env_name = kit.platform.visible_devices_env
    if env_name is None:
        raise _CheckSkippedError("the platform has no visible-devices variable")
    n = kit.count()
    if n < 2:
        raise _CheckSkippedError(f"{n} device(s) visible: hiding one cannot be shown")
    cases: list[tuple[str, int]] = [("0", 1)]
    if n >= 3:
        cases.append(("0,1", 2))
    hides_all = kit.opts.empty_visible_hides_all
    if hides_all is None:
        hides_all = getattr(kit.platform, "visible_devices_empty_hides_all", None) is True
    if hides_all:
        cases.append(("", 0))
    problems: list[str] = []
    seen: list[str] = []
    for value, expected in cases:
        got, how = _count_with_env(kit, env_name, value)
        seen.append(f"{env_name}={value!r} -> {got} ({how})")
        if got != expected:
            problems.append(f"{env_name}={value!r} gave {got} device(s), expected {expected}")
    if problems:
        raise _CheckFailedError("; ".join(problems) + f" [{'; '.join(seen)}]")
    return "; ".join(seen)


_CHECKS: dict[str, Callable[[_Kit], str]] = {
    "protocol": _check_protocol,
    "probe": _check_probe,
    "devices": _check_devices,
    "memory_values": _check_memory_values,
    "memory_stable": _check_memory_stable,
    "bad_index": _check_bad_index,
    "memory_holders": _check_memory_holders,
    "release": _check_release,
    "graph": _check_graph,
    "default_memory_utilization": _check_utilization,
    "preferred_start_method": _check_start_method,
    "no_framework_import": _check_no_framework_import,
    "no_device_context": _check_no_device_context,
    "settle_idle": _check_settle_idle,
    "visible_devices": _check_visible_devices,
}

CHECK_NAMES: tuple[str, ...] = tuple(_CHECKS)
"""Every check, in the order :func:`run_conformance` runs them (the keys of the one table)."""


def _run_one(kit: _Kit, name: str) -> CheckResult:
    try:
        detail = _CHECKS[name](kit)
    except _CheckFailedError as exc:
        return CheckResult(name, "fail", str(exc))
    except _CheckSkippedError as exc:
        return CheckResult(name, "skip", str(exc))
    except Exception as exc:
        return CheckResult(name, "fail", f"raised {_describe(exc)}")
    return CheckResult(name, "pass", detail)


def run_conformance(
    platform: Platform | str,
    *,
    checks: Iterable[str] | None = None,
    factory: Callable[[], Any] | None = None,
    child: str | None = None,
    isolation: Literal["auto", "subprocess", "inprocess"] = "auto",
    sum_tolerance: Tolerance = SUM_TOLERANCE,
    stability_tolerance: Tolerance = STABILITY_TOLERANCE,
    min_total_bytes: int = MIB,
    probe_budget_s: float = 2.0,
    settle_timeout_s: float | None = None,
    settle_clock: Any = None,
    empty_visible_hides_all: bool | None = None,
    subprocess_timeout_s: float = 60.0,
    env: Mapping[str, str] | None = None,
) -> ConformanceReport:
    """Run the conformance checks against a platform and report every verdict.

    Args:
        platform: A platform instance, or a registered name (resolved with
            :func:`accelplat.get_platform`; the name is then also used to rebuild it in a
            subprocess and must equal ``platform.name``).
        checks: Names from :data:`CHECK_NAMES` to run; ``None`` runs all.
        factory: Zero-argument callable building a fresh, equivalent platform; used for the
            in-process fallbacks (a fresh instance for the import check, rebuilding it with the
            visible-devices variable changed) and, when it has ``probe``, for the probe check.
        child: How a fresh process rebuilds the platform: a registered name, or a
            ``"module:attr"`` reference to a class or zero-argument factory. By default the
            registered name, then the instance's class.
        isolation: ``"auto"`` uses a subprocess when one reproduces the platform, else the
            caller's process; ``"inprocess"`` never starts one; ``"subprocess"`` fails the
            subprocess checks when none can be started.
        sum_tolerance: Allowed gap between ``used + free`` and ``total``.
        stability_tolerance: Allowed movement of ``used``/``free`` between two reads.
        min_total_bytes: Smallest plausible ``total``; smaller suggests a unit other than bytes.
        probe_budget_s: Longest a probe may take.
        settle_timeout_s: Timeout passed to the settle wait; default: the platform's stability
            window (lazy platforms) plus 5 s.
        settle_clock: A clock (``monotonic()``, ``sleep()``) for the settle wait, so tests of
            lazy platforms need not sleep for real.
        empty_visible_hides_all: ``True`` where the vendor documents that an empty
            visible-devices variable hides every device (CUDA does); that case is then checked.
            ``None`` reads the platform's optional ``visible_devices_empty_hides_all``
            attribute (not part of the protocol), and skips the case without it.
        subprocess_timeout_s: Limit for each child process.
        env: Extra environment variables for child processes.

    Returns:
        A :class:`ConformanceReport`; :attr:`ConformanceReport.passed` is ``False`` when a
        check failed.

    Raises:
        ConfigurationError: For an unknown check name or a name that is not registered.
        PlatformNotAvailableError: When ``platform`` names a platform unavailable here.

    Side effects:
        Calls every query of the platform (a few times); starts a few short-lived Python
        processes; the in-process visible-devices fallback changes ``os.environ`` for a moment.
    """
    registered: str | None = None
    if isinstance(platform, str):
        from accelplat._registry import get_platform

        registered = platform
        instance: Any = get_platform(platform)
    else:
        instance = platform
    names = CHECK_NAMES if checks is None else tuple(checks)
    unknown = [n for n in names if n not in _CHECKS]
    if unknown:
        raise ConfigurationError(
            f"unknown conformance check(s) {unknown}; valid: {', '.join(CHECK_NAMES)}"
        )
    if isolation not in ("auto", "subprocess", "inprocess"):
        raise ConfigurationError(
            f"isolation must be 'auto', 'subprocess' or 'inprocess', got {isolation!r}"
        )
    opts = _Options(
        registered_name=registered,
        factory=factory,
        child=child,
        isolation=isolation,
        sum_tolerance=sum_tolerance,
        stability_tolerance=stability_tolerance,
        min_total_bytes=min_total_bytes,
        probe_budget_s=probe_budget_s,
        settle_timeout_s=settle_timeout_s,
        settle_clock=settle_clock,
        empty_visible_hides_all=empty_visible_hides_all,
        subprocess_timeout_s=subprocess_timeout_s,
        env=dict(env or {}),
    )
    kit = _Kit(instance, opts)
    results = []
    for name in names:
        result = _run_one(kit, name)
        if (
            isolation == "subprocess"
            and name in _SUBPROCESS_CHECKS
            and result.verdict != "skip"
            and kit.baseline() is None
        ):
            result = CheckResult(name, "fail", f"isolation='subprocess': {kit._baseline_note}")
        results.append(result)
    label = getattr(instance, "name", None)
    return ConformanceReport(
        platform=label if isinstance(label, str) else repr(instance), results=tuple(results)
    )


_SUBPROCESS_CHECKS = frozenset({"no_framework_import", "no_device_context", "visible_devices"})

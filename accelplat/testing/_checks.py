"""The conformance checks: what every accelplat backend, built-in or third-party, must do.

The kit calls the platform the way accelplat's waits, sizing helpers and ``accelplat info`` will,
and judges the answers. No check raises: a failure is a ``"fail"`` verdict whose detail says what
was expected and what came back. ``docs/writing-a-backend.md`` explains each check.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Literal, get_args

from accelplat import _validate
from accelplat._platform import Platform, StartMethod, optional, validate_utilization
from accelplat._registry import describe_failure, get_platform, protocol_problems
from accelplat._types import (
    MIB,
    DeviceInfo,
    GraphSupport,
    HolderState,
    MemoryHolder,
    ProbeResult,
    ReleaseProfile,
)
from accelplat.errors import ConfigurationError, DeviceNotFoundError, PlatformNotAvailableError
from accelplat.testing._child import frameworks_in, held_here, query
from accelplat.testing._kit import (
    STABILITY_TOLERANCE,
    SUM_TOLERANCE,
    CheckFailedError,
    CheckSkippedError,
    Isolation,
    Kit,
    Tolerance,
    call,
    is_int,
)

Verdict = Literal["pass", "fail", "skip"]


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
        return {r.name: r for r in self.results}[name]

    def summary(self) -> str:
        """Return one line per check, e.g. ``"FAIL memory_values: device 0: used > total"``."""
        head = f"conformance of {self.platform!r}: {'passed' if self.passed else 'FAILED'}"
        return "\n".join(
            [head, *(f"  {r.verdict.upper():4} {r.name}: {r.detail}" for r in self.results)]
        )

    def assert_passed(self) -> None:
        """Raise ``AssertionError`` with :meth:`summary` when a check failed."""
        if not self.passed:
            raise AssertionError(self.summary())


def _check_protocol(kit: Kit, problems: list[str]) -> str:
    p = kit.platform
    if isinstance(p, type):
        raise CheckFailedError(f"got the class {p.__qualname__}, not an instance")
    if missing := protocol_problems(p):
        raise CheckFailedError("does not satisfy the Platform protocol: " + "; ".join(missing))
    name = p.name
    if not isinstance(name, str) or not _validate.NAME_RE.match(name):
        problems.append(f"name is {name!r}, not a valid platform name")
    elif kit.registered_name is not None and name != kit.registered_name:
        problems.append(f"name is {name!r} but it is registered as {kit.registered_name!r}")
    if not isinstance(p.device_type, str) or not p.device_type:
        problems.append(f"device_type is {p.device_type!r}, not a non-empty str")
    if (env := p.visible_devices_env) is not None and (not isinstance(env, str) or not env):
        problems.append(f"visible_devices_env is {env!r}, not None or a non-empty str")
    if not isinstance(p.context_free, bool):
        problems.append(f"context_free is {p.context_free!r}, not a bool")
    if not isinstance(accelerator := optional(p, "is_accelerator"), bool):
        problems.append(f"is_accelerator is {accelerator!r}, not a bool")
    return f"name={name!r}, device_type={p.device_type!r}, context_free={p.context_free}"


def _check_probe(kit: Kit, problems: list[str]) -> str:
    owner = kit.probe_owner()
    probe = getattr(owner, "probe", None)
    if not callable(probe):
        raise CheckFailedError(
            f"{getattr(owner, '__qualname__', owner)!r} offers no callable probe()"
        )
    start = time.perf_counter()
    result = call("probe()", probe)
    took = time.perf_counter() - start
    if not isinstance(result, ProbeResult):
        raise CheckFailedError(f"probe() returned {result!r}, not a ProbeResult")
    if not isinstance(result.available, bool):
        raise CheckFailedError(f"ProbeResult.available is {result.available!r}, not a bool")
    if not isinstance(result.reason, str) or not result.reason.strip():
        raise CheckFailedError(f"ProbeResult.reason is {result.reason!r}, not a non-empty str")
    note = ""
    if not result.available and kit.count > 0:
        if kit.probe_describes_platform():
            raise CheckFailedError(
                f"probe() says unavailable ({result.reason}) while {kit.count} device(s) answer"
            )
        note = " (the platform was built with arguments, so the probe describes another setup)"
    if took > 2.0:
        raise CheckFailedError(f"probe() took {took:.2f} s; a probe must be cheap (2 s at most)")
    return f"available={result.available} in {took * 1000:.1f} ms: {result.reason}{note}"


def _check_devices(kit: Kit, problems: list[str]) -> str:
    n = kit.count
    devs = kit.devices
    if len(devs) != n:
        problems.append(f"device_count() is {n} but devices() lists {len(devs)}")
    seen_physical: set[int] = set()
    for i, d in enumerate(devs):
        if not isinstance(d, DeviceInfo):
            problems.append(f"devices()[{i}] is {type(d).__name__}, not DeviceInfo")
            continue
        if not is_int(d.index) or d.index != i:
            problems.append(f"devices()[{i}].index is {d.index!r}, expected {i}")
        if not is_int(d.physical_index) or d.physical_index < 0:
            problems.append(f"device {i}: physical_index {d.physical_index!r} is not an int >= 0")
        elif d.physical_index in seen_physical:
            problems.append(f"device {i}: physical_index {d.physical_index} appears twice")
        else:
            seen_physical.add(d.physical_index)
        if not isinstance(d.name, str) or not d.name:
            problems.append(f"device {i}: name {d.name!r} is not a non-empty str")
        for attr in ("uuid", "pci_bus_id"):
            if (value := getattr(d, attr)) is not None and not isinstance(value, str):
                problems.append(f"device {i}: {attr} {value!r} is neither None nor a str")
    again = call("a second device_count()", kit.platform.device_count)
    if again != n:
        problems.append(f"device_count() changed between two calls: {n} then {again}")
    return "" if problems else f"{n} device(s): " + ", ".join(f"{d.index}={d.name}" for d in devs)


def _check_memory_values(kit: Kit, problems: list[str]) -> str:
    n = kit.need_devices()
    shown: list[str] = []
    for d in range(n):
        m = kit.memory(d)
        fields = ("free", "total", "used", "reserved")
        bad = [f"{k}={getattr(m, k)!r}" for k in fields if not is_int(getattr(m, k))]
        if bad:
            problems.append(f"device {d}: not int byte counts: {', '.join(bad)}")
            continue
        if not isinstance(m.source, str):
            problems.append(f"device {d}: source {m.source!r} is not a str")
        if m.total < MIB:
            problems.append(
                f"device {d}: total={m.total} is below {MIB} bytes; are the values in bytes?"
            )
        for attr, value in (("used", m.used), ("free", m.free)):
            if not 0 <= value <= m.total:
                problems.append(f"device {d}: {attr}={value} is not within 0..total={m.total}")
        if m.reserved < 0:
            problems.append(f"device {d}: reserved={m.reserved} is negative")
        allowed = kit.sum_tolerance.allowed(m.total)
        gap = m.used + m.free - m.total
        gap_reserved = gap + m.reserved
        if abs(gap) > allowed and abs(gap_reserved) > allowed:
            extra = f" (with reserved: {gap_reserved:+d})" if m.reserved else ""
            problems.append(
                f"device {d}: used + free - total = {gap:+d} bytes{extra}, beyond the "
                f"tolerance of {allowed} bytes"
            )
        shown.append(f"{d}: used={m.used} free={m.free} total={m.total} [{m.source}]")
    return "; ".join(shown)


def _check_memory_stable(kit: Kit, problems: list[str]) -> str:
    n = kit.need_devices()
    for d in range(n):
        a, b = kit.memory(d), kit.memory(d)
        for attr in ("total", "reserved"):
            if (x := getattr(a, attr)) != (y := getattr(b, attr)):
                problems.append(f"device {d}: {attr} changed from {x} to {y}")
        allowed = kit.stability_tolerance.allowed(max(a.total, 0))
        for attr in ("used", "free"):
            x, y = getattr(a, attr), getattr(b, attr)
            if is_int(x) and is_int(y) and abs(x - y) > allowed:
                problems.append(
                    f"device {d}: {attr} moved {y - x:+d} bytes between two back-to-back reads "
                    f"(tolerance {allowed})"
                )
    return f"{n} device(s) stable across two reads"


def _check_bad_index(kit: Kit, problems: list[str]) -> str:
    n = kit.count
    bad_indices: list[object] = [-1, n, n + 1, "0", True, False, 1.5, None]
    for method in ("memory_info", "memory_holders"):
        fn = getattr(kit.platform, method)
        for bad in bad_indices:
            try:
                said = f"returned {fn(bad)!r}"
            except DeviceNotFoundError:
                continue
            except Exception as exc:
                said = f"raised {describe_failure(exc)}"
            problems.append(f"{method}({bad!r}) {said}")
    if problems:
        raise CheckFailedError("expected DeviceNotFoundError: " + "; ".join(problems))
    return f"{len(bad_indices) * 2} bad calls raised DeviceNotFoundError"


def _check_memory_holders(kit: Kit, problems: list[str]) -> str:
    n = kit.need_devices()
    shown: list[str] = []
    for d in range(n):
        holders = call(f"memory_holders({d})", kit.platform.memory_holders, d)
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
            if not is_int(h.pid) or h.pid <= 0:
                problems.append(f"device {d}: pid {h.pid!r} is not a positive int")
            if h.used_bytes is not None and (not is_int(h.used_bytes) or h.used_bytes < 0):
                problems.append(f"device {d}: used_bytes {h.used_bytes!r} is not None or >= 0")
            if not isinstance(h.state, HolderState):
                problems.append(f"device {d}: state {h.state!r} is not a HolderState")
        shown.append(f"{d}: {len(holders)} holder(s)")
    return "; ".join(shown)


def _check_release(kit: Kit, problems: list[str]) -> str:
    r = kit.platform.release
    if not isinstance(r, ReleaseProfile):
        raise CheckFailedError(f"release is {type(r).__name__}, not ReleaseProfile")
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
    if not is_int(r.idle_floor_bytes) or r.idle_floor_bytes < 0:
        problems.append(f"idle_floor_bytes is {r.idle_floor_bytes!r}, not an int >= 0")
    elif kit.count > 0:
        with suppress(CheckFailedError):  # memory_values reports that; the floor cannot be compared
            largest = max(kit.memory(d).total for d in range(kit.count))
            if r.idle_floor_bytes > largest:
                problems.append(
                    f"idle_floor_bytes={r.idle_floor_bytes} exceeds every device's total "
                    f"(largest {largest})"
                )
    return repr(r)


def _check_graph(kit: Kit, problems: list[str]) -> str:
    g = kit.platform.graph
    if not isinstance(g, GraphSupport):
        raise CheckFailedError(f"graph is {type(g).__name__}, not GraphSupport")
    if not isinstance(g.available, bool):
        problems.append(f"available is {g.available!r}, not a bool")
    if not isinstance(g.reason, str) or not g.reason.strip():
        problems.append(f"reason is {g.reason!r}, not a non-empty str")
    if g.api is not None and (not isinstance(g.api, str) or not g.api):
        problems.append(f"api is {g.api!r}, not None or a non-empty str")
    if g.available is True and g.api is None:
        problems.append("available is True but api is None: name the capture API")
    return repr(g)


def _check_utilization(kit: Kit, problems: list[str]) -> str:
    u = kit.platform.default_memory_utilization
    try:
        validate_utilization(u, argument="default_memory_utilization")
    except ValueError as exc:  # the rule every engine argument is held to
        raise CheckFailedError(str(exc)) from None
    return f"{u!r}"


def _check_start_method(kit: Kit, problems: list[str]) -> str:
    m = kit.platform.preferred_start_method
    if m not in (methods := get_args(StartMethod)):
        raise CheckFailedError(f"preferred_start_method is {m!r}, not one of {sorted(methods)}")
    return repr(m)


def _check_no_framework_import(kit: Kit, problems: list[str]) -> str:
    context_free = kit.platform.context_free is not False
    run = kit.baseline
    if run is not None:
        fw: dict[str, list[str]] = run.get("frameworks", {})
        stages = ("import", "probe", "construct", "queries") if context_free else ("probe",)
        bad = {s: fw.get(s, []) for s in stages if fw.get(s)}
        if bad:
            text = "; ".join(f"{s} imported {', '.join(v)}" for s, v in bad.items())
            raise CheckFailedError(f"in a fresh process ({run['label']}): {text}")
        scope = "import, probe, construction and queries" if context_free else "the probe"
        note = "" if context_free else " (context_free = False: only the probe is held to it)"
        return f"fresh process ({run['label']}): {scope} imported no framework{note}"
    before = set(sys.modules)
    masked = frameworks_in(before)
    probe = getattr(kit.probe_owner(), "probe", None)
    if callable(probe):
        probe()
    after_probe = set(sys.modules)
    if context_free:
        target = kit.factory() if kit.factory is not None else kit.platform
        target.devices()
        query(target)
    new_probe = frameworks_in(after_probe - before)
    new_rest = frameworks_in(set(sys.modules) - after_probe)
    if new_probe or new_rest:
        raise CheckFailedError(
            f"{kit.inprocess_note()}: the probe imported {new_probe or 'nothing'}, the "
            f"queries imported {new_rest or 'nothing'}"
        )
    if masked:
        raise CheckSkippedError(
            f"{kit.inprocess_note()}; {', '.join(masked)} already imported, so an import "
            "of it could not be seen"
        )
    return f"{kit.inprocess_note()}: nothing imported a framework"


def _check_no_device_context(kit: Kit, problems: list[str]) -> str:
    if kit.platform.context_free is False:
        raise CheckSkippedError("the platform declares context_free = False")
    run = kit.baseline
    if run is not None:
        if held := run.get("self_holders"):
            raise CheckFailedError(
                f"in a fresh process ({run['label']}): the process is listed among the memory "
                f"holders of device(s) {held}"
            )
        # A mapped runtime library is reported, not failed: mapping creates no context
        # (nvmlInit maps libcuda.so on R580 drivers, taking no device memory).
        libraries = run.get("libraries")
        loaded = f"; mapped {libraries} without holding memory" if libraries else ""
        return f"fresh process ({run['label']}): not a memory holder{loaded}"
    if held := held_here(kit.platform):
        raise CheckFailedError(
            f"{kit.inprocess_note()}: this process holds memory on device(s) {held} (if an "
            "earlier test created that context, isolate the kit)"
        )
    return f"{kit.inprocess_note()}: this process holds no device memory"


def _check_settle_idle(kit: Kit, problems: list[str]) -> str:
    from accelplat._memory import wait_for_memory_to_settle

    n = kit.need_devices()
    release = kit.platform.release
    window = release.stable_duration_s if release.lazy else 0.0
    timeout = window + 5.0 if kit.settle_timeout_s is None else kit.settle_timeout_s
    settle = {"platform": kit.platform, "timeout_s": timeout, "clock": kit.settle_clock}
    start = time.monotonic()
    result = call(
        "wait_for_memory_to_settle", wait_for_memory_to_settle, threshold_ratio=1.0, **settle
    )
    elapsed = time.monotonic() - start
    covered = set(result.snapshot.memory)
    if covered != set(range(n)):
        problems.append(f"the snapshot covers devices {sorted(covered)}, not 0..{n - 1}")
    limit = window + 1.0
    if result.waited_s > limit or elapsed > timeout + 1.0:
        problems.append(
            f"took {result.waited_s:.2f} s ({elapsed:.2f} s real) on an idle device; expected "
            f"at most {limit:.2f} s"
        )
    return f"settled in {result.waited_s:.3f} s after {result.polls} poll(s)"


def _count_with_env(kit: Kit, env_name: str, value: str) -> tuple[int | None, str]:
    """Return the device count a fresh platform sees with ``env_name=value``, and how."""
    # visible_devices_shadowed_by names variables that win over env_name when non-empty (ROCm:
    # HIP_VISIBLE_DEVICES over CUDA_VISIBLE_DEVICES); "" reads as unset to the runtime
    shadows = optional(kit.platform, "visible_devices_shadowed_by")
    changes = {name: "" for name in shadows if isinstance(name, str) and name != env_name}
    changes[env_name] = value
    run = kit.baseline
    if run is not None:
        answer = kit.run_child(run["spec"], env=changes, queries=False)
        if not answer.get("ok"):
            return None, f"the child failed: {answer.get('error')}"
        count = answer.get("device_count")
        return (count if isinstance(count, int) else None), "subprocess"
    if kit.platform.context_free is False:
        raise CheckSkippedError(
            f"{kit.inprocess_note()}; and the platform declares context_free = False: its "
            f"framework reads {env_name} once, when it starts, so changing it in this process "
            "shows nothing"
        )
    factory = kit.factory
    if factory is None:
        raise CheckSkippedError(
            f"{kit.inprocess_note()}; and no factory= to rebuild the platform with "
            f"{env_name} changed"
        )
    from unittest import mock

    with mock.patch.dict(os.environ, changes):
        try:
            probe = getattr(factory, "probe", None)
            if callable(probe):
                result = probe()
                if isinstance(result, ProbeResult) and not result.available:
                    return 0, "in-process (probe says unavailable)"
            return int(factory().device_count()), "in-process"
        except PlatformNotAvailableError:
            return 0, "in-process (not available)"
        except Exception as exc:
            return None, f"in-process: raised {describe_failure(exc)}"


def _check_visible_devices(kit: Kit, problems: list[str]) -> str:
    env_name = kit.platform.visible_devices_env
    if env_name is None:
        raise CheckSkippedError("the platform has no visible-devices variable")
    n = kit.count
    if n < 2:
        raise CheckSkippedError(f"{n} device(s) visible: hiding one cannot be shown")
    hides_all = kit.empty_visible_hides_all
    if hides_all is None:
        hides_all = optional(kit.platform, "visible_devices_empty_hides_all") is True
    cases = [("0", 1), *([("0,1", 2)] if n >= 3 else []), *([("", 0)] if hides_all else [])]
    seen: list[str] = []
    for value, expected in cases:
        got, how = _count_with_env(kit, env_name, value)
        seen.append(f"{env_name}={value!r} -> {got} ({how})")
        if got != expected:
            problems.append(f"{env_name}={value!r} gave {got} device(s), expected {expected}")
    if problems:
        raise CheckFailedError(f"{'; '.join(problems)} [{'; '.join(seen)}]")
    return "; ".join(seen)


_CHECKS: dict[str, Callable[[Kit, list[str]], str]] = {
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
"""Every check, in the order :func:`run_conformance` runs them."""


def run_conformance(
    platform: Platform | str,
    *,
    checks: Iterable[str] | None = None,
    factory: Callable[[], Any] | None = None,
    child: str | None = None,
    isolation: Isolation = "auto",
    sum_tolerance: Tolerance = SUM_TOLERANCE,
    stability_tolerance: Tolerance = STABILITY_TOLERANCE,
    settle_timeout_s: float | None = None,
    settle_clock: Any = None,
    empty_visible_hides_all: bool | None = None,
    env: Mapping[str, str] | None = None,
) -> ConformanceReport:
    """Run the conformance checks against a platform and report every verdict.

    ``platform``: an instance or a registered name (also used to rebuild it in a subprocess);
    ``checks``: names from :data:`CHECK_NAMES` (``None``: all); ``factory``: builds an
    equivalent platform for the in-process fallbacks; ``child``: how a fresh process rebuilds it
    (a name or ``"module:attr"``); ``isolation``: ``"auto"``, ``"inprocess"`` or
    ``"subprocess"``; the rest tune single checks (docs/writing-a-backend.md). Calls every query
    a few times, starts short-lived processes, may change ``os.environ`` for a moment.

    Returns:
        A :class:`ConformanceReport` (``passed`` is ``False`` when a check failed).

    Raises:
        ConfigurationError: For a bad option (naming it), an unknown check or platform name.
        PlatformNotAvailableError: When ``platform`` names a platform unavailable here.
    """
    options = dict(locals())  # every keyword option, by name, for the Kit
    del options["platform"], options["checks"]
    options["env"] = {} if env is None else env
    registered = platform if isinstance(platform, str) else None
    if registered is not None:
        platform = get_platform(registered)
    if checks is not None and (
        isinstance(checks, (str, bytes)) or not isinstance(checks, Iterable)
    ):
        raise ConfigurationError(f"checks must be an iterable of check names, got {checks!r:.200}")
    names = CHECK_NAMES if checks is None else tuple(checks)
    unknown = [n for n in names if not isinstance(n, str) or n not in _CHECKS]
    if unknown:
        raise ConfigurationError(
            f"checks: unknown conformance check(s) {unknown!r:.200}; valid: "
            f"{', '.join(CHECK_NAMES)}"
        )
    kit = Kit(platform, registered_name=registered, **options)
    results = []
    for name in names:
        problems: list[str] = []  # a check lists what is wrong here, or raises
        try:
            detail = _CHECKS[name](kit, problems)
            result = CheckResult(
                name, "fail" if problems else "pass", "; ".join(problems) or detail
            )
        except CheckFailedError as exc:
            result = CheckResult(name, "fail", str(exc))
        except CheckSkippedError as exc:
            result = CheckResult(name, "skip", str(exc))
        except Exception as exc:
            result = CheckResult(name, "fail", f"raised {describe_failure(exc)}")
        if (
            isolation == "subprocess"
            and name in _SUBPROCESS_CHECKS
            and result.verdict != "skip"
            and kit.baseline is None
        ):
            result = CheckResult(name, "fail", f"isolation='subprocess': {kit.baseline_note}")
        results.append(result)
    label = getattr(platform, "name", None)
    return ConformanceReport(
        platform=label if isinstance(label, str) else repr(platform), results=tuple(results)
    )


_SUBPROCESS_CHECKS = frozenset({"no_framework_import", "no_device_context", "visible_devices"})

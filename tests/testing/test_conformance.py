"""The conformance kit judges behaviour: a good platform passes, each defect fails its check.

The platforms below are defined at module level so that the kit can rebuild them in a fresh
process (``tests.testing.test_conformance:GoodPlatform``); their devices come from variables so
that the fresh process sees the same ones.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from accelplat import _registry as registry
from accelplat._platform import BasePlatform
from accelplat._types import (
    DeviceInfo,
    GraphSupport,
    HolderState,
    MemoryHolder,
    MemoryInfo,
    ProbeResult,
    ReleaseProfile,
)
from accelplat.errors import ConfigurationError, DeviceNotFoundError
from accelplat.testing import (
    CHECK_NAMES,
    CheckResult,
    ConformanceReport,
    make_conformance_test,
    run_conformance,
)
from accelplat.testing._kit import SUM_TOLERANCE, Tolerance

REPO = Path(__file__).resolve().parents[2]
GIB = 1024**3
MIB = 1024**2

ENV_DEVICES = "KIT_TEST_DEVICES"
ENV_VISIBLE = "KIT_TEST_VISIBLE"
ENV_RUNTIME = "KIT_TEST_FAKE_RUNTIME"
FAKE_FRAMEWORK = "paddle"

# Checks that start no subprocess: most defects are judged with these only, for speed.
LOCAL = tuple(
    c
    for c in CHECK_NAMES
    if c not in {"no_framework_import", "no_device_context", "visible_devices"}
)


class GoodPlatform(BasePlatform):
    """A well-behaved fake: ``KIT_TEST_DEVICES`` devices (default 3), visibility like CUDA's."""

    name = "kit-good"
    device_type = "npu"
    visible_devices_env = ENV_VISIBLE
    TOTAL = 8 * GIB

    @classmethod
    def probe(cls) -> ProbeResult:
        n = len(cls._visible())
        return ProbeResult(n > 0, f"{n} fake device(s)")

    @staticmethod
    def _visible() -> list[int]:
        physical = int(os.environ.get(ENV_DEVICES, "3"))
        raw = os.environ.get(ENV_VISIBLE)
        if raw is None:
            return list(range(physical))
        return [int(x) for x in raw.split(",") if x.strip() and int(x) < physical]

    def devices(self) -> Sequence[DeviceInfo]:
        return tuple(DeviceInfo(i, p, f"Fake NPU {p}") for i, p in enumerate(self._visible()))

    def _memory_info(self, device: int) -> MemoryInfo:
        used = (device + 1) * GIB // 4
        return MemoryInfo(
            free=self.TOTAL - used, total=self.TOTAL, used=used, reserved=GIB // 8, source="fake"
        )


class VirtualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


def run_local(platform: Any) -> ConformanceReport:
    """Run the checks that need no subprocess, waiting in virtual time."""
    return run_conformance(platform, checks=LOCAL, settle_clock=VirtualClock())


def failed(report: ConformanceReport) -> set[str]:
    return {r.name for r in report.failures}


def detail(report: ConformanceReport, name: str) -> str:
    return report.result(name).detail


@pytest.fixture(autouse=True)
def _fake_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_DEVICES, raising=False)
    monkeypatch.delenv(ENV_VISIBLE, raising=False)


# -- the good platform ---------------------------------------------------------------------------


def test_good_platform_passes_every_check_in_a_subprocess() -> None:
    report = run_conformance(GoodPlatform(), empty_visible_hides_all=True)
    assert report.passed, report.summary()
    assert [r.name for r in report.results] == list(CHECK_NAMES)
    assert {r.verdict for r in report.results} == {"pass"}
    assert "fresh process (ref 'tests.testing.test_conformance:GoodPlatform')" in detail(
        report, "no_framework_import"
    )
    assert detail(report, "visible_devices") == (
        "KIT_TEST_VISIBLE='0' -> 1 (subprocess); KIT_TEST_VISIBLE='0,1' -> 2 (subprocess); "
        "KIT_TEST_VISIBLE='' -> 0 (subprocess)"
    )


def test_report_api() -> None:
    report = run_conformance(GoodPlatform(), checks=["protocol", "devices"])
    assert report.platform == "kit-good"
    assert report.passed
    assert report.failures == ()
    assert report.result("devices").verdict == "pass"
    with pytest.raises(KeyError):
        report.result("graph")
    text = report.summary()
    assert text.splitlines()[0] == "conformance of 'kit-good': passed"
    assert "  PASS devices: 3 device(s): 0=Fake NPU 0, 1=Fake NPU 1, 2=Fake NPU 2" in text
    report.assert_passed()
    bad = ConformanceReport("x", (CheckResult("graph", "fail", "broken"), CheckResult("a", "skip")))
    assert not bad.passed
    assert bad.skipped == (CheckResult("a", "skip"),)
    with pytest.raises(AssertionError, match="FAIL graph: broken"):
        bad.assert_passed()


def test_unknown_check_name_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="unknown conformance check"):
        run_conformance(GoodPlatform(), checks=["protocol", "nope"])
    with pytest.raises(ConfigurationError, match="isolation"):
        run_conformance(GoodPlatform(), isolation="thread")  # type: ignore[arg-type]


def test_zero_devices_skips_memory_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VISIBLE, "")
    report = run_conformance(GoodPlatform(), checks=LOCAL)
    assert report.passed, report.summary()
    for name in ("memory_values", "memory_stable", "memory_holders", "settle_idle"):
        assert report.result(name).verdict == "skip"
        assert detail(report, name) == "no device is visible"
    assert report.result("bad_index").verdict == "pass"
    assert report.result("probe").verdict == "pass"  # unavailable is right with no device


# -- defects, one check at a time -----------------------------------------------------------------


class NoProbe(GoodPlatform):
    probe = None  # type: ignore[assignment]


class BoolProbe(GoodPlatform):
    @classmethod
    def probe(cls) -> Any:
        return True


class LyingProbe(GoodPlatform):
    @classmethod
    def probe(cls) -> ProbeResult:
        return ProbeResult(False, "driver missing")


class CountMismatch(GoodPlatform):
    def device_count(self) -> int:
        return len(self.devices()) + 1


class Misnumbered(GoodPlatform):
    def devices(self) -> Sequence[DeviceInfo]:
        return tuple(DeviceInfo(i + 1, i, "x") for i in range(3))


class SharedPhysical(GoodPlatform):
    def devices(self) -> Sequence[DeviceInfo]:
        return tuple(DeviceInfo(i, 0, "x") for i in range(3))


class UsedOverTotal(GoodPlatform):
    def _memory_info(self, device: int) -> MemoryInfo:
        return MemoryInfo(free=0, total=GIB, used=2 * GIB)


class FloatBytes(GoodPlatform):
    def _memory_info(self, device: int) -> MemoryInfo:
        return MemoryInfo(free=float(GIB), total=2 * GIB, used=GIB)  # type: ignore[arg-type]


class BoolBytes(GoodPlatform):
    def _memory_info(self, device: int) -> MemoryInfo:
        return MemoryInfo(free=GIB, total=2 * GIB, used=GIB, reserved=False)


class MiBUnits(GoodPlatform):
    def _memory_info(self, device: int) -> MemoryInfo:
        return MemoryInfo(free=8192, total=16384, used=8192)


class SumMismatch(GoodPlatform):
    """used excludes caches that free also excludes: 2 GiB vanish."""

    def _memory_info(self, device: int) -> MemoryInfo:
        return MemoryInfo(free=4 * GIB, total=8 * GIB, used=2 * GIB)


class ReservedInsideTotal(GoodPlatform):
    """A backend whose total includes the reserved part: accepted."""

    def _memory_info(self, device: int) -> MemoryInfo:
        return MemoryInfo(free=5 * GIB, total=8 * GIB, used=2 * GIB, reserved=GIB)


class Unstable(GoodPlatform):
    reads = 0

    def _memory_info(self, device: int) -> MemoryInfo:
        Unstable.reads += 1
        used = GIB if Unstable.reads % 2 else 3 * GIB
        return MemoryInfo(free=8 * GIB - used, total=8 * GIB, used=used)


class NaiveIndex(GoodPlatform):
    """Checks the range only, so True and False pass as 1 and 0."""

    def memory_info(self, device: int) -> MemoryInfo:
        if not 0 <= device < self.device_count():
            raise DeviceNotFoundError(device, self.device_count(), self.name)
        return self._memory_info(device)


class PlainIndexError(GoodPlatform):
    def memory_holders(self, device: int) -> Sequence[MemoryHolder] | None:
        if device not in range(self.device_count()):
            raise IndexError(device)
        return None


class BadHolders(GoodPlatform):
    def memory_holders(self, device: int) -> Any:
        self.check_device(device)
        return [{"pid": 1}, MemoryHolder(-5, None, HolderState.ALIVE)]


class WindowBeyondTimeout(GoodPlatform):
    RELEASE = ReleaseProfile(lazy=True, stable_duration_s=30.0, settle_timeout_s=10.0)


class FloorAboveDevice(GoodPlatform):
    RELEASE = ReleaseProfile(
        lazy=False, stable_duration_s=0, settle_timeout_s=1, idle_floor_bytes=9 * GIB
    )


class GraphWithoutApi(GoodPlatform):
    GRAPH = GraphSupport(True, None, "graphs work")


class GraphWithoutReason(GoodPlatform):
    GRAPH = GraphSupport(False, None, "")


class ThreadStart(GoodPlatform):
    preferred_start_method = "thread"  # type: ignore[assignment]


class BadName(GoodPlatform):
    name = "Kit Good"


@pytest.mark.parametrize(
    ("cls", "check", "fragment"),
    [
        (NoProbe, "probe", "offers no callable probe()"),
        (BoolProbe, "probe", "probe() returned True, not a ProbeResult"),
        (LyingProbe, "probe", "says unavailable (driver missing) while 3 device(s) answer"),
        (CountMismatch, "devices", "device_count() is 4 but devices() lists 3"),
        (Misnumbered, "devices", "devices()[0].index is 1, expected 0"),
        (SharedPhysical, "devices", "physical_index 0 appears twice"),
        (UsedOverTotal, "memory_values", "used=2147483648 is not within 0..total=1073741824"),
        (FloatBytes, "memory_values", "not int byte counts: free=1073741824.0"),
        (BoolBytes, "memory_values", "not int byte counts: reserved=False"),
        (MiBUnits, "memory_values", "total=16384 is below 1048576 bytes; are the values in bytes?"),
        (SumMismatch, "memory_values", "used + free - total = -2147483648 bytes"),
        (Unstable, "memory_stable", "2147483648 bytes between two back-to-back reads"),
        (NaiveIndex, "bad_index", "memory_info(True) returned MemoryInfo"),
        (PlainIndexError, "bad_index", "memory_holders(-1) raised IndexError: -1"),
        (BadHolders, "memory_holders", "{'pid': 1} is not a MemoryHolder"),
        (BadHolders, "memory_holders", "pid -5 is not a positive int"),
        (WindowBeyondTimeout, "release", "a settle wait could never succeed"),
        (FloorAboveDevice, "release", "exceeds every device's total"),
        (GraphWithoutApi, "graph", "available is True but api is None"),
        (GraphWithoutReason, "graph", "reason is '', not a non-empty str"),
        (ThreadStart, "preferred_start_method", "preferred_start_method is 'thread'"),
        (BadName, "protocol", "name is 'Kit Good', not a valid platform name"),
    ],
)
def test_each_defect_fails_its_check(cls: type[GoodPlatform], check: str, fragment: str) -> None:
    report = run_local(cls())
    assert not report.passed
    assert check in failed(report), report.summary()
    assert fragment in detail(report, check)


def test_defects_fail_only_their_own_check() -> None:
    """Checks are independent: one defect does not fail unrelated checks."""
    for cls, check in [
        (ThreadStart, "preferred_start_method"),
        (GraphWithoutApi, "graph"),
        (SumMismatch, "memory_values"),
        (NaiveIndex, "bad_index"),
        (LyingProbe, "probe"),
    ]:
        assert failed(run_local(cls())) == {check}, cls.__name__


def test_reserved_counted_inside_total_is_accepted() -> None:
    report = run_conformance(ReservedInsideTotal(), checks=["memory_values"])
    assert report.passed, report.summary()


def test_sum_tolerance_is_configurable() -> None:
    loose = Tolerance(min_bytes=3 * GIB, ratio=0.0)
    assert run_conformance(SumMismatch(), checks=["memory_values"], sum_tolerance=loose).passed
    assert SUM_TOLERANCE.allowed(GIB) == 64 * MIB
    assert SUM_TOLERANCE.allowed(80 * GIB) == int(0.005 * 80 * GIB)


@pytest.mark.parametrize("value", [0, 1.5, True, float("nan"), "0.9"])
def test_bad_default_utilization_fails(value: Any) -> None:
    cls = type("BadUtil", (GoodPlatform,), {"default_memory_utilization": value})
    report = run_conformance(cls(), checks=["default_memory_utilization"])
    assert failed(report) == {"default_memory_utilization"}


def test_registered_name_must_match_the_platform_name() -> None:
    registry.register_platform("other-name", GoodPlatform)
    report = run_conformance("other-name", checks=["protocol"])
    assert "registered as 'other-name'" in detail(report, "protocol")


def test_a_platform_that_raises_everywhere_gets_a_report_not_an_exception() -> None:
    class Hostile:
        name = "hostile"

        def __getattr__(self, attr: str) -> Any:
            raise RuntimeError(f"no {attr} for you")

    report = run_conformance(Hostile(), isolation="inprocess")  # type: ignore[arg-type]
    assert not report.passed
    assert failed(report) >= {"protocol", "devices", "release", "graph"}
    assert "missing: device_type" in detail(report, "protocol") or "raised" in detail(
        report, "protocol"
    )


def test_class_instead_of_instance_fails_protocol() -> None:
    report = run_conformance(GoodPlatform, checks=["protocol"])  # type: ignore[arg-type]
    assert "got the class GoodPlatform, not an instance" in detail(report, "protocol")


def test_optional_is_accelerator_must_be_a_bool() -> None:
    bad = type("SaysYes", (GoodPlatform,), {"is_accelerator": "yes"})
    report = run_conformance(bad(), checks=["protocol"])
    assert "is_accelerator is 'yes', not a bool" in detail(report, "protocol")


# -- settle ---------------------------------------------------------------------------------------


class Lazy(GoodPlatform):
    RELEASE = ReleaseProfile(lazy=True, stable_duration_s=2.0, settle_timeout_s=60.0)


class LazyJitter(Lazy):
    reads = 0

    def _memory_info(self, device: int) -> MemoryInfo:
        LazyJitter.reads += 1
        used = GIB if LazyJitter.reads % 2 else 3 * GIB
        return MemoryInfo(free=8 * GIB - used, total=8 * GIB, used=used)


def test_settle_on_a_lazy_platform_waits_its_window_in_virtual_time() -> None:
    report = run_conformance(Lazy(), checks=["settle_idle"], settle_clock=VirtualClock())
    assert report.passed, report.summary()
    assert detail(report, "settle_idle").startswith("settled in 2.0")


def test_settle_that_never_settles_fails() -> None:
    report = run_conformance(
        LazyJitter(), checks=["settle_idle"], settle_clock=VirtualClock(), settle_timeout_s=5.0
    )
    assert failed(report) == {"settle_idle"}
    assert "wait_for_memory_to_settle raised MemoryNotSettledError" in detail(report, "settle_idle")


# -- isolation: frameworks, contexts, visible devices ----------------------------------------------


@pytest.fixture
def fake_framework(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An importable stand-in for a framework, visible to child processes too."""
    pkg = tmp_path / FAKE_FRAMEWORK
    pkg.mkdir()
    (pkg / "__init__.py").write_text("IMPORTED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield FAKE_FRAMEWORK
    sys.modules.pop(FAKE_FRAMEWORK, None)


class ImportsInQueries(GoodPlatform):
    def _memory_info(self, device: int) -> MemoryInfo:
        importlib.import_module(FAKE_FRAMEWORK)
        return super()._memory_info(device)


class ImportsInQueriesDeclared(ImportsInQueries):
    context_free = False


class ImportsInProbe(GoodPlatform):
    context_free = False

    @classmethod
    def probe(cls) -> ProbeResult:
        importlib.import_module(FAKE_FRAMEWORK)
        return ProbeResult(True, "imported a framework to find out")


def test_framework_imported_by_queries_fails(fake_framework: str) -> None:
    report = run_conformance(ImportsInQueries(), checks=["no_framework_import"])
    assert failed(report) == {"no_framework_import"}
    assert "queries imported paddle" in detail(report, "no_framework_import")
    assert "fresh process" in detail(report, "no_framework_import")


def test_already_imported_framework_does_not_mask_the_subprocess_check(
    fake_framework: str,
) -> None:
    importlib.import_module(fake_framework)  # the caller already has it
    report = run_conformance(ImportsInQueries(), checks=["no_framework_import"])
    assert "queries imported paddle" in detail(report, "no_framework_import")


def test_context_free_false_allows_queries_but_not_the_probe(fake_framework: str) -> None:
    report = run_conformance(
        ImportsInQueriesDeclared(), checks=["no_framework_import", "no_device_context"]
    )
    assert report.passed, report.summary()
    assert report.result("no_device_context").verdict == "skip"
    assert "only the probe" in detail(report, "no_framework_import")
    report = run_conformance(ImportsInProbe(), checks=["no_framework_import"])
    assert "probe imported paddle" in detail(report, "no_framework_import")


class HoldsMemory(GoodPlatform):
    def memory_holders(self, device: int) -> Sequence[MemoryHolder] | None:
        self.check_device(device)
        return (MemoryHolder(os.getpid(), 512 * MIB, HolderState.SELF, "python"),)


def test_process_listed_as_holder_fails_no_device_context() -> None:
    report = run_conformance(HoldsMemory(), checks=["memory_holders", "no_device_context"])
    assert failed(report) == {"no_device_context"}
    assert "listed among the memory holders of device(s) [0, 1, 2]" in detail(
        report, "no_device_context"
    )


class LoadsRuntime(GoodPlatform):
    def _memory_info(self, device: int) -> MemoryInfo:
        ctypes.CDLL(os.environ[ENV_RUNTIME])
        return super()._memory_info(device)


def test_loading_a_device_runtime_is_reported_not_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = ctypes.util.find_library("m")
    if sys.platform != "linux" or found is None:
        pytest.skip("needs Linux and libm to stand in for a runtime library")
    source = next(
        (
            p / found
            for p in map(Path, ("/lib/x86_64-linux-gnu", "/usr/lib64", "/lib64", "/lib"))
            if (p / found).exists()
        ),
        None,
    )
    if source is None:
        pytest.skip(f"cannot locate {found}")
    fake = tmp_path / "libsycl.so.99"
    shutil.copy(source, fake)
    monkeypatch.setenv(ENV_RUNTIME, str(fake))
    # Mapping a runtime is no context (nvmlInit maps libcuda.so itself on R580 drivers); the
    # kit names the library in its detail and fails only when the process holds memory.
    report = run_conformance(LoadsRuntime(), checks=["no_device_context"])
    assert failed(report) == set()
    assert "mapped ['libsycl.so'] without holding memory" in detail(report, "no_device_context")


class IgnoresVisible(GoodPlatform):
    @staticmethod
    def _visible() -> list[int]:
        return list(range(3))


def test_visible_variable_that_hides_nothing_fails() -> None:
    report = run_conformance(IgnoresVisible(), checks=["visible_devices"])
    assert failed(report) == {"visible_devices"}
    assert "KIT_TEST_VISIBLE='0' gave 3 device(s), expected 1" in detail(report, "visible_devices")


def test_visible_devices_skips_without_a_variable_or_with_one_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cls = type("NoEnv", (GoodPlatform,), {"visible_devices_env": None})
    report = run_conformance(cls(), checks=["visible_devices"])
    assert detail(report, "visible_devices") == "the platform has no visible-devices variable"
    monkeypatch.setenv(ENV_DEVICES, "1")
    report = run_conformance(GoodPlatform(), checks=["visible_devices"])
    assert report.result("visible_devices").verdict == "skip"
    assert "1 device(s) visible" in detail(report, "visible_devices")


def test_unreproducible_platform_falls_back_to_the_caller_process() -> None:
    """A platform built from local state cannot be rebuilt in a child: the kit says so."""

    class Local(GoodPlatform):
        pass

    report = run_conformance(Local())
    assert report.passed, report.summary()
    assert "in-process: no way to rebuild the platform in a subprocess" in detail(
        report, "no_framework_import"
    )
    assert report.result("visible_devices").verdict == "skip"
    assert "no factory=" in detail(report, "visible_devices")
    # With a factory the in-process visible-devices check runs, changing the variable briefly.
    report = run_conformance(Local(), factory=Local, checks=["visible_devices"])
    assert report.passed, report.summary()
    assert "KIT_TEST_VISIBLE='0' -> 1 (in-process)" in detail(report, "visible_devices")
    assert ENV_VISIBLE not in os.environ
    bad = type("LocalIgnores", (IgnoresVisible,), {})
    report = run_conformance(bad(), factory=bad, checks=["visible_devices"])
    assert failed(report) == {"visible_devices"}


def test_child_that_sees_other_devices_is_not_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The child rebuilds from the class; a caller-built instance with other devices differs."""
    inst = GoodPlatform()
    monkeypatch.setattr(inst, "devices", lambda: (DeviceInfo(0, 7, "Hand-made"),))
    monkeypatch.setattr(inst, "device_count", lambda: 1)
    report = run_conformance(inst, checks=["no_framework_import"])
    assert "a fresh process could not reproduce it" in detail(report, "no_framework_import")
    report = run_conformance(inst, checks=["no_framework_import"], isolation="subprocess")
    assert failed(report) == {"no_framework_import"}


def test_inprocess_check_catches_an_import_when_not_masked(fake_framework: str) -> None:
    class LocalImports(ImportsInQueries):
        pass

    report = run_conformance(LocalImports(), checks=["no_framework_import"])
    assert failed(report) == {"no_framework_import"}
    assert "in-process" in detail(report, "no_framework_import")
    assert "the queries imported ['paddle']" in detail(report, "no_framework_import")
    # Now the framework is imported already: the in-process check cannot tell, and skips.
    report = run_conformance(LocalImports(), checks=["no_framework_import"])
    assert report.result("no_framework_import").verdict == "skip"
    assert "paddle already imported" in detail(report, "no_framework_import")


def test_explicit_child_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    inst = GoodPlatform()
    report = run_conformance(
        inst, child="tests.testing.test_conformance:GoodPlatform", checks=["no_device_context"]
    )
    assert "fresh process (ref 'tests.testing.test_conformance:GoodPlatform')" in detail(
        report, "no_device_context"
    )
    report = run_conformance(inst, child="no.such.module:X", checks=["no_device_context"])
    assert "ModuleNotFoundError" in detail(report, "no_device_context")


# -- packaging: no pytest at import; the pytest entry points -------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def test_testing_package_imports_no_pytest_and_accelplat_does_not_import_it() -> None:
    code = (
        "import sys, accelplat\n"
        "assert 'accelplat.testing' not in sys.modules\n"
        "import accelplat.testing\n"
        "print(sorted(m for m in ('pytest', '_pytest', 'torch') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), check=True
    )
    assert out.stdout.strip() == "[]"


def test_make_conformance_test_reports_each_check() -> None:
    test = make_conformance_test(GoodPlatform, checks=LOCAL)
    marks = test.pytestmark  # type: ignore[attr-defined]
    assert marks[0].args == ("check", CHECK_NAMES)
    test("memory_values")  # passes
    with pytest.raises(pytest.skip.Exception, match="was not selected"):
        test("visible_devices")
    bad = make_conformance_test(SumMismatch(), checks=LOCAL)
    with pytest.raises(pytest.fail.Exception, match="memory_values: device 0"):
        bad("memory_values")
    bad("graph")


PLUGIN_SOURCE = """
    from accelplat import BasePlatform
    from accelplat.types import DeviceInfo, MemoryInfo, ProbeResult

    class BadNpu(BasePlatform):
        name = "kit-bad"

        @classmethod
        def probe(cls):
            return ProbeResult(True, "always")

        def devices(self):
            return (DeviceInfo(0, 0, "bad npu"),)

        def _memory_info(self, device):
            return MemoryInfo(free=3 << 30, total=8 << 30, used=1 << 30)  # 4 GiB unaccounted
"""


def _run_pytest(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--pyargs",
            "accelplat.testing._conformance",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        check=False,
        timeout=120,
    )


def test_pytest_entry_passes_for_cpu_via_the_variable(tmp_path: Path) -> None:
    out = _run_pytest(env=_env(ACCELPLAT_PLATFORM="cpu"), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "14 passed, 1 skipped" in out.stdout


def test_pytest_entry_fails_a_bad_plugin_and_names_the_check(tmp_path: Path) -> None:
    info = tmp_path / "kit_bad-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kit-bad\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[accelplat.platforms]\nkit-bad = kit_bad:BadNpu\n")
    (tmp_path / "kit_bad.py").write_text(textwrap.dedent(PLUGIN_SOURCE))
    env = _env(ACCELPLAT_PLATFORM="kit-bad")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    out = _run_pytest(env=env, cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAILED" in out.stdout
    assert "test_conformance[memory_values]" in out.stdout
    assert "used + free - total = -4294967296 bytes" in out.stdout
    assert "1 failed, 13 passed, 1 skipped" in out.stdout


def test_pytest_entry_with_the_plugin_option(tmp_path: Path) -> None:
    plugin = importlib.import_module("accelplat.pytest_plugin")
    if not hasattr(plugin, "pytest_addoption"):
        pytest.skip("accelplat.pytest_plugin does not add --accelplat-platform yet")
    from importlib.metadata import entry_points

    autoloaded = any(ep.value == "accelplat.pytest_plugin" for ep in entry_points(group="pytest11"))
    load = () if autoloaded else ("-p", "accelplat.pytest_plugin")
    out = _run_pytest(*load, "--accelplat-platform", "cpu", env=_env(), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "14 passed, 1 skipped" in out.stdout


def test_child_answer_is_json_with_stages(tmp_path: Path) -> None:
    """The child protocol itself: stages, frameworks and devices, as the parent reads them."""
    from accelplat.testing._child import BOOTSTRAP

    out = tmp_path / "answer.json"
    job = {"kind": "ref", "value": "tests.testing.test_conformance:GoodPlatform", "queries": True}
    job["out"] = str(out)
    subprocess.run(
        [sys.executable, "-c", BOOTSTRAP, json.dumps(job)], env=_env(), check=True, timeout=60
    )
    answer = json.loads(out.read_text())
    assert answer["ok"] is True
    assert answer["device_count"] == 3
    assert set(answer["frameworks"]) == {"import", "probe", "construct", "queries"}
    assert answer["self_holders"] == []


class Rooted(GoodPlatform):
    """Built over a fake root: its argument-less probe describes the real machine."""

    def __init__(self, root: str | None = None) -> None:
        self.root = root

    @classmethod
    def probe(cls) -> ProbeResult:
        return ProbeResult(False, "nothing under /sys")

    def _visible(self) -> list[int]:  # type: ignore[override]
        return [0, 1] if self.root else []


def test_probe_of_a_platform_built_with_arguments_is_not_compared() -> None:
    report = run_conformance(Rooted("/fake"), checks=["probe"])
    assert report.passed, report.summary()
    assert "describes another setup" in detail(report, "probe")
    # Built without arguments, the same class must agree with its probe.
    lying = type("LyingRooted", (Rooted,), {"_visible": lambda self: [0, 1]})
    assert failed(run_conformance(lying(), checks=["probe"])) == {"probe"}


def test_platform_attribute_asks_for_the_empty_value_case() -> None:
    report = run_conformance(DeclaresEmptyHidesAll(), checks=["visible_devices"])
    assert report.passed, report.summary()
    assert "KIT_TEST_VISIBLE='' -> 0 (subprocess)" in detail(report, "visible_devices")
    broken = run_conformance(EmptyShowsAll(), checks=["visible_devices"])
    assert "KIT_TEST_VISIBLE='' gave 3 device(s), expected 0" in detail(broken, "visible_devices")
    # The keyword overrides the attribute.
    report = run_conformance(
        EmptyShowsAll(), checks=["visible_devices"], empty_visible_hides_all=False
    )
    assert report.passed, report.summary()


class DeclaresEmptyHidesAll(GoodPlatform):
    visible_devices_empty_hides_all = True


class EmptyShowsAll(DeclaresEmptyHidesAll):
    @staticmethod
    def _visible() -> list[int]:
        raw = os.environ.get(ENV_VISIBLE)
        if not raw:
            return list(range(3))
        return [int(x) for x in raw.split(",")]


class MemoryExplodes(GoodPlatform):
    def _memory_info(self, device: int) -> MemoryInfo:
        raise RuntimeError("driver went away")


def test_a_query_that_raises_fails_its_checks_only() -> None:
    report = run_local(MemoryExplodes())
    assert failed(report) == {"memory_values", "memory_stable", "settle_idle"}
    assert detail(report, "memory_values") == (
        "memory_info(0) raised RuntimeError: driver went away"
    )

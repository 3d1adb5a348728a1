"""Registry rules: forcing, plugins versus built-ins, broken plugins, laziness, caching, fork."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from accelplat import _registry as registry
from accelplat._platform import BasePlatform
from accelplat._types import Candidate, DeviceInfo, MemoryInfo, ProbeResult
from accelplat.errors import AccelplatError, ConfigurationError, PlatformNotAvailableError

REPO = Path(__file__).resolve().parents[1]
GIB = 1024**3

# -- stub platforms --------------------------------------------------------------------------

CALLS: dict[str, int] = {}


def _count(key: str) -> None:
    CALLS[key] = CALLS.get(key, 0) + 1


@pytest.fixture(autouse=True)
def _clear_calls() -> Iterator[None]:
    CALLS.clear()
    yield
    CALLS.clear()


def make_platform(
    name: str, *, available: bool = True, devices: int = 1, **attrs: Any
) -> type[BasePlatform]:
    """Return a platform class that counts probes and constructions."""

    def probe(cls: type[BasePlatform]) -> ProbeResult:
        _count(f"probe:{name}")
        return ProbeResult(available, f"{name} stub {'present' if available else 'absent'}")

    def init(self: BasePlatform) -> None:
        _count(f"init:{name}")

    def devs(self: BasePlatform) -> Sequence[DeviceInfo]:
        return tuple(DeviceInfo(i, i, f"{name} {i}") for i in range(devices))

    def mem(self: BasePlatform, device: int) -> MemoryInfo:
        return MemoryInfo(free=GIB, total=2 * GIB, used=GIB)

    ns: dict[str, Any] = {
        "name": name,
        "probe": classmethod(probe),
        "__init__": init,
        "devices": devs,
        "_memory_info": mem,
    }
    ns.update(attrs)
    return type(f"Stub_{name.replace('-', '_')}", (BasePlatform,), ns)


@pytest.fixture
def builtins_stubbed() -> dict[str, type[BasePlatform]]:
    """Replace the built-ins by stubs: cuda, rocm, xpu absent, cpu present."""
    stubs = {
        "cuda": make_platform("cuda", available=False),
        "rocm": make_platform("rocm", available=False),
        "xpu": make_platform("xpu", available=False),
        "cpu": make_platform("cpu"),
    }
    for name, cls in stubs.items():
        registry.register_platform(name, cls, override=True)
    return stubs


def names(candidates: Sequence[Candidate]) -> list[str]:
    return [c.name for c in candidates]


def by_name(candidates: Sequence[Candidate], name: str) -> Candidate:
    for c in candidates:
        if c.name == name:
            return c
    raise AssertionError(f"{name} not among {names(candidates)}")


# -- path-based distributions with entry points --------------------------------------------

_counter = itertools.count()


@pytest.fixture
def dist_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., str]]:
    """Create distributions advertising ``accelplat.platforms`` entry points on ``sys.path``.

    Returns a function ``make(entry_points: dict[name, "mod:attr"], modules: dict[mod, source],
    dist=None) -> dist name``; module names should come from ``unique()``.
    """
    created: list[str] = []
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(entry_points: dict[str, str], modules: dict[str, str], dist: str | None = None) -> str:
        dist = dist or f"plugin_dist_{next(_counter)}"
        info = tmp_path / f"{dist}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        lines = ["[accelplat.platforms]", *(f"{k} = {v}" for k, v in entry_points.items())]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        for mod, source in modules.items():
            (tmp_path / f"{mod}.py").write_text(textwrap.dedent(source))
            created.append(mod)
        import importlib

        importlib.invalidate_caches()
        registry._entry_points_loaded = False  # discovery already ran (e.g. register_platform)
        return dist

    yield make
    for mod in created:
        sys.modules.pop(mod, None)


def unique(stem: str) -> str:
    return f"{stem}_{os.getpid()}_{next(_counter)}"


GOOD_PLUGIN = """
    from accelplat import BasePlatform
    from accelplat.types import DeviceInfo, MemoryInfo, ProbeResult

    class Plugin(BasePlatform):
        name = "{name}"

        @classmethod
        def probe(cls):
            return ProbeResult({available}, "plugin {name} says {available}")

        def devices(self):
            return (DeviceInfo(0, 0, "plugin device"),)

        def _memory_info(self, device):
            return MemoryInfo(free=1 << 30, total=1 << 31, used=1 << 30)
"""


def good_plugin(name: str, available: bool = True) -> str:
    return textwrap.dedent(GOOD_PLUGIN.format(name=name, available=available))


# -- forcing -----------------------------------------------------------------------------------


def test_forced_name_selects_any_registered_platform(
    builtins_stubbed: dict[str, type[BasePlatform]], monkeypatch: pytest.MonkeyPatch
) -> None:
    registry.register_platform("my-npu", make_platform("my-npu"))
    monkeypatch.setenv("ACCELPLAT_PLATFORM", " XPU ")  # blanks and case do not matter
    registry.register_platform("xpu", make_platform("xpu"), override=True)
    assert registry.current_platform().name == "xpu"
    registry.reset()
    registry.register_platform("my-npu", make_platform("my-npu"))
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "my-npu")
    assert registry.current_platform().name == "my-npu"
    report = registry.detect()
    assert report.chosen == "my-npu"
    assert report.forced == "my-npu"
    assert report.candidates[0].builtin is False
    assert "forced by ACCELPLAT_PLATFORM" in report.candidates[0].reason


def test_forcing_probes_only_the_forced_platform(
    builtins_stubbed: dict[str, type[BasePlatform]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "cpu")
    registry.current_platform()
    assert CALLS == {"probe:cpu": 1, "init:cpu": 1}


def test_unknown_forced_name_lists_valid_names(
    builtins_stubbed: dict[str, type[BasePlatform]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "tpu")
    with pytest.raises(ConfigurationError, match=r"unknown platform 'tpu'.*cpu, cuda"):
        registry.current_platform()
    report = registry.detect()  # never raises: the error is in the report
    assert report.chosen is None
    assert report.error is not None
    assert "tpu" in report.error


def test_forced_platform_that_is_absent_names_the_reason(
    builtins_stubbed: dict[str, type[BasePlatform]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "rocm")
    with pytest.raises(PlatformNotAvailableError, match="rocm stub absent") as info:
        registry.current_platform()
    assert info.value.platform == "rocm"
    report = registry.detect()
    assert report.chosen is None
    assert report.candidates == (Candidate("rocm", False, False, "rocm stub absent", True),)


def test_forced_broken_plugin_raises_platform_not_available(
    builtins_stubbed: dict[str, type[BasePlatform]],
    dist_factory: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mod = unique("broken")
    dist_factory({"broken-npu": f"{mod}:Plugin"}, {mod: "raise ImportError('no libnpu.so')"})
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "broken-npu")
    with pytest.raises(PlatformNotAvailableError, match=r"import failed: ImportError: no libnpu"):
        registry.current_platform()


def test_set_current_platform_overrides_the_variable(
    builtins_stubbed: dict[str, type[BasePlatform]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "rocm")  # absent: would raise
    registry.set_current_platform("cpu")
    assert registry.current_platform().name == "cpu"
    assert registry.detect().candidates[0].reason.startswith("forced by set_current_platform()")
    instance = make_platform("mine")()
    registry.set_current_platform(instance)
    assert registry.current_platform() is instance
    assert registry.detect().chosen == "mine"
    registry.set_current_platform(None)
    with pytest.raises(PlatformNotAvailableError):
        registry.current_platform()


def test_set_current_platform_rejects_bad_values(
    builtins_stubbed: dict[str, type[BasePlatform]],
) -> None:
    with pytest.raises(ConfigurationError, match="unknown platform 'nope'"):
        registry.set_current_platform("nope")
    with pytest.raises(ConfigurationError, match=r"missing: .*memory_info"):
        registry.set_current_platform(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="class, not an instance"):
        registry.set_current_platform(make_platform("cls"))  # type: ignore[arg-type]


def test_use_platform_restores_the_previous_state(
    builtins_stubbed: dict[str, type[BasePlatform]],
) -> None:
    registry.register_platform("other", make_platform("other"))
    registry.set_current_platform("cpu")
    before = registry.current_platform()
    with registry.use_platform("other") as p:
        assert p.name == "other"
        assert registry.current_platform() is p
        with registry.use_platform("cpu") as inner:
            assert inner.name == "cpu"
        assert registry.current_platform() is p
    assert registry.current_platform() is before
    with pytest.raises(RuntimeError, match="boom"), registry.use_platform("other"):
        raise RuntimeError("boom")
    assert registry.current_platform() is before
    with pytest.raises(ConfigurationError), registry.use_platform("nope"):
        pass
    assert registry.current_platform() is before


# -- plugins versus built-ins ------------------------------------------------------------------


def test_single_available_third_party_platform_wins_over_builtins(
    builtins_stubbed: dict[str, type[BasePlatform]],
) -> None:
    registry.register_platform("npu", make_platform("npu"))
    registry.register_platform("absent-npu", make_platform("absent-npu", available=False))
    assert registry.current_platform().name == "npu"
    # "only what it must": the built-ins were not even probed
    assert not any(k.startswith("probe:c") or k.startswith("probe:x") for k in CALLS)
    report = registry.detect()
    assert report.chosen == "npu"
    builtins = [row.name for row in registry.BUILTINS if row.detected]  # in the rows' order
    assert names(report.candidates) == ["npu", "absent-npu", *builtins]
    assert [c.chosen for c in report.candidates] == [True] + [False] * (1 + len(builtins))
    assert by_name(report.candidates, "cpu").available is True
    assert by_name(report.candidates, "npu").builtin is False
    assert by_name(report.candidates, "cpu").builtin is True


def test_two_available_third_party_platforms_are_an_error_naming_both(
    builtins_stubbed: dict[str, type[BasePlatform]],
) -> None:
    registry.register_platform("npu-a", make_platform("npu-a"))
    registry.register_platform("npu-b", make_platform("npu-b"))
    with pytest.raises(ConfigurationError) as info:
        registry.current_platform()
    text = str(info.value)
    assert "'npu-a'" in text
    assert "'npu-b'" in text
    assert "ACCELPLAT_PLATFORM=<name>" in text
    assert "ACCELPLAT_PLUGINS" in text
    report = registry.detect()
    assert report.chosen is None
    assert report.error == text


def test_two_available_plugins_resolved_by_forcing(
    builtins_stubbed: dict[str, type[BasePlatform]], monkeypatch: pytest.MonkeyPatch
) -> None:
    registry.register_platform("npu-a", make_platform("npu-a"))
    registry.register_platform("npu-b", make_platform("npu-b"))
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "npu-b")
    assert registry.current_platform().name == "npu-b"


def test_builtins_are_probed_in_order_and_stop_at_the_first_available(
    builtins_stubbed: dict[str, type[BasePlatform]],
) -> None:
    registry.register_platform("rocm", make_platform("rocm"), override=True)
    assert registry.current_platform().name == "rocm"
    assert "probe:cuda" in CALLS
    assert "probe:xpu" not in CALLS
    assert "probe:cpu" not in CALLS
    report = registry.detect()
    assert [c.name for c in report.candidates if c.chosen] == ["rocm"]
    assert by_name(report.candidates, "cpu").available  # probed by detect()


def test_simulated_is_never_auto_detected(
    builtins_stubbed: dict[str, type[BasePlatform]],
) -> None:
    registry.register_platform("simulated", make_platform("simulated"), override=True)
    assert registry.current_platform().name == "cpu"
    assert "simulated" not in names(registry.detect().candidates)
    assert "simulated" in registry.available_platforms()


def test_no_platform_at_all_is_reported(
    builtins_stubbed: dict[str, type[BasePlatform]],
) -> None:
    registry.register_platform("cpu", make_platform("cpu", available=False), override=True)
    with pytest.raises(AccelplatError, match="no platform detected"):
        registry.current_platform()
    report = registry.detect()
    assert report.chosen is None
    assert report.error == "no platform is available"


# -- broken plugins ---------------------------------------------------------------------------


def test_plugin_whose_import_raises_is_skipped_with_reason(
    builtins_stubbed: dict[str, type[BasePlatform]], dist_factory: Callable[..., str]
) -> None:
    bad, worse, good = unique("bad"), unique("worse"), unique("good")
    dist_factory(
        {
            "bad-npu": f"{bad}:Plugin",
            "exiting-npu": f"{worse}:Plugin",
            "good-npu": f"{good}:Plugin",
        },
        {
            bad: "raise ImportError('libbad.so: cannot open shared object file')",
            worse: "import sys\nsys.exit(3)",
            good: good_plugin("good-npu"),
        },
    )
    assert registry.current_platform().name == "good-npu"
    report = registry.detect()
    assert report.chosen == "good-npu"
    c = by_name(report.candidates, "bad-npu")
    assert not c.available
    assert not c.builtin
    assert c.reason == (
        "skipped: import failed: ImportError: libbad.so: cannot open shared object file"
    )
    assert by_name(report.candidates, "exiting-npu").reason == (
        "skipped: import failed: SystemExit: 3"
    )


def test_plugin_whose_entry_point_names_a_missing_attribute_is_skipped(
    builtins_stubbed: dict[str, type[BasePlatform]], dist_factory: Callable[..., str]
) -> None:
    mod = unique("noattr")
    dist_factory({"noattr": f"{mod}:Missing", "notcallable": f"{mod}:VALUE"}, {mod: "VALUE = 3"})
    report = registry.detect()
    assert "AttributeError" in by_name(report.candidates, "noattr").reason
    assert "neither a class nor a factory" in by_name(report.candidates, "notcallable").reason
    assert report.chosen == "cpu"


@pytest.mark.parametrize(
    ("probe_body", "reason"),
    [
        ("raise RuntimeError('driver exploded')", "probe failed: RuntimeError: driver exploded"),
        ("return 'yes'", "probe() returned 'yes', not a ProbeResult"),
        ("return ProbeResult(1, 'x')", "malformed"),
    ],
)
def test_plugin_whose_probe_fails_is_skipped_with_reason(
    builtins_stubbed: dict[str, type[BasePlatform]], probe_body: str, reason: str
) -> None:
    ns: dict[str, Any] = {"ProbeResult": ProbeResult}
    exec(f"def probe(cls):\n    {probe_body}\n", ns)
    registry.register_platform("odd", make_platform("odd", probe=classmethod(ns["probe"])))
    report = registry.detect()
    assert report.chosen == "cpu"
    c = by_name(report.candidates, "odd")
    assert not c.available
    assert reason in c.reason
    assert registry.current_platform().name == "cpu"


def test_probe_returning_a_bool_is_accepted(
    builtins_stubbed: dict[str, type[BasePlatform]],
) -> None:
    cls = make_platform("boolish", probe=classmethod(lambda cls: True))
    registry.register_platform("boolish", cls)
    assert registry.current_platform().name == "boolish"
    assert by_name(registry.detect().candidates, "boolish").reason == "probe() returned True"


def test_factory_without_probe_is_assumed_available(
    builtins_stubbed: dict[str, type[BasePlatform]],
) -> None:
    cls = make_platform("made")

    def factory() -> BasePlatform:
        return cls()

    registry.register_platform("made", factory)
    assert registry.current_platform().name == "made"
    assert "assumed available" in by_name(registry.detect().candidates, "made").reason


class _NoMemory:
    name = "half"
    device_type = "npu"
    visible_devices_env = None
    release = BasePlatform.RELEASE
    graph = BasePlatform.GRAPH
    default_memory_utilization = 0.9
    preferred_start_method = "spawn"
    context_free = True

    @classmethod
    def probe(cls) -> ProbeResult:
        return ProbeResult(True, "present")

    def device_count(self) -> int:
        return 1

    def devices(self) -> Sequence[DeviceInfo]:
        return (DeviceInfo(0, 0, "half"),)


class _RaisingProperty(_NoMemory):
    def memory_info(self, device: int) -> MemoryInfo:
        raise NotImplementedError

    def memory_holders(self, device: int) -> None:
        return None

    @property
    def graph(self) -> Any:  # type: ignore[override]
        raise RuntimeError("graph probing crashed")


def test_class_that_does_not_satisfy_the_protocol_is_reported_not_crashed_on(
    builtins_stubbed: dict[str, type[BasePlatform]], monkeypatch: pytest.MonkeyPatch
) -> None:
    registry.register_platform("half", _NoMemory)
    registry.register_platform("raising", _RaisingProperty)
    registry.register_platform("classy", lambda: _NoMemory)
    assert registry.current_platform().name == "cpu"
    report = registry.detect()
    assert report.chosen == "cpu"
    half = by_name(report.candidates, "half")
    assert not half.available
    assert "does not satisfy the Platform protocol (missing: memory_info, memory_holders)" in (
        half.reason
    )
    assert "graph raised RuntimeError: graph probing crashed" in (
        by_name(report.candidates, "raising").reason
    )
    assert "returned a class" in by_name(report.candidates, "classy").reason
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "half")
    registry.set_current_platform(None)  # forget the cached detection
    with pytest.raises(PlatformNotAvailableError, match="missing: memory_info"):
        registry.current_platform()


def test_plugin_whose_constructor_raises_is_skipped(
    builtins_stubbed: dict[str, type[BasePlatform]],
) -> None:
    def explode(self: Any) -> None:
        raise OSError("device node busy")

    registry.register_platform("ctor", make_platform("ctor", __init__=explode))
    c = by_name(registry.detect().candidates, "ctor")
    assert c.reason == "skipped: construction failed: OSError: device node busy"


def test_protocol_problems_lists_every_member() -> None:
    assert registry.protocol_problems(make_platform("ok")()) == ()
    problems = registry.protocol_problems(object())
    assert problems[0].startswith("missing: name, device_type")
    assert set(problems[0].removeprefix("missing: ").split(", ")) == {
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
    }


# -- hanging probes ---------------------------------------------------------------------------

GATE = threading.Event()


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    GATE.clear()
    yield GATE
    GATE.set()


def test_hanging_probe_is_bounded_and_not_restarted(
    builtins_stubbed: dict[str, type[BasePlatform]],
    monkeypatch: pytest.MonkeyPatch,
    gate: threading.Event,
) -> None:
    def slow_probe(cls: Any) -> ProbeResult:
        _count("slow")
        gate.wait(120)
        return ProbeResult(True, "finally")

    registry.register_platform("slow", make_platform("slow", probe=classmethod(slow_probe)))
    # The limit must leave the other (instant) probes time to finish on a loaded machine; the
    # hanging one is held by the gate until the test opens it, far beyond the limit.
    monkeypatch.setenv("ACCELPLAT_PROBE_TIMEOUT_S", "1")
    report = registry.detect()
    pending = registry._registered["slow"].pending
    assert pending is not None
    assert pending.is_alive()  # detection returned while the probe was still stuck in it
    c = by_name(report.candidates, "slow")
    assert not c.available
    assert c.reason.startswith("skipped: load or probe did not finish within 1 s")
    assert report.chosen == "cpu"
    # A second detection does not pile up another stuck thread.
    c2 = by_name(registry.detect().candidates, "slow")
    assert "still running" in c2.reason
    assert CALLS["slow"] == 1
    assert registry.current_platform().name == "cpu"
    # Once it finishes, the next detection probes it again, and it wins.
    gate.set()
    pending.join(60)
    assert not pending.is_alive()
    registry.set_current_platform(None)
    assert registry.current_platform().name == "slow"
    assert CALLS["slow"] == 2


IMPORT_GATE = threading.Event()


def test_hanging_plugin_import_is_bounded(
    builtins_stubbed: dict[str, type[BasePlatform]],
    dist_factory: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    IMPORT_GATE.clear()
    mod = unique("hang")
    dist_factory(
        {"hang": f"{mod}:Plugin"},
        {mod: "import tests.test_registry as t\nt.IMPORT_GATE.wait(120)\n" + good_plugin("hang")},
    )
    monkeypatch.setenv("ACCELPLAT_PROBE_TIMEOUT_S", "1")  # time for the instant ones, loaded
    try:
        report = registry.detect()
        pending = registry._registered["hang"].pending
        assert pending is not None
        assert pending.is_alive()  # detection returned while the import was still stuck
        assert "did not finish within 1 s" in by_name(report.candidates, "hang").reason
        assert report.chosen == "cpu"
    finally:
        IMPORT_GATE.set()
        pending = registry._registered["hang"].pending
        if pending is not None:
            pending.join(60)


@pytest.mark.parametrize("value", ["abc", "0", "-1", "inf", "nan"])
def test_malformed_probe_timeout_is_a_configuration_error(
    builtins_stubbed: dict[str, type[BasePlatform]],
    monkeypatch: pytest.MonkeyPatch,
    value: str,
) -> None:
    monkeypatch.setenv("ACCELPLAT_PROBE_TIMEOUT_S", value)
    with pytest.raises(ConfigurationError, match="ACCELPLAT_PROBE_TIMEOUT_S"):
        registry.current_platform()
    assert "ACCELPLAT_PROBE_TIMEOUT_S" in (registry.detect().error or "")


def test_builtin_and_plugin_probes_both_run_in_a_bounded_thread() -> None:
    seen: list[str] = []

    class Probe:
        @classmethod
        def probe(cls) -> ProbeResult:
            seen.append(threading.current_thread().name)
            return ProbeResult(False, "x")

    entry = registry._Entry("x", "built-in", loaded=Probe)
    registry._consider(entry, 1.0)
    entry2 = registry._Entry("y", "test", loaded=Probe)
    registry._consider(entry2, 1.0)
    assert seen == ["accelplat-probe-x", "accelplat-probe-y"]


def test_quick_absence_checks_and_the_cpu_builtin_run_without_a_worker_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GPU platform ruled out by its absence check, and the CPU platform, start no thread.

    Both only read host files (and ask the loader for a library); the thread bounds work that
    talks to a driver or comes from a plugin.
    """
    seen: list[str] = []

    def absent() -> str:
        seen.append(threading.current_thread().name)
        return "no such hardware here"

    monkeypatch.setattr(sys.modules[__name__], "_absence_for_test", absent, raising=False)
    row = registry.Builtin("gpu", "builtins:object", f"{__name__}:_absence_for_test")
    gpu = registry._Entry("gpu", "built-in", row)
    assert registry._consider(gpu, 1.0).reason == "no such hardware here"
    assert gpu.pending is None
    assert registry._BUILTINS["cpu"].in_caller
    cpu = registry._Entry("cpu", "built-in", registry._BUILTINS["cpu"])
    started: list[threading.Thread] = []
    real_start = threading.Thread.start

    def counting_start(thread: threading.Thread) -> None:
        started.append(thread)
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    assert registry._consider(cpu, 1.0).available
    assert started == []
    assert seen == [threading.current_thread().name]
    assert not any(registry._BUILTINS[n].in_caller for n in ("cuda", "rocm", "xpu"))


# -- entry points and ACCELPLAT_PLUGINS ---------------------------------------------------------


def test_entry_point_plugins_are_discovered_but_not_loaded(
    builtins_stubbed: dict[str, type[BasePlatform]], dist_factory: Callable[..., str]
) -> None:
    mod = unique("lazy")
    dist_factory({"lazy-npu": f"{mod}:Plugin"}, {mod: good_plugin("lazy-npu", available=False)})
    assert "lazy-npu" in registry.available_platforms()
    assert mod not in sys.modules
    report = registry.detect()
    assert mod in sys.modules
    assert by_name(report.candidates, "lazy-npu").reason == "plugin lazy-npu says False"


def test_acceplat_plugins_limits_which_plugins_load(
    builtins_stubbed: dict[str, type[BasePlatform]],
    dist_factory: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = unique("pa"), unique("pb")
    dist_factory(
        {"npu-a": f"{a}:Plugin", "npu-b": f"{b}:Plugin"},
        {a: good_plugin("npu-a"), b: good_plugin("npu-b")},
    )
    monkeypatch.setenv("ACCELPLAT_PLUGINS", " npu-b , typo-npu")
    assert registry.current_platform().name == "npu-b"
    assert a not in sys.modules
    report = registry.detect()
    assert "npu-a" not in names(report.candidates)
    typo = by_name(report.candidates, "typo-npu")
    assert "ACCELPLAT_PLUGINS names 'typo-npu', but no installed plugin" in typo.reason
    assert "npu-a" not in registry.available_platforms()
    # Forcing an excluded plugin says why instead of "unknown".
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "npu-a")
    registry.set_current_platform(None)
    with pytest.raises(ConfigurationError, match="installed plugin, but ACCELPLAT_PLUGINS"):
        registry.current_platform()
    with pytest.raises(ConfigurationError, match="ACCELPLAT_PLUGINS"):
        registry.get_platform("npu-a")


def test_empty_acceplat_plugins_loads_none_and_reads_no_metadata(
    builtins_stubbed: dict[str, type[BasePlatform]],
    dist_factory: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mod = unique("none")
    dist_factory({"npu": f"{mod}:Plugin"}, {mod: good_plugin("npu")})
    registry.reset()
    builtin_stubs = {
        n: make_platform(n, available=n == "cpu") for n in ("cuda", "rocm", "xpu", "cpu")
    }
    monkeypatch.setenv("ACCELPLAT_PLUGINS", "")
    import importlib.metadata

    def forbidden(**kwargs: Any) -> Any:
        raise AssertionError("entry points were read")

    monkeypatch.setattr(importlib.metadata, "entry_points", forbidden)
    for n, cls in builtin_stubs.items():
        registry._registered.setdefault(n, registry._Entry(n, "t", loaded=cls))
    assert registry.current_platform().name == "cpu"
    assert mod not in sys.modules
    # register_platform calls are not plugins: the variable does not limit them
    monkeypatch.undo()
    monkeypatch.setenv("ACCELPLAT_PLUGINS", "")
    registry.register_platform("mine", make_platform("mine"))
    assert registry.current_platform().name == "mine"


def test_entry_point_discovery_problems_are_reported(
    builtins_stubbed: dict[str, type[BasePlatform]], dist_factory: Callable[..., str]
) -> None:
    registry.reset()  # forget the stubs so that "cpu" is the built-in again
    a, b = unique("first"), unique("second")
    dist_factory(
        {"Bad Name": f"{a}:Plugin", "cpu": f"{a}:Plugin", "dup": f"{a}:Plugin"},
        {a: good_plugin("dup", available=False)},
        dist="aaa_first",
    )
    dist_factory({"dup": f"{b}:Plugin"}, {b: good_plugin("dup")}, dist="zzz_second")
    report = registry.detect()
    reasons = {c.name: c.reason for c in report.candidates if not c.builtin}
    assert "not a valid platform name" in reasons["Bad Name"]
    problems = [c for c in report.candidates if c.name == "cpu" and not c.builtin]
    assert len(problems) == 1
    assert "already taken by built-in" in problems[0].reason
    dups = [c for c in report.candidates if c.name == "dup"]
    assert len(dups) == 2
    assert sum("already taken by entry point" in c.reason for c in dups) == 1


# -- register_platform ---------------------------------------------------------------------------


def test_register_platform_rejects_duplicates_unless_override(
    builtins_stubbed: dict[str, type[BasePlatform]],
) -> None:
    registry.register_platform("npu", make_platform("npu"))
    with pytest.raises(ConfigurationError, match=r"already registered.*override=True"):
        registry.register_platform("npu", make_platform("npu"))
    registry.reset()
    with pytest.raises(ConfigurationError, match="'cuda' is already registered \\(built-in\\)"):
        registry.register_platform("cuda", make_platform("cuda"))
    replacement = make_platform("npu", available=False)
    registry.register_platform("npu", make_platform("npu"))
    registry.register_platform("npu", replacement, override=True)
    with pytest.raises(PlatformNotAvailableError):
        registry.get_platform("npu")


@pytest.mark.parametrize("bad", ["", "Upper", "with space", "-lead", "x" * 65, 3, None])
def test_register_platform_rejects_bad_names(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="platform name must be"):
        registry.register_platform(bad, make_platform("x"))


def test_register_platform_rejects_non_callables() -> None:
    with pytest.raises(ConfigurationError, match="class or a zero-argument factory"):
        registry.register_platform("thing", 42)  # type: ignore[arg-type]


def test_registering_clears_the_cached_platform(
    builtins_stubbed: dict[str, type[BasePlatform]],
) -> None:
    assert registry.current_platform().name == "cpu"
    registry.register_platform("npu", make_platform("npu"))
    assert registry.current_platform().name == "npu"
    registry.unregister_platform("npu")
    assert registry.current_platform().name == "cpu"
    with pytest.raises(ConfigurationError, match="unknown platform"):
        registry.unregister_platform("npu")


def test_unregister_restores_a_builtin() -> None:
    registry.register_platform("cpu", make_platform("cpu", available=False), override=True)
    with pytest.raises(PlatformNotAvailableError):
        registry.get_platform("cpu")
    registry.unregister_platform("cpu")
    assert registry._registered["cpu"].row == registry._BUILTINS["cpu"]


def test_override_of_a_builtin_keeps_its_place_in_the_order(
    builtins_stubbed: dict[str, type[BasePlatform]],
) -> None:
    registry.register_platform("xpu", make_platform("xpu"), override=True)
    report = registry.detect()
    assert report.chosen == "xpu"
    assert by_name(report.candidates, "xpu").builtin is True


# -- caching, threads, fork ------------------------------------------------------------------------


def test_current_platform_is_cached_and_get_platform_shares_instances(
    builtins_stubbed: dict[str, type[BasePlatform]],
) -> None:
    first = registry.current_platform()
    assert registry.current_platform() is first
    assert registry.get_platform("cpu") is first
    assert CALLS["init:cpu"] == 1
    registry.detect()
    assert registry.current_platform() is first  # detect() leaves the cache alone
    assert CALLS["init:cpu"] == 1  # and does not construct built-ins


def test_detection_is_thread_safe(builtins_stubbed: dict[str, type[BasePlatform]]) -> None:
    def slow_init(self: Any) -> None:
        _count("init:npu")
        time.sleep(0.02)

    registry.register_platform("npu", make_platform("npu", __init__=slow_init))
    barrier = threading.Barrier(8)
    results: list[Any] = []

    def worker() -> None:
        barrier.wait()
        results.append(registry.current_platform())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(results) == 8
    assert all(r is results[0] for r in results)
    assert CALLS["init:npu"] == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_forgets_cached_instances(
    builtins_stubbed: dict[str, type[BasePlatform]],
) -> None:
    parent = registry.current_platform()
    registry.set_current_platform("cpu")
    registry.current_platform()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            os.close(r)
            ok = registry._current is None and not registry._instances
            child = registry.current_platform()
            ok = ok and child is not parent and child.name == "cpu"
            ok = ok and registry._lock.acquire(blocking=False)
            code = 0 if ok else 2
        finally:
            os.write(w, bytes([code]))
            os._exit(code)
    os.close(w)
    status = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert status == b"\x00"
    assert registry.current_platform() is not None


# -- laziness of the real package ------------------------------------------------------------------


def _python(code: str, env: dict[str, str] | None = None) -> str:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    full_env["PYTHONPATH"] = str(REPO)
    full_env.update(env or {})
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, check=True
    )
    return out.stdout.strip()


def test_importing_accelplat_loads_no_backend_plugin_or_metadata() -> None:
    out = _python(
        "import sys, accelplat\n"
        "bad = [m for m in sys.modules if m.startswith(('accelplat._backends', 'accelplat.testing',"
        " 'accelplat._registry', 'torch'))]\n"
        "print(bad)"
    )
    assert out == "[]"


def test_real_detection_loads_only_what_it_must() -> None:
    out = _python(
        "import sys, accelplat\n"
        "accelplat.current_platform()\n"
        "print(sorted(m for m in sys.modules if m.startswith('accelplat._backends.')\n"
        "             and not m.rpartition('.')[2].startswith('_')))",  # shared helpers aside
        env={"ACCELPLAT_PLATFORM": "cpu"},
    )
    assert out == "['accelplat._backends.cpu']"


# -- the cheap pre-check that spares importlib.metadata on the detection path -------------------


def _only_path(monkeypatch: pytest.MonkeyPatch, *entries: str) -> None:
    import sys

    monkeypatch.setattr(sys, "path", list(entries))


def test_precheck_finds_a_declared_platform_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelplat._registry import _may_declare_platforms

    dist = tmp_path / "vendor_npu-1.0.dist-info"
    dist.mkdir()
    (dist / "entry_points.txt").write_text("[console_scripts]\nx = y:z\n")
    _only_path(monkeypatch, str(tmp_path))
    assert _may_declare_platforms() is False
    (dist / "entry_points.txt").write_text("[accelplat.platforms]\nnpu = vendor_npu:Platform\n")
    assert _may_declare_platforms() is True


def test_precheck_defers_to_importlib_for_archives_on_sys_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelplat._registry import _may_declare_platforms

    archive = tmp_path / "bundle.zip"
    archive.write_bytes(b"PK\x05\x06" + b"\x00" * 18)
    _only_path(monkeypatch, str(tmp_path / "missing"), str(archive))
    assert _may_declare_platforms() is True
    _only_path(monkeypatch, str(tmp_path / "missing"))
    assert _may_declare_platforms() is False


def test_precheck_never_reads_an_entry_points_file_that_is_not_a_regular_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FIFO in a dist-info folder would block a read for ever: it is passed over unread."""
    from accelplat._registry import _may_declare_platforms

    fifo_dist = tmp_path / "odd-1.0.dist-info"
    fifo_dist.mkdir()
    os.mkfifo(fifo_dist / "entry_points.txt")
    _only_path(monkeypatch, str(tmp_path))
    assert _may_declare_platforms() is False  # returns at once, reading nothing
    dist = tmp_path / "vendor_npu-1.0.dist-info"
    dist.mkdir()
    (dist / "entry_points.txt").write_text("[accelplat.platforms]\nnpu = vendor_npu:Platform\n")
    assert _may_declare_platforms() is True


def test_no_plugin_installed_means_importlib_metadata_is_not_imported() -> None:
    import subprocess
    import sys

    code = (
        "import sys, accelplat\n"
        "accelplat.current_platform()\n"
        "print('importlib.metadata' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_detecting_a_shipped_backend_runs_none_of_its_properties() -> None:
    """Detection of CUDA (over the fake NVML) must not look up torch's version for ``graph``."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from tests.fakes.nvml import FakeNvml, h200\n"
        "sys.modules['pynvml'] = FakeNvml([h200(0)])\n"
        "import accelplat\n"
        "p = accelplat.current_platform()\n"
        "assert p.name == 'cuda', p.name\n"
        "print('importlib.metadata' in sys.modules)\n"
        "p.graph\n"
        "print('importlib.metadata' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True"]


def test_a_plugin_whose_property_raises_is_still_reported() -> None:
    from accelplat._registry import protocol_problems

    class Broken(make_platform("broken-prop")):  # type: ignore[misc]
        @property
        def graph(self) -> object:
            raise RuntimeError("boom")

    assert protocol_problems(Broken()) == ("graph raised RuntimeError: boom",)


# -- the contract -------------------------------------------------------------------------------


def test_a_backend_missing_a_required_member_cannot_be_instantiated() -> None:
    from accelplat._platform import BasePlatform as Base

    class NoMemory(Base):
        @classmethod
        def probe(cls) -> ProbeResult:
            return ProbeResult(True, "here")

        def devices(self) -> Sequence[DeviceInfo]:
            return (DeviceInfo(0, 0, "x"),)

    with pytest.raises(TypeError, match="_memory_info"):
        NoMemory()  # type: ignore[abstract]


def test_memory_info_checks_the_index_once_through_device_count() -> None:
    counted: list[int] = []
    cls = make_platform("counted", devices=2)
    original = cls.device_count

    def device_count(self: BasePlatform) -> int:
        counted.append(1)
        return original(self)

    cls.device_count = device_count  # type: ignore[method-assign]
    platform = cls()
    assert platform.memory_info(1).total == 2 * GIB
    assert counted == [1]
    with pytest.raises(IndexError):
        platform.memory_info(2)
    with pytest.raises(IndexError):
        platform.memory_info(True)


def test_optional_members_are_read_with_their_one_declared_default() -> None:
    from accelplat._platform import OPTIONAL_MEMBERS, optional

    class Bare:
        pass

    for name, default in OPTIONAL_MEMBERS.items():
        assert optional(Bare(), name) == default
        assert hasattr(BasePlatform, name), name
    assert optional(make_platform("acc")(), "is_accelerator") is True
    assert optional(make_platform("host", is_accelerator=False)(), "is_accelerator") is False

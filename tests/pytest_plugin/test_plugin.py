"""accelplat's pytest plugin: markers, fixtures and options, driven through pytester sub-runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from accelplat.pytest_plugin._requires import MARKER

pytest_plugins = ["pytester"]

BASE_ARGS = ("-p", "no:cacheprovider", "--strict-markers", "-rs")


def write_spec(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, **spec: Any) -> Path:
    """Write a simulated-platform spec and point ACCELPLAT_SIMULATED_SPEC at it."""
    data = {"clock": "virtual", **spec}
    path = pytester.path / "spec.json"
    path.write_text(json.dumps(data))
    monkeypatch.setenv("ACCELPLAT_SIMULATED_SPEC", str(path))
    return path


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(*BASE_ARGS, *args)


def skip_lines(result: pytest.RunResult) -> list[str]:
    return [line for line in result.outlines if line.startswith("SKIPPED")]


def test_the_marker_is_registered(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfigure("-p", "no:cacheprovider")
    assert MARKER in config.getini("markers")


SIMULATED_TESTS = """
import os

import pytest

from accelplat.integrations.vllm import large_gpu_mark


@pytest.mark.accelplat_requires("graphs")
def test_graph():
    pass


@pytest.mark.accelplat_requires(device_memory="24GiB")
def test_memory_24():
    pass


@pytest.mark.accelplat_requires(device_memory="16GiB")
def test_memory_16():
    pass


@pytest.mark.accelplat_requires(device_memory="20GiB", devices=3)
def test_memory_on_three():
    pass


@large_gpu_mark(17)
def test_large_17_gb():
    pass


@large_gpu_mark(18)
def test_large_18_gb():
    pass


@pytest.mark.accelplat_requires(devices=2)
def test_two_devices():
    pass


@pytest.mark.accelplat_requires(devices=3)
def test_three_devices():
    pass


@pytest.mark.accelplat_requires(platforms=["cuda", "rocm"])
def test_cuda_or_rocm():
    pass


@pytest.mark.accelplat_requires(platforms="simulated")
def test_on_simulated():
    pass


@pytest.mark.accelplat_requires(shm="0.0001GiB", shm_path=os.environ["SHM_PATH"])
def test_small_shm():
    pass


@pytest.mark.accelplat_requires(shm="1000000GiB", shm_path=os.environ["SHM_PATH"])
def test_huge_shm():
    pass


@pytest.mark.accelplat_requires(shm="1GiB", shm_path="/no/such/mount")
def test_missing_mount():
    pass


@pytest.mark.accelplat_requires(devices=3)
class TestNeedsThree:
    def test_inherits_the_class_mark(self):
        pass

    @pytest.mark.accelplat_requires(devices=1)
    def test_every_mark_must_hold(self):
        pass


def test_fixture(accel_platform):
    assert accel_platform.name == "simulated"
    assert accel_platform.device_count() == 2
    assert os.environ["ACCELPLAT_PLATFORM"] == "simulated"


def test_settled(settled_device_memory):
    assert settled_device_memory.already_settled
    assert sorted(settled_device_memory.snapshot.memory) == [0, 1]
"""


def test_markers_on_the_simulated_platform(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_spec(
        pytester,
        monkeypatch,
        graph={"available": False, "reason": "graphs are off in this spec"},
        devices=[{"total": "16GiB", "used": "1GiB"}, {"total": "24GiB", "used": "1GiB"}],
    )
    monkeypatch.setenv("SHM_PATH", str(pytester.path))
    pytester.makepyfile(test_sim=SIMULATED_TESTS)
    result = run(pytester, "--accelplat-platform", "simulated")
    result.assert_outcomes(passed=7, skipped=10)
    skipped = "\n".join(skip_lines(result))
    expected = [
        "test_sim.py:8: needs graphs: graphs are off in this spec",
        "test_sim.py:13: needs 24.00 GiB device memory, simulated device 0 has 16.00 GiB total",
        "test_sim.py:23: needs 3 accelerators, simulated has 2 visible; needs 20.00 GiB device "
        "memory on 3 accelerators, simulated has 2 visible",
        # vLLM's large_gpu_mark: a plain skipif, decimal GB, vLLM's reason text
        "test_sim.py:33: Need at least 18GB GPU memory to run the test (found 17.179869184GB).",
        "test_sim.py:43: needs 3 accelerators, simulated has 2 visible",
        "test_sim.py:48: runs only on cuda, rocm; the current platform is simulated",
        "test_sim.py:63: needs 976.56 TiB free in",
        "test_sim.py:68: needs 1.00 GiB free in /no/such/mount: path '/no/such/mount' does not",
    ]
    for text in expected:
        assert text in skipped, text
    # test_memory_on_three, test_three_devices and both tests of the class
    assert skipped.count("needs 3 accelerators, simulated has 2 visible") == 4


CPU_TESTS = """
import pytest


@pytest.mark.accelplat_requires("graphs")
def test_graph():
    pass


@pytest.mark.accelplat_requires(device_memory="1000000GiB")
def test_memory():
    pass


@pytest.mark.accelplat_requires(devices=1000)
def test_devices():
    pass


@pytest.mark.accelplat_requires(platforms=["cpu"])
def test_cpu_only(accel_platform):
    assert accel_platform.name == "cpu"
"""


def test_markers_on_the_cpu_platform(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_cpu=CPU_TESTS)
    result = run(pytester, "--accelplat-platform", "cpu")
    result.assert_outcomes(passed=1, skipped=3)
    skipped = "\n".join(skip_lines(result))
    assert "needs graphs: CPU has no graph capture" in skipped
    # the host CPU is never counted as a device (vLLM's large_gpu_mark skips there too)
    assert "needs 976.56 TiB device memory on an accelerator, cpu has 0 visible" in skipped
    assert "needs 1000 accelerators, cpu has 0 visible" in skipped


def test_malformed_marker_arguments_stop_the_session_naming_each_test(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_bad="""
        import pytest

        @pytest.mark.accelplat_requires(devices="two")
        def test_count():
            pass

        @pytest.mark.accelplat_requires(device_memory="-1GiB")
        def test_memory():
            pass

        @pytest.mark.accelplat_requires(platforms=[])
        def test_platforms():
            pass

        @pytest.mark.accelplat_requires(gpus=2)
        def test_keyword():
            pass

        @pytest.mark.accelplat_requires()
        def test_nothing():
            pass
        """
    )
    result = run(pytester, "--accelplat-platform", "cpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = "\n".join(result.errlines)
    for text in (
        "test_bad.py::test_count: accelplat_requires(devices=) must be an int >= 1, got ",
        "test_bad.py::test_memory: accelplat_requires(device_memory=)",
        "test_bad.py::test_platforms: accelplat_requires(platforms=) takes one or more platform",
        "test_bad.py::test_keyword: accelplat_requires: unknown keyword(s) gpus; known: devices, "
        "device_memory",
        "test_bad.py::test_nothing: accelplat_requires needs at least one",
    ):
        assert text in err, err


@pytest.mark.parametrize("value", ["80", 80, 80.0, 0], ids=["text", "int", "float", "zero"])
@pytest.mark.parametrize("keyword", ["device_memory", "shm"])
def test_a_size_without_a_unit_is_refused_naming_the_keyword_and_the_units(
    pytester: pytest.Pytester, keyword: str, value: object
) -> None:
    """``device_memory=80`` once meant 80 bytes; a size a person types must carry its unit."""
    pytester.makepyfile(
        test_bare=f"""
        import pytest

        @pytest.mark.accelplat_requires({keyword}={value!r})
        def test_bare():
            pass
        """
    )
    result = run(pytester, "--accelplat-platform", "cpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = "\n".join(result.errlines)
    assert f"test_bare.py::test_bare: accelplat_requires({keyword}=)" in err, err
    assert "has no unit" in err, err
    assert "GiB" in err, err
    assert "GB" in err, err


def test_an_unknown_or_unavailable_platform_is_a_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = run(pytester, "--accelplat-platform", "nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--accelplat-platform nope: unknown platform 'nope'*"])
    monkeypatch.delenv("ACCELPLAT_SIMULATED_SPEC", raising=False)
    result = run(pytester, "--accelplat-platform", "simulated")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ACCELPLAT_SIMULATED_SPEC is not set*"])


def test_the_forced_platform_survives_a_registry_reset_in_a_fixture(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_spec(pytester, monkeypatch, devices=[{"total": "8GiB"}])
    pytester.makeconftest(
        """
        import pytest
        from accelplat import _registry as registry

        @pytest.fixture(autouse=True)
        def _reset_registry():
            registry.reset()
            yield
            registry.reset()
        """
    )
    pytester.makepyfile(
        test_reset="""
        import pytest
        from accelplat import _registry as registry

        def test_body_sees_it():
            assert registry.current_platform().name == "simulated"

        @pytest.mark.accelplat_requires(devices=2)
        def test_markers_see_it():
            pass

        def test_a_test_may_still_choose(accel_platform):
            assert accel_platform.name == "simulated"
            with registry.use_platform("cpu") as chosen:
                assert chosen.name == "cpu"
        """
    )
    result = run(pytester, "--accelplat-platform", "simulated")
    result.assert_outcomes(passed=2, skipped=1)
    assert "needs 2 accelerators, simulated has 1 visible" in "\n".join(skip_lines(result))


def test_a_session_that_uses_nothing_detects_nothing_and_imports_no_framework(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_plain="""
        import sys

        def test_plain():
            assert "torch" not in sys.modules
            assert "accelplat._registry" not in sys.modules
            assert not any(m.startswith("accelplat._backends") for m in sys.modules)
            assert "accelplat.pytest_plugin" in sys.modules
        """
    )
    run(pytester).assert_outcomes(passed=1)


LEAK_TESTS = """
def test_leaks(accel_platform):
    accel_platform.clock.advance(1.0)  # the timeline steps up at t=1


def test_clean():
    pass
"""


def test_leak_check_reports_tests_that_left_memory_held(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_spec(
        pytester,
        monkeypatch,
        devices=[{"total": "16GiB", "used": "1GiB", "timeline": [{"at": 1.0, "used": "5GiB"}]}],
    )
    pytester.makepyfile(test_leak=LEAK_TESTS)
    result = run(pytester, "--accelplat-platform", "simulated", "--accelplat-leak-check")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*= accelplat leak check =*",
            "1 test(s) left device memory held beyond 256.00 MiB (2 checked):",
            "  test_leak.py::test_leaks: device 0 +4.00 GiB (1.00 GiB -> 5.00 GiB used)",
        ]
    )
    assert "test_clean:" not in result.stdout.str()

    result = run(
        pytester,
        "--accelplat-platform",
        "simulated",
        "--accelplat-leak-check",
        "--accelplat-leak-tolerance",
        "8GiB",
    )
    result.stdout.fnmatch_lines(
        ["accelplat leak check: no test left device memory held beyond 8.00 GiB (2 checked)"]
    )


def test_leak_check_from_ini_and_waiting_for_lazy_release(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_spec(
        pytester,
        monkeypatch,
        release={"lazy": True, "stable_duration_s": 1.0, "settle_timeout_s": 30},
        devices=[
            {
                "total": "16GiB",
                "used": "1GiB",
                "timeline": [{"at": 1.0, "used": "5GiB"}, {"at": 2.5, "used": "1GiB"}],
            }
        ],
    )
    pytester.makeini("[pytest]\naccelplat_leak_check = true\naccelplat_leak_tolerance = 1GiB\n")
    pytester.makepyfile(test_leak=LEAK_TESTS)
    # memory comes back 1.5 s after the test, within the 4 x 1 s allowed on a lazy platform
    result = run(pytester, "--accelplat-platform", "simulated")
    result.stdout.fnmatch_lines(
        ["accelplat leak check: no test left device memory held beyond 1.00 GiB (2 checked)"]
    )
    result = run(pytester, "--accelplat-platform", "simulated", "--accelplat-leak-wait", "0")
    result.stdout.fnmatch_lines(["*test_leak.py::test_leaks: device 0 +4.00 GiB*"])


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--accelplat-leak-tolerance", "lots", "--accelplat-leak-tolerance must be"),
        ("--accelplat-leak-wait", "-1", "--accelplat-leak-wait must be 'auto' or seconds >= 0"),
    ],
)
def test_bad_leak_settings_are_usage_errors(
    pytester: pytest.Pytester, option: str, value: str, message: str
) -> None:
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = run(pytester, "--accelplat-leak-check", option, value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_vllms_distributed_selector_is_kept_where_registered(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_spec(pytester, monkeypatch, devices=[{"total": "8GiB"}])
    pytester.makeini("[pytest]\nmarkers =\n    distributed(num_gpus): vLLM's selector\n")
    pytester.makepyfile(
        test_multi="""
        from accelplat.integrations.vllm import multi_gpu_test

        @multi_gpu_test(num_gpus=2)
        def test_two():
            pass

        def test_other():
            pass
        """
    )
    result = run(pytester, "--accelplat-platform", "simulated", "-m", "distributed")
    result.assert_outcomes(skipped=1, deselected=1)
    assert "Need at least 2 GPUs to run the test." in "\n".join(skip_lines(result))


# -- the leak check and the timeline share the reading taken as a teardown ends -----------------


class _CountingPlatform:
    """Two devices whose readings are counted (the vendor boundary of this unit test)."""

    name = "counting"

    def __init__(self) -> None:
        self.reads = 0

    def device_count(self) -> int:
        return 2

    def memory_info(self, device: int) -> Any:
        from accelplat.types import MemoryInfo

        self.reads += 1
        return MemoryInfo(free=10 - device, total=10, used=device)


def _item(with_leak_check: bool) -> Any:
    from types import SimpleNamespace

    plugins = {"accelplat-leak-check": object()} if with_leak_check else {}
    manager = SimpleNamespace(get_plugin=plugins.get)
    return SimpleNamespace(stash=pytest.Stash(), config=SimpleNamespace(pluginmanager=manager))


def _tracks(*indices: int) -> list[Any]:
    from accelplat.timeline._trace import DeviceTrack

    return [DeviceTrack(i, f"dev{i}", 10) for i in indices]


def test_the_leak_check_takes_the_timelines_reading_of_the_same_moment() -> None:
    from accelplat.pytest_plugin._shared import share_after_teardown, used_after_teardown

    platform = _CountingPlatform()
    item = _item(with_leak_check=True)
    share_after_teardown(item, _tracks(0, 1), (7, 8))
    assert used_after_teardown(item, platform) == {0: 7, 1: 8}  # type: ignore[arg-type]
    assert platform.reads == 0
    # consumed: the next teardown judges its own reading
    assert used_after_teardown(item, platform) is None  # type: ignore[arg-type]
    assert platform.reads == 0


@pytest.mark.parametrize(
    ("tracks", "reading"),
    [((0,), (7,)), ((0, 1), (7, None))],
    ids=["a device not sampled", "a failed query"],
)
def test_a_reading_that_misses_a_device_is_not_taken(
    tracks: tuple[int, ...], reading: tuple[int | None, ...]
) -> None:
    from accelplat.pytest_plugin._shared import share_after_teardown, used_after_teardown

    platform = _CountingPlatform()
    item = _item(with_leak_check=True)
    share_after_teardown(item, _tracks(*tracks), reading)
    assert used_after_teardown(item, platform) is None  # type: ignore[arg-type]


def test_nothing_is_kept_for_the_leak_check_when_it_is_off() -> None:
    from accelplat.pytest_plugin._shared import _AFTER_TEARDOWN_KEY, share_after_teardown

    item = _item(with_leak_check=False)
    share_after_teardown(item, _tracks(0, 1), (7, 8))
    assert _AFTER_TEARDOWN_KEY not in item.stash


def _plugin() -> list[str]:
    """Load the plugin where the checkout is not installed (no entry point)."""
    from importlib.metadata import entry_points

    installed = any(ep.name == "accelplat" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "accelplat.pytest_plugin"]


READ_COUNTING_CONFTEST = """
import accelplat._backends.simulated as sim

READS = [0]
_read = sim.SimulatedPlatform.memory_info


def _counting(self, device):
    READS[0] += 1
    return _read(self, device)


sim.SimulatedPlatform.memory_info = _counting


def pytest_unconfigure(config):
    (config.rootpath / "reads.txt").write_text(str(READS[0]))
"""


@pytest.mark.parametrize(
    ("options", "per_test"),
    [
        (["--accelplat-leak-check"], 2),
        # the timeline judges by the leak check's readings by owner, which judge a device whole
        # by the timeline's used bytes after the test: each takes its own two readings
        (["--accelplat-timeline=r.html", "--accelplat-timeline-hz=0.001"], 4),
        (
            [
                "--accelplat-leak-check",
                "--accelplat-timeline=r.html",
                "--accelplat-timeline-hz=0.001",
            ],
            4,
        ),
    ],
    ids=["leak check", "timeline", "both"],
)
def test_readings_per_test_with_the_leak_check_and_the_timeline(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, options: list[str], per_test: int
) -> None:
    """Each takes one reading before and one after a test, and no other."""
    write_spec(pytester, monkeypatch, devices=[{"total": "16GiB", "used": "1GiB"}] * 2)
    pytester.makeconftest(READ_COUNTING_CONFTEST)
    reads: dict[int, int] = {}
    for tests in (1, 3):
        body = "\n".join(f"def test_{i}():\n    pass\n" for i in range(tests))
        pytester.makepyfile(test_some=body)
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", *_plugin(), "--accelplat-platform", "simulated",
            *options,
        )  # fmt: skip
        result.assert_outcomes(passed=tests)
        reads[tests] = int((pytester.path / "reads.txt").read_text())
    devices = 2
    assert reads[3] - reads[1] == 2 * per_test * devices


MIXED_MARKS = """
import pytest

pytestmark = pytest.mark.accelplat_requires(devices=9)


@pytest.mark.accelplat_requires(devices=5)
@pytest.mark.accelplat_requires(platforms=["rocm"])
def test_mixed():
    pass
"""


def test_unmet_marks_are_reported_closest_first(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every mark must hold; the reasons of the closest mark come first."""
    write_spec(pytester, monkeypatch, devices=[{"total": "16GiB", "used": "1GiB"}])
    pytester.makepyfile(test_mixed=MIXED_MARKS)
    result = run(pytester, "--accelplat-platform", "simulated")
    result.assert_outcomes(skipped=1)
    (line,) = skip_lines(result)
    assert line.endswith(
        "runs only on rocm; the current platform is simulated; "
        "needs 5 accelerators, simulated has 1 visible; needs 9 accelerators, simulated has 1 "
        "visible"
    ), line


def test_one_entry_point_and_one_option_group(pytester: pytest.Pytester) -> None:
    """The leak check, the timeline and the leases are parts of one plugin, with one group."""
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    section = pyproject.split("[project.entry-points.pytest11]\n", 1)[1].split("\n\n", 1)[0]
    assert section.strip() == 'accelplat = "accelplat.pytest_plugin"'
    out = pytester.runpytest_subprocess(*_plugin(), "--help").stdout.str()
    assert out.count("accelplat accelerator platform:") == 1
    group = out.split("accelplat accelerator platform:")[1].split("\n\n")[0]
    for option in ("--accelplat-leak-check", "--accelplat-timeline-hz", "--accelplat-lease-count"):
        assert option in group


# -- the header line and the ini options ----------------------------------------------------------

HEADER_SPEC = {
    "devices": [{"name": "Sim A", "total": "16GiB"}, {"name": "Sim A", "total": "16GiB"}]
}


def _header(result: pytest.RunResult) -> list[str]:
    import accelplat

    return [
        line for line in result.outlines if line.startswith(f"accelplat {accelplat.__version__}:")
    ]


def test_no_header_line_when_no_part_is_on(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_ok="def test_ok():\n    pass\n")
    result = run(pytester)
    result.assert_outcomes(passed=1)
    assert _header(result) == []


def test_the_header_names_the_platform_its_devices_and_the_parts_that_are_on(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    import accelplat

    write_spec(pytester, monkeypatch, **HEADER_SPEC)
    pytester.makepyfile(test_ok="def test_ok():\n    pass\n")
    result = run(pytester, "--accelplat-platform", "simulated")
    result.assert_outcomes(passed=1)
    assert _header(result) == [
        f"accelplat {accelplat.__version__}: platform simulated (forced), 2 devices (2 x Sim A)"
    ]
    result = run(
        pytester,
        "--accelplat-platform=simulated",
        "--accelplat-leak-check",
        "--accelplat-leak-tolerance=1GiB",
        "--accelplat-timeline=report.html",
    )
    result.assert_outcomes(passed=1)
    assert _header(result)[0].endswith(
        "2 devices (2 x Sim A); on: leak check (beyond 1.00 GiB), timeline (report.html)"
    )


def test_ini_options_set_the_platform_the_timeline_and_the_leak_check(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_spec(pytester, monkeypatch, **HEADER_SPEC)
    pytester.makeini(
        "[pytest]\n"
        "accelplat_platform = simulated\n"
        "accelplat_leak_check = true\n"
        "accelplat_timeline = out/report.html\n"
        "accelplat_timeline_json = out/trace.json\n"
    )
    (pytester.path / "out").mkdir()
    pytester.makepyfile(
        test_ok="import os\n\ndef test_ok():\n"
        "    assert os.environ['ACCELPLAT_PLATFORM'] == 'simulated'\n"
    )
    sub = pytester.mkdir("sub")  # run from elsewhere: the ini's paths are relative to the ini
    monkeypatch.chdir(sub)
    ini, test = pytester.path / "tox.ini", pytester.path / "test_ok.py"
    result = pytester.runpytest_subprocess(*BASE_ARGS, "-c", str(ini), str(test))
    result.assert_outcomes(passed=1)
    (line,) = _header(result)
    assert "platform simulated (forced)" in line
    assert f"timeline ({pytester.path / 'out' / 'report.html'})" in line
    assert "leak check (beyond 256.00 MiB)" in line
    assert (pytester.path / "out" / "report.html").is_file()
    assert json.loads((pytester.path / "out" / "trace.json").read_text())
    assert not (sub / "out").exists()


def test_the_command_line_wins_over_the_ini(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_spec(pytester, monkeypatch, **HEADER_SPEC)
    pytester.makeini("[pytest]\naccelplat_platform = no-such-platform\n")
    pytester.makepyfile(test_ok="def test_ok():\n    pass\n")
    result = run(pytester, "--accelplat-platform", "cpu")
    result.assert_outcomes(passed=1)
    assert "platform cpu (forced)" in _header(result)[0]
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "no-such-platform" in result.stderr.str()


# -- leaks with blame, and the settle fixture on a shared device -------------------------------

BLAME_TESTS = """
def test_a_first_clean_test(accel_platform):
    accel_platform.clock.advance(1.0)  # this process's context appears


def test_keeps_memory(accel_platform):
    accel_platform.clock.advance(1.0)  # this process keeps 2 GiB more


def test_beside_a_co_tenant(accel_platform):
    accel_platform.clock.advance(1.0)  # another process takes 3 GiB


def test_a_child_outlives_it(accel_platform):
    accel_platform.clock.advance(1.0)  # a child it started still holds 1 GiB


def test_clean_at_the_end(accel_platform):
    pass
"""

BLAME_DEVICE = {
    "total": "16GiB",
    "holders": [
        {"pid": 100, "used": "527MiB", "state": "self", "start": 1.0},
        {"pid": 100, "used": "2GiB", "state": "self", "start": 2.0},
        {"pid": 200, "used": "3GiB", "state": "alive", "start": 3.0, "name": "tenant"},
        {"pid": 300, "used": "1GiB", "state": "child", "start": 4.0, "name": "server"},
    ],
}


def test_the_leak_check_blames_owners_not_the_context_nor_a_co_tenant(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_spec(pytester, monkeypatch, devices=[BLAME_DEVICE])
    pytester.makepyfile(test_blame=BLAME_TESTS)
    out = pytester.path / "trace.json"
    result = run(
        pytester, "--accelplat-platform", "simulated", "--accelplat-leak-check",
        "--accelplat-timeline", str(pytester.path / "r.html"),
        "--accelplat-timeline-json", str(out),
    )  # fmt: skip
    result.assert_outcomes(passed=5)
    text = result.stdout.str()
    assert "2 test(s) left device memory held beyond 256.00 MiB (5 checked)" in text
    assert "test_blame.py::test_keeps_memory: device 0 +2.00 GiB (this process +2.00 GiB)" in text
    assert (
        "test_blame.py::test_a_child_outlives_it: device 0 +1.00 GiB (this process +0 B; "
        "children it started, still holding: pid 300 1.00 GiB)"
    ) in text
    assert "  test_blame.py::test_a_first_clean_test: device" not in text
    assert "  test_blame.py::test_beside_a_co_tenant: device" not in text
    assert (
        "context: device 0 527.00 MiB is this process's own device context, first used in "
        "test_blame.py::test_a_first_clean_test (not a leak)"
    ) in text
    assert (
        "other processes' memory moved, not blamed: test_blame.py::test_beside_a_co_tenant: "
        "device 0 +3.00 GiB"
    ) in text
    from accelplat.timeline import load_trace

    by_timeline = {leak.nodeid.rpartition("::")[2] for leak in load_trace(out).leaks()}
    assert by_timeline == {"test_keeps_memory", "test_a_child_outlives_it"}
    page = (pytester.path / "r.html").read_text()
    assert "test_a_child_outlives_it (held by child pid 300 1.00 GiB)" in page
    assert "test_keeps_memory (held by this process)" in page


SHARED_GPU_FIXTURE_TESTS = """
def test_uses_the_fixture(settled_device_memory):
    assert settled_device_memory.owners == "ours"
    assert "pid 200 'tenant' 20.00 GiB" in settled_device_memory.note
"""


def test_settled_device_memory_does_not_wait_for_a_co_tenant(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's case: a stuck 20 GiB holder of another process on an eager device."""
    device = {
        "total": "140GiB",
        "holders": [{"pid": 200, "used": "20GiB", "state": "alive", "name": "tenant"}],
    }
    write_spec(pytester, monkeypatch, devices=[device])
    pytester.makepyfile(test_shared=SHARED_GPU_FIXTURE_TESTS)
    result = run(pytester, "--accelplat-platform", "simulated")
    result.assert_outcomes(passed=1)
    pytester.makeini("[pytest]\naccelplat_settle_owners = all\naccelplat_settle_timeout = 2\n")
    result = run(pytester, "--accelplat-platform", "simulated")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*did not clear within 2.00 s*", "*pid 200 'tenant'*"])


ENGINE_CONFTEST = """
import json, os, subprocess, sys
from pathlib import Path

import pytest

ENGINE = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
# the driver keeps listing the killed engine, 30 GiB, until t = 2 s
SPEC = {
    "clock": "virtual",
    "devices": [{
        "total": "80GiB",
        "holders": [{"pid": ENGINE.pid, "used": "30GiB", "state": "gone", "end": 2.0}],
    }],
}
Path("spec.json").write_text(json.dumps(SPEC))
os.environ["ACCELPLAT_SIMULATED_SPEC"] = str(Path("spec.json").resolve())


@pytest.fixture
def engine():
    yield ENGINE
    ENGINE.kill()
    ENGINE.wait()
"""

ENGINE_TESTS = """
def test_runs_an_engine(engine):
    pass


def test_next_engine(settled_device_memory):
    assert settled_device_memory.waited_s >= 2.0, settled_device_memory
"""


def test_settled_device_memory_waits_for_an_engine_of_ours_that_exited_still_listed(
    pytester: pytest.Pytester,
) -> None:
    """The engine was never seen holding memory; it is remembered as ours before teardown."""
    pytester.makeconftest(ENGINE_CONFTEST)
    pytester.makepyfile(test_engine=ENGINE_TESTS)
    result = run(pytester, "--accelplat-platform", "simulated")
    result.assert_outcomes(passed=2)

"""``accelplat.testing.requires`` and ``skip_module_unless``: plain skips that need no plugin."""

from __future__ import annotations

import pytest

from accelplat.errors import ConfigurationError

pytest_plugins = ["pytester"]

TESTS = """
import pytest
from accelplat.testing import requires


@requires("cpu")
def test_on_cpu():
    pass


@requires("cuda or xpu")
def test_gpu_only():
    raise AssertionError("must not run on a CPU host")


@requires("bf16", devices=1)
def test_needs_an_accelerator():
    raise AssertionError("the host CPU is no accelerator")


@requires("not rocm", device_memory="1GiB")
def test_device_memory():
    raise AssertionError("a CPU host has no device memory")
"""

MODULE_SKIP = """
from accelplat.testing import skip_module_unless

skip_module_unless("cuda-api and capability>=90")

raise AssertionError("the module body below the skip must not run")
"""

RAW_MARKER = """
import pytest


@pytest.mark.accelplat_requires("cuda")
def test_raw():
    pass
"""

OUTCOME = {
    "test_req.py::test_on_cpu": "PASSED",
    "test_req.py::test_gpu_only": "SKIPPED",
    "test_req.py::test_needs_an_accelerator": "SKIPPED",
    "test_req.py::test_device_memory": "SKIPPED",
}


def outcomes(result: pytest.RunResult) -> dict[str, str]:
    out = {}
    for line in result.outlines:
        test, _, verdict = line.partition(" ")
        if "::" in test and verdict.split(" ")[0] in ("PASSED", "SKIPPED", "FAILED"):
            out[test] = verdict.split(" ")[0]
    return out


@pytest.mark.parametrize(
    ("args", "env"),
    [
        ((), {}),  # the plugin loaded
        (("-p", "no:accelplat"), {}),  # the plugin disabled by name
        ((), {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}),  # no entry-point plugin at all
    ],
    ids=["plugin", "no-accelplat", "no-autoload"],
)
def test_requires_skips_the_same_with_or_without_the_plugin(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    args: tuple[str, ...],
    env: dict[str, str],
) -> None:
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "cpu")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    pytester.makepyfile(test_req=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", "-rs", *args)
    assert outcomes(result) == OUTCOME
    text = "\n".join(result.outlines)
    assert "needs cuda or xpu: the current platform is cpu" in text
    assert "needs an accelerator, cpu has 0 visible" in text


def test_skip_module_unless_skips_the_whole_module(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "cpu")
    pytester.makepyfile(test_mod=MODULE_SKIP)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", "-p", "no:accelplat")
    result.assert_outcomes(skipped=1)
    assert "needs cuda-api and capability>=90: the cpu platform's torch device type" in str(
        result.outlines
    )


def test_the_raw_marker_fails_collection_without_the_plugin_under_strict_markers(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_raw=RAW_MARKER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--strict-markers", "-p",
                                           "no:accelplat")  # fmt: skip
    assert result.ret != 0
    assert "'accelplat_requires' not found in `markers` configuration option" in str(
        result.outlines + result.errlines
    )


def test_bad_requirements_are_errors_at_import() -> None:
    from accelplat.testing import requires

    with pytest.raises(ConfigurationError, match="unknown word 'cdua'"):
        requires("cdua")
    with pytest.raises(ConfigurationError, match="has no unit"):
        requires("cpu", device_memory=4)  # type: ignore[arg-type]


ISOLATED = """
import os
from accelplat.testing import isolate, requires

PARENT = os.getpid()


@requires("cpu")
@isolate()
def test_runs_in_a_child():
    assert os.getpid() != PARENT


@requires("cpu", devices=2)
@isolate()
def test_skipped_before_any_child_starts():
    raise AssertionError("unreachable")
"""


def test_requires_stacks_over_process_isolation(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "cpu")
    pytester.makepyfile(test_iso=ISOLATED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    assert outcomes(result) == {
        "test_iso.py::test_runs_in_a_child": "PASSED",
        "test_iso.py::test_skipped_before_any_child_starts": "SKIPPED",
    }

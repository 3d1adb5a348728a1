"""The ``accelplat_requires`` marker and ``--accelplat-capabilities``, through pytester sub-runs."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

BASE_ARGS = ("-p", "no:cacheprovider", "--strict-markers", "-rs")

CONFTEST = """
from accelplat import register_platform
from accelplat._types import DeviceInfo, FeatureRule, MemoryInfo, ProbeResult
from accelplat._capabilities import define_capability
from accelplat._platform import BasePlatform

GIB = 1024**3


class FakeGpus(BasePlatform):
    name = "fakegpu"
    device_type = "cuda"
    FEATURES = {
        "bf16": (FeatureRule(min_compute_capability=(8, 0)),),
        "fp8": (FeatureRule(min_compute_capability=(8, 9), value="e4m3fn"),),
    }

    @classmethod
    def probe(cls):
        return ProbeResult(True, "fake")

    def devices(self):
        return (
            DeviceInfo(0, 0, "Fake A100", arch="sm_80", compute_capability=(8, 0)),
            DeviceInfo(1, 1, "Fake A100", arch="sm_80", compute_capability=(8, 0)),
        )

    def _memory_info(self, device):
        return MemoryInfo(free=80 * GIB, total=80 * GIB, used=0)


register_platform("fakegpu", FakeGpus)
define_capability("flash-attn", platforms=["fakegpu", "rocm"], arch=["sm_80+"])
"""

TESTS = """
import pytest


@pytest.mark.accelplat_requires("bf16", "flash-attn", "cuda-api", devices=2, device_memory="40GiB")
def test_runs():
    pass


@pytest.mark.accelplat_requires("fp8")
def test_fp8():
    pass


@pytest.mark.accelplat_requires("fp8", "hopper-only", "bf16", devices=4, device_memory="100GiB")
def test_everything_unmet():
    pass


@pytest.mark.accelplat_requires(platforms=["rocm"])
def test_rocm_only():
    pass


@pytest.mark.accelplat_requires(devices=2)
@pytest.mark.accelplat_requires("flash-attn")
def test_two_marks_together():
    pass
"""

PYPROJECT = """
[tool.accelplat.capabilities]
hopper-only = { arch = ["sm_90"], reason = "uses wgmma" }
"""


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(*BASE_ARGS, "--accelplat-platform", "fakegpu", *args)


def skip_lines(result: pytest.RunResult) -> str:
    return "\n".join(line for line in result.outlines if line.startswith("SKIPPED"))


def test_requirements_skip_with_every_unmet_reason(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makefile(".toml", pyproject=PYPROJECT)
    pytester.makepyfile(test_req=TESTS)
    result = run(pytester, "-vv")
    result.assert_outcomes(passed=2, skipped=3)
    skipped = skip_lines(result)
    assert "test_req.py:9: needs fp8: needs sm_89+ (e4m3fn); this is Fake A100 (sm_80)" in skipped
    assert (
        "test_req.py:14: needs 4 devices, fakegpu has 2 visible; needs fp8: needs sm_89+ "
        "(e4m3fn); this is Fake A100 (sm_80); needs hopper-only: needs sm_90; this is Fake A100 "
        "(sm_80) (uses wgmma); needs 100.00 GiB device memory on 4 devices, fakegpu has 2 visible"
    ) in skipped
    assert "runs only on rocm; the current platform is fakegpu" in skipped


def test_unknown_capability_is_a_collection_error_naming_the_test(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_typo="""
import pytest

@pytest.mark.accelplat_requires("fp9")
def test_typo():
    pass

@pytest.mark.accelplat_requires("bf16", device_memory="lots")
def test_bad_size():
    pass
"""
    )
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = "\n".join(result.errlines)
    assert "test_typo.py::test_typo: unknown capability 'fp9'" in err
    assert "test_typo.py::test_bad_size: accelplat_requires(device_memory=)" in err


def test_malformed_pyproject_entry_stops_the_session(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makefile(".toml", pyproject='[tool.accelplat.capabilities]\nfa = { arch = ["gfx"] }\n')
    pytester.makepyfile(test_ok="def test_ok():\n    pass\n")
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = "\n".join(result.errlines)
    assert "pyproject.toml: [tool.accelplat.capabilities] fa" in err
    assert "unknown arch 'gfx'" in err


def test_impossible_define_capability_in_conftest_names_the_line(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST + '\ndefine_capability("bad", arch=["sm_999"])\n')
    pytester.makepyfile(test_ok="def test_ok():\n    pass\n")
    result = run(pytester)
    assert result.ret != pytest.ExitCode.OK
    line = CONFTEST.strip().count("\n") + 3  # the appended call, after one blank line
    assert f"conftest.py:{line}: capability 'bad': 'sm_999' is no NVIDIA architecture" in (
        "\n".join(result.errlines)
    )


def test_capability_table_in_the_header(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_ok="def test_ok():\n    pass\n")
    result = run(pytester, "--accelplat-capabilities")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert "accelplat capabilities of fakegpu device 0 (Fake A100, sm_80):" in out
    result.stdout.re_match_lines([r"\s+fp8\s+no\s+needs sm_89\+ \(e4m3fn\); this is Fake A100"])
    result.stdout.re_match_lines([r"\s+flash-attn\s+yes\s+all conditions hold on Fake A100"])

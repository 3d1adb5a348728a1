"""Requirement expressions: the grammar, and vLLM's meaning of each word on every vendor's host.

The expected truth tables are read off vLLM 0.33.0's platform classes (vllm/platforms/*.py:
``has_device_capability`` compares ``to_int()``, ROCm derives its numbers from the gfx target,
XPU and CPU have none; ``supports_fp8`` is cc >= 89 on CUDA, CDNA or RDNA on ROCm, always on XPU;
``is_fp8_fnuz`` is gfx94*), and checked against accelplat's answers through the vendor fakes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import accelplat
from accelplat import _capabilities as caps
from accelplat._backends.cuda import CudaPlatform
from accelplat._backends.rocm import RocmPlatform
from accelplat._backends.xpu import XpuPlatform
from accelplat._platform import Platform
from accelplat._requirement import parse, parse_arch
from accelplat._types import GIB
from accelplat.errors import ConfigurationError
from tests.conftest import Install
from tests.fakes.hostfs import HostFS
from tests.fakes.levelzero import FakeLevelZero, arc, pvc
from tests.fakes.nvml import FakeGpu, FakeNvml
from tests.fakes.sysfs import FakeSysfs

CAPS = frozenset(caps.BUILTIN) | {"my-kernels"}


@pytest.fixture(autouse=True)
def _fresh_project() -> Iterator[None]:
    caps.clear_project_capabilities()
    yield
    caps.clear_project_capabilities()


PLATFORMS = frozenset({"cuda", "rocm", "xpu", "cpu", "tpu"})


def text(requirement: str) -> str:
    return parse(requirement, capabilities=CAPS, platforms=PLATFORMS).text


# -- the grammar ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("fp8", "fp8"),
        ("  FP8  ", "fp8"),
        ("xpu or (cuda and capability>=90)", "xpu or (cuda and capability>=90)"),
        ("xpu or cuda and capability>=90", "xpu or (cuda and capability>=90)"),
        ("cuda or (xpu or cpu) or cuda", "cuda or xpu or cpu"),
        ("(xpu or cuda) and capability >= 90", "(xpu or cuda) and capability>=90"),
        ("not (rocm or xpu)", "not (rocm or xpu)"),
        ("not not cpu", "not not cpu"),
        ("cuda-api and not capability>=89", "cuda-api and not capability>=89"),
        ("capability==10x", "capability==10x"),
        ("capability!=12x or sm_80..sm_89", "capability!=12x or sm_80..sm_89"),
        ("gfx94* or sm_10x", "gfx94* or sm_10x"),
        ("cuda and fp8 or xpu", "(cuda and fp8) or xpu"),
        ("cuda and (fp8 or xpu)", "cuda and (fp8 or xpu)"),
        ("my-kernels and not tpu", "my-kernels and not tpu"),
    ],
)  # fmt: skip
def test_canonical_text(given: str, canonical: str) -> None:
    assert text(given) == canonical
    assert text(canonical) == canonical  # the canonical form parses to itself


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("", "is empty"),
        ("   ", "is empty"),
        ("fp9", "unknown word 'fp9'"),
        ("cuda and", "ends too early"),
        ("(cuda or xpu", "ends too early"),
        ("cuda xpu", "unexpected 'xpu'"),
        ("cuda )", "unexpected ')'"),
        ("and cuda", "unexpected 'and'"),
        ("capability>=9.0", "unexpected"),
        ("capability>=10x", "a family (10x) compares only with == or !="),
        ("sm_999", "unknown word 'sm_999'"),
        ("cuda; import os", "unexpected ';"),
        ("(" * 40 + "cuda" + ")" * 40, "nests deeper than 32 levels"),
        ("not " * 40 + "cuda", "nests deeper than 32 levels"),
        ("cuda or " * 200 + "xpu", "longer than 1000 characters"),
    ],
)
def test_malformed_requirements_are_refused_naming_the_problem(given: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        text(given)


@pytest.mark.parametrize("given", [None, 3, ["cuda"], b"cuda"])
def test_a_requirement_is_a_string(given: object) -> None:
    with pytest.raises(ConfigurationError, match="a requirement is a string"):
        parse(given, capabilities=CAPS, platforms=PLATFORMS)


def test_parsing_is_linear_in_a_long_flat_expression() -> None:
    long = " or ".join(f"gfx9{i:02x}" for i in range(90))  # under the length limit
    assert text(long).count(" or ") == 89


@pytest.mark.parametrize(
    ("pattern", "bounds"),
    [
        ("sm_90", ((9, 0), (9, 0))),
        ("sm_80+", ((8, 0), None)),
        ("sm_10x", ((10, 0), (10, 9))),
        ("sm_12x", ((12, 0), (12, 9))),
        ("sm_80..sm_89", ((8, 0), (8, 9))),
        ("SM_100", ((10, 0), (10, 0))),
    ],
)
def test_nvidia_arch_patterns_are_compute_capability_bounds(
    pattern: str, bounds: tuple[tuple[int, int], tuple[int, int] | None]
) -> None:
    arch = parse_arch(pattern)
    assert (arch.low, arch.high) == bounds


@pytest.mark.parametrize("pattern", ["sm_90..sm_80", "sm_10x+", "sm_160", "gfx", "volta"])
def test_bad_arch_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(ConfigurationError):
        parse_arch(pattern)


# -- vLLM's meaning on every vendor's host ---------------------------------------------------------


def nvidia(name: str, cc: tuple[int, int]) -> FakeGpu:
    return FakeGpu(name=name, uuid="GPU-00000000-aaaa-bbbb-cccc-dddddddddddd",
                   pci_bus_id="00000000:18:00.0", compute_capability=cc)  # fmt: skip


NVIDIA = {"t4": ("Tesla T4", (7, 5)), "a100": ("NVIDIA A100", (8, 0)), "l4": ("NVIDIA L4", (8, 9)),
          "h200": ("NVIDIA H200", (9, 0)), "b200": ("NVIDIA B200", (10, 0)),
          "rtx5090": ("NVIDIA GeForce RTX 5090", (12, 0))}  # fmt: skip
AMD = {"mi250": 90010, "mi300x": 90402, "mi355x": 90500, "rx7900": 110000, "r9700": 120001}
HOSTS = (*NVIDIA, *AMD, "max1550", "b580", "cpu")


@pytest.fixture
def host(
    request: pytest.FixtureRequest,
    install: Install,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[[str], Platform]:
    def make(name: str) -> Platform:
        if name in NVIDIA:
            install(FakeNvml([nvidia(*NVIDIA[name])]))
            return CudaPlatform()
        if name in AMD:
            for var in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
                monkeypatch.delenv(var, raising=False)
            monkeypatch.setitem(sys.modules, "amdsmi", None)
            tree = FakeSysfs(tmp_path / name)
            tree.add_amd_gpu(0, pci="0000:03:00.0", vram_total=64 * GIB,
                             gfx_target_version=AMD[name])  # fmt: skip
            monkeypatch.setenv("ACCELPLAT_SYSFS_ROOT", str(tree.sys))
            return RocmPlatform()
        if name in ("max1550", "b580"):
            monkeypatch.delenv("ZE_AFFINITY_MASK", raising=False)
            card = pvc(0x3A) if name == "max1550" else arc(0x8C)
            return XpuPlatform(level_zero=FakeLevelZero([card]), usage_visible=True)
        fs = HostFS(tmp_path / "host")
        fs.cpuinfo("Fake Xeon")
        fs.meminfo(total=32 * GIB, available=30 * GIB)
        return fs.platform()

    return make


# requirement -> the hosts where vLLM's predicate it replaces is true (vLLM 0.33.0 semantics)
CUDA_HOSTS = set(NVIDIA)
ROCM_HOSTS = set(AMD)
XPU_HOSTS = {"max1550", "b580"}
EXPECTED: dict[str, set[str]] = {
    "cuda": CUDA_HOSTS,  # is_cuda()
    "not rocm": set(HOSTS) - ROCM_HOSTS,  # not is_rocm()
    "cuda-api": CUDA_HOSTS | ROCM_HOSTS,  # is_cuda_alike()
    "cuda or xpu": CUDA_HOSTS | XPU_HOSTS,
    "not cpu": set(HOSTS) - {"cpu"},
    "accelerator": set(HOSTS) - {"cpu"},
    # has_device_capability(90): ROCm's numbers count (gfx90a is 9.0, gfx1100 is 11.0)
    "capability>=90": {"h200", "b200", "rtx5090", *ROCM_HOSTS},
    "capability>=89": {"l4", "h200", "b200", "rtx5090", *ROCM_HOSTS},
    "capability==94": {"mi300x"},  # is_device_capability(94)
    "capability==100": {"b200"},
    "capability==10x": {"b200"},  # is_device_capability_family(100)
    "capability==12x": {"rtx5090", "r9700"},
    "capability<80": {"t4"},  # CPU and XPU have no number: every comparison is false
    "fp8": {"l4", "h200", "b200", "rtx5090", *ROCM_HOSTS, *XPU_HOSTS},  # supports_fp8()
    "fp8-fnuz": {"mi300x"},  # is_fp8_fnuz()
    "fp8-native": {"l4", "h200", "b200", "rtx5090", "mi300x", "mi355x", "r9700"},
    "mxfp4 and rocm": {"mi355x"},  # supports_mx() on ROCm
    "xpu or (cuda and capability>=90)": {"h200", "b200", "rtx5090", *XPU_HOSTS},
    "cuda-api and not capability>=89": {"t4", "a100"},
    "sm_80..sm_89": {"a100", "l4"},
    "sm_10x or sm_12x": {"b200", "rtx5090"},
    "gfx9*": {"mi250", "mi300x", "mi355x"},  # on_gfx9()
    "gfx942 or gfx950": {"mi300x", "mi355x"},  # on_mi3xx()
    "pvc": {"max1550"},
}


@pytest.mark.parametrize("name", HOSTS)
def test_each_word_means_vllms_predicate_on_every_host(
    name: str, host: Callable[[str], Platform]
) -> None:
    platform = host(name)
    got = {req: accelplat.has(req, platform=platform) for req in EXPECTED}
    assert got == {req: name in hosts for req, hosts in EXPECTED.items()}


def test_fp8_value_is_vllms_fp8_dtype(host: Callable[[str], Platform]) -> None:
    values = {n: caps.capabilities(platform=host(n))["fp8"].value for n in ("mi300x", "h200")}
    assert values == {"mi300x": "e4m3fnuz", "h200": "e4m3fn"}


def test_the_reason_names_the_fact_that_decided(host: Callable[[str], Platform]) -> None:
    from accelplat._needs import parse_needs, unmet

    platform = host("a100")
    need = parse_needs(("xpu or (cuda and capability>=90)",), {})
    assert unmet(need, platform) == [
        "needs xpu or (cuda and capability>=90): the current platform is cuda; "
        "NVIDIA A100 (sm_80) has capability 80"
    ]
    assert unmet(parse_needs(("not cuda",), {}), platform) == [
        "needs not cuda: the current platform is cuda"
    ]


def test_project_capabilities_require_expressions(host: Callable[[str], Platform]) -> None:
    caps.define_capability("fused-moe", requires=["cuda-api and not fp8-fnuz"])
    caps.define_capability("fused-moe-fp8", requires=["fused-moe and fp8"])
    decided = {
        n: (accelplat.has("fused-moe", platform=p), accelplat.has("fused-moe-fp8", platform=p))
        for n in ("a100", "mi300x", "mi250")
        for p in [host(n)]
    }
    assert decided == {"a100": (True, False), "mi300x": (False, False), "mi250": (True, True)}


def test_a_project_capability_cannot_shadow_a_platform_or_an_arch() -> None:
    with pytest.raises(ConfigurationError, match="'rocm' is a platform name"):
        caps.define_capability("rocm", platforms=["rocm"])
    with pytest.raises(ConfigurationError, match="'gfx942' is an arch pattern"):
        caps.define_capability("gfx942", platforms=["rocm"])


def test_a_requirement_cycle_through_an_expression_is_refused() -> None:
    caps.define_capability("one", requires=["cuda or two"])
    caps.define_capability("two", requires=["not one"])
    with pytest.raises(ConfigurationError, match="requirement cycle"):
        caps.validate()


def test_a_migrated_condition_and_its_skip_reason_print_the_same_text() -> None:
    import ast

    from accelplat._translate import translate

    condition = ast.parse(
        "current_platform.is_xpu() or "
        "(current_platform.is_cuda() and current_platform.supports_fp8())",
        mode="eval",
    )
    migrated = translate(condition.body)
    assert migrated == "xpu or (cuda and fp8)"
    assert caps.requirement(migrated).text == migrated

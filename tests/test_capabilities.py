"""Hardware identity facts per backend (through the vendor fakes) and the capability table."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from accelplat import _capabilities as caps
from accelplat._backends.cpu import cpu_isa
from accelplat._backends.cuda import CudaPlatform
from accelplat._backends.rocm import RocmPlatform
from accelplat._backends.rocm._topology import gfx_arch
from accelplat._backends.xpu import XpuPlatform, xe_arch
from accelplat._types import GIB, DeviceInfo, FeatureRule, GraphSupport
from accelplat.errors import ConfigurationError, DeviceNotFoundError
from tests.conftest import Install
from tests.fakes.hostfs import HostFS
from tests.fakes.levelzero import FakeLevelZero, arc, pvc
from tests.fakes.nvml import FakeGpu, FakeNvml, h200
from tests.fakes.sysfs import FakeSysfs


@pytest.fixture(autouse=True)
def _fresh_project() -> Iterator[None]:
    caps.clear_project_capabilities()
    yield
    caps.clear_project_capabilities()


def a100(index: int = 1) -> FakeGpu:
    return FakeGpu(
        name="NVIDIA A100-SXM4-80GB",
        uuid=f"GPU-{index:08x}-aaaa-bbbb-cccc-dddddddddddd",
        pci_bus_id=f"00000000:{0x40 + index:02X}:00.0",
        compute_capability=(8, 0),
    )


@pytest.fixture
def cuda(install: Install) -> CudaPlatform:
    install(FakeNvml([h200(0), a100(1)]))
    return CudaPlatform()


@pytest.fixture
def amd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSysfs:
    for name in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    tree = FakeSysfs(tmp_path)
    monkeypatch.setenv("ACCELPLAT_SYSFS_ROOT", str(tree.sys))
    return tree


# -- identity facts ------------------------------------------------------------------------------


def test_cuda_arch_and_compute_capability_come_from_nvml(cuda: CudaPlatform) -> None:
    first, second = cuda.devices()
    assert (first.arch, first.compute_capability) == ("sm_90", (9, 0))
    assert (second.arch, second.compute_capability) == ("sm_80", (8, 0))


def test_cuda_without_the_nvml_call_has_no_capability(install: Install) -> None:
    gpu = h200(0)
    gpu.compute_capability = None  # the fake then raises NVMLError_NotSupported
    install(FakeNvml([gpu]))
    (device,) = CudaPlatform().devices()
    assert (device.arch, device.compute_capability) == (None, None)
    assert device.name == "NVIDIA H200"  # the rest of the identity is unaffected


@pytest.mark.parametrize(
    ("version", "arch"),
    [(90402, "gfx942"), (90010, "gfx90a"), (90500, "gfx950"), (110000, "gfx1100"),
     (120001, "gfx1201"), (0, None), (None, None), (9999999, None), (91600, None)],
)  # fmt: skip
def test_gfx_target_version_names(version: int | None, arch: str | None) -> None:
    assert gfx_arch(version) == arch


def test_rocm_arch_comes_from_the_kfd_topology(amd: FakeSysfs) -> None:
    amd.add_kfd_cpu_node()
    amd.add_amd_gpu(0, pci="0000:03:00.0", vram_total=192 * GIB)
    amd.add_amd_gpu(
        1, pci="0000:83:00.0", vram_total=64 * GIB, gfx_target_version=90010, product_name="MI210"
    )
    devices = RocmPlatform().devices()
    assert [(d.arch, d.compute_capability) for d in devices] == [
        ("gfx942", (9, 4)),
        ("gfx90a", (9, 0)),
    ]


def test_rocm_node_without_the_property_has_no_arch(amd: FakeSysfs) -> None:
    amd.add_amd_gpu(0, pci="0000:03:00.0", vram_total=8 * GIB, gfx_target_version=None)
    assert RocmPlatform().devices()[0].arch is None


def test_xpu_arch_comes_from_the_level_zero_device_id() -> None:
    p = XpuPlatform(level_zero=FakeLevelZero([pvc(0x3A), arc(0x8C)]), usage_visible=True)
    assert [d.arch for d in p.devices()] == ["pvc", "pvc", "bmg"]  # two PVC tiles, one B580
    assert xe_arch(0x56A0) == "dg2"
    assert xe_arch(0x1234) is None


@pytest.mark.parametrize(
    ("machine", "flags", "isa"),
    [
        ("x86_64", "fpu sse sse2", "x86_64"),
        ("x86_64", "cx16 popcnt sse4_1 sse4_2 ssse3", "x86-64-v2"),
        (
            "x86_64",
            "cx16 popcnt sse4_1 sse4_2 ssse3 avx avx2 bmi1 bmi2 f16c fma movbe",
            "x86-64-v3",
        ),
        ("x86_64", "avx512f avx512bw avx512cd avx512dq avx512vl", "x86_64"),  # v4 needs v3, v2
        ("aarch64", "fp asimd sve", "aarch64"),
        ("", None, None),
    ],
)
def test_cpu_isa_levels(machine: str, flags: str | None, isa: str | None) -> None:
    assert cpu_isa(machine, None if flags is None else frozenset(flags.split())) == isa


def test_cpu_arch_from_proc_cpuinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = HostFS(tmp_path / "host")
    host.cpuinfo("Fake Xeon", flags="cx16 popcnt sse4_1 sse4_2 ssse3 avx avx2 bmi1 bmi2 f16c fma")
    host.meminfo(total=32 * GIB, available=30 * GIB)
    monkeypatch.setattr("accelplat._backends.cpu._machine", lambda: "x86_64")
    (device,) = host.platform().devices()
    assert (device.name, device.arch, device.compute_capability) == ("Fake Xeon", "x86-64-v2", None)


# -- built-in capabilities -----------------------------------------------------------------------


def test_hopper_has_fp8_e4m3fn_and_bf16_but_no_fp4(cuda: CudaPlatform) -> None:
    table = caps.capabilities(0, platform=cuda)
    assert table["fp8"] == caps.Capability(True, table["fp8"].reason, "e4m3fn")
    assert table["bf16"].available
    assert table["cuda-api"].available
    assert table["accelerator"].available
    assert not table["fp4"].available
    assert table["fp4"].reason == "needs sm_100+ (nvfp4,mxfp4); this is NVIDIA H200 (sm_90)"


def test_a100_reason_names_the_fact(cuda: CudaPlatform) -> None:
    fp8 = caps.capabilities(1, platform=cuda)["fp8"]
    assert not fp8.available
    assert fp8.value is None
    assert fp8.reason == "needs sm_89+ (e4m3fn); this is NVIDIA A100-SXM4-80GB (sm_80)"
    assert caps.has("bf16", 1, platform=cuda)


def test_mi300_fp8_is_fnuz_and_mi350_is_ocp(amd: FakeSysfs) -> None:
    amd.add_amd_gpu(0, pci="0000:03:00.0", vram_total=192 * GIB)
    amd.add_amd_gpu(1, pci="0000:83:00.0", vram_total=288 * GIB, gfx_target_version=90500)
    amd.add_amd_gpu(2, pci="0000:c3:00.0", vram_total=64 * GIB, gfx_target_version=90010)
    p = RocmPlatform()
    mi300, mi350, mi210 = (caps.capabilities(d, platform=p) for d in range(3))
    assert (mi300["fp8"].value, mi350["fp8"].value) == ("e4m3fnuz", "e4m3fn")
    assert not mi300["mxfp4"].available
    assert mi350["mxfp4"].available
    # vLLM's supports_fp8() is true on every CDNA part; MI210 emulates it (no fp8 hardware)
    assert mi210["fp8"].available
    assert mi210["fp8"].value == "e4m3fn"
    assert "emulated" in mi210["fp8"].reason
    assert "gfx90a" in mi210["fp8"].reason
    assert not mi210["fp8-native"].available
    assert "gfx90a" in mi210["fp8-native"].reason
    assert [t["fp8-native"].available for t in (mi300, mi350)] == [True, True]
    assert [t["fp8-fnuz"].available for t in (mi300, mi350, mi210)] == [True, False, False]
    assert mi210["bf16"].available
    assert mi300["cuda-api"].available


def test_cpu_has_bf16_and_nothing_device_only(tmp_path: Path) -> None:
    host = HostFS(tmp_path / "host")
    host.cpuinfo("Fake EPYC")
    host.meminfo(total=32 * GIB, available=30 * GIB)
    table = caps.capabilities(platform=host.platform())
    assert table["bf16"].available
    assert "any CPU" in table["bf16"].reason
    assert [n for n, c in table.items() if c.available] == ["bf16"]
    assert table["fp8"].reason == "the cpu platform has no fp8 support"
    assert table["cuda-api"].reason == "the cpu platform's torch device type is 'cpu'"


def test_graphs_carry_the_api_from_the_platform(cuda: CudaPlatform, monkeypatch) -> None:
    support = GraphSupport(True, "torch.cuda.CUDAGraph", "CUDA graphs via torch.cuda.CUDAGraph")
    monkeypatch.setattr(CudaPlatform, "graph", property(lambda self: support))
    assert caps.capabilities(platform=cuda)["graphs"].value == "torch.cuda.CUDAGraph"


def test_bad_device_index_is_an_error(cuda: CudaPlatform) -> None:
    with pytest.raises(DeviceNotFoundError):
        caps.capabilities(2, platform=cuda)


def test_unknown_name_is_an_error(cuda: CudaPlatform) -> None:
    with pytest.raises(ConfigurationError, match="unknown word 'fp9'"):
        caps.has("fp9", platform=cuda)


def test_backend_rules_and_project_arch_share_one_grammar(cuda: CudaPlatform, monkeypatch) -> None:
    rules = {"fp8": (FeatureRule(archs=("sm_89+",), value="e4m3fn"),)}
    monkeypatch.setattr(CudaPlatform, "FEATURES", rules)
    caps.define_capability("ada-or-newer", arch=["sm_89+"])
    hopper, ampere = caps.capabilities(0, platform=cuda), caps.capabilities(1, platform=cuda)
    assert hopper["fp8"].available
    assert hopper["ada-or-newer"].available
    assert not ampere["fp8"].available
    assert not ampere["ada-or-newer"].available


def test_accelerator_is_the_platform_datum_not_its_name(cuda: CudaPlatform, monkeypatch) -> None:
    monkeypatch.setattr(CudaPlatform, "is_accelerator", False, raising=False)
    assert (
        caps.capabilities(platform=cuda)["accelerator"].reason
        == "the cuda platform is the host CPU"
    )


# -- project capabilities ------------------------------------------------------------------------


def test_package_versions_are_pep_440(cuda: CudaPlatform, monkeypatch) -> None:
    monkeypatch.setattr(caps, "distribution_version", lambda name: "2.6.0a0+git1234")
    caps.define_capability("torch-25", packages={"torch": ">=2.5"})
    caps.define_capability("torch-26", packages=["torch>=2.6"])
    caps.define_capability("torch-26-exact", packages={"torch": "2.6.0a0"})  # bare means ==
    table = caps.capabilities(platform=cuda)
    assert table["torch-25"].available
    assert table["torch-26"].reason == "needs torch>=2.6; torch 2.6.0a0+git1234 is installed"
    assert table["torch-26-exact"].available


def test_capability_names_are_platform_names(cuda: CudaPlatform) -> None:
    caps.define_capability("a" * 64)
    with pytest.raises(ConfigurationError, match="at most 64 characters"):
        caps.define_capability("a" * 65)


def test_define_capability_with_arch_requires_and_packages(cuda: CudaPlatform) -> None:
    caps.define_capability("fa2-kernels", platforms=["cuda"], arch=["sm_80+"], requires=["bf16"])
    caps.define_capability("hopper-kernels", arch=["sm_90"], requires=["fa2-kernels"])
    caps.define_capability("needs-pkg", packages={"pytest": ">=1.0", "no-such-dist-xyz": ">=1"})
    caps.define_capability("old-pytest", packages=["pytest<1.0"])
    h, a = caps.capabilities(0, platform=cuda), caps.capabilities(1, platform=cuda)
    assert h["fa2-kernels"].available
    assert a["fa2-kernels"].available
    assert h["hopper-kernels"].available
    assert not a["hopper-kernels"].available
    assert "needs sm_90; this is NVIDIA A100-SXM4-80GB (sm_80)" in a["hopper-kernels"].reason
    assert h["needs-pkg"].reason == "needs no-such-dist-xyz>=1; no-such-dist-xyz is not installed"
    assert "needs pytest<1.0; pytest " in h["old-pytest"].reason


def test_every_unmet_condition_is_in_the_reason(cuda: CudaPlatform) -> None:
    caps.define_capability("aiter-moe", platforms=["rocm"], arch=["gfx942", "gfx950"], reason="AMD")
    reason = caps.capabilities(0, platform=cuda)["aiter-moe"].reason
    assert reason == (
        "runs on rocm; this is cuda; needs gfx942 or gfx950; this is NVIDIA H200 (sm_90) (AMD)"
    )


def test_check_callable_is_the_escape_hatch(cuda: CudaPlatform) -> None:
    caps.define_capability("big", check=lambda p, info: info is not None and "H200" in info.name)
    caps.define_capability("says-why", check=lambda p, info: "driver too old")
    caps.define_capability("raises", check=lambda p, info: 1 / 0)
    table = caps.capabilities(1, platform=cuda)
    assert not table["big"].available
    assert table["says-why"].reason == "driver too old"
    assert "ZeroDivisionError" in table["raises"].reason
    assert caps.capabilities(0, platform=cuda)["big"].available


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"arch": ["sm_999"]}, "'sm_999' is no NVIDIA architecture"),
        ({"arch": ["gfx"]}, "unknown arch 'gfx'"),
        ({"arch": ["volta"]}, "unknown arch 'volta'"),
        ({"min_compute_capability": "99.0"}, "compute capability 99.0 does not exist"),
        ({"packages": {"torch": "~=2"}}, "malformed version condition '~=2'"),
        ({"platforms": []}, "platforms must be a non-empty list"),
    ],
)
def test_impossible_conditions_are_configuration_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        caps.define_capability("x", **kwargs)
    assert "test_capabilities.py:" in str(info.value)  # names the defining file and line


def test_names_are_checked(cuda: CudaPlatform) -> None:
    with pytest.raises(ConfigurationError, match="built-in"):
        caps.define_capability("fp8")
    with pytest.raises(ConfigurationError, match="lower case"):
        caps.define_capability("Flash Attn")
    caps.define_capability("a", requires=["nope"])
    with pytest.raises(ConfigurationError, match="requires: unknown word 'nope'"):
        caps.capabilities(platform=cuda)


def test_pyproject_table(tmp_path: Path, cuda: CudaPlatform) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text(
        "[tool.accelplat.capabilities]\n"
        'fa2-kernels = { platforms = ["cuda"], min_compute_capability = "8.0" }\n'
        'fa3 = { arch = ["sm_90"], requires = ["fa2-kernels"] }\n'
    )
    loaded = caps.load_pyproject(path)
    assert [c.name for c in loaded] == ["fa2-kernels", "fa3"]
    assert caps.has("fa3", 0, platform=cuda)
    assert not caps.has("fa3", 1, platform=cuda)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('fa = { arch = ["sm_999"] }', r"pyproject.toml: \[tool.accelplat.capabilities\] fa"),
        ('fa = { colour = "red" }', "unknown condition"),
        ("fa = 3", "must be a table of conditions"),
        ('fa = { requires = ["fb"] }\nfb = { requires = ["fa"] }', "requirement cycle"),
        ("fa = {", "not valid TOML"),
    ],
)
def test_pyproject_errors_name_the_file_and_entry(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text("[tool.accelplat.capabilities]\n" + body + "\n")
    with pytest.raises(ConfigurationError, match=message):
        caps.load_pyproject(path)


def test_a_platform_without_devices_answers_no(cuda: CudaPlatform, monkeypatch) -> None:
    monkeypatch.setattr(CudaPlatform, "devices", lambda self: ())
    table = caps.capabilities(platform=cuda)
    assert table["fp8"] == caps.Capability(False, "needs a device; cuda has none visible")
    assert table["accelerator"].reason == "cuda has no visible device"


def test_device_info_defaults_keep_old_constructors() -> None:
    info = DeviceInfo(0, 0, "x")
    assert (info.arch, info.compute_capability) == (None, None)


@pytest.mark.parametrize(
    "imports",
    ["import accelplat", "import accelplat._capabilities, accelplat"],
)
def test_package_api_in_either_import_order(imports: str) -> None:
    import subprocess

    code = (
        f"{imports}; t = accelplat.capabilities(0, platform=accelplat.get_platform('cpu')); "
        "assert t['bf16'].available; assert isinstance(accelplat.has('fp8'), bool); "
        "import sys; assert 'torch' not in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_pyproject_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "pyproject.toml")
    with pytest.raises(ConfigurationError, match="cannot read the capability table"):
        caps.load_pyproject(tmp_path / "pyproject.toml")
    with pytest.raises(ConfigurationError, match="cannot read the capability table"):
        caps.load_pyproject(tmp_path / "missing.toml")


# -- hostile tables (issue 23): shapes, depth, long chains, linear work ---------------------------


def _load(tmp_path: Path, text: str) -> list[caps.ProjectCapability]:
    path = tmp_path / "pyproject.toml"
    path.write_text(text)
    return caps.load_pyproject(path)


TABLE = "[tool.accelplat.capabilities]\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tool = 1\n", r"\[tool\] must be a table"),
        ('tool = "accelplat"\n', r"\[tool\] must be a table"),
        ("tool = [1, 2]\n", r"\[tool\] must be a table"),
        ("[[tool]]\nx = 1\n", r"\[tool\] must be a table"),
        ("[tool]\naccelplat = 1\n", r"\[tool.accelplat\] must be a table"),
        ("[tool]\naccelplat = []\n", r"\[tool.accelplat\] must be a table"),
        ("[tool.accelplat]\ncapabilities = 'x'\n", r"\[tool.accelplat.capabilities\] must be"),
        ("[[tool.accelplat.capabilities]]\n", r"\[tool.accelplat.capabilities\] must be"),
        (TABLE + "fa = []\n", "must be a table of conditions"),
        (TABLE + "fa = { platforms = 1 }\n", "platforms must be a non-empty list"),
        (TABLE + "fa = { platforms = [1] }\n", "platforms entries must be non-empty strings"),
        (TABLE + "fa = { arch = { a = 1 } }\n", "arch must be a non-empty list"),
        (TABLE + "fa = { arch = [[]] }\n", "arch entries must be"),
        (TABLE + "fa = { min_compute_capability = true }\n", "min_compute_capability must"),
        (TABLE + "fa = { min_compute_capability = [[[8]], 0] }\n", "min_compute_capability"),
        (TABLE + "fa = { min_compute_capability = nan }\n", "min_compute_capability must"),
        (TABLE + "fa = { requires = 5 }\n", "requires must be a non-empty list"),
        (TABLE + "fa = { requires = [{}] }\n", "requires entries must be"),
        (TABLE + "fa = { packages = 5 }\n", "packages must be a table"),
        (TABLE + "fa = { packages = [1] }\n", "packages entries must be strings"),
        (TABLE + "fa = { packages = { torch = 1 } }\n", "needs a version string"),
        (TABLE + "fa = { packages = ['-torch'] }\n", "malformed package requirement"),
        (TABLE + "fa = { reason = 1 }\n", "reason must be a string"),
        (TABLE + f"{'a' * 100_000} = {{}}\n", "lower case letters"),
        (TABLE + "fa = { arch = ['" + "x" * 100_000 + "'] }\n", r"unknown arch 'xxx.*characters"),
    ],
)
def test_every_table_shape_is_checked_and_named(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        _load(tmp_path, text)
    assert "pyproject.toml" in str(info.value)
    assert len(str(info.value)) < 1_000  # a 100 KB value is not echoed in full


@pytest.mark.parametrize(
    "text",
    [
        "x = " + "[" * 5_000 + "]" * 5_000 + "\n",
        "x = " + "{ a = " * 5_000 + "1" + " }" * 5_000 + "\n",
        "tool = " + "[" * 5_000 + "]" * 5_000 + "\n",
        TABLE + "fa = { platforms = " + "[" * 5_000 + "]" * 5_000 + " }\n",
        TABLE + "fa = { arch = " + "[" * 200 + "'sm_80'" + "]" * 200 + " }\n",
        TABLE + "fa = { min_compute_capability = " + "[" * 200 + "]" * 200 + " }\n",
        "[" + ".".join(["tool", "accelplat", "capabilities", "fa"] + ["a"] * 5_000) + "]\n",
    ],
)
def test_deep_toml_is_a_configuration_error(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigurationError, match=r"pyproject\.toml"):  # never a RecursionError
        _load(tmp_path, text)


@pytest.mark.parametrize(
    ("n", "each"),
    [
        (3_000, '"c{i_1}"'),  # a chain 3,000 long
        (200, '"c{i_1}"'),
        (60, '"c{i_1}", "c{i_2}"'),  # each needs the two before: reasons used to double
        (200, "all before"),  # a wide DAG, 19,900 edges
    ],
)
def test_long_chains_and_wide_tables_are_linear(
    tmp_path: Path, cuda: CudaPlatform, monkeypatch: pytest.MonkeyPatch, n: int, each: str
) -> None:
    evaluated: list[str] = []
    real = caps._evaluate_project

    def counting(cap: caps.ProjectCapability, *args: object) -> caps.Capability:
        evaluated.append(cap.name)
        return real(cap, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(caps, "_evaluate_project", counting)
    lines = [TABLE, 'c0 = { platforms = ["rocm"], reason = "' + "r" * 500 + '" }\n']
    for i in range(1, n):
        if each == "all before":
            needs = ", ".join(f'"c{j}"' for j in range(i))
        else:
            needs = each.replace("{i_1}", str(i - 1)).replace("{i_2}", str(max(i - 2, 0)))
        lines.append(f"c{i} = {{ requires = [{needs}] }}\n")
    _load(tmp_path, "".join(lines))
    table = caps.capabilities(0, platform=cuda)  # no RecursionError, no exponential reason
    assert len(evaluated) == n  # each entry once
    assert not table[f"c{n - 1}"].available
    assert len(table[f"c{n - 1}"].reason) <= n * 200
    assert list(table)[-n:] == sorted(f"c{i}" for i in range(n))


def test_a_wide_table_does_not_hang_info_or_pytest(tmp_path: Path) -> None:
    import subprocess

    names = [f"c{i}" for i in range(200)]
    body = 'c0 = { platforms = ["rocm"] }\n' + "".join(
        f"{n} = {{ requires = [{', '.join(repr(m) for m in names[:i][-60:])}] }}\n"
        for i, n in enumerate(names)
        if i
    )
    (tmp_path / "pyproject.toml").write_text(TABLE + body)
    env = {**__import__("os").environ, "ACCELPLAT_PLATFORM": "cpu"}
    done = subprocess.run(  # a generous bound: it used to never finish
        [sys.executable, "-m", "accelplat", "info"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "c199" in done.stdout


@pytest.mark.parametrize(
    "entry",
    [
        "a" + " " * 100_000 + "x\ny",
        " " * 100_000 + "torch>=1",
        "torch" + " " * 100_000 + ">=1",
        "torch>=" + " " * 100_000 + "1",
        "torch>=1" + " " * 100_000,
        "torch" + " " * 100_000 + "\n>=1\nx",
        "torch" + "," * 100_000 + ">=1",
        "torch>=1" + ", " * 50_000 + "x",
    ],
)
def test_version_conditions_parse_in_linear_time(entry: str) -> None:
    try:
        cap = caps.define_capability("pkg", packages=[entry])
    except ConfigurationError as exc:
        message = str(exc)
    else:
        message = cap.packages[0].name
    assert message in ("torch", "a") or "malformed" in message
    assert len(message) < 1_000


def test_info_names_a_broken_table_instead_of_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from accelplat._cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "cpu")
    for text in ("tool = 1\n", "[tool]\naccelplat = 'x'\n", "x = " + "[" * 5_000 + "]" * 5_000):
        (tmp_path / "pyproject.toml").write_text(text)
        assert main(["info"]) == 2
        err = capsys.readouterr().err
        assert "pyproject.toml" in err
        assert "Traceback" not in err

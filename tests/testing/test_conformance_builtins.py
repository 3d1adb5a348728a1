"""Every built-in backend passes the conformance kit: cpu and simulated as they are, rocm, xpu
and cuda over the vendor fakes (a fake sysfs tree, a fake Level Zero loader or torch.xpu, a fake
pynvml). CUDA on a real GPU runs from ``tests/gpu`` (see ``docs/writing-a-backend.md``).

Where the fake lives in files named by variables (sysfs roots, a compiled Level Zero loader, a
simulated spec), the kit rebuilds the platform by name in a fresh process, so the framework and
device-context checks run isolated. Where the fake is a module in ``sys.modules`` (fake pynvml,
fake torch), a fresh process could not see it; the kit then runs those checks in this process
with ``factory=`` to rebuild the platform, and says so.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from accelplat.testing import ConformanceReport, run_conformance
from tests._hosts import VirtualClock, clear_vendor_variables

GIB = 1024**3


def assert_conforms(report: ConformanceReport, *, isolated: bool) -> None:
    assert report.passed, report.summary()
    where = report.result("no_framework_import").detail
    if isolated:
        assert where.startswith("fresh process"), where
    else:
        assert "in-process" in where or report.result("no_framework_import").verdict == "skip"


@pytest.fixture(autouse=True)
def _no_vendor_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_vendor_variables(monkeypatch)


# -- cpu and simulated -------------------------------------------------------------------------


def test_cpu_conforms() -> None:
    report = run_conformance("cpu")
    assert_conforms(report, isolated=True)
    assert report.result("visible_devices").verdict == "skip"  # the host has no such variable


def test_simulated_conforms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tmp_path / "sim.json"
    spec.write_text(
        json.dumps(
            {
                "clock": "virtual",
                "release": {"lazy": True, "stable_duration_s": 2.0, "settle_timeout_s": 60.0},
                "devices": [
                    {"name": "Sim A", "total": 80 * GIB, "used": 2 * GIB},
                    {"name": "Sim B", "total": 80 * GIB, "used": 0},
                ],
            }
        )
    )
    monkeypatch.setenv("ACCELPLAT_SIMULATED_SPEC", str(spec))
    report = run_conformance("simulated")
    assert_conforms(report, isolated=True)


# -- rocm over a fake sysfs tree ----------------------------------------------------------------


@pytest.fixture
def amd_tree(tmp_path: Path) -> Path:
    from tests.fakes.sysfs import FakeSysfs

    fs = FakeSysfs(tmp_path / "root")
    gpus = [
        fs.add_amd_gpu(card, pci=f"0000:{0x10 + card:02x}:00.0", vram_total=192 * GIB,
                       vram_used=(card + 1) * GIB)
        for card in range(3)
    ]  # fmt: skip
    fs.add_kfd_process(os.getppid(), {gpus[0].gpu_id: GIB // 2})
    fs.add_dev_nodes([g.render_minor for g in gpus])
    return fs.root


def test_rocm_conforms_over_fake_sysfs_in_a_fresh_process(
    amd_tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELPLAT_SYSFS_ROOT", str(amd_tree / "sys"))
    monkeypatch.setenv("ACCELPLAT_DEV_ROOT", str(amd_tree / "dev"))
    report = run_conformance("rocm", settle_clock=VirtualClock())
    assert_conforms(report, isolated=True)
    assert "CUDA_VISIBLE_DEVICES='0,1' -> 2 (subprocess)" in report.result("visible_devices").detail
    assert "0: 1 holder(s)" in report.result("memory_holders").detail


def test_rocm_visible_devices_check_clears_a_parent_hip_visible_devices(
    amd_tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A parent with HIP_VISIBLE_DEVICES set (Slurm, Ray): setting only CUDA_VISIBLE_DEVICES would
    # conflict (vLLM raises); the check sets HIP_VISIBLE_DEVICES="" beside it, which HIP ignores.
    monkeypatch.setenv("ACCELPLAT_SYSFS_ROOT", str(amd_tree / "sys"))
    monkeypatch.setenv("ACCELPLAT_DEV_ROOT", str(amd_tree / "dev"))
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "2,1,0")
    report = run_conformance("rocm", checks=["visible_devices"])
    result = report.result("visible_devices")
    assert result.verdict == "pass", result.detail
    assert "CUDA_VISIBLE_DEVICES='0' -> 1 (subprocess)" in result.detail


def test_rocm_conforms_when_built_with_roots(amd_tree: Path) -> None:
    from accelplat._backends.rocm import RocmPlatform

    def factory() -> RocmPlatform:
        return RocmPlatform(
            sysfs_root=amd_tree / "sys", dev_root=amd_tree / "dev", allow_amdsmi=False
        )

    report = run_conformance(factory(), factory=factory, settle_clock=VirtualClock())
    assert_conforms(report, isolated=False)
    assert "(in-process)" in report.result("visible_devices").detail


# -- xpu over fake Level Zero and fake torch.xpu -------------------------------------------------


def test_xpu_conforms_over_a_compiled_level_zero_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.fakes import levelzero

    if levelzero.c_compiler() is None:
        pytest.skip("no C compiler to build the fake Level Zero loader")
    cards = [levelzero.arc(0x30 + i, used=(i + 1) * GIB) for i in range(3)]
    lib = levelzero.build_c_library(cards, tmp_path / "lz")
    (tmp_path / "sys").mkdir()
    monkeypatch.setenv("ACCELPLAT_LEVEL_ZERO_LIB", str(lib))
    monkeypatch.setenv("ACCELPLAT_SYSFS_ROOT", str(tmp_path / "sys"))
    report = run_conformance("xpu", settle_clock=VirtualClock())
    assert_conforms(report, isolated=True)
    assert "ZE_AFFINITY_MASK='0' -> 1 (subprocess)" in report.result("visible_devices").detail


def test_xpu_conforms_over_a_python_level_zero(tmp_path: Path) -> None:
    from accelplat._backends.xpu import XpuPlatform
    from tests.fakes.levelzero import FakeLevelZero, arc

    (tmp_path / "sys").mkdir()

    def factory() -> XpuPlatform:
        cards = [arc(0x30 + i, used=(i + 1) * GIB) for i in range(3)]
        return XpuPlatform(sysfs_root=tmp_path / "sys", level_zero=FakeLevelZero(cards))

    report = run_conformance(factory(), factory=factory, settle_clock=VirtualClock())
    assert_conforms(report, isolated=False)


def test_xpu_conforms_over_fake_torch_xpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from accelplat._backends.xpu import XpuPlatform
    from tests.fakes.sysfs import FakeSysfs
    from tests.fakes.torch_xpu import FakeXpuDevice, install_fake_torch, make_fake_torch

    torch = make_fake_torch([FakeXpuDevice(free=60 * GIB), FakeXpuDevice(free=50 * GIB)])
    install_fake_torch(monkeypatch, torch)
    fs = FakeSysfs(tmp_path / "root")  # the cards torch sees, as the xe driver shows them
    for card in range(2):
        fs.add_intel_gpu(card, pci=f"0000:{0x40 + card:02x}:00.0")
    monkeypatch.setenv("ACCELPLAT_SYSFS_ROOT", str(fs.sys))

    def factory() -> XpuPlatform:
        return XpuPlatform(level_zero=False, allow_torch=True)

    platform = factory()
    report = run_conformance(platform, factory=factory, settle_clock=VirtualClock())
    assert report.passed, report.summary()
    assert platform.context_free is False  # torch.xpu creates a context: declared
    assert report.result("no_device_context").verdict == "skip"
    # torch reads ZE_AFFINITY_MASK once at start: an in-process change proves nothing
    assert report.result("visible_devices").verdict == "skip"
    assert report.result("probe").detail.startswith("available=True")


# -- cuda over a fake pynvml ----------------------------------------------------------------------


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from accelplat._vendor import nvml as _nvml
    from tests.fakes.nvml import FakeNvml, h200

    fake = FakeNvml([h200(0, used=GIB), h200(1, used=7 * GIB), h200(2)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # no libcuda needed for the order
    yield fake
    _nvml.shutdown()


def test_cuda_conforms_over_fake_nvml(fake_nvml: Any) -> None:
    from accelplat._backends.cuda import CudaPlatform

    report = run_conformance(
        CudaPlatform(), factory=CudaPlatform, empty_visible_hides_all=True, isolation="inprocess"
    )
    assert_conforms(report, isolated=False)
    assert "CUDA_VISIBLE_DEVICES='' -> 0 (in-process" in report.result("visible_devices").detail

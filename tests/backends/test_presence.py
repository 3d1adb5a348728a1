"""Quick absence checks: the same answer as the backends' probes, without loading them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelplat._backends import _common, _presence
from accelplat._backends.rocm import RocmPlatform
from accelplat._backends.xpu import XpuPlatform
from accelplat._vendor import levelzero as _levelzero
from accelplat._vendor import nvml as _nvml
from tests.fakes.sysfs import FakeSysfs

HEAVY = (
    "pynvml",
    "psutil",
    "amdsmi",
    "torch",
    "secrets",
    "accelplat._vendor.levelzero",
    "accelplat._backends.cuda",
    "accelplat._backends.rocm",
    "accelplat._backends.xpu",
    "accelplat._visible.cuda",
    "accelplat._visible.oneapi",
    "accelplat._visible.rocm",
)
"""What detection and a first query must not import on a host without an accelerator driver."""


@pytest.fixture
def fs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSysfs:
    tree = FakeSysfs(tmp_path)
    monkeypatch.setenv(_common.ENV_SYSFS_ROOT, str(tree.sys))
    monkeypatch.setenv(_presence.ENV_LEVEL_ZERO_LIB, str(tmp_path / "no-libze_loader.so.1"))
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    return tree


def _same_as_probes() -> None:
    rocm, xpu = RocmPlatform.probe(), XpuPlatform.probe()
    assert not rocm.available
    assert not xpu.available
    assert _presence.rocm_absent() == rocm.reason
    assert _presence.xpu_absent() == xpu.reason


def test_no_drm_directory_gives_the_probes_reasons(fs: FakeSysfs) -> None:
    (fs.sys / "class" / "drm").rmdir()
    _same_as_probes()
    assert "does not exist" in (_presence.xpu_absent() or "")


def test_cards_of_other_vendors_give_the_probes_reasons(fs: FakeSysfs) -> None:
    fs.add_other_gpu(0, pci="0000:01:00.0")
    fs.add_connector("card0-DP-1")
    _same_as_probes()
    assert "no AMD GPU with VRAM files" in (_presence.rocm_absent() or "")


def test_a_vendor_card_defers_to_the_full_probe(fs: FakeSysfs) -> None:
    fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=1 << 30)
    fs.add_intel_gpu(1, pci="0000:8c:00.0")
    assert _presence.rocm_absent() is None
    assert _presence.xpu_absent() is None


def test_an_unreadable_vendor_file_defers_to_the_full_probe(fs: FakeSysfs) -> None:
    fs.add_other_gpu(0, pci="0000:01:00.0")
    fs.write_attr(0, "vendor", "not hex\n")
    assert _presence.rocm_absent() is None
    assert _presence.xpu_absent() is None


def test_torch_or_amdsmi_imported_defers_rocm_to_its_probe(
    fs: FakeSysfs, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _presence.rocm_absent() is not None
    monkeypatch.setitem(sys.modules, "torch", object())
    assert _presence.rocm_absent() is None
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # blocked: the probe says so itself
    assert _presence.rocm_absent() is None


def test_a_loadable_level_zero_loader_defers_xpu_to_its_probe(
    fs: FakeSysfs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_presence.ENV_LEVEL_ZERO_LIB, "libc.so.6")  # loads: may list a GPU
    assert _presence.xpu_absent() is None


def test_the_binding_knows_intels_vendor_id() -> None:
    # the binding sits below the backends, so it keeps its own copy of Intel's vendor id
    assert _common.INTEL_VENDOR_ID == _levelzero.INTEL_VENDOR_ID


def test_cuda_check_is_nvmls_own_and_defers_once_pynvml_is_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setattr(_nvml, "library_missing", lambda: "no library here")
    assert _nvml.unavailable_before_import() == "no library here"
    monkeypatch.setitem(sys.modules, "pynvml", object())
    assert _nvml.unavailable_before_import() is None


_DETECT = """
import json, sys, accelplat
from accelplat import _registry as registry
platform = accelplat.current_platform()
platform.memory_info(0)
report = registry.detect()
heavy = sorted(m for m in json.loads(sys.argv[1]) if m in sys.modules)
from accelplat._backends.cuda import CudaPlatform
from accelplat._backends.rocm import RocmPlatform
from accelplat._backends.xpu import XpuPlatform
probes = {c.name: c.probe().reason for c in (CudaPlatform, RocmPlatform, XpuPlatform)}
print(json.dumps({
    "platform": platform.name,
    "heavy": heavy,
    "reasons": {c.name: c.reason for c in report.candidates if c.name in probes},
    "probes": probes,
}))
"""


def test_detection_without_a_driver_loads_no_gpu_backend(tmp_path: Path) -> None:
    if _nvml.library_missing() is None:
        pytest.skip("NVML's library loads on this host")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELPLAT_")}
    env[_common.ENV_SYSFS_ROOT] = str(tmp_path)  # no class/drm: no AMD or Intel card
    env[_presence.ENV_LEVEL_ZERO_LIB] = str(tmp_path / "no-libze_loader.so.1")
    done = subprocess.run(
        [sys.executable, "-c", _DETECT, json.dumps(HEAVY)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["platform"] == "cpu"
    assert seen["heavy"] == []
    # the quick checks said what the probes say
    assert seen["reasons"] == seen["probes"]

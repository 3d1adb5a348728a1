"""Leases stay inside the devices an outer scheduler granted, on every vendor.

Slurm GRES sets ``CUDA_VISIBLE_DEVICES`` (and ``GPU_DEVICE_ORDINAL``; ``ROCR_VISIBLE_DEVICES`` on
AMD, ``ZE_AFFINITY_MASK`` on Intel); Kubernetes' device plugin hands the container runtime
``NVIDIA_VISIBLE_DEVICES``, which shows the pod only those GPUs; Ray sets ``CUDA_VISIBLE_DEVICES``
(NVIDIA), ``ROCR_VISIBLE_DEVICES`` (AMD; ``HIP_VISIBLE_DEVICES`` in older releases) or
``ZE_AFFINITY_MASK`` (Intel; ``ONEAPI_DEVICE_SELECTOR`` in older releases), as its
``ray/_private/accelerators/`` managers say. For each: whole-device leases and memory shares
take only granted devices, a lease of more is refused, and a child under the lease's environment
(with the scheduler's variables still set) sees exactly the leased devices.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from accelplat._leasing import ENV_LEASE_DIR, lease
from accelplat._platform import Platform
from accelplat._types import GIB
from accelplat.errors import LeaseUnsatisfiableError
from tests.fakes.levelzero import FakeLevelZero, pvc
from tests.fakes.nvml import FakeNvml, h200
from tests.fakes.sysfs import FakeSysfs

SCHEDULER_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "NVIDIA_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
    "ONEAPI_DEVICE_SELECTOR",
    "ZE_FLAT_DEVICE_HIERARCHY",
)


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in (*SCHEDULER_VARS, ENV_LEASE_DIR, "CUDA_DEVICE_ORDER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # hermetic: sysfs only on ROCm
    monkeypatch.setenv("ACCELPLAT_LEVEL_ZERO_LIB", str(tmp_path / "no-libze_loader.so.1"))
    monkeypatch.setenv("ACCELPLAT_SYSFS_ROOT", str(tmp_path / "empty-sys"))


@pytest.fixture
def cuda_host(install: Any) -> Callable[..., tuple[Callable[[], Platform], list[str]]]:
    from accelplat._backends.cuda import CudaPlatform

    def make(count: int = 4) -> tuple[Callable[[], Platform], list[str]]:
        gpus = [h200(i, used=i * GIB) for i in range(count)]
        install(FakeNvml(gpus))
        return CudaPlatform, [g.uuid for g in gpus]

    return make


@pytest.fixture
def rocm_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[[], tuple[Callable[[], Platform], list[str]]]:
    from accelplat._backends.rocm import RocmPlatform

    def make() -> tuple[Callable[[], Platform], list[str]]:
        fs = FakeSysfs(tmp_path / "host")
        monkeypatch.setenv("ACCELPLAT_SYSFS_ROOT", str(fs.sys))
        fs.add_kfd_cpu_node()
        gpus = [
            fs.add_amd_gpu(i, pci=f"0000:{0x10 * (i + 1):02x}:00.0", vram_total=192 * GIB)
            for i in range(4)
        ]
        return RocmPlatform, [g.uuid for g in gpus]

    return make


def _check(
    make: Callable[[], Platform],
    granted: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every kind of lease stays in ``granted`` (stable ids), and its child sees what it holds."""
    platform = make()
    assert sorted(d.stable_id or "" for d in platform.devices()) == sorted(granted)
    n = len(granted)
    with lease(n, platform=platform, lock_dir=tmp_path) as whole:
        assert sorted(d.stable_id or "" for d in whole.devices) == sorted(granted)
    with pytest.raises(LeaseUnsatisfiableError, match=f"shows this process only {n}"):
        lease(n + 1, platform=platform, lock_dir=tmp_path)
    with lease(n, memory="8GiB", platform=platform, lock_dir=tmp_path) as share:
        assert sorted(d.stable_id or "" for d in share.devices) == sorted(granted)
    with lease(1, platform=platform, lock_dir=tmp_path) as one:
        chosen = [d.stable_id for d in one.devices]
        with monkeypatch.context() as child:  # the child's environment: the scheduler's + ours
            for name, value in one.environ.items():
                if value is None:
                    child.delenv(name, raising=False)
                else:
                    child.setenv(name, value)
            assert [d.stable_id for d in make().devices()] == chosen
        assert chosen[0] in granted


@pytest.mark.parametrize(
    ("value", "granted"),
    [
        ("3,1", [3, 1]),  # Slurm and Ray: indices
        ("uuids:2", [2]),  # by UUID
    ],
    ids=["indices", "uuid"],
)
def test_cuda_grants(
    cuda_host: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, granted: list[int]
) -> None:
    make, uuids = cuda_host()
    if value.startswith("uuids:"):
        value = ",".join(uuids[int(i)] for i in value[6:].split(","))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    monkeypatch.setenv("GPU_DEVICE_ORDINAL", value)  # Slurm sets it beside; CUDA ignores it
    _check(make, [uuids[i] for i in granted], tmp_path, monkeypatch)


def test_kubernetes_pod_sees_and_leases_only_its_gpus(
    cuda_host: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The device plugin's NVIDIA_VISIBLE_DEVICES is applied by the container runtime: NVML in
    # the pod enumerates only the granted GPUs. accelplat leaves the variable to the runtime.
    make, uuids = cuda_host(2)
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", ",".join(uuids))
    _check(make, uuids, tmp_path, monkeypatch)
    with lease(memory="8GiB", platform=make(), lock_dir=tmp_path) as held:
        assert "NVIDIA_VISIBLE_DEVICES" not in held.environ


@pytest.mark.parametrize(
    ("env", "granted"),
    [
        ({"ROCR_VISIBLE_DEVICES": "3,1"}, [3, 1]),  # Slurm (AMD) and Ray (AMD)
        ({"ROCR_VISIBLE_DEVICES": "2", "GPU_DEVICE_ORDINAL": "2"}, [2]),  # Slurm sets both
        ({"HIP_VISIBLE_DEVICES": "0,2"}, [0, 2]),  # older Ray (AMD)
        # GPU_DEVICE_ORDINAL alone is OpenCL's: HIP reads HIP_VISIBLE_DEVICES, else
        # CUDA_VISIBLE_DEVICES, and not it (ROCm/clr rocdevice.cpp, Device::init)
        ({"GPU_DEVICE_ORDINAL": "1"}, [0, 1, 2, 3]),
    ],
    ids=["rocr", "rocr+ordinal", "hip", "ordinal-alone"],
)
def test_rocm_grants(
    rocm_host: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    granted: list[int],
) -> None:
    make, uuids = rocm_host()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    _check(make, [uuids[i] for i in granted], tmp_path, monkeypatch)


@pytest.mark.parametrize(
    ("env", "granted"),
    [
        ({"ZE_AFFINITY_MASK": "2,0"}, [2, 0]),  # Slurm and Ray (Intel)
        ({"ONEAPI_DEVICE_SELECTOR": "level_zero:1,3"}, [1, 3]),  # older Ray (Intel)
    ],
    ids=["affinity-mask", "selector"],
)
def test_xpu_grants(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], granted: list[int]
) -> None:
    from accelplat._backends.xpu import XpuPlatform

    monkeypatch.setenv("ZE_FLAT_DEVICE_HIERARCHY", "COMPOSITE")  # one device per card
    cards = [pvc(0x3A + i) for i in range(4)]
    fake = FakeLevelZero(cards)

    def make() -> Platform:
        return XpuPlatform(level_zero=fake, usage_visible=True)

    every = [d.stable_id or "" for d in make().devices()]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    _check(make, [every[i] for i in granted], tmp_path, monkeypatch)

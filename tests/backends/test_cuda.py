"""The CUDA backend against a fake nvidia-ml-py (tests/fakes/nvml.py): no GPU needed."""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import json
import logging
import os
import subprocess
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest

from accelplat import _registry as registry
from accelplat._backends.cuda import CudaPlatform, cuda_order_uuids
from accelplat._platform import Platform
from accelplat._types import GraphSupport, HolderState, MemoryInfo, ReleaseProfile
from accelplat._vendor import nvml as _nvml
from accelplat.errors import AccelplatError, BackendError, DeviceNotFoundError
from tests.conftest import Install
from tests.fakes.nvml import (
    GIB,
    H200_RESERVED,
    H200_TOTAL,
    MIB,
    FakeGpu,
    FakeMigDevice,
    FakeNvml,
    NVMLError,
    NVMLLibraryMismatchError,
    error_class,
    h200,
)

REPO = Path(__file__).resolve().parents[2]


def two_gpus() -> FakeNvml:
    """Two H200s that differ in memory use, so a wrong mapping shows."""
    return FakeNvml([h200(0, used=1 * GIB), h200(1, used=7 * GIB)])


# -- constants and capability ----------------------------------------------------------------


def test_platform_constants(install: Install) -> None:
    install(two_gpus())
    p = CudaPlatform()
    assert isinstance(p, Platform)
    assert (p.name, p.device_type, p.visible_devices_env) == (
        "cuda",
        "cuda",
        "CUDA_VISIBLE_DEVICES",
    )
    assert p.default_memory_utilization == 0.92
    assert p.preferred_start_method == "fork"
    assert p.context_free is True
    assert p.release == ReleaseProfile(
        lazy=False, stable_duration_s=0.0, settle_timeout_s=120.0, idle_floor_bytes=0
    )


@pytest.mark.parametrize(
    ("installed", "available", "api"),
    [
        (None, False, None),
        ("2.11.0+cu130", True, "torch.cuda.CUDAGraph"),
        ("2.4.0", True, "torch.cuda.CUDAGraph"),
        ("2.5.1+cpu", False, None),
    ],
)
def test_graph_support_from_the_installed_version(
    monkeypatch: pytest.MonkeyPatch, installed: str | None, available: bool, api: str | None
) -> None:
    def version(name: str) -> str:
        assert name == "torch"
        if installed is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed

    monkeypatch.setattr(importlib.metadata, "version", version)
    graph = CudaPlatform().graph
    assert isinstance(graph, GraphSupport)
    assert (graph.available, graph.api) == (available, api)
    assert graph.reason
    if installed is not None:
        assert installed in graph.reason


# -- probe -----------------------------------------------------------------------------------


def test_probe_available_names_driver_and_count(install: Install) -> None:
    install(FakeNvml([h200(0), h200(1), h200(2)], driver_version="580.159.03"))
    result = CudaPlatform.probe()
    assert result.available
    assert "580.159.03" in result.reason
    assert "3 of 3" in result.reason
    assert "NVIDIA H200" in result.reason


def test_probe_counts_after_the_visible_mapping(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(FakeNvml([h200(0), h200(1), h200(2)]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert "2 of 3" in CudaPlatform.probe().reason
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = CudaPlatform.probe()
    assert not result.available
    assert "CUDA_VISIBLE_DEVICES=''" in result.reason
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,1")
    result = CudaPlatform.probe()
    assert not result.available
    assert "twice" in result.reason


def test_probe_without_gpus(install: Install) -> None:
    install(FakeNvml([]))
    result = CudaPlatform.probe()
    assert not result.available
    assert "no NVIDIA GPU" in result.reason


def test_probe_without_nvidia_ml_py(install: Install) -> None:
    install(None)  # sys.modules entry None: "import pynvml" raises ImportError
    result = CudaPlatform.probe()
    assert not result.available
    assert "nvidia-ml-py" in result.reason


def test_probe_with_a_shadowed_pynvml_module(install: Install) -> None:
    install(types.ModuleType("pynvml"))  # e.g. a stray pynvml.py on sys.path
    result = CudaPlatform.probe()
    assert not result.available
    assert "shadowed" in result.reason


@pytest.mark.parametrize(
    ("error", "words"),
    [
        ("LibraryNotFound", "libnvidia-ml.so.1"),
        ("DriverNotLoaded", "kernel driver is not loaded"),
        ("LibRmVersionMismatch", "differ in version"),
        ("NoPermission", "permission"),
        ("Unknown", "unknown"),
        ("Timeout", "NVMLError_Timeout"),
        (NVMLLibraryMismatchError("too new"), "newer than the installed driver"),
        (RuntimeError("boom"), "boom"),
    ],
)
def test_probe_reasons_when_nvml_init_fails(install: Install, error: Any, words: str) -> None:
    fake = install(two_gpus())
    fake.fail("nvmlInit", error)
    result = CudaPlatform.probe()
    assert not result.available
    assert words in result.reason


def test_probe_never_raises_when_enumeration_fails(install: Install) -> None:
    fake = install(two_gpus())
    fake.fail("nvmlDeviceGetHandleByIndex", "GpuIsLost", after=1)
    result = CudaPlatform.probe()
    assert not result.available
    assert "NVMLError_GpuIsLost" in result.reason


def test_detection_picks_cuda_and_a_failing_nvml_falls_through(install: Install) -> None:
    install(two_gpus())
    assert registry.current_platform().name == "cuda"
    registry.reset()
    fake = install(two_gpus())
    fake.fail("nvmlInit", "DriverNotLoaded")
    report = registry.detect()
    (cuda,) = [c for c in report.candidates if c.name == "cuda"]
    assert not cuda.available
    assert "NVMLError_DriverNotLoaded" in cuda.reason
    assert report.chosen != "cuda"


# -- devices and the visible mapping ---------------------------------------------------------


def test_devices_describe_each_gpu(install: Install) -> None:
    install(two_gpus())
    devices = CudaPlatform().devices()
    assert [(d.index, d.physical_index, d.name) for d in devices] == [
        (0, 0, "NVIDIA H200"),
        (1, 1, "NVIDIA H200"),
    ]
    assert devices[0].uuid == "GPU-00000000-1111-2222-3333-444444444444"
    assert devices[1].pci_bus_id == "0000:28:00.0"


def test_visible_device_0_is_physical_gpu_1_under_cuda_visible_devices_1(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = install(two_gpus())
    p = CudaPlatform()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    (dev,) = p.devices()
    assert (dev.index, dev.physical_index, dev.uuid) == (0, 1, fake.gpus[1].uuid)
    # memory of physical GPU 1 is what memory_info(0) returns
    assert p.memory_info(0).used == 7 * GIB
    with pytest.raises(DeviceNotFoundError):
        p.memory_info(1)


@pytest.mark.parametrize(
    ("value", "physical"),
    [
        (None, [0, 1, 2]),
        ("", []),
        ("NoDevFiles", []),
        ("1", [1]),
        ("2,0", [2, 0]),
        ("1abc,0", [1, 0]),
        ("0,7,1", [0]),
        ("0,x,1", [0]),
        ("1,1", []),
        ("GPU-00000002", [2]),
        ("GPU-00000002-1111-2222-3333-444444444444,GPU-00000000", [2, 0]),
        ("GPU-0000000", []),  # ambiguous prefix
        ("GPU-00000001,0", [1]),
    ],
)
def test_cuda_visible_devices_forms_through_the_backend(
    install: Install, monkeypatch: pytest.MonkeyPatch, value: str | None, physical: list[int]
) -> None:
    install(FakeNvml([h200(0), h200(1), h200(2)]))
    if value is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    p = CudaPlatform()
    assert [d.physical_index for d in p.devices()] == physical
    assert p.device_count() == len(physical)


def test_the_variable_is_read_on_every_call(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(two_gpus())
    p = CudaPlatform()
    assert p.device_count() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert p.memory_info(0).used == 7 * GIB
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert p.memory_info(0).used == 1 * GIB
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert p.device_count() == 2


@pytest.mark.parametrize("bad", [2, -1, True, "0", 0.0, None])
def test_bad_indices_raise_device_not_found(install: Install, bad: Any) -> None:
    install(two_gpus())
    p = CudaPlatform()
    with pytest.raises(DeviceNotFoundError) as info:
        p.memory_info(bad)
    assert isinstance(info.value, IndexError)
    with pytest.raises(DeviceNotFoundError):
        p.memory_holders(bad)


def test_pci_order_when_nvml_order_differs(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = FakeGpu("NVIDIA H200", "GPU-aaaaaaaa", "00000000:9A:00.0", used=1 * GIB)
    b = FakeGpu("NVIDIA H200", "GPU-bbbbbbbb", "00000000:1B:00.0", used=2 * GIB)
    install(FakeNvml([a, b]))
    p = CudaPlatform()
    assert [d.uuid for d in p.devices()] == ["GPU-bbbbbbbb", "GPU-aaaaaaaa"]
    assert [d.physical_index for d in p.devices()] == [1, 0]
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert p.memory_info(0).used == 2 * GIB


class OrderRecorder:
    """An order resolver that records its calls and answers from a script."""

    def __init__(self, answer: list[str] | Exception) -> None:
        self.answer = answer
        self.envs: list[dict[str, str]] = []

    def __call__(self, env: Any) -> list[str]:
        self.envs.append(dict(env))
        if isinstance(self.answer, Exception):
            raise self.answer
        return list(self.answer)


def mixed_models() -> FakeNvml:
    """NVML (PCI) order: a slow card, then a fast one. CUDA's fastest-first puts the H200 first."""
    slow = FakeGpu("NVIDIA T400", "GPU-11111111", "00000000:01:00.0", total=2 * GIB)
    fast = FakeGpu("NVIDIA H200", "GPU-22222222", "00000000:41:00.0", total=H200_TOTAL)
    return FakeNvml([slow, fast])


def test_homogeneous_gpus_need_no_order_subprocess(install: Install) -> None:
    install(two_gpus())
    resolver = OrderRecorder(RuntimeError("must not be called"))
    p = CudaPlatform(order_resolver=resolver)
    assert [d.physical_index for d in p.devices()] == [0, 1]
    assert resolver.envs == []
    assert p.notes == ()


def test_heterogeneous_gpus_follow_cudas_fastest_first_order(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(mixed_models())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    resolver = OrderRecorder(["GPU-22222222", "GPU-11111111"])
    p = CudaPlatform(order_resolver=resolver)
    (dev,) = p.devices()
    assert (dev.name, dev.physical_index) == ("NVIDIA H200", 1)
    # the subprocess sees every GPU: CUDA_VISIBLE_DEVICES is removed from its environment
    assert "CUDA_VISIBLE_DEVICES" not in resolver.envs[0]
    # cached per CUDA_DEVICE_ORDER value: changing CUDA_VISIBLE_DEVICES does not re-run it
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert [d.name for d in p.devices()] == ["NVIDIA T400", "NVIDIA H200"]
    assert len(resolver.envs) == 1
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    p.devices()
    assert len(resolver.envs) == 2
    assert resolver.envs[1]["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


def test_heterogeneous_gpus_with_pci_bus_order_need_no_subprocess(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(mixed_models())
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    resolver = OrderRecorder(RuntimeError("must not be called"))
    p = CudaPlatform(order_resolver=resolver)
    assert [d.name for d in p.devices()] == ["NVIDIA T400"]
    assert resolver.envs == []


@pytest.mark.parametrize(
    "answer",
    [RuntimeError("libcuda.so.1 cannot be loaded"), ["GPU-99999999"], []],
)
def test_heterogeneous_order_falls_back_to_pci_order_and_says_so(
    install: Install, monkeypatch: pytest.MonkeyPatch, answer: Any
) -> None:
    install(mixed_models())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    p = CudaPlatform(order_resolver=OrderRecorder(answer))
    assert [d.name for d in p.devices()] == ["NVIDIA T400"]
    (note,) = p.notes
    assert "PCI bus order is assumed" in note
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in note


def test_the_default_order_resolver_reports_a_missing_libcuda() -> None:
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(RuntimeError, match=r"libcuda|CUDA error"):
        cuda_order_uuids({"PATH": os.environ.get("PATH", "")})


# -- memory ----------------------------------------------------------------------------------


def test_memory_v2_on_an_idle_h200_matches_the_measured_figures(install: Install) -> None:
    fake = install(FakeNvml([h200(0)]))
    info = CudaPlatform().memory_info(0)
    assert info == MemoryInfo(
        free=H200_TOTAL - H200_RESERVED,
        total=H200_TOTAL - H200_RESERVED,
        used=0,
        reserved=644_939_776,
        source="nvml-v2",
    )
    assert info.used_ratio == 0.0
    # the fake answers v1 as the driver does: reserved counted as used
    v1 = fake.nvmlDeviceGetMemoryInfo(fake.handle_of(0))
    assert v1.used == 644_939_776
    assert v1.free == info.free


def test_memory_v2_with_an_application_holding_memory(install: Install) -> None:
    install(FakeNvml([h200(0, used=8 * GIB)]))
    info = CudaPlatform().memory_info(0)
    assert info.used == 8 * GIB
    assert info.free == H200_TOTAL - H200_RESERVED - 8 * GIB
    assert info.total == info.used + info.free


def test_v1_only_driver(install: Install) -> None:
    fake = install(FakeNvml([h200(0, used=3 * GIB)], memory_v2=False))
    p = CudaPlatform()
    first = p.memory_info(0)
    assert first == MemoryInfo(
        free=H200_TOTAL - H200_RESERVED - 3 * GIB,
        total=H200_TOTAL,
        used=3 * GIB + H200_RESERVED,
        reserved=0,
        source="nvml-v1",
    )
    calls_before = fake.calls["nvmlDeviceGetMemoryInfo"]
    assert p.memory_info(0) == first
    # the missing v2 function is not asked for again: one call per query from now on
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == calls_before + 1


def test_the_step_down_is_decided_once_per_session_and_logged_once(
    install: Install, caplog: pytest.LogCaptureFixture
) -> None:
    fake = install(FakeNvml([h200(0), h200(1)], memory_v2=False))
    with caplog.at_level(logging.INFO, logger="accelplat._vendor.nvml"):
        first, second = CudaPlatform(), CudaPlatform()
        for _ in range(3):
            assert first.memory_info(0).source == "nvml-v1"
            assert second.memory_info(0).source == "nvml-v1"  # one decision for the process
    steps = [r.getMessage() for r in caplog.records]
    assert len(steps) == 1
    assert "cuda device 0" in steps[0]
    assert "FunctionNotFound" in steps[0]
    assert "nvml-v1" in steps[0]
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == 7  # v2 once, then v1 for each reading
    _nvml.shutdown()  # a new session decides afresh
    fake.calls.clear()
    assert CudaPlatform().memory_info(0).source == "nvml-v1"
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == 2


def test_unknown_from_v2_falls_back_to_v1_and_v2_is_tried_again(install: Install) -> None:
    fake = install(FakeNvml([h200(0)]))
    fake.fail("nvmlDeviceGetMemoryInfo", "Unknown", when=lambda h, version=None: bool(version))
    p = CudaPlatform()
    assert p.memory_info(0).source == "nvml-v1"
    assert p.memory_info(0).source == "nvml-v1"
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == 4  # v2 then v1, twice
    fake.clear_faults()
    assert p.memory_info(0).source == "nvml-v2"


def test_argument_version_mismatch_falls_back_to_v1(install: Install) -> None:
    fake = install(FakeNvml([h200(0)]))
    fake.fail(
        "nvmlDeviceGetMemoryInfo",
        "ArgumentVersionMismatch",
        when=lambda h, version=None: bool(version),
    )
    assert CudaPlatform().memory_info(0).source == "nvml-v1"


def test_nvidia_ml_py_without_nvml_memory_v2(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = install(FakeNvml([h200(0)]))
    monkeypatch.delattr(FakeNvml, "nvmlMemory_v2")  # an nvidia-ml-py older than R510's
    assert CudaPlatform().memory_info(0).source == "nvml-v1"
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == 1


MEMINFO = """MemTotal:       128000000 kB
MemFree:         1000000 kB
MemAvailable:   96000000 kB
Buffers:          100000 kB
"""


def test_unified_memory_device_reports_host_memory(install: Install, tmp_path: Path) -> None:
    gb10 = FakeGpu("NVIDIA GB10", "GPU-0b100000", "0000000F:01:00.0", unified_memory=True)
    fake = install(FakeNvml([gb10]))
    (tmp_path / "meminfo").write_text(MEMINFO)
    p = CudaPlatform(proc_root=tmp_path)
    info = p.memory_info(0)
    assert info == MemoryInfo(
        free=96_000_000 * 1024,
        total=128_000_000 * 1024,
        used=32_000_000 * 1024,
        reserved=0,
        source="host-unified",
    )
    calls = fake.calls["nvmlDeviceGetMemoryInfo"]
    p.memory_info(0)
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == calls  # remembered: NVML is not asked again


def test_unified_memory_root_from_the_environment(
    install: Install, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(FakeNvml([FakeGpu("NVIDIA GB10", "GPU-0b1", "00000000:01:00.0", unified_memory=True)]))
    (tmp_path / "meminfo").write_text(MEMINFO)
    monkeypatch.setenv("ACCELPLAT_PROC_ROOT", str(tmp_path))
    assert CudaPlatform().memory_info(0).total == 128_000_000 * 1024


def test_unified_memory_without_meminfo_is_a_backend_error(
    install: Install, tmp_path: Path
) -> None:
    install(FakeNvml([FakeGpu("NVIDIA GB10", "GPU-0b1", "00000000:01:00.0", unified_memory=True)]))
    with pytest.raises(BackendError) as info:
        CudaPlatform(proc_root=tmp_path / "absent").memory_info(0)
    assert info.value.vendor_error == "NVMLError_NotSupported"


FATAL_ERRORS = [
    "GpuIsLost",
    "LibRmVersionMismatch",
    "NoPermission",
    "DriverNotLoaded",
    "Uninitialized",
    "ResetRequired",
    "InsufficientResources",
    "Timeout",
    "Memory",
]


@pytest.mark.parametrize("name", FATAL_ERRORS)
def test_nvml_errors_become_backend_errors_naming_them(install: Install, name: str) -> None:
    fake = install(two_gpus())
    p = CudaPlatform()
    p.devices()
    fake.fail("nvmlDeviceGetMemoryInfo", name)
    with pytest.raises(BackendError) as info:
        p.memory_info(1)
    err = info.value
    assert isinstance(err, AccelplatError)
    assert err.vendor_error == f"NVMLError_{name}"
    assert err.platform == "cuda"
    assert f"NVMLError_{name}" in str(err)
    assert "cuda device 1" in str(err)
    assert isinstance(err.__cause__, NVMLError)


def test_unknown_from_both_versions_is_a_backend_error(install: Install) -> None:
    fake = install(two_gpus())
    fake.fail("nvmlDeviceGetMemoryInfo", "Unknown")
    with pytest.raises(BackendError) as info:
        CudaPlatform().memory_info(0)
    assert info.value.vendor_error == "NVMLError_Unknown"


def test_an_unregistered_error_code_is_named_by_value(install: Install) -> None:
    fake = install(two_gpus())
    fake.fail("nvmlDeviceGetMemoryInfo", NVMLError(12345))
    with pytest.raises(BackendError) as info:
        CudaPlatform().memory_info(0)
    assert info.value.vendor_error == "NVMLError(12345)"


def test_gpu_lost_in_the_middle_of_a_wait_is_a_typed_error(install: Install) -> None:
    fake = install(two_gpus())
    p = CudaPlatform()
    fake.fail("nvmlDeviceGetMemoryInfo", "GpuIsLost", after=3)
    for _ in range(3):
        assert p.memory_info(0).used == 1 * GIB
    with pytest.raises(BackendError) as info:
        p.memory_info(0)
    assert info.value.vendor_error == "NVMLError_GpuIsLost"
    assert "lost" in str(info.value)


def test_a_shadowed_module_mid_call_is_a_backend_error(install: Install) -> None:
    fake = install(two_gpus())
    fake.fail("nvmlDeviceGetMemoryInfo", AttributeError("module has no attribute"))
    fake.fail("nvmlDeviceGetMemoryInfo", AttributeError("still none"))
    with pytest.raises(BackendError) as info:
        CudaPlatform().memory_info(0)
    assert info.value.vendor_error == "AttributeError"


def test_nvml_unavailable_after_detection_is_a_backend_error(install: Install) -> None:
    fake = install(two_gpus())
    p = CudaPlatform()
    p.devices()
    _nvml.shutdown()
    fake.fail("nvmlInit", "DriverNotLoaded")
    with pytest.raises(BackendError) as info:
        p.memory_info(0)
    assert info.value.vendor_error == "NVMLError_DriverNotLoaded"


# -- MIG -------------------------------------------------------------------------------------

MIG_A = "MIG-d184f67c-c95f-5ef2-a935-195bd0094fbd"
MIG_B = "MIG-37b51284-1df4-5451-979d-3231ccb0822e"


def a100_with_mig(*, hidden_second: bool = False) -> FakeNvml:
    migs = [
        FakeMigDevice(
            MIG_A,
            total=4864 * MIB,
            used=100 * MIB,
            gpu_instance_id=13,
            compute_instance_id=0,
            processes=[(os.getpid(), 100 * MIB)],
        ),
        FakeMigDevice(
            MIG_B,
            name="NVIDIA A100-SXM4-40GB MIG 3g.20gb",
            total=19968 * MIB,
            used=2 * GIB,
            gpu_instance_id=2,
            compute_instance_id=0,
            slot=9 if hidden_second else None,
        ),
    ]
    gpu = FakeGpu(
        "NVIDIA A100-SXM4-40GB",
        "GPU-3eb79704-1571-707c-aee8-f43ce747313d",
        "00000000:07:00.0",
        total=40 * GIB,
        mig_capable=True,
        mig_mode=1,
        mig_devices=migs,
    )
    plain = FakeGpu(
        "NVIDIA A100-SXM4-40GB",
        "GPU-5eb00000-0000-0000-0000-000000000000",
        "00000000:0B:00.0",
        total=40 * GIB,
        mig_capable=True,
        mig_mode=0,
    )
    return FakeNvml([gpu, plain])


def test_mig_uuid_reads_memory_on_the_mig_handle(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(a100_with_mig())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", MIG_B)
    p = CudaPlatform()
    (dev,) = p.devices()
    assert (dev.uuid, dev.physical_index, dev.name) == (
        MIG_B,
        0,
        "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
    )
    assert dev.pci_bus_id == "0000:07:00.0"
    info = p.memory_info(0)
    assert (info.total, info.used) == (19968 * MIB, 2 * GIB)


def test_mig_enabled_gpu_shows_only_its_first_mig_device(install: Install) -> None:
    install(a100_with_mig())
    p = CudaPlatform()
    assert [d.uuid for d in p.devices()] == [MIG_A]
    assert p.memory_info(0).total == 4864 * MIB
    holders = p.memory_holders(0)
    assert holders is not None
    assert [(h.pid, h.used_bytes, h.state) for h in holders] == [
        (os.getpid(), 100 * MIB, HolderState.SELF)
    ]


def test_legacy_mig_form_and_plain_gpu_of_a_mig_capable_machine(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(a100_with_mig())
    p = CudaPlatform()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-GPU-3eb79704/2/0")
    assert [d.uuid for d in p.devices()] == [MIG_B]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [d.uuid for d in p.devices()] == ["GPU-5eb00000-0000-0000-0000-000000000000"]


PLAIN = "GPU-5eb00000-0000-0000-0000-000000000000"


def test_every_mig_device_and_every_other_gpu_is_a_lease_unit(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(a100_with_mig())  # GPU 0 in MIG mode (two slices), GPU 1 not: a mixed host
    p = CudaPlatform()
    assert [d.uuid for d in p.devices()] == [MIG_A]  # CUDA shows this process one MIG device
    assert p.lease_units() == (MIG_A, MIG_B, PLAIN)
    for unit, total in ((MIG_A, 4864 * MIB), (MIG_B, 19968 * MIB), (PLAIN, 40 * GIB)):
        child = p.restricted(unit)
        (dev,) = child.devices()
        assert (dev.index, dev.uuid, child.memory_info(0).total) == (0, unit, total)
        assert child.lease_units() == ()  # one unit, and it is the visible device
    assert [d.uuid for d in p.devices()] == [MIG_A]  # restricted() read no variable of ours
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # only the plain GPU may be used
    assert p.lease_units() == ()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # only the MIG GPU: its slices
    assert p.lease_units() == (MIG_A, MIG_B)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", MIG_B)  # one slice named: nothing beyond it
    assert p.lease_units() == ()


def test_full_mig_uuid_missed_by_enumeration_is_found_by_uuid(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = install(a100_with_mig(hidden_second=True))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", MIG_B)
    p = CudaPlatform()
    (dev,) = p.devices()
    assert dev.uuid == MIG_B
    assert fake.calls["nvmlDeviceGetHandleByUUID"] == 1
    assert p.memory_info(0).used == 2 * GIB


# -- holders ---------------------------------------------------------------------------------


def test_memory_holders(install: Install) -> None:
    gpu = h200(0, used=5 * GIB)
    gpu.processes = [(os.getpid(), 4 * GIB), (2**22 + 12345, None)]
    install(FakeNvml([gpu]))
    holders = CudaPlatform().memory_holders(0)
    assert holders is not None
    assert [(h.pid, h.used_bytes, h.state) for h in holders] == [
        (os.getpid(), 4 * GIB, HolderState.SELF),
        (2**22 + 12345, None, HolderState.GONE),
    ]


def test_memory_holders_of_a_child(install: Install) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        gpu = h200(0)
        gpu.processes = [(child.pid, 1 * GIB)]
        install(FakeNvml([gpu]))
        holders = CudaPlatform().memory_holders(0)
        assert holders is not None
        assert holders[0].state is HolderState.CHILD
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("name", ["NotSupported", "NoPermission"])
def test_memory_holders_unknown(install: Install, name: str) -> None:
    fake = install(two_gpus())
    fake.fail("nvmlDeviceGetComputeRunningProcesses", name)
    assert CudaPlatform().memory_holders(0) is None


def test_memory_holders_on_an_old_driver_use_the_v2_list(install: Install) -> None:
    gpu = h200(0)
    gpu.processes = [(os.getpid(), 1 * GIB)]
    fake = install(FakeNvml([gpu], processes_v3=False))
    holders = CudaPlatform().memory_holders(0)
    assert holders is not None
    assert [h.pid for h in holders] == [os.getpid()]
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 1


def test_memory_holders_errors(install: Install) -> None:
    fake = install(two_gpus())
    fake.fail("nvmlDeviceGetComputeRunningProcesses", "GpuIsLost")
    with pytest.raises(BackendError) as info:
        CudaPlatform().memory_holders(0)
    assert info.value.vendor_error == "NVMLError_GpuIsLost"


# -- the NVML session ------------------------------------------------------------------------


def test_32_threads_share_one_nvml_init(install: Install) -> None:
    fake = install(two_gpus())
    _nvml.shutdown()
    fake.calls.clear()
    p = CudaPlatform()
    barrier = threading.Barrier(32)
    results: list[MemoryInfo] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        try:
            barrier.wait()
            for _ in range(20):
                info = p.memory_info(i % 2)
                with lock:
                    results.append(info)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert len(results) == 32 * 20
    assert {r.used for r in results} == {1 * GIB, 7 * GIB}
    assert fake.calls["nvmlInit"] == 1
    assert fake.refcount == 1


def test_shutdown_waits_for_the_call_in_flight(install: Install) -> None:
    fake = install(two_gpus())
    p = CudaPlatform()
    p.devices()
    inside = threading.Event()
    release = threading.Event()

    def hold() -> None:
        inside.set()
        release.wait(10)

    fake.on_call("nvmlDeviceGetMemoryInfo", hold)
    reader = threading.Thread(target=p.memory_info, args=(0,))
    reader.start()
    assert inside.wait(10)
    closer = threading.Thread(target=_nvml.shutdown)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive(), "shutdown must wait while a call is in flight"
    assert fake.calls["nvmlShutdown"] == 0
    release.set()
    reader.join(10)
    closer.join(10)
    fake.on_call("nvmlDeviceGetMemoryInfo", None)
    assert fake.calls["nvmlShutdown"] == 1
    assert not fake.shutdown_while_in_flight
    # the next query initialises NVML again
    assert p.memory_info(0).used == 1 * GIB
    assert fake.refcount == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_initialises_nvml_again(install: Install) -> None:
    fake = install(two_gpus())
    p = CudaPlatform()
    assert p.memory_info(1).used == 7 * GIB
    inits_in_parent = fake.calls["nvmlInit"]
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report, then leave without running pytest's teardown
        code = 1
        try:
            os.close(read_fd)
            initialized_at_start = _nvml.initialized()
            used = p.memory_info(1).used
            report = {
                "initialized_at_start": initialized_at_start,
                "inits": fake.calls["nvmlInit"],
                "used": used,
            }
            os.write(write_fd, json.dumps(report).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd) as fh:
        data = fh.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    report = json.loads(data)
    assert report == {
        "initialized_at_start": False,
        "inits": inits_in_parent + 1,
        "used": 7 * GIB,
    }
    assert fake.calls["nvmlInit"] == inits_in_parent  # the parent is untouched


def test_the_deprecated_pynvml_package_warning_is_filtered(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # a stand-in for the deprecated "pynvml" PyPI package: warns on import, then re-exports
    (tmp_path / "pynvml.py").write_text(
        "import warnings\n"
        "warnings.warn('The pynvml package is deprecated. Please install nvidia-ml-py "
        "instead.', FutureWarning, stacklevel=2)\n"
        "def nvmlInit():\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = _nvml._import_live()  # this host may have no NVML library to check first
    monkeypatch.setitem(sys.modules, "pynvml", module)
    assert module.__file__ == str(tmp_path / "pynvml.py")
    assert [w for w in caught if issubclass(w.category, FutureWarning)] == []


# -- import hygiene --------------------------------------------------------------------------


class _ImportRecorder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.names: list[str] = []

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if name.split(".", maxsplit=1)[0] == "torch":
            self.names.append(name)


def test_no_torch_import_is_ever_attempted(install: Install) -> None:
    gpu = h200(0)
    gpu.processes = [(os.getpid(), 1 * GIB)]
    install(FakeNvml([gpu]))
    recorder = _ImportRecorder()
    sys.meta_path.insert(0, recorder)
    try:
        p = registry.current_platform()
        p.devices()
        p.memory_info(0)
        p.memory_holders(0)
        p.graph
        registry.detect()
    finally:
        sys.meta_path.remove(recorder)
    assert recorder.names == []
    assert "torch" not in sys.modules


def test_detection_in_a_fresh_process_imports_neither_torch_nor_psutil() -> None:
    script = (
        "import sys\n"
        "from tests.fakes.nvml import FakeNvml, h200\n"
        "sys.modules['pynvml'] = FakeNvml([h200(0)])\n"
        "import accelplat\n"
        "p = accelplat.current_platform()\n"
        "m = p.memory_info(0)\n"
        "print(p.name, m.source, 'torch' in sys.modules, 'psutil' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELPLAT_", "CUDA_"))}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert out == ["cuda", "nvml-v2", "False", "False"]


def test_the_backend_over_the_fake_passes_the_conformance_kit(install: Install) -> None:
    from accelplat.testing import run_conformance
    from tests.fakes.nvml import faked_cuda_platform

    install(FakeNvml([h200(0, used=2 * GIB), h200(1)]))
    report = run_conformance(
        CudaPlatform(),
        factory=CudaPlatform,
        child="tests.fakes.nvml:faked_cuda_platform",  # a fresh process installs the same fake
        empty_visible_hides_all=True,
    )
    assert report.passed, report.summary()
    assert "fresh process" in report.result("no_device_context").detail
    assert faked_cuda_platform().name == "cuda"


# -- the fake itself follows nvidia-ml-py ----------------------------------------------------


def _real_pynvml(monkeypatch: pytest.MonkeyPatch) -> Any:
    path = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidate = path / "site-packages" / "pynvml.py"
    if not candidate.exists():
        pytest.skip("nvidia-ml-py is not installed in this environment")
    import importlib.util

    spec = importlib.util.spec_from_file_location("_real_pynvml_for_names", candidate)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # it looks itself up while loading
    spec.loader.exec_module(module)
    return module


def test_fake_names_and_values_exist_in_nvidia_ml_py(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _real_pynvml(monkeypatch)
    fake = FakeNvml([])
    names = [n for n in dir(fake) if n.startswith(("nvml", "NVML", "c_nvml"))]
    assert len(names) > 60
    for name in names:
        assert hasattr(real, name), f"{name} is not an nvidia-ml-py name"
        value = getattr(fake, name)
        if isinstance(value, int):
            assert getattr(real, name) == value, name
    for name, cls in vars(fake).items():
        if name.startswith("NVMLError_"):
            assert getattr(real, name)().value == cls().value
    assert not issubclass(real.NVMLLibraryMismatchError, real.NVMLError)
    assert not issubclass(fake.NVMLLibraryMismatchError, fake.NVMLError)
    assert [f[0] for f in real.c_nvmlMemory_v2_t._fields_] == [
        f[0] for f in fake.c_nvmlMemory_v2_t._fields_
    ]
    assert [f[0] for f in real.c_nvmlMemory_t._fields_] == [
        f[0] for f in fake.c_nvmlMemory_t._fields_
    ]


def test_fake_errors_behave_like_nvidia_ml_py() -> None:
    err = NVMLError(15)
    assert type(err).__name__ == "NVMLError_GpuIsLost"
    assert isinstance(err, error_class("GpuIsLost"))
    assert error_class("GpuIsLost")().value == 15
    assert str(err) == "GPU is lost"
    assert err == error_class(15)()
    with pytest.raises(TypeError):
        hash(err)
    assert type(NVMLError(4242)) is NVMLError


# -- the memory ladder reads nvidia-ml-py's own v2 structure through its public fields ---------


def test_v2_fields_of_the_real_structure_are_read_as_nvml_reports_them() -> None:
    import importlib.machinery
    import importlib.util

    # The installed nvidia-ml-py, loaded from its file: sys.modules may hold a fake.
    spec = importlib.machinery.PathFinder.find_spec("pynvml")
    if spec is None or spec.loader is None:
        pytest.skip("nvidia-ml-py is not installed")
    real = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real)
    assert hasattr(real, "c_nvmlMemory_v2_t"), "nvidia-ml-py without the v2 memory structure"
    mem = real.c_nvmlMemory_v2_t()
    mem.version = real.nvmlMemory_v2
    mem.total, mem.reserved = 150_754_820_096, 644_939_776
    mem.free, mem.used = 149_000_000_000, 2**40 + 12345
    nv = types.SimpleNamespace(
        nvmlMemory_v2=real.nvmlMemory_v2, nvmlDeviceGetMemoryInfo=lambda handle, version: mem
    )
    figures = _nvml.memory(nv, object(), "GPU-real-structure", "cuda device 0")
    total = 150_754_820_096 - 644_939_776
    assert figures == (149_000_000_000, total, 2**40 + 12345, 644_939_776, "nvml-v2")


# -- without the driver's library, nvidia-ml-py is not even imported ---------------------------


class _PynvmlImportRecorder(importlib.abc.MetaPathFinder):
    """Records every attempt to import ``pynvml`` and lets it fail as if not installed."""

    def __init__(self) -> None:
        self.attempts = 0

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pynvml":
            self.attempts += 1
            raise ModuleNotFoundError("No module named 'pynvml'", name="pynvml")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the loader check is Linux's")
def test_a_missing_nvml_library_is_found_without_importing_pynvml(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _nvml.shutdown()
    monkeypatch.setitem(sys.modules, "pynvml", None)  # undone: removed again afterwards
    monkeypatch.delitem(sys.modules, "pynvml")
    recorder = _PynvmlImportRecorder()
    monkeypatch.setattr(sys, "meta_path", [recorder, *sys.meta_path])
    monkeypatch.setattr(_nvml, "LIBRARY", "libaccelplat-no-such-library.so.1")
    result = CudaPlatform.probe()
    assert not result.available
    assert "NVMLError_LibraryNotFound" in result.reason
    assert "libnvidia-ml.so.1 was not found" in result.reason
    assert recorder.attempts == 0
    assert "pynvml" not in sys.modules


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the loader check is Linux's")
def test_a_loadable_nvml_library_goes_on_to_import_pynvml(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _nvml.shutdown()
    monkeypatch.setitem(sys.modules, "pynvml", None)  # undone: removed again afterwards
    monkeypatch.delitem(sys.modules, "pynvml")
    recorder = _PynvmlImportRecorder()
    monkeypatch.setattr(sys, "meta_path", [recorder, *sys.meta_path])
    monkeypatch.setattr(_nvml, "LIBRARY", "libc.so.6")  # any library the loader finds
    assert _nvml.library_missing() is None
    result = CudaPlatform.probe()
    assert not result.available
    assert recorder.attempts == 1  # then nvidia-ml-py decides (here: not installed)
    assert "nvidia-ml-py" in result.reason


# -- attribution --------------------------------------------------------------------------------


def test_holders_merge_nvmls_compute_and_graphics_lists(install: Install) -> None:
    gpu = h200(0, used=6 * GIB)
    gpu.processes = [(os.getpid(), 4 * GIB)]
    # a process in both lists reports its memory on the device in each: listed once
    gpu.graphics = [(os.getpid(), 4 * GIB), (2**22 + 7, 2 * GIB)]
    install(FakeNvml([gpu]))
    holders = CudaPlatform().memory_holders(0)
    assert holders is not None
    assert sorted((h.pid, h.used_bytes) for h in holders) == [
        (os.getpid(), 4 * GIB),
        (2**22 + 7, 2 * GIB),
    ]


def test_an_h200_snapshot_splits_self_and_a_co_tenant(install: Install) -> None:
    import accelplat

    gpu = h200(0, used=527 * MIB + 20 * GIB)
    gpu.processes = [(os.getpid(), 527 * MIB), (2**22 + 9, 20 * GIB)]
    install(FakeNvml([gpu]))
    owners = accelplat.snapshot(platform=CudaPlatform()).attribution[0]
    assert owners.available
    assert (owners.self_bytes, owners.others_bytes) == (527 * MIB, 20 * GIB)


def test_mig_without_per_process_accounting_is_not_attributed(install: Install) -> None:
    import accelplat

    gpu = h200(0, used=3 * GIB)
    gpu.processes = [(os.getpid(), None)]  # NVML_VALUE_NOT_AVAILABLE
    install(FakeNvml([gpu]))
    owners = accelplat.snapshot(platform=CudaPlatform()).attribution[0]
    assert "not their bytes (MIG" in owners.reason


def test_a_container_whose_nvml_lists_no_process_is_judged_whole(install: Install) -> None:
    """What a user sees where NVML in a container reports no pids: the reason, device-wide."""
    import accelplat

    install(FakeNvml([h200(0, used=20 * GIB)]))  # 20 GiB used, no process listed
    owners = accelplat.snapshot(platform=CudaPlatform()).attribution[0]
    assert "lists holders of 0.00 GiB of the 20.00 GiB used" in owners.reason
    with pytest.raises(accelplat.errors.MemoryNotSettledError):  # whole device: 20 GiB > 10 %?
        accelplat.wait_for_memory_to_settle(
            platform=CudaPlatform(), threshold_ratio=0.01, timeout_s=0
        )

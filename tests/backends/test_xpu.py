"""The xpu backend against fake Level Zero libraries (Python and compiled C), sysfs and torch."""

from __future__ import annotations

import ctypes
import importlib.abc
import importlib.metadata
import math
import os
from pathlib import Path

import pytest

from accelplat import _registry as registry
from accelplat._backends.xpu import XpuPlatform, usage_visible_to_this_process
from accelplat._platform import Platform
from accelplat._types import GIB, HolderState
from accelplat._vendor import levelzero as lz
from accelplat.errors import BackendError, ConfigurationError, DeviceNotFoundError
from tests.fakes.imports import TorchBlocker, forbid_torch
from tests.fakes.levelzero import (
    ZE_RESULT_ERROR_DEVICE_LOST,
    ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS,
    ZE_RESULT_ERROR_UNINITIALIZED,
    FakeLevelZero,
    FakeModule,
    FakeZesDevice,
    arc,
    build_c_library,
    c_compiler,
    igpu,
    pvc,
    uuid_text,
)
from tests.fakes.sysfs import FakeSysfs
from tests.fakes.torch_xpu import (
    FakeXpuDevice,
    install_fake_ipex,
    install_fake_torch,
    make_fake_torch,
)

XPU_VARS = (
    "ZE_AFFINITY_MASK",
    "ONEAPI_DEVICE_SELECTOR",
    "ZE_FLAT_DEVICE_HIERARCHY",
    "ZE_ENABLE_PCI_ID_DEVICE_ORDER",
)


@pytest.fixture(autouse=True)
def no_torch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> TorchBlocker:
    for name in XPU_VARS:
        monkeypatch.delenv(name, raising=False)
    # hermetic: no real Level Zero loader, no real torch, an empty sysfs
    monkeypatch.setenv("ACCELPLAT_LEVEL_ZERO_LIB", str(tmp_path / "no-libze_loader.so.1"))
    monkeypatch.setenv("ACCELPLAT_SYSFS_ROOT", str(tmp_path / "empty-sys"))
    return forbid_torch(monkeypatch)


def lz_platform(devices: list[FakeZesDevice], **kwargs) -> tuple[XpuPlatform, FakeLevelZero]:
    fake = FakeLevelZero(devices)
    kwargs.setdefault("usage_visible", True)
    return XpuPlatform(level_zero=fake, **kwargs), fake


# -- identity -----------------------------------------------------------------------------------


def test_identity_and_release_profile():
    p = XpuPlatform(level_zero=False)
    assert isinstance(p, Platform)
    assert (p.name, p.device_type, p.visible_devices_env) == ("xpu", "xpu", "ZE_AFFINITY_MASK")
    assert p.default_memory_utilization == 0.9
    assert p.preferred_start_method == "spawn"
    r = p.release
    assert r.lazy is True
    assert (r.stable_duration_s, r.settle_timeout_s, r.idle_floor_bytes) == (2.0, 240.0, 0)


# -- Level Zero Sysman --------------------------------------------------------------------------


def test_flat_hierarchy_exposes_tiles_with_their_own_memory():
    card = pvc(0x3A, used=(GIB, 3 * GIB))
    p, fake = lz_platform([card, arc(0x8C, used=2 * GIB)])
    devices = p.devices()
    assert [d.name for d in devices] == [
        "Intel(R) Data Center GPU Max 1550 (tile 0)",
        "Intel(R) Data Center GPU Max 1550 (tile 1)",
        "Intel(R) Arc(TM) B580 Graphics",
    ]
    # Unmasked, FLAT mode lists one device per tile: physical indices count tiles, as
    # ZE_AFFINITY_MASK does, and each tile has its own UUID (sub-device id + 1 in the last byte,
    # as torch.xpu lists a Max 1550 host in intel/torch-xpu-ops#3585).
    assert [d.physical_index for d in devices] == [0, 1, 2]
    assert devices[0].pci_bus_id == "0000:3a:00.0"
    card_uuid = uuid_text(card)
    assert card_uuid.endswith("00")
    assert [d.uuid for d in devices[:2]] == [card_uuid[:-2] + "01", card_uuid[:-2] + "02"]
    assert devices[2].uuid == uuid_text(arc(0x8C))
    infos = [p.memory_info(i) for i in range(3)]
    assert [(i.used, i.total) for i in infos] == [
        (GIB, 64 * GIB),
        (3 * GIB, 64 * GIB),
        (2 * GIB, 12 * GIB),
    ]
    assert all(i.source == "level-zero-sysman" for i in infos)
    assert p.context_free is True
    assert p.memory_source == "level-zero-sysman"
    assert fake.calls.count("zesInit") == 1


def test_composite_hierarchy_sums_the_tiles(monkeypatch):
    monkeypatch.setenv("ZE_FLAT_DEVICE_HIERARCHY", "COMPOSITE")
    p, _ = lz_platform([pvc(0x3A, used=(GIB, 3 * GIB))])
    assert p.device_count() == 1
    info = p.memory_info(0)
    assert (info.used, info.total) == (4 * GIB, 128 * GIB)
    monkeypatch.setenv("ZE_AFFINITY_MASK", "0.1")
    (only,) = p.devices()
    assert only.name.endswith("(tile 1)")
    assert only.physical_index == 0  # COMPOSITE lists cards: the tile's card
    assert p.memory_info(0).used == 3 * GIB


def test_a_flat_mask_keeps_the_tile_physical_index_the_mask_named(monkeypatch):
    card = pvc(0x3A, used=(GIB, 3 * GIB))
    p, _ = lz_platform([card, pvc(0x9A)])
    monkeypatch.setenv("ZE_AFFINITY_MASK", "3,1")
    devices = p.devices()
    assert [d.physical_index for d in devices] == [1, 3]  # the order is not the mask's
    assert devices[0].uuid == uuid_text(card)[:-2] + "02"
    assert p.memory_info(0).used == 3 * GIB


def test_level_zero_order_is_discrete_first_then_pci(monkeypatch):
    # Sysman enumerates in its own order; Level Zero core sorts.
    p, _ = lz_platform([arc(0x8C), igpu(), arc(0x03, name="Intel(R) Arc(TM) A770 Graphics")])
    assert [d.pci_bus_id for d in p.devices()] == ["0000:03:00.0", "0000:8c:00.0", "0000:00:02.0"]
    monkeypatch.setenv("ZE_ENABLE_PCI_ID_DEVICE_ORDER", "1")
    assert [d.pci_bus_id for d in p.devices()] == [
        "0000:00:02.0",
        "0000:03:00.0",
        "0000:8c:00.0",
    ]


@pytest.mark.parametrize("value", ["true", "yes", "on", "2", " 1"])
def test_pci_order_variable_counts_only_as_one(monkeypatch, value):
    # the loader's getenv_tobool accepts exactly "1" (the specification: {0, 1})
    p, _ = lz_platform([arc(0x8C), igpu()])
    monkeypatch.setenv("ZE_ENABLE_PCI_ID_DEVICE_ORDER", value)
    assert [d.pci_bus_id for d in p.devices()] == ["0000:8c:00.0", "0000:00:02.0"]


def test_integrated_gpu_memory_is_host_memory_and_is_refused():
    # compute-runtime answers for an iGPU from /proc/meminfo: free = MemFree, size = MemAvailable
    p, _ = lz_platform([arc(0x8C, used=GIB), igpu(mem_free=20 * GIB, mem_available=28 * GIB)])
    assert p.memory_info(0).used == GIB
    with pytest.raises(BackendError, match=r"integrated GPU.*MemFree/MemAvailable"):
        p.memory_info(1)


def test_non_intel_sysman_devices_are_ignored():
    other = FakeZesDevice(name="Other", pci=(0, 5, 0, 0), vendor_id=0x1234, modules=[])
    p, _ = lz_platform([other, arc(0x8C)])
    assert [d.pci_bus_id for d in p.devices()] == ["0000:8c:00.0"]


def test_affinity_mask_and_selector_pick_devices(monkeypatch):
    p, _ = lz_platform([pvc(0x3A, used=(GIB, 3 * GIB)), arc(0x8C, used=2 * GIB)])
    monkeypatch.setenv("ZE_AFFINITY_MASK", "2")
    assert p.memory_info(0).total == 12 * GIB
    with pytest.raises(DeviceNotFoundError):
        p.memory_info(1)
    monkeypatch.setenv("ZE_AFFINITY_MASK", "1,2")
    monkeypatch.setenv("ONEAPI_DEVICE_SELECTOR", "level_zero:0")
    (only,) = p.devices()
    assert only.name.endswith("(tile 1)")
    assert p.memory_info(0).used == 3 * GIB


def test_unsupported_visible_forms_are_configuration_errors(monkeypatch):
    p, _ = lz_platform([pvc(0x3A)])  # a Max defaults to FLAT: "0.0" is not valid there
    monkeypatch.setenv("ZE_AFFINITY_MASK", "0.0")
    with pytest.raises(ConfigurationError, match="ZE_AFFINITY_MASK"):
        p.devices()
    monkeypatch.delenv("ZE_AFFINITY_MASK")
    monkeypatch.setenv("ONEAPI_DEVICE_SELECTOR", "level_zero;0")
    with pytest.raises(ConfigurationError, match="ONEAPI_DEVICE_SELECTOR"):
        p.devices()


def test_arc_defaults_to_composite_where_a_tile_mask_is_valid(monkeypatch):
    p, _ = lz_platform([arc(0x8C, used=GIB), arc(0x03)])
    monkeypatch.setenv("ZE_AFFINITY_MASK", "1.0")  # valid on Arc/Flex/BMG (COMPOSITE)
    (only,) = p.devices()
    assert only.pci_bus_id == "0000:8c:00.0"
    assert p.memory_info(0).used == GIB


def test_max_defaults_to_flat_and_the_probe_says_it_is_assumed(monkeypatch):
    p, fake = lz_platform([pvc(0x3A), pvc(0x9A)])
    assert p.device_count() == 4  # FLAT: one device per tile
    monkeypatch.setenv("ZE_FLAT_DEVICE_HIERARCHY", "COMPOSITE")  # an older driver's default
    assert p.device_count() == 2
    monkeypatch.delenv("ZE_FLAT_DEVICE_HIERARCHY")
    monkeypatch.setattr(lz, "load_loader", lambda name: fake)
    result = XpuPlatform.probe()
    assert result.available
    assert "FLAT assumed" in result.reason
    monkeypatch.setenv("ZE_FLAT_DEVICE_HIERARCHY", "FLAT")
    assert "assumed" not in XpuPlatform.probe().reason


def test_sysman_failures_are_typed():
    card = arc(0x8C)
    card.fail["zesMemoryGetState"] = ZE_RESULT_ERROR_DEVICE_LOST
    p, _ = lz_platform([card])
    with pytest.raises(BackendError) as info:
        p.memory_info(0)
    assert info.value.vendor_error == "ZE_RESULT_ERROR_DEVICE_LOST"


def test_device_without_memory_modules():
    p, _ = lz_platform([FakeZesDevice(pci=(0, 9, 0, 0), modules=[])])
    with pytest.raises(BackendError, match="no memory module"):
        p.memory_info(0)


def test_missing_pci_properties_still_works():
    card = arc(0x8C)
    card.fail["zesDevicePciGetProperties"] = 0x78000003
    p, _ = lz_platform([card])
    assert p.devices()[0].pci_bus_id is None
    assert p.memory_info(0).total == 12 * GIB


def test_state_size_zero_falls_back_to_physical_size():
    card = FakeZesDevice(pci=(0, 9, 0, 0), modules=[FakeModule(0, 5 * GIB, physical_size=8 * GIB)])
    p, _ = lz_platform([card])
    info = p.memory_info(0)
    assert (info.total, info.used) == (8 * GIB, 3 * GIB)


def test_holders_from_sysman():
    card = arc(0x8C, used=2 * GIB)
    card.processes = [(os.getpid(), GIB), (4_000_004, 0)]
    p, _ = lz_platform([card])
    (holder,) = p.memory_holders(0)
    assert (holder.pid, holder.used_bytes, holder.state) == (os.getpid(), GIB, HolderState.SELF)
    card.fail["zesDeviceProcessesGetState"] = ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS
    assert p.memory_holders(0) is None


def test_holders_retry_when_processes_attach_between_calls():
    card = arc(0x8C)
    card.processes = [(1, GIB)]
    p, fake = lz_platform([card])
    original = fake.zesDeviceProcessesGetState

    def growing(handle, count, procs):
        if procs is None:
            code = original(handle, count, procs)
            card.processes = [(1, GIB), (2, GIB), (3, GIB)]  # two more attach
            return code
        return original(handle, count, procs)

    fake.zesDeviceProcessesGetState = growing  # type: ignore[method-assign]
    holders = p.memory_holders(0)
    assert sorted(h.pid for h in holders) == [1, 2, 3]


# -- privileges -----------------------------------------------------------------------------------


INIT_NS = "         0          0 4294967295\n"


@pytest.mark.parametrize(
    ("capeff", "uid_map", "visible"),
    [
        ("000001ffffffffff", INIT_NS, True),  # root
        (f"{1 << 38:016x}", INIT_NS, True),  # CAP_PERFMON
        (f"{1 << 21:016x}", INIT_NS, True),  # CAP_SYS_ADMIN
        ("00000000a80425fb", INIT_NS, False),  # Docker's default set
        ("0000000000000000", INIT_NS, False),
        # a user-namespaced (rootless) container: full caps there, none in the initial namespace
        ("000001ffffffffff", "         0       1000          1\n", False),
    ],
)
def test_usage_visibility_from_capabilities_and_user_namespace(capeff, uid_map, visible):
    status = f"Name:\tpython\nCapInh:\t0000000000000000\nCapEff:\t{capeff}\n"
    assert usage_visible_to_this_process(status, uid_map) is visible


def _proc(tmp_path: Path, capeff: str, uid_map: str = INIT_NS) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "status").write_text(f"Name:\tpython\nCapEff:\t{capeff}\n")
    (proc / "self" / "uid_map").write_text(uid_map)
    return proc


def _hidden(tmp_path, fs, driver: str, *, used: int, uid_map: str = INIT_NS):
    """An unprivileged process; the kernel hides usage as ``driver`` does."""
    fs.add_intel_gpu(0, pci="0000:8c:00.0", driver=driver, device_id=0xE20B)
    fake = FakeLevelZero([arc(0x8C, used=used)], hides_usage=True)
    proc = _proc(tmp_path, "00000000a80425fb", uid_map)
    return XpuPlatform(level_zero=fake, proc_root=proc)


def test_i915_hidden_usage_is_refused_and_called_hidden(tmp_path, fs):
    p = _hidden(tmp_path, fs, "i915", used=3 * GIB)
    with pytest.raises(BackendError, match=r"i915 hides memory usage.*hidden usage, not a reading"):
        p.memory_info(0)


def test_xe_zero_may_be_hidden_and_is_refused(tmp_path, fs):
    p = _hidden(tmp_path, fs, "xe", used=3 * GIB)
    with pytest.raises(BackendError, match=r"xe may hide usage.*4d0b035fd6da"):
        p.memory_info(0)


def test_capabilities_inside_a_user_namespace_do_not_count(tmp_path, fs):
    fs.add_intel_gpu(0, pci="0000:8c:00.0", driver="i915", device_id=0xE20B)
    fake = FakeLevelZero([arc(0x8C, used=3 * GIB)], hides_usage=True)
    proc = _proc(tmp_path, "000001ffffffffff", "         0       1000          1\n")
    with pytest.raises(BackendError, match="i915 hides"):
        XpuPlatform(level_zero=fake, proc_root=proc).memory_info(0)


def test_privileged_process_sees_and_trusts_usage(tmp_path, fs):
    fs.add_intel_gpu(0, pci="0000:8c:00.0", driver="i915", device_id=0xE20B)
    fake = FakeLevelZero([arc(0x8C, used=0)])
    proc = _proc(tmp_path, f"{1 << 38:016x}")
    assert XpuPlatform(level_zero=fake, proc_root=proc).memory_info(0).used == 0


def test_torch_reading_the_same_hidden_zero_is_refused_too(tmp_path, fs, monkeypatch):
    p = _hidden(tmp_path, fs, "i915", used=3 * GIB)
    # torch's figure comes from the same kernel query, so it shows no usage either
    torch = make_fake_torch([FakeXpuDevice(total=12 * GIB, free=12 * GIB)])
    install_fake_torch(monkeypatch, torch)
    with pytest.raises(BackendError, match="reads the same kernel figure"):
        p.memory_info(0)


def test_torch_showing_usage_answers_when_sysman_shows_none(tmp_path, fs, monkeypatch):
    p = _hidden(tmp_path, fs, "xe", used=3 * GIB)
    torch = make_fake_torch([FakeXpuDevice(total=12 * GIB, free=9 * GIB)])
    install_fake_torch(monkeypatch, torch)
    info = p.memory_info(0)
    assert (info.used, info.source) == (3 * GIB, "torch.accelerator (creates a device context)")


def test_unprivileged_nonzero_usage_is_trusted(tmp_path, fs):
    # a patched xe kernel shows every process the real usage
    fs.add_intel_gpu(0, pci="0000:8c:00.0", driver="xe", device_id=0xE20B)
    fake = FakeLevelZero([arc(0x8C, used=GIB)])
    proc = _proc(tmp_path, "00000000a80425fb")
    assert XpuPlatform(level_zero=fake, proc_root=proc).memory_info(0).used == GIB


# -- without Level Zero -------------------------------------------------------------------------


def test_zes_init_failure_falls_back_to_sysfs_devices(tmp_path, monkeypatch):
    fs = FakeSysfs(tmp_path / "t")
    fs.add_intel_gpu(0, pci="0000:03:00.0", driver="xe", tiles=2, device_id=0x0BD5)
    monkeypatch.setenv("ACCELPLAT_SYSFS_ROOT", str(fs.sys))
    fake = FakeLevelZero([arc(0x8C)], init_result=ZE_RESULT_ERROR_UNINITIALIZED)
    p = XpuPlatform(level_zero=fake)
    assert [d.name for d in p.devices()] == [  # a Max: FLAT by default, one device per tile
        "Intel GPU 0x0bd5 (tile 0)",
        "Intel GPU 0x0bd5 (tile 1)",
    ]
    assert p.context_free is False
    assert p.memory_source == ""
    with pytest.raises(
        BackendError, match=r"ZE_RESULT_ERROR_UNINITIALIZED.*ACCELPLAT_XPU_ALLOW_TORCH"
    ):
        p.memory_info(0)


def test_old_loader_without_zes_init(fs):
    fs.add_intel_gpu(0, pci="0000:8c:00.0")
    fake = FakeLevelZero([arc(0x8C)], missing=("zesInit",))
    p = XpuPlatform(level_zero=fake)
    assert p.device_count() == 1  # from sysfs
    with pytest.raises(BackendError, match=r"loader v1\.9\.4"):
        p.memory_info(0)


def test_torch_source_when_the_caller_imported_torch(monkeypatch):
    devices = [
        FakeXpuDevice(name="Intel(R) Arc(TM) B580 Graphics", total=12 * GIB, free=11 * GIB),
        FakeXpuDevice(total=64 * GIB, free=32 * GIB),
    ]
    torch = make_fake_torch(devices)
    install_fake_torch(monkeypatch, torch)
    p = XpuPlatform(level_zero=False)
    assert p.context_free is False
    assert p.memory_source == "torch.accelerator (creates a device context)"
    assert [d.name for d in p.devices()] == [
        "Intel(R) Arc(TM) B580 Graphics",
        "Intel(R) Data Center GPU Max 1550",
    ]
    info = p.memory_info(1)
    assert (info.free, info.total, info.used) == (32 * GIB, 64 * GIB, 32 * GIB)
    # what vLLM 0.33 trusts (it routes torch.accelerator.get_memory_info to its own op)
    assert ("accelerator.get_memory_info", 1) in torch.calls
    assert ("xpu.mem_get_info", 1) not in torch.calls
    assert p.memory_holders(1) is None


def test_torch_xpu_mem_get_info_when_there_is_no_torch_accelerator(monkeypatch):
    torch = make_fake_torch([FakeXpuDevice(total=8 * GIB, free=6 * GIB)], accelerator=False)
    install_fake_torch(monkeypatch, torch)
    p = XpuPlatform(level_zero=False)
    assert p.memory_source == "torch.xpu (creates a device context)"
    info = p.memory_info(0)
    assert info.source == "torch.xpu (creates a device context)"
    assert info.used == 2 * GIB


def test_a_shifted_torch_total_is_rejected(monkeypatch):
    # the BMG report: total jumped from 24385683456 to 25669140480 while free stayed below it
    card = FakeXpuDevice(name="Intel(R) Arc(TM) B580 Graphics", total=24385683456, free=20 * GIB)
    card.umd_total_shift = 25669140480 - 24385683456
    torch = make_fake_torch([card], accelerator=False)
    install_fake_torch(monkeypatch, torch)
    with pytest.raises(BackendError, match=r"total=25669140480.*total_memory is 24385683456"):
        XpuPlatform(level_zero=False).memory_info(0)


def test_a_torch_total_that_moves_between_readings_is_rejected(monkeypatch):
    card = FakeXpuDevice(total=24 * GIB, free=20 * GIB)
    torch = make_fake_torch([card])
    del torch.xpu.get_device_properties  # nothing else to compare with
    install_fake_torch(monkeypatch, torch)
    p = XpuPlatform(level_zero=False)
    assert p.memory_info(0).total == 24 * GIB
    card.total = 25 * GIB
    with pytest.raises(BackendError, match="first reported in this process"):
        p.memory_info(0)


def test_torch_on_an_integrated_gpu_fails_clearly(monkeypatch):
    torch = make_fake_torch([FakeXpuDevice(name="Intel(R) Graphics", integrated=True)])
    install_fake_torch(monkeypatch, torch)
    with pytest.raises(BackendError, match="free memory"):
        XpuPlatform(level_zero=False).memory_info(0)


def test_ipex_fallback_for_old_torch(monkeypatch, tmp_path):
    devices = [FakeXpuDevice(total=16 * GIB, free=10 * GIB)]
    torch = make_fake_torch(devices, version="2.3.1", mem_get_info=False, accelerator=False)
    install_fake_torch(monkeypatch, torch)
    p = XpuPlatform(level_zero=False)
    with pytest.raises(BackendError, match=r"neither torch\.accelerator\.get_memory_info nor"):
        p.memory_info(0)  # IPEX is neither imported nor allowed
    install_fake_ipex(monkeypatch, tmp_path, torch, devices)
    info = XpuPlatform(level_zero=False, allow_torch=True).memory_info(0)
    assert info.source == "ipex xpu.mem_get_info (creates a device context)"
    assert info.used == 6 * GIB
    assert ("ipex.xpu.mem_get_info", 0) in torch.calls


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"xpu": False}, "has no torch.xpu"),
        ({"available": False}, "is_available() is False"),
    ],
)
def test_torch_without_a_usable_xpu(fs, monkeypatch, kwargs, message):
    fs.add_intel_gpu(0, pci="0000:8c:00.0")
    install_fake_torch(monkeypatch, make_fake_torch([FakeXpuDevice()], **kwargs))
    p = XpuPlatform(level_zero=False)
    assert p.device_count() == 1  # torch cannot say, sysfs can
    with pytest.raises(BackendError) as info:
        p.memory_info(0)
    assert message in str(info.value)


def test_torch_memory_errors_are_typed(monkeypatch):
    devices = [
        FakeXpuDevice(error=RuntimeError("UR_RESULT_ERROR_DEVICE_LOST")),
        FakeXpuDevice(total=8 * GIB, free=9 * GIB),  # the wrong answers some drivers gave
    ]
    install_fake_torch(monkeypatch, make_fake_torch(devices))
    p = XpuPlatform(level_zero=False)
    with pytest.raises(BackendError, match="DEVICE_LOST") as info:
        p.memory_info(0)
    assert info.value.vendor_error == "RuntimeError"
    with pytest.raises(BackendError, match="implausible"):
        p.memory_info(1)


def test_torch_is_not_imported_unless_allowed(fs, no_torch, monkeypatch):
    fs.add_intel_gpu(0, pci="0000:8c:00.0")
    p = XpuPlatform(level_zero=False)
    with pytest.raises(BackendError, match="ACCELPLAT_XPU_ALLOW_TORCH=1"):
        p.memory_info(0)
    assert no_torch.attempts == []
    monkeypatch.setenv("ACCELPLAT_XPU_ALLOW_TORCH", "1")
    with pytest.raises(BackendError, match="import torch failed"):
        XpuPlatform(level_zero=False).memory_info(0)
    assert no_torch.attempts == ["torch"]  # allowed: accelplat tried to import it


# -- graphs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "available", "words"),
    [
        (None, False, "not installed"),
        ("2.10.0+xpu", False, "torch >= 2.11"),
        ("2.11.0+xpu", True, "torch.xpu.XPUGraph"),
        ("2.12.0.dev20260301+xpu", True, "2.12.0.dev20260301+xpu"),
        ("2.13.0", True, "torch.xpu.XPUGraph"),
        ("2.11.0+cu130", False, "CUDA build"),
        ("2.11.0+rocm7.1", False, "ROCm build"),
    ],
)
def test_graph_support_by_version(monkeypatch, no_torch, version, available, words):
    def fake_version(name: str) -> str:
        assert name == "torch"
        if version is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return version

    monkeypatch.setattr(importlib.metadata, "version", fake_version)
    graph = XpuPlatform(level_zero=False).graph
    assert graph.available is available
    assert (graph.api == "torch.xpu.XPUGraph") is available
    assert words in graph.reason
    assert no_torch.attempts == []


# -- sysfs discovery and probe ------------------------------------------------------------------


@pytest.fixture
def fs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSysfs:
    tree = FakeSysfs(tmp_path / "tree")
    monkeypatch.setenv("ACCELPLAT_SYSFS_ROOT", str(tree.sys))
    return tree


def test_probe_discrete_xe(fs):
    fs.add_intel_gpu(1, pci="0000:03:00.0", driver="xe")
    fs.add_connector("card1-DP-1")
    result = XpuPlatform.probe()
    assert result.available
    assert "sysfs: xe" in result.reason


def test_probe_i915_multi_tile(fs):
    fs.add_intel_gpu(0, pci="0000:3a:00.0", driver="i915", tiles=2, device_id=0x0BD5)
    result = XpuPlatform.probe()
    assert result.available
    assert result.reason.startswith("2 XPU device(s) visible on 1 Intel GPU")


def test_probe_integrated_only(fs, monkeypatch):
    fs.add_intel_gpu(0, pci="0000:00:02.0", driver="i915", device_id=0x7D55)
    result = XpuPlatform.probe()
    assert not result.available
    assert "integrated" in result.reason
    monkeypatch.setenv("ACCELPLAT_XPU_INTEGRATED", "1")
    result = XpuPlatform.probe()
    assert result.available
    assert result.reason.startswith("1 XPU device")  # its media GT is not a tile


def test_probe_other_driver_and_vendors(fs):
    fs.add_other_gpu(0, pci="0000:01:00.0")
    fs.add_other_gpu(1, pci="0000:02:00.0", vendor=0x8086, driver="vfio-pci")
    result = XpuPlatform.probe()
    assert not result.available
    assert "vfio-pci" in result.reason
    assert "Level Zero loader" in result.reason


def test_probe_all_hidden(fs, monkeypatch):
    fs.add_intel_gpu(0, pci="0000:03:00.0")
    monkeypatch.setenv("ONEAPI_DEVICE_SELECTOR", "opencl:*")
    result = XpuPlatform.probe()
    assert not result.available
    assert "hide all" in result.reason


def test_probe_bad_variable(fs, monkeypatch):
    fs.add_intel_gpu(0, pci="0000:03:00.0")
    monkeypatch.setenv("ZE_AFFINITY_MASK", "zero")
    result = XpuPlatform.probe()
    assert not result.available
    assert "ZE_AFFINITY_MASK" in result.reason


def test_probe_never_imports_torch(fs, no_torch, monkeypatch):
    fs.add_intel_gpu(0, pci="0000:03:00.0")
    monkeypatch.setenv("ACCELPLAT_XPU_ALLOW_TORCH", "1")
    XpuPlatform.probe()
    assert no_torch.attempts == []


def test_registry_loads_xpu(fs, monkeypatch):
    fs.add_intel_gpu(0, pci="0000:03:00.0")
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "xpu")
    platform = registry.current_platform()
    assert isinstance(platform, XpuPlatform)
    assert platform.device_count() == 1


# -- the compiled Level Zero fake: real C structure layouts -------------------------------------

needs_cc = pytest.mark.skipif(c_compiler() is None, reason="no C compiler")


@pytest.fixture(scope="module")
def c_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if c_compiler() is None:
        pytest.skip("no C compiler")
    card = pvc(0x3A, used=(GIB, 3 * GIB))
    card.processes = [(4242, 5 * GIB)]
    return build_c_library([arc(0x8C, used=2 * GIB), card], tmp_path_factory.mktemp("ze"))


@needs_cc
@pytest.mark.parametrize(
    ("c_type", "py_type", "fields"),
    [
        ("ze_device_properties_t", lz.ZeDeviceProperties, ("uuid", "name")),
        ("zes_device_properties_t", lz.ZesDeviceProperties, ("numSubdevices",)),
        ("zes_pci_properties_t", lz.ZesPciProperties, ("address",)),
        ("zes_mem_properties_t", lz.ZesMemProperties, ("subdeviceId", "physicalSize")),
        ("zes_mem_state_t", lz.ZesMemState, ("free",)),
        ("zes_process_state_t", lz.ZesProcessState, ("memSize",)),
    ],
)
def test_structure_layouts_match_the_c_compiler(c_library, c_type, py_type, fields):
    lib = ctypes.CDLL(str(c_library))
    size = getattr(lib, f"size_{c_type}")
    size.restype = ctypes.c_size_t
    assert size() == ctypes.sizeof(py_type)
    for name in fields:
        offset = getattr(lib, f"layout_{c_type}_{name}")
        offset.restype = ctypes.c_size_t
        assert offset() == getattr(py_type, name).offset, name


@needs_cc
def test_compiled_loader_through_the_environment(c_library, monkeypatch):
    monkeypatch.setenv("ACCELPLAT_LEVEL_ZERO_LIB", str(c_library))
    p = XpuPlatform(usage_visible=True)
    # Sysman lists the Arc first; Level Zero orders by PCI: the two-tile card comes first
    assert [d.pci_bus_id for d in p.devices()] == ["0000:3a:00.0"] * 2 + ["0000:8c:00.0"]
    assert [p.memory_info(i).used for i in range(3)] == [GIB, 3 * GIB, 2 * GIB]
    assert [(h.pid, h.used_bytes) for h in p.memory_holders(0)] == [(4242, 5 * GIB)]
    assert p.devices()[2].name == "Intel(R) Arc(TM) B580 Graphics"


@needs_cc
def test_probe_through_level_zero_when_sysfs_shows_nothing(c_library, monkeypatch):
    monkeypatch.setenv("ACCELPLAT_LEVEL_ZERO_LIB", str(c_library))
    result = XpuPlatform.probe()
    assert result.available
    assert "Level Zero" in result.reason


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_initialises_sysman_again_and_drops_parent_handles():
    # zesInit: "Each forked process must call this function"
    p, fake = lz_platform([arc(0x8C, used=GIB)])
    assert p.memory_info(0).used == GIB
    inits, enumerations = fake.calls.count("zesInit"), fake.calls.count("zesDeviceGet")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ok = p.memory_info(0).used == GIB
            ok = ok and fake.calls.count("zesInit") == inits + 1
            ok = ok and fake.calls.count("zesDeviceGet") > enumerations
            code = 0 if ok else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    p.memory_info(0)
    assert fake.calls.count("zesInit") == inits  # the parent keeps its initialisation


NOT_INTEGERS = [math.nan, math.inf, -math.inf, 1.5, "1024", b"12", None, True, [1], object()]
"""What a broken library, a fake or a replay bundle may answer where a byte count belongs."""
NOT_INTEGER_IDS = ["nan", "inf", "-inf", "1.5", "text", "bytes", "None", "True", "list", "object"]


@pytest.mark.parametrize("value", NOT_INTEGERS, ids=NOT_INTEGER_IDS)
@pytest.mark.parametrize("field", ["free", "total"])
def test_torch_memory_that_is_not_an_integer_is_a_backend_error(monkeypatch, field, value):
    card = FakeXpuDevice(total=24 * GIB, free=20 * GIB)
    setattr(card, field, value)
    install_fake_torch(monkeypatch, make_fake_torch([card]))
    with pytest.raises(BackendError, match="not an integer"):
        XpuPlatform(level_zero=False).memory_info(0)


def test_sysman_processes_attribute_memory_by_owner():
    import accelplat

    card = arc(0x8C, used=3 * GIB)
    card.processes = [(os.getpid(), GIB), (2**22 + 3, 2 * GIB)]
    p, _ = lz_platform([card])
    owners = accelplat.snapshot(platform=p).attribution[0]
    assert owners.available
    assert (owners.self_bytes, owners.others_bytes) == (GIB, 2 * GIB)

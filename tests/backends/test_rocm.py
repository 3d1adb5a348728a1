"""The rocm backend against a fake sysfs tree, a fake amdsmi and a fake (already imported) torch."""

from __future__ import annotations

import errno
import importlib.abc
import importlib.metadata
import importlib.util
import math
import os
import shutil
import sys
from pathlib import Path

import pytest

from accelplat import _registry as registry
from accelplat._backends.rocm import RocmPlatform
from accelplat._platform import Platform
from accelplat._types import GIB, MIB, HolderState
from accelplat.errors import (
    BackendError,
    ConfigurationError,
    DeviceNotFoundError,
    ImplausibleReadingError,
)
from tests.fakes.amdsmi import FakeAmdGpu, install_broken_amdsmi, make_amdsmi
from tests.fakes.imports import forbid_torch
from tests.fakes.sysfs import FakeSysfs
from tests.fakes.torch_xpu import FakeXpuDevice, install_fake_torch, make_fake_torch

VISIBLE_VARS = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VISIBLE_VARS:
        monkeypatch.delenv(name, raising=False)
    # hermetic: no real amdsmi, whatever is installed
    monkeypatch.setitem(sys.modules, "amdsmi", None)


@pytest.fixture
def fs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSysfs:
    tree = FakeSysfs(tmp_path)
    monkeypatch.setenv("ACCELPLAT_SYSFS_ROOT", str(tree.sys))
    return tree


@pytest.fixture
def two_gpus(fs: FakeSysfs):
    """A CPU node, then card1 at c1:00.0, then card0 at 03:00.0 (KFD order != PCI order)."""
    fs.add_kfd_cpu_node()
    first = fs.add_amd_gpu(1, pci="0000:c1:00.0", vram_total=192 * GIB, vram_used=3 * GIB)
    second = fs.add_amd_gpu(
        0, pci="0000:03:00.0", vram_total=192 * GIB, vram_used=2 * GIB, product_name="MI300A"
    )
    return first, second


# -- identity -----------------------------------------------------------------------------------


def test_identity_and_release_profile():
    p = RocmPlatform()
    assert isinstance(p, Platform)
    assert (p.name, p.device_type) == ("rocm", "cuda")
    assert p.visible_devices_env == "CUDA_VISIBLE_DEVICES"  # vLLM's device_control_env_var
    assert p.visible_devices_shadowed_by == ("HIP_VISIBLE_DEVICES",)
    assert p.default_memory_utilization == 0.92
    assert p.preferred_start_method == "spawn"  # vLLM's test helper spawns on ROCm
    r = p.release
    assert r.lazy is True
    assert (r.stable_duration_s, r.settle_timeout_s, r.idle_floor_bytes) == (2.0, 240.0, 4 * GIB)


# -- devices and order --------------------------------------------------------------------------


def test_devices_follow_kfd_node_order_not_card_or_pci_order(two_gpus):
    first, second = two_gpus
    devices = RocmPlatform().devices()
    assert [d.pci_bus_id for d in devices] == ["0000:c1:00.0", "0000:03:00.0"]
    assert [d.physical_index for d in devices] == [0, 1]
    assert [d.uuid for d in devices] == [first.uuid, second.uuid]
    assert [d.name for d in devices] == ["AMD Instinct MI300X", "MI300A"]


def test_connectors_render_entries_other_vendors_and_cpu_nodes_are_ignored(fs):
    fs.add_kfd_cpu_node()
    fs.add_other_gpu(0, pci="0000:01:00.0")
    fs.add_amd_gpu(1, pci="0000:02:00.0", vram_total=64 * GIB)
    fs.add_connector("card1-DP-1")
    fs.add_connector("card1-HDMI-A-1")
    fs.add_render_entry(129)
    fs.add_kfd_cpu_node()
    devices = RocmPlatform().devices()
    assert [d.pci_bus_id for d in devices] == ["0000:02:00.0"]


def test_name_falls_back_to_device_id_without_product_name(fs):
    fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=GIB, product_name=None, device_id=0x744C)
    assert RocmPlatform().devices()[0].name == "AMD GPU 0x744c"


def test_without_kfd_cards_are_in_pci_order_and_uuids_unknown(fs, monkeypatch):
    fs.add_amd_gpu(0, pci="0000:c1:00.0", vram_total=8 * GIB, kfd=False)
    fs.add_amd_gpu(1, pci="0000:03:00.0", vram_total=16 * GIB, kfd=False)
    p = RocmPlatform()
    assert [d.pci_bus_id for d in p.devices()] == ["0000:03:00.0", "0000:c1:00.0"]
    assert [d.uuid for d in p.devices()] == [None, None]
    assert p.memory_info(0).total == 16 * GIB
    assert p.memory_holders(0) is None  # no gpu_id to read KFD process files with
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "GPU-0123")
    with pytest.raises(ConfigurationError, match="UUID"):
        p.devices()


def test_node_matched_by_pci_when_its_render_minor_is_elsewhere(fs):
    fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=8 * GIB, kfd=False)
    fs.add_kfd_gpu_node(gpu_id=777, pci="0000:03:00.0", render_minor=250, unique_id=5)
    p = RocmPlatform()
    assert p.memory_info(0).total == 8 * GIB


def test_node_without_card_is_listed_but_its_memory_is_unknown(fs):
    fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=8 * GIB)
    fs.add_kfd_gpu_node(gpu_id=999, pci="0000:0a:00.0", render_minor=140, unique_id=9)
    p = RocmPlatform()
    assert p.device_count() == 2  # HIP numbers it, so accelplat must too
    assert p.memory_info(0).total == 8 * GIB
    with pytest.raises(BackendError, match="matches no card"):
        p.memory_info(1)


def test_node_without_domain_property_defaults_to_domain_zero(fs):
    fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=8 * GIB, kfd=False)
    fs.add_kfd_gpu_node(
        gpu_id=1, pci="0000:03:00.0", render_minor=None, unique_id=3, with_domain=False
    )
    assert RocmPlatform().memory_info(0).total == 8 * GIB


def test_partitioned_gpu_every_partition_resolves_to_its_card_with_hips_share(fs):
    # MI300X in CPX + NPS1: 8 KFD nodes, partition id ORed into location_id, partitions 1..7 on
    # amdgpu_xcp platform devices; HIP sees 192 GiB / 8 per partition.
    gpu = fs.add_amd_gpu(
        0, pci="0000:03:00.0", vram_total=192 * GIB, vram_used=10 * GIB, partitions=8
    )
    fs.add_kfd_process(4242, {gpu.gpu_ids[2]: 5 * GIB, gpu.gpu_ids[7]: GIB})
    p = RocmPlatform()
    devices = p.devices()
    assert len(devices) == 8
    assert [d.pci_bus_id for d in devices] == ["0000:03:00.0"] * 8
    assert [d.uuid for d in devices] == [f"GPU-{u:016x}" for u in gpu.unique_ids]
    assert {d.name for d in devices} == {"AMD Instinct MI300X"}
    infos = [p.memory_info(i) for i in range(8)]
    assert [i.total for i in infos] == [24 * GIB] * 8
    assert [i.used for i in infos] == [0, 0, 5 * GIB, 0, 0, 0, 0, GIB]
    assert infos[2].free == 19 * GIB
    assert "partition 2 of 8" in infos[2].source
    assert "KFD allocations" in infos[2].source
    assert [h.pid for h in p.memory_holders(2) or []] == [4242]
    assert p.memory_holders(3) == []
    assert "compute partitions on 1 card(s)" in RocmPlatform.probe().reason


@pytest.mark.parametrize(
    ("partitions", "nps", "share"),
    [(2, 1, 96 * GIB), (4, 4, 48 * GIB), (8, 4, 24 * GIB), (8, 2, 24 * GIB)],
)
def test_partition_share_follows_the_memory_partition_mode(fs, partitions, nps, share):
    fs.add_amd_gpu(
        0, pci="0000:03:00.0", vram_total=192 * GIB, partitions=partitions, memory_partitions=nps
    )
    p = RocmPlatform()
    assert [p.memory_info(i).total for i in range(partitions)] == [share] * partitions


def test_partitions_of_two_cards_resolve_to_their_own_card(fs):
    a = fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=192 * GIB, partitions=4)
    b = fs.add_amd_gpu(1, pci="0000:23:00.0", vram_total=192 * GIB, partitions=4)
    fs.add_kfd_process(7, {b.gpu_ids[1]: 2 * GIB})
    p = RocmPlatform()
    assert [d.pci_bus_id for d in p.devices()] == ["0000:03:00.0"] * 4 + ["0000:23:00.0"] * 4
    assert p.memory_info(5).used == 2 * GIB
    assert p.memory_info(1).used == 0
    assert len(set(a.render_minors) | set(b.render_minors)) == 8


def test_partition_usage_unknown_reports_the_whole_card_and_says_so(fs):
    fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=192 * GIB, vram_used=10 * GIB, partitions=4)
    shutil.rmtree(fs.sys / "class" / "kfd" / "kfd" / "proc")
    info = RocmPlatform().memory_info(3)
    assert (info.total, info.used) == (192 * GIB, 10 * GIB)
    assert "whole card, shared by 4 partitions" in info.source
    assert "unreadable" in info.source


def test_partition_without_kfd_memory_bank_reports_the_whole_card_and_says_so(fs):
    gpu = fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=192 * GIB, partitions=2)
    for node in gpu.nodes:
        shutil.rmtree(
            fs.sys / "class" / "kfd" / "kfd" / "topology" / "nodes" / str(node) / "mem_banks"
        )
    info = RocmPlatform().memory_info(1)
    assert info.total == 192 * GIB
    assert "no KFD memory bank" in info.source


def test_partitions_in_a_container_use_their_own_render_nodes(fs, monkeypatch):
    gpu = fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=192 * GIB, partitions=8)
    fs.add_dev_nodes(gpu.render_minors[:2])  # given only partitions 0 and 1
    monkeypatch.setenv("ACCELPLAT_DEV_ROOT", str(fs.dev))
    p = RocmPlatform()
    assert p.device_count() == 2
    assert [p.memory_info(i).total for i in range(2)] == [24 * GIB] * 2


def test_partitions_sharing_their_cards_unique_id(fs, monkeypatch):
    gpu = fs.add_amd_gpu(
        0, pci="0000:03:00.0", vram_total=192 * GIB, partitions=4, shared_unique_id=True
    )
    p = RocmPlatform()
    devices = p.devices()
    assert len({d.uuid for d in devices}) == 1
    # HIP would take a shared UUID as the first partition, so a subset is named by index
    env = p.visible_devices_environment(devices[2:])
    assert env["HIP_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == "2,3"
    # ROCr: a UUID matching several GPUs is ambiguous and ends the list
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", f"{gpu.uuid},1")
    assert p.device_count() == 0


# -- APUs ---------------------------------------------------------------------------------------


def test_apu_preferring_gtt_reports_kfds_memory_not_the_carve_out(fs):
    apu = fs.add_amd_apu(0, carveout=512 * MIB, gtt_limit=62 * GIB, vram_used=300 * MIB)
    fs.add_kfd_process(99, {apu.gpu_id: 7 * GIB})
    info = RocmPlatform().memory_info(0)
    assert (info.total, info.used, info.free) == (62 * GIB, 7 * GIB, 55 * GIB)
    assert "APU" in info.source
    assert "host memory pressure not counted" in info.source


def test_apu_whose_kfd_usage_is_unreadable_fails_clearly(fs):
    fs.add_amd_apu(0)
    shutil.rmtree(fs.sys / "class" / "kfd" / "kfd" / "proc")
    with pytest.raises(BackendError, match=r"APU.*carve-out"):
        RocmPlatform().memory_info(0)


def test_discrete_card_keeps_the_card_wide_vram_files(fs):
    fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=192 * GIB, vram_used=3 * GIB)
    info = RocmPlatform().memory_info(0)
    assert (info.total, info.used, info.source) == (192 * GIB, 3 * GIB, "sysfs")


# -- visibility ---------------------------------------------------------------------------------


def test_hip_visible_devices_maps_visible_to_physical(two_gpus, monkeypatch):
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1")
    p = RocmPlatform()
    (only,) = p.devices()
    assert (only.index, only.physical_index, only.pci_bus_id) == (0, 1, "0000:03:00.0")
    assert p.memory_info(0).used == 2 * GIB  # physical 1's usage, not physical 0's
    with pytest.raises(DeviceNotFoundError):
        p.memory_info(1)


def test_rocr_then_hip(two_gpus, monkeypatch):
    _, second = two_gpus
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", f"{second.uuid},0")
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1")
    (only,) = RocmPlatform().devices()
    assert only.pci_bus_id == "0000:c1:00.0"


def test_cuda_visible_devices_is_honoured(two_gpus, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert [d.physical_index for d in RocmPlatform().devices()] == [1, 0]


def test_empty_hip_visible_devices_falls_back_to_cuda_visible_devices(two_gpus, monkeypatch):
    # Ray sets HIP_VISIBLE_DEVICES="" while it starts an actor; HIP and vLLM read "" as unset.
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    (only,) = RocmPlatform().devices()
    assert (only.physical_index, only.pci_bus_id) == (1, "0000:03:00.0")
    assert RocmPlatform.probe().available


def test_conflicting_hip_and_cuda(two_gpus, monkeypatch):
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(ConfigurationError):
        RocmPlatform().devices()
    result = RocmPlatform.probe()
    assert not result.available
    assert "disagree" in result.reason


def test_render_nodes_absent_from_dev_hide_gpus(fs, monkeypatch):
    fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=8 * GIB)
    fs.add_amd_gpu(1, pci="0000:23:00.0", vram_total=16 * GIB)
    fs.add_dev_nodes([129])  # a container given only the second GPU
    monkeypatch.setenv("ACCELPLAT_DEV_ROOT", str(fs.dev))
    p = RocmPlatform()
    (only,) = p.devices()
    assert only.pci_bus_id == "0000:23:00.0"
    assert p.memory_info(0).total == 16 * GIB


def test_missing_dev_kfd_means_no_gpu(fs, monkeypatch):
    fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=8 * GIB)
    fs.add_dev_nodes([128], kfd=False)
    monkeypatch.setenv("ACCELPLAT_DEV_ROOT", str(fs.dev))
    assert RocmPlatform().device_count() == 0
    result = RocmPlatform.probe()
    assert not result.available
    assert "kfd is missing" in result.reason


def _in_container(fs: FakeSysfs, monkeypatch: pytest.MonkeyPatch) -> RocmPlatform:
    monkeypatch.setenv("ACCELPLAT_DEV_ROOT", str(fs.dev))
    return RocmPlatform(open_device=fs.open_device)


def test_render_node_denied_by_the_device_cgroup_is_dropped_like_the_thunk(fs, monkeypatch):
    fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=8 * GIB)
    fs.add_amd_gpu(1, pci="0000:23:00.0", vram_total=16 * GIB)
    fs.add_amd_gpu(2, pci="0000:43:00.0", vram_total=32 * GIB)
    fs.add_dev_nodes([128, 129, 130])  # /dev bind-mounted whole...
    fs.deny_device("dri/renderD129", errno.EPERM)  # ...but the cgroup denies the second GPU
    p = _in_container(fs, monkeypatch)
    assert [d.pci_bus_id for d in p.devices()] == ["0000:03:00.0", "0000:43:00.0"]
    assert p.memory_info(1).total == 32 * GIB  # HIP's device 1 is the third card


def test_render_node_without_permission_fails_the_whole_topology(fs, monkeypatch):
    fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=8 * GIB)
    fs.add_amd_gpu(1, pci="0000:23:00.0", vram_total=16 * GIB)
    fs.add_dev_nodes([128, 129])
    fs.deny_device("dri/renderD129", errno.EACCES)  # not in the render group
    p = _in_container(fs, monkeypatch)
    assert p.device_count() == 0  # ROCm sees no GPU at all, so neither does accelplat
    monkeypatch.setattr(
        RocmPlatform, "__init__", _with_opener(RocmPlatform.__init__, fs.open_device)
    )
    result = RocmPlatform.probe()
    assert not result.available
    assert "EACCES" in result.reason
    assert "render" in result.reason


def test_gpu_node_without_render_minor_fails_the_topology_when_dev_is_checked(fs, monkeypatch):
    fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=8 * GIB, kfd=False)
    fs.add_kfd_gpu_node(gpu_id=5, pci="0000:03:00.0", render_minor=None, unique_id=3)
    fs.add_dev_nodes([128])
    assert _in_container(fs, monkeypatch).device_count() == 0


def test_dev_kfd_without_permission_means_no_gpu(fs, monkeypatch):
    fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=8 * GIB)
    fs.add_dev_nodes([128])
    fs.deny_device("kfd", errno.EACCES)
    assert _in_container(fs, monkeypatch).device_count() == 0


def _with_opener(init, opener):
    def patched(self, **kwargs):
        kwargs.setdefault("open_device", opener)
        init(self, **kwargs)

    return patched


def test_dev_checks_are_skipped_when_only_sysfs_is_moved(fs):
    fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=8 * GIB)
    assert not fs.dev.exists()
    assert RocmPlatform().device_count() == 1


def test_constructor_roots_override_environment(fs, tmp_path, monkeypatch):
    fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=8 * GIB)
    monkeypatch.setenv("ACCELPLAT_SYSFS_ROOT", str(tmp_path / "nowhere"))
    assert RocmPlatform(sysfs_root=fs.sys).device_count() == 1


# -- memory -------------------------------------------------------------------------------------


def test_memory_info_reads_bytes_every_time(two_gpus, fs):
    p = RocmPlatform()
    info = p.memory_info(0)
    assert (info.total, info.used, info.free) == (192 * GIB, 3 * GIB, 189 * GIB)
    assert info.source == "sysfs"
    fs.set_vram(1, used=100 * GIB)  # card1 is physical 0
    assert p.memory_info(0).used == 100 * GIB
    assert p.context_free is True
    assert p.memory_source == "sysfs"


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda fs: (fs.device_dir(0) / "mem_info_vram_used").unlink(), "is missing"),
        (lambda fs: fs.write_attr(0, "mem_info_vram_used", ""), "is empty"),
        (lambda fs: fs.write_attr(0, "mem_info_vram_used", "\n"), "is empty"),
        (lambda fs: fs.write_attr(0, "mem_info_vram_used", "12ab\n"), "not a number"),
        (lambda fs: fs.write_attr(0, "mem_info_vram_total", "-5\n"), "negative"),
        (lambda fs: fs.replace_with_directory(0, "mem_info_vram_used"), "is a directory"),
        (lambda fs: fs.set_vram(0, used=9 * GIB), "exceeds"),
        (lambda fs: fs.set_vram(0, total=2**64 - 1, used=2**64 - 2), "above 8 EiB"),
    ],
)
def test_damaged_sysfs_gives_a_backend_error_naming_the_file(fs, damage, message):
    fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=8 * GIB)
    p = RocmPlatform()
    assert p.device_count() == 1
    damage(fs)
    with pytest.raises(BackendError, match=message) as info:
        p.memory_info(0)
    assert "mem_info_vram" in str(info.value)
    assert not isinstance(info.value, (OSError, ValueError))


def test_permission_denied_is_a_backend_error(fs):
    fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=8 * GIB)

    def read(path: str) -> str:
        if path.endswith("mem_info_vram_used"):
            raise PermissionError(13, "Permission denied", path)
        with open(path) as f:
            return f.read()

    p = RocmPlatform(read_text=read)
    with pytest.raises(BackendError, match="mem_info_vram_used: permission denied"):
        p.memory_info(0)


def test_other_os_errors_are_backend_errors(fs):
    fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=8 * GIB)

    def read(path: str) -> str:
        if path.endswith("mem_info_vram_total"):
            raise OSError(19, "No such device")
        with open(path) as f:
            return f.read()

    with pytest.raises(BackendError, match="No such device"):
        RocmPlatform(read_text=read).memory_info(0)


def test_card_disappearing_mid_call(two_gpus, fs):
    p = RocmPlatform()
    assert p.device_count() == 2
    fs.remove_card(0)  # physical 1 (card0) is unplugged
    with pytest.raises(BackendError, match=r"card0.*missing"):
        p.memory_info(1)
    # the next query scans again: the KFD node is still there but has no card any more
    with pytest.raises(BackendError, match="matches no card"):
        p.memory_info(1)
    assert p.memory_info(0).total == 192 * GIB


def test_unreadable_vendor_file_skips_the_card(fs):
    fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=8 * GIB, kfd=False)
    fs.add_amd_gpu(1, pci="0000:04:00.0", vram_total=16 * GIB, kfd=False)
    fs.write_attr(0, "vendor", "garbage\n")
    assert [d.pci_bus_id for d in RocmPlatform().devices()] == ["0000:04:00.0"]


def test_bad_index(two_gpus):
    p = RocmPlatform()
    for bad in (2, -1, True, "0", 1.0):
        with pytest.raises(DeviceNotFoundError):
            p.memory_info(bad)


# -- holders ------------------------------------------------------------------------------------


def test_holders_from_kfd_proc(two_gpus, fs):
    first, second = two_gpus
    me = os.getpid()
    fs.add_kfd_process(me, {first.gpu_id: 5 * GIB, second.gpu_id: 0})
    fs.add_kfd_process(4_000_000, {second.gpu_id: GIB})  # a pid that does not exist
    p = RocmPlatform()
    (holder,) = p.memory_holders(0)
    assert (holder.pid, holder.used_bytes, holder.state) == (me, 5 * GIB, HolderState.SELF)
    (ghost,) = p.memory_holders(1)  # zero-byte entries are left out
    assert (ghost.pid, ghost.used_bytes, ghost.state) == (4_000_000, GIB, HolderState.GONE)


def test_holders_skip_unreadable_entries(two_gpus, fs):
    first, _ = two_gpus
    fs.add_kfd_process(4_000_001, {first.gpu_id: GIB})
    bad = fs.sys / "class" / "kfd" / "kfd" / "proc" / "4000002"
    bad.mkdir()
    (bad / f"vram_{first.gpu_id}").write_text("oops\n")
    assert [h.pid for h in RocmPlatform().memory_holders(0)] == [4_000_001]


def test_holders_unknown_without_kfd_proc(fs):
    fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=8 * GIB)
    os.rmdir(fs.sys / "class" / "kfd" / "kfd" / "proc")
    assert RocmPlatform().memory_holders(0) is None


# -- amdsmi -------------------------------------------------------------------------------------


def _install_amdsmi(monkeypatch, gpus, **kwargs):
    module = make_amdsmi(gpus, **kwargs)
    monkeypatch.setitem(sys.modules, "amdsmi", module)
    return module


def test_amdsmi_when_sysfs_has_no_amd_card(fs, monkeypatch):
    gpus = [
        FakeAmdGpu("0000:c1:00.0", 192 * GIB, 7 * GIB, hip_id=1, hip_uuid="GPU-bbbb000000000001"),
        FakeAmdGpu("0000:03:00.0", 192 * GIB, 2 * GIB, hip_id=0, hip_uuid="GPU-aaaa000000000000"),
    ]
    module = _install_amdsmi(monkeypatch, gpus)
    p = RocmPlatform()
    assert p.memory_source == "amdsmi"
    assert [d.pci_bus_id for d in p.devices()] == ["0000:03:00.0", "0000:c1:00.0"]  # by hip_id
    info = p.memory_info(1)
    assert (info.total, info.used, info.source) == (192 * GIB, 7 * GIB, "amdsmi")
    mem_calls = [c for c in module.calls if c[0].startswith("amdsmi_get_gpu_memory")]
    assert mem_calls
    assert all(c[1] == module.AmdSmiMemoryType.VRAM for c in mem_calls)
    assert not any(c[0] == "amdsmi_get_gpu_vram_usage" for c in module.calls)
    assert [c[0] for c in module.calls].count("amdsmi_init") == 1
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "GPU-bbbb")
    assert [d.pci_bus_id for d in p.devices()] == ["0000:c1:00.0"]


def test_amdsmi_without_hip_id_orders_by_pci(fs, monkeypatch):
    gpus = [
        FakeAmdGpu("0000:c1:00.0", 8 * GIB),
        FakeAmdGpu("0000:03:00.0", 16 * GIB),
    ]
    _install_amdsmi(monkeypatch, gpus, enumeration=False)
    assert [d.pci_bus_id for d in RocmPlatform().devices()] == ["0000:03:00.0", "0000:c1:00.0"]


def test_amdsmi_holders(fs, monkeypatch):
    gpu = FakeAmdGpu("0000:03:00.0", 8 * GIB, processes=[(os.getpid(), GIB), (4_000_003, 0)])
    _install_amdsmi(monkeypatch, [gpu])
    (holder,) = RocmPlatform().memory_holders(0)
    assert (holder.pid, holder.used_bytes, holder.state) == (os.getpid(), GIB, HolderState.SELF)


def test_amdsmi_legacy_process_handles_mean_holders_unknown(fs, monkeypatch):
    gpu = FakeAmdGpu("0000:03:00.0", 8 * GIB, processes=[(1, GIB)])
    _install_amdsmi(monkeypatch, [gpu], legacy_process_list=True)
    assert RocmPlatform().memory_holders(0) is None


def test_amdsmi_memory_failure_is_a_backend_error(fs, monkeypatch):
    _install_amdsmi(monkeypatch, [FakeAmdGpu("0000:03:00.0", 8 * GIB, fail_memory=True)])
    with pytest.raises(BackendError) as info:
        RocmPlatform().memory_info(0)
    assert info.value.vendor_error == "AmdSmiLibraryException"


@pytest.mark.parametrize(
    ("total", "used", "reason"),
    [
        (8 * GIB, 2**64 - 4096, "used is above 8 EiB"),  # a counter wrapped below zero
        (8 * GIB, 9 * GIB, "used exceeds total"),
        (0, 0, "total is zero"),
    ],
)
def test_amdsmi_impossible_memory_is_refused(fs, monkeypatch, total, used, reason):
    _install_amdsmi(monkeypatch, [FakeAmdGpu("0000:03:00.0", total, vram_used=used)])
    with pytest.raises(ImplausibleReadingError) as info:
        RocmPlatform().memory_info(0)
    assert info.value.reason.startswith(reason)
    assert info.value.source == "amdsmi"


def test_amdsmi_init_failure_makes_the_platform_unavailable(fs, monkeypatch):
    _install_amdsmi(monkeypatch, [FakeAmdGpu("0000:03:00.0", GIB)], init_error=True)
    result = RocmPlatform.probe()
    assert not result.available
    assert "AmdSmiLibraryException" in result.reason


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("keyerror", "libamd_smi.so is missing: the PyPI amdsmi wheel, the `amd` extra, needs"),
        ("keyerror-7.0.2", "KeyError: 'libamd_smi.so'"),
        ("attributeerror", "older than this amdsmi"),
    ],
)
@pytest.mark.usefixtures("fs")
def test_amdsmi_import_failures_are_caught_and_silenced(
    tmp_path, monkeypatch, capsys, mode, expected
):
    monkeypatch.delitem(sys.modules, "amdsmi")
    install_broken_amdsmi(monkeypatch, tmp_path, mode)
    result = RocmPlatform.probe()
    assert not result.available
    assert expected in result.reason
    assert capsys.readouterr().out == ""  # what amdsmi printed was swallowed
    with pytest.raises(BackendError, match="import amdsmi failed"):
        RocmPlatform().devices()


def test_amdsmi_not_installed(fs, monkeypatch):
    monkeypatch.delitem(sys.modules, "amdsmi")
    real_find_spec = importlib.util.find_spec

    def find_spec(name, package=None):
        return None if name == "amdsmi" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    result = RocmPlatform.probe()
    assert not result.available
    assert "amdsmi is not installed" in result.reason


def test_sysfs_wins_over_amdsmi(two_gpus, monkeypatch):
    module = _install_amdsmi(monkeypatch, [FakeAmdGpu("0000:99:00.0", GIB)])
    assert RocmPlatform().memory_source == "sysfs"
    assert module.calls == []


# -- torch, last ---------------------------------------------------------------------------------


def test_torch_fallback_only_when_the_caller_imported_a_rocm_torch(fs, monkeypatch):
    p = RocmPlatform()
    with pytest.raises(BackendError, match="torch is not imported"):
        p.devices()
    cuda = [FakeXpuDevice(name="MI300X", total=192 * GIB, free=150 * GIB)]
    install_fake_torch(monkeypatch, make_fake_torch(hip=None, cuda_devices=cuda))
    with pytest.raises(BackendError, match="not a ROCm build"):
        RocmPlatform().devices()
    torch = make_fake_torch(hip="6.2.41133", cuda_devices=cuda)
    install_fake_torch(monkeypatch, torch)
    p = RocmPlatform()
    assert p.context_free is False
    info = p.memory_info(0)
    assert (info.free, info.total, info.used) == (150 * GIB, 192 * GIB, 42 * GIB)
    assert info.source == "torch.cuda (creates a device context)"
    assert ("cuda.mem_get_info", 0) in torch.calls
    assert p.memory_holders(0) is None


def test_rocm_queries_never_import_torch(two_gpus, fs, monkeypatch):
    blocker = forbid_torch(monkeypatch)
    p = RocmPlatform()
    p.devices()
    p.memory_info(0)
    p.memory_holders(1)
    _ = p.graph, p.context_free, p.release
    RocmPlatform.probe()
    # and with no source at all (empty sysfs), still no torch import
    RocmPlatform(sysfs_root=fs.root / "empty").probe()
    assert blocker.attempts == []
    assert "torch" not in sys.modules


# -- graphs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "available", "words"),
    [
        (None, False, "not installed"),
        ("2.5.1+rocm6.2", True, "torch.cuda.CUDAGraph"),
        ("2.4.0", True, "2.4.0"),
        ("2.11.0+cu130", False, "CUDA build"),
        ("2.8.0+cpu", False, "CPU-only build"),
        ("1.9.1", False, ">= 2.0"),
        ("1.13.1+rocm5.2", False, ">= 2.0"),  # ROCm builds before hipGraph support (PR 88202)
        ("2.0.0+rocm5.4.2", True, "torch.cuda.CUDAGraph"),
        ("garbage", False, "cannot read"),
    ],
)
def test_graph_support_from_installed_version(monkeypatch, version, available, words):
    def fake_version(name: str) -> str:
        assert name == "torch"
        if version is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return version

    monkeypatch.setattr(importlib.metadata, "version", fake_version)
    graph = RocmPlatform().graph
    assert graph.available is available
    assert (graph.api == "torch.cuda.CUDAGraph") is available
    assert words in graph.reason


# -- probe and registry -------------------------------------------------------------------------


def test_probe_available(two_gpus):
    result = RocmPlatform.probe()
    assert result.available
    assert "2 of 2" in result.reason


def test_probe_all_hidden(two_gpus, monkeypatch):
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "-1")
    result = RocmPlatform.probe()
    assert not result.available
    assert "hide all" in result.reason


def test_probe_without_anything(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELPLAT_SYSFS_ROOT", str(tmp_path / "absent"))
    result = RocmPlatform.probe()
    assert not result.available
    assert "no AMD GPU" in result.reason


def test_probe_never_raises_on_a_file_as_root(tmp_path, monkeypatch):
    bogus = tmp_path / "file"
    bogus.write_text("not a directory")
    monkeypatch.setenv("ACCELPLAT_SYSFS_ROOT", str(bogus))
    assert RocmPlatform.probe().available is False


def test_registry_loads_rocm(two_gpus, monkeypatch):
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "rocm")
    platform = registry.current_platform()
    assert isinstance(platform, RocmPlatform)
    assert platform.device_count() == 2


def test_amdsmi_is_initialised_once_per_process_and_again_after_fork(fs, monkeypatch):
    from accelplat._backends.rocm import _sources as rocm

    module = _install_amdsmi(monkeypatch, [FakeAmdGpu("0000:03:00.0", 8 * GIB)])
    RocmPlatform().devices()
    RocmPlatform().memory_info(0)
    assert [c[0] for c in module.calls].count("amdsmi_init") == 1
    pid = os.fork()
    if pid == 0:  # the child must initialise again: the parent's library state is not its own
        os._exit(0 if rocm._amdsmi_initialised is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert rocm._amdsmi_initialised is module


# -- hostile vendor answers ---------------------------------------------------------------------

NOT_INTEGERS = [math.nan, math.inf, -math.inf, 1.5, "1024", b"12", None, True, [1], object()]
"""What a broken library, a fake or a replay bundle may answer where a byte count belongs."""
NOT_INTEGER_IDS = ["nan", "inf", "-inf", "1.5", "text", "bytes", "None", "True", "list", "object"]


@pytest.mark.parametrize("value", NOT_INTEGERS, ids=NOT_INTEGER_IDS)
@pytest.mark.parametrize("field", ["vram_total", "vram_used"])
def test_amdsmi_memory_that_is_not_an_integer_is_a_backend_error(fs, monkeypatch, field, value):
    gpu = FakeAmdGpu("0000:03:00.0", 8 * GIB, GIB)
    setattr(gpu, field, value)
    _install_amdsmi(monkeypatch, [gpu])
    with pytest.raises(BackendError, match="not an integer"):
        RocmPlatform().memory_info(0)


@pytest.mark.parametrize("value", NOT_INTEGERS, ids=NOT_INTEGER_IDS)
@pytest.mark.parametrize("field", ["free", "total"])
def test_torch_memory_that_is_not_an_integer_is_a_backend_error(fs, monkeypatch, field, value):
    card = FakeXpuDevice(total=192 * GIB, free=150 * GIB)
    setattr(card, field, value)
    install_fake_torch(monkeypatch, make_fake_torch(hip="6.2.41133", cuda_devices=[card]))
    with pytest.raises(BackendError, match="not an integer"):
        RocmPlatform().memory_info(0)


@pytest.mark.parametrize("pid", [True, False, 0, -1, "42", 4.0, None])
def test_amdsmi_holders_with_impossible_pids_are_left_out(fs, monkeypatch, pid):
    gpu = FakeAmdGpu("0000:03:00.0", 8 * GIB, processes=[(pid, GIB), (os.getpid(), GIB)])
    _install_amdsmi(monkeypatch, [gpu])
    assert [h.pid for h in RocmPlatform().memory_holders(0) or ()] == [os.getpid()]


@pytest.mark.parametrize("name", ["\u00b3", "\u0663", "\uff11", "\u0967", "1\u0663"])
def test_sysfs_entries_named_with_non_ascii_digits_are_ignored(fs, name):
    # str.isdigit() takes these for digits; int() refuses some and reads others as another number
    gpu = fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=8 * GIB, vram_used=GIB, partitions=2)
    fs.add_kfd_process(4242, {gpu.gpu_ids[1]: GIB})
    kfd = fs.sys / "class" / "kfd" / "kfd"
    for fake in (kfd / "topology" / "nodes" / name, kfd / "proc" / name):
        fake.mkdir()
        for gid in gpu.gpu_ids:
            (fake / f"vram_{gid}").write_text(f"{GIB}\n")
    bank = kfd / "topology" / "nodes" / "1" / "mem_banks" / name
    bank.mkdir(parents=True)
    (bank / "properties").write_text(f"heap_type 1\nsize_in_bytes {GIB}\n")
    p = RocmPlatform()
    assert len(p.devices()) == 2
    assert [i.used for i in (p.memory_info(0), p.memory_info(1))] == [0, GIB]
    assert [h.pid for h in p.memory_holders(1) or ()] == [4242]


# -- attribution from KFD's per-process files ---------------------------------------------------


def test_kfd_process_files_attribute_memory_by_owner(fs):
    import accelplat

    gpu = fs.add_amd_gpu(0, pci="0000:03:00.0", vram_total=192 * GIB, vram_used=9 * GIB)
    fs.add_kfd_process(os.getpid(), {gpu.gpu_id: GIB})
    fs.add_kfd_process(2**22 + 5, {gpu.gpu_id: 6 * GIB})
    owners = accelplat.snapshot(platform=RocmPlatform()).attribution[0]
    assert owners.available  # 2 GiB unexplained: under the 4 GiB idle floor and the slack
    assert owners.self_bytes == GIB
    assert [(h.pid, h.used_bytes) for h in owners.others] == [(2**22 + 5, 6 * GIB)]

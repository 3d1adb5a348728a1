"""The AMD and Intel hosts shaped from public dumps replay with the facts those dumps show.

Each bundle (``python -m tests.hosts.make_amd_intel``) is a host nobody here owns; its
``CONTENTS.txt`` names the dump behind each file. These tests pin what the dumps say the
runtime sees: partitions tied to their card with a capped share of its memory, the card's
``unique_id`` shared by its partitions, an APU's memory from GTT, a Max in FLAT mode.
"""

from __future__ import annotations

import sys

import pytest

from accelplat._registry import current_platform
from accelplat.errors import BackendError
from accelplat.replay import load_bundle, replaying
from tests._hosts import HOSTS, clear_vendor_variables

GIB = 1024**3
MIB = 1024**2
CARD_VRAM = 206141652992  # mem_info_vram_total of a partitioned MI300X (ROCm/ROCm#4750)


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCELPLAT_REPLAY", raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)
    clear_vendor_variables(monkeypatch)


def test_each_shaped_bundle_says_where_its_files_came_from() -> None:
    names = ["amd-mi300x-cpx", "amd-mi308x-cpx", "amd-strix-halo-apu", "amd-rx7900xtx"]
    for name in [*names, "intel-max1550-x2"]:
        contents = load_bundle(HOSTS / f"{name}.tar.gz").contents
        assert contents.startswith("How this host was made: shaped from a public dump"), name
        assert "https://github.com/" in contents, name


def test_mi308x_cpx_partitions_belong_to_their_card_with_a_capped_share() -> None:
    with replaying(HOSTS / "amd-mi308x-cpx.tar.gz"):
        platform = current_platform()
        devices = list(platform.devices())
        memory = [platform.memory_info(d.index) for d in devices]
    assert platform.name == "rocm"
    assert [d.pci_bus_id for d in devices] == ["0000:0a:00.0"] * 4 + ["0000:80:00.0"] * 4
    assert {d.arch for d in devices} == {"gfx942"}
    # The dump's KFD banks: 48 GiB a partition, the card's last 16 MiB less; the four add up
    # to the card's sysfs total, which every partition would otherwise report.
    assert [m.total for m in memory[:4]] == [48 * GIB] * 3 + [48 * GIB - 16 * MIB]
    assert sum(m.total for m in memory[:4]) == CARD_VRAM
    assert [m.used for m in memory] == [2607050752] + [0] * 7
    assert all(m.source.startswith("sysfs kfd (partition") for m in memory)


def test_mi300x_cpx_has_eight_partitions_a_card_that_share_its_uuid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with replaying(HOSTS / "amd-mi300x-cpx.tar.gz"):
        platform = current_platform()
        devices = list(platform.devices())
        totals = [platform.memory_info(d.index).total for d in devices]
        # Every partition carries its card's unique_id (the dump): HIP takes the first GPU
        # whose UUID contains the token, so a UUID names partition 0 only, and accelplat
        # names partitions by index.
        card1 = devices[8].uuid
        assert card1 is not None
        with monkeypatch.context() as patch:  # undone before the replay ends
            patch.setenv("HIP_VISIBLE_DEVICES", card1)
            by_uuid = [d.physical_index for d in platform.devices()]
            patch.setenv("HIP_VISIBLE_DEVICES", "9,3")
            by_index = [d.physical_index for d in platform.devices()]
        env = platform.visible_devices_environment([devices[9]])
    assert len(devices) == 16
    assert len({d.uuid for d in devices[:8]}) == 1
    assert devices[0].uuid != card1
    assert totals.count(24 * GIB) == 14
    assert sum(totals[8:]) == CARD_VRAM
    assert by_uuid == [8]
    assert by_index == [9, 3]
    assert env["HIP_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == "9"


def test_strix_halo_reports_the_kfd_gtt_pool_not_the_carve_out() -> None:
    with replaying(HOSTS / "amd-strix-halo-apu.tar.gz"):
        platform = current_platform()
        (device,) = platform.devices()
        memory = platform.memory_info(0)
    assert device.arch == "gfx1151"
    assert device.uuid is None  # unique_id 0: HIP calls it GPU-XX (rocminfo in antirez/ds4#475)
    assert memory.total == 118111600640  # what HIP reports (ROCm/rocm-systems#8475), not 512 MiB
    assert memory.used == 6 * GIB
    assert "APU" in memory.source


def test_rx7900xtx_is_one_gfx1100_card_with_its_sysfs_vram() -> None:
    with replaying(HOSTS / "amd-rx7900xtx.tar.gz"):
        platform = current_platform()
        (device,) = platform.devices()
        memory = platform.memory_info(0)
    assert (device.name, device.arch) == ("AMD Radeon RX 7900 XTX", "gfx1100")
    assert memory.total == 25753026560  # 24560 MiB (LACT#533)
    assert memory.source == "sysfs"


def test_max1550_in_flat_mode_lists_each_tile_as_torch_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with replaying(HOSTS / "intel-max1550-x2.tar.gz"):
        platform = current_platform()
        devices = list(platform.devices())
        memory = [platform.memory_info(d.index) for d in devices]
        # undone before the replay ends, which restores the variables the bundle replaced
        with monkeypatch.context() as env:
            env.setenv("ZE_AFFINITY_MASK", "2")
            masked = [(d.physical_index, d.uuid) for d in platform.devices()]
            env.delenv("ZE_AFFINITY_MASK")
            env.setenv("ZE_FLAT_DEVICE_HIERARCHY", "COMPOSITE")
            cards = [platform.memory_info(d.index).total for d in platform.devices()]
    assert platform.name == "xpu"
    assert [d.physical_index for d in devices] == [0, 1, 2, 3]
    # The UUIDs torch.xpu printed for these tiles (intel/torch-xpu-ops#3585).
    assert [d.uuid for d in devices] == [
        "8680d50b-2f00-0000-1a00-000000000001",
        "8680d50b-2f00-0000-1a00-000000000002",
        "8680d50b-2f00-0000-2c00-000000000001",
        "8680d50b-2f00-0000-2c00-000000000002",
    ]
    assert [m.total for m in memory] == [64 * GIB] * 4
    assert masked == [(2, "8680d50b-2f00-0000-2c00-000000000001")]
    assert cards == [128 * GIB] * 2


def test_mi210_devices_follow_kfd_order_not_pci_order(monkeypatch: pytest.MonkeyPatch) -> None:
    with replaying(HOSTS / "amd-mi210-x2.tar.gz"):
        platform = current_platform()
        devices = list(platform.devices())
        monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "1")
        (only,) = platform.devices()
    assert [(d.pci_bus_id, d.arch) for d in devices] == [
        ("0000:63:00.0", "gfx90a"),
        ("0000:43:00.0", "gfx90a"),
    ]
    assert only.pci_bus_id == "0000:43:00.0"


def test_the_built_hosts_say_they_were_built() -> None:
    for name in ("amd-mi355x-x2", "intel-arc-b580"):
        contents = load_bundle(HOSTS / f"{name}.tar.gz").contents
        assert contents.startswith("How this host was made: built from vendor facts"), name


def test_arc_with_an_igpu_lists_the_igpu_second_and_refuses_its_host_ram_figures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with replaying(HOSTS / "intel-arc-a770-igpu.tar.gz"):
        platform = current_platform()
        selected = [(d.name, d.arch) for d in platform.devices()]
        # Without the recorded selector, Level Zero's (and torch's) order: discrete first.
        with monkeypatch.context() as patch:  # undone before the replay ends
            patch.delenv("ONEAPI_DEVICE_SELECTOR")
            both = [(d.physical_index, d.name, d.pci_bus_id) for d in platform.devices()]
            with pytest.raises(BackendError, match="integrated GPU"):
                platform.memory_info(1)
    assert selected == [("Intel(R) Arc(TM) A770 Graphics", "dg2")]
    assert both == [
        (0, "Intel(R) Arc(TM) A770 Graphics", "0000:03:00.0"),
        (1, "Intel(R) UHD Graphics 770", "0000:00:02.0"),
    ]


def test_mi250x_gcds_are_two_gpus_and_the_first_has_the_uuid_rocminfo_printed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with replaying(HOSTS / "amd-mi250x.tar.gz"):
        platform = current_platform()
        devices = list(platform.devices())
        monkeypatch.setenv("HIP_VISIBLE_DEVICES", "GPU-124d13ccd7b050e5")
        (chosen,) = platform.devices()
    assert [(d.arch, d.pci_bus_id) for d in devices] == [
        ("gfx90a", "0000:93:00.0"),
        ("gfx90a", "0000:96:00.0"),
    ]
    assert devices[0].uuid == "GPU-124d13ccd7b050e5"  # rocminfo in ROCm/aiter#179
    assert chosen.physical_index == 0

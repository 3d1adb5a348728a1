"""The cpu backend against fake /proc, sysfs and cgroup trees built in the kernel's formats."""

from __future__ import annotations

import math
import sys
from collections import namedtuple
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import accelplat
import accelplat.types
from accelplat import GIB, MIB, Platform
from accelplat._backends.cpu import CpuPlatform, utilization_with_margin
from accelplat.errors import BackendError, DeviceNotFoundError
from tests.fakes.hostfs import V1_UNLIMITED, HostFS


@pytest.fixture
def fs(tmp_path: Path) -> HostFS:
    host = HostFS(tmp_path / "host")
    host.cpuinfo("Fake EPYC 9999 64-Core Processor")
    host.meminfo(total=32 * GIB, available=30 * GIB, free=28 * GIB)
    return host


# -- identity -----------------------------------------------------------------------------------


def test_identity_and_static_properties(fs: HostFS) -> None:
    p = fs.platform()
    assert isinstance(p, Platform)
    assert (p.name, p.device_type, p.visible_devices_env) == ("cpu", "cpu", None)
    assert p.preferred_start_method == "fork"
    assert p.context_free is True
    assert p.release == accelplat.types.ReleaseProfile(False, 0.0, 120.0, 0)
    assert p.graph.available is False
    assert p.graph.api is None
    assert p.graph.reason == "CPU has no graph capture"
    probe = CpuPlatform.probe()
    assert probe.available is True
    assert probe.reason


def test_registry_builds_cpu_platform_and_reads_env_roots(
    fs: HostFS, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs.cgroup_v2("/")
    fs.v2_level("/", max=4 * GIB, current=GIB, inactive_file=0)
    fs.use_env(monkeypatch)
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "cpu")
    p = accelplat.current_platform()
    assert isinstance(p, CpuPlatform)
    info = p.memory_info(0)
    assert (info.total, info.used, info.source) == (4 * GIB, GIB, "cgroup-v2")


def test_querying_memory_does_not_import_torch(fs: HostFS) -> None:
    had_torch = "torch" in sys.modules
    fs.platform().memory_info(0)
    assert ("torch" in sys.modules) == had_torch


# -- /proc/meminfo only -------------------------------------------------------------------------


def test_meminfo_without_cgroup_file(fs: HostFS) -> None:
    info = fs.platform().memory_info(0)
    assert info == accelplat.types.MemoryInfo(
        free=30 * GIB, total=32 * GIB, used=2 * GIB, source="meminfo"
    )


def test_meminfo_of_old_kernel_without_memavailable(fs: HostFS) -> None:
    fs.meminfo(total=8 * GIB, available=None, free=GIB, buffers=256 * MIB, cached=2 * GIB)
    info = fs.platform().memory_info(0)
    assert info.free == GIB + 256 * MIB + 2 * GIB
    assert info.used == info.total - info.free == 8 * GIB - info.free


def test_no_proc_at_all_falls_back_to_psutil(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psutil

    vm = namedtuple("vm", "total available")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: vm(16 * GIB, 10 * GIB))
    p = CpuPlatform(proc_root=tmp_path / "nope", sysfs_root=tmp_path / "nosys")
    info = p.memory_info(0)
    assert (info.total, info.free, info.used, info.source) == (
        16 * GIB,
        10 * GIB,
        6 * GIB,
        "psutil",
    )
    assert p.devices()[0].name.startswith("cpu")


# -- cgroup v2 ----------------------------------------------------------------------------------


def test_v2_limit_on_an_ancestor_bounds_total(fs: HostFS) -> None:
    fs.cgroup_v2("/kubepods/pod1/ctr")
    fs.v2_level("/", max=None)  # the root cgroup has no memory.max
    fs.v2_level("/kubepods", max="max", current=20 * GIB)
    fs.v2_level("/kubepods/pod1", max=8 * GIB, current=3 * GIB, inactive_file=GIB)
    fs.v2_level("/kubepods/pod1/ctr", max="max", current=2 * GIB)
    info = fs.platform().memory_info(0)
    # charge = memory.current - inactive_file = 3 - 1 GiB at the limited level
    assert info == accelplat.types.MemoryInfo(
        free=6 * GIB, total=8 * GIB, used=2 * GIB, source="cgroup-v2"
    )


def test_v2_smallest_limit_wins_and_tightest_headroom_bounds_free(fs: HostFS) -> None:
    fs.cgroup_v2("/a/b")
    fs.v2_level("/a", max=8 * GIB, current=7 * GIB, inactive_file=0)  # 1 GiB headroom
    fs.v2_level("/a/b", max=4 * GIB, current=GIB, inactive_file=0)  # 3 GiB headroom
    info = fs.platform().memory_info(0)
    assert info.total == 4 * GIB
    assert info.free == GIB
    assert info.used == 3 * GIB
    assert info.source == "cgroup-v2"


def test_v2_unlimited_everywhere_reads_meminfo(fs: HostFS) -> None:
    fs.cgroup_v2("/user.slice/session-1.scope")
    fs.v2_level("/user.slice", max="max", current=GIB)
    fs.v2_level("/user.slice/session-1.scope", max="max", current=GIB)
    info = fs.platform().memory_info(0)
    assert (info.total, info.free, info.source) == (32 * GIB, 30 * GIB, "meminfo")


def test_v2_free_never_exceeds_memavailable(fs: HostFS) -> None:
    fs.meminfo(total=32 * GIB, available=5 * GIB)
    fs.cgroup_v2("/ci")
    fs.v2_level("/ci", max=16 * GIB, current=GIB, inactive_file=0)
    info = fs.platform().memory_info(0)
    assert info.total == 16 * GIB
    assert info.free == 5 * GIB  # not 15 GiB: the host itself has only 5 GiB available
    assert info.used + info.free == info.total


def test_v2_limit_above_memtotal_keeps_memtotal(fs: HostFS) -> None:
    fs.cgroup_v2("/big")
    fs.v2_level("/big", max=64 * GIB, current=GIB, inactive_file=0)
    info = fs.platform().memory_info(0)
    assert info.total == 32 * GIB
    assert info.free == 30 * GIB
    assert info.source == "cgroup-v2"


def test_v2_inside_cgroup_namespace_reads_the_mount_root(fs: HostFS) -> None:
    # With a cgroup namespace the container's own cgroup is the mount root and the path is "/".
    fs.cgroup_v2("/")
    fs.v2_level("/", max=2 * GIB, current=512 * MIB, inactive_file=0)
    assert fs.platform().memory_info(0).total == 2 * GIB


def test_v2_path_of_host_namespace_not_under_mount_resolves_to_mount(fs: HostFS) -> None:
    # The container sees only its subtree mounted, but /proc/self/cgroup shows the host path.
    fs.cgroup_v2("/system.slice/docker-abc.scope")
    fs.v2_level("/", max=3 * GIB, current=GIB, inactive_file=0)
    info = fs.platform().memory_info(0)
    assert (info.total, info.free) == (3 * GIB, 2 * GIB)


def test_v2_charge_never_negative(fs: HostFS) -> None:
    fs.cgroup_v2("/x")
    fs.v2_level("/x", max=4 * GIB, current=GIB, inactive_file=2 * GIB)
    info = fs.platform().memory_info(0)
    assert (info.free, info.used) == (4 * GIB, 0)


def test_hybrid_host_with_v2_unified_mount_without_memory_files(fs: HostFS) -> None:
    fs.cgroup_v2("/", mount="unified")
    info = fs.platform().memory_info(0)
    assert info.source == "meminfo"


def test_hybrid_host_with_limit_on_unified_mount(fs: HostFS) -> None:
    fs.cgroup_v2("/job", mount="unified")
    fs.v2_level("/job", max=6 * GIB, current=2 * GIB, inactive_file=0, mount="unified")
    info = fs.platform().memory_info(0)
    assert (info.total, info.free, info.source) == (6 * GIB, 4 * GIB, "cgroup-v2")


@pytest.mark.parametrize(
    "case",
    ["malformed-max", "negative-max", "missing-current", "no-inactive-file", "unreadable-max"],
)
def test_v2_broken_files_fall_back_to_meminfo(fs: HostFS, case: str) -> None:
    fs.cgroup_v2("/x")
    if case == "malformed-max":
        fs.v2_level("/x", max="12 GiB", current=GIB)
    elif case == "negative-max":
        fs.v2_level("/x", max=-5, current=GIB)
    elif case == "missing-current":
        fs.v2_level("/x", max=4 * GIB, current=None)
    elif case == "no-inactive-file":
        fs.v2_level("/x", max=4 * GIB, current=GIB, inactive_file=None)
    else:
        d = fs.v2_level("/x", max=None, current=GIB)
        (d / "memory.max").mkdir()  # reading it raises IsADirectoryError, an OSError
    info = fs.platform().memory_info(0)
    assert (info.total, info.free, info.source) == (32 * GIB, 30 * GIB, "meminfo")


def test_malformed_proc_self_cgroup_falls_back_to_meminfo(fs: HostFS) -> None:
    fs.cgroup_v2("/x")
    fs.v2_level("/x", max=4 * GIB, current=GIB)
    fs.proc_self_cgroup("this is not a cgroup file\n")
    assert fs.platform().memory_info(0).source == "meminfo"


# -- cgroup v1 ----------------------------------------------------------------------------------


def test_v1_limit_and_usage_less_inactive_file(fs: HostFS) -> None:
    fs.cgroup_v1("/docker/abc")
    fs.v1_level("/", limit=V1_UNLIMITED, usage=20 * GIB)
    fs.v1_level("/docker", limit=V1_UNLIMITED, usage=10 * GIB)
    fs.v1_level("/docker/abc", limit=2 * GIB, usage=1536 * MIB, total_inactive_file=512 * MIB)
    info = fs.platform().memory_info(0)
    assert info == accelplat.types.MemoryInfo(free=GIB, total=2 * GIB, used=GIB, source="cgroup-v1")


def test_v1_unlimited_reads_meminfo(fs: HostFS) -> None:
    fs.cgroup_v1("/process_api/x")
    fs.v1_level("/", limit=V1_UNLIMITED, usage=GIB)
    fs.v1_level("/process_api/x", limit=V1_UNLIMITED, usage=GIB)
    assert fs.platform().memory_info(0).source == "meminfo"


def test_v1_comounted_controller_directory(fs: HostFS) -> None:
    fs.cgroup_v1("/job", controller_dir="cpu,memory")
    fs.v1_level(
        "/job", limit=3 * GIB, usage=GIB, total_inactive_file=0, controller_dir="cpu,memory"
    )
    info = fs.platform().memory_info(0)
    assert (info.total, info.free, info.source) == (3 * GIB, 2 * GIB, "cgroup-v1")


def test_v1_without_total_inactive_file_uses_local_inactive_file(fs: HostFS) -> None:
    fs.cgroup_v1("/job")
    fs.v1_level("/job", limit=3 * GIB, usage=GIB + 4096, total_inactive_file=None)
    info = fs.platform().memory_info(0)
    assert info.used == GIB  # the fake's memory.stat has "inactive_file 4096"


def test_v1_malformed_usage_falls_back(fs: HostFS) -> None:
    fs.cgroup_v1("/job")
    d = fs.v1_level("/job", limit=3 * GIB, usage=None)
    fs.write(d / "memory.usage_in_bytes", "lots\n")
    assert fs.platform().memory_info(0).source == "meminfo"


# -- NUMA nodes ---------------------------------------------------------------------------------


def test_single_numa_node_is_the_host(fs: HostFS) -> None:
    fs.numa_node(0, total=4 * GIB, free=GIB)  # ignored: one node means the host device
    p = fs.platform()
    assert p.device_count() == 1
    (dev,) = p.devices()
    assert (dev.index, dev.physical_index, dev.name) == (0, 0, "Fake EPYC 9999 64-Core Processor")
    assert p.memory_info(0).total == 32 * GIB


def test_several_numa_nodes_are_devices(fs: HostFS) -> None:
    fs.numa_node(0, total=16 * GIB, free=4 * GIB, active_file=GIB, inactive_file=2 * GIB,
                 sreclaimable=512 * MIB)  # fmt: skip
    fs.numa_node(1, total=16 * GIB, free=12 * GIB)
    fs.numa_node(2, total=0, free=0)  # a memoryless node (CPUs only) is not a device
    p = fs.platform()
    assert p.device_count() == 2
    names = [(d.index, d.physical_index, d.name) for d in p.devices()]
    assert names == [
        (0, 0, "Fake EPYC 9999 64-Core Processor (node 0)"),
        (1, 1, "Fake EPYC 9999 64-Core Processor (node 1)"),
    ]
    # available as vLLM's CPU worker counts it:
    # MemFree + Active(file) + Inactive(file) + SReclaimable
    n0 = p.memory_info(0)
    assert n0 == accelplat.types.MemoryInfo(
        free=4 * GIB + GIB + 2 * GIB + 512 * MIB,
        total=16 * GIB,
        used=16 * GIB - (7 * GIB + 512 * MIB),
        source="numa-node",
    )
    assert p.memory_info(1).free == 12 * GIB
    with pytest.raises(DeviceNotFoundError):
        p.memory_info(2)


def test_numa_nodes_filtered_by_mems_allowed(fs: HostFS) -> None:
    fs.numa_node(0, total=16 * GIB, free=4 * GIB)
    fs.numa_node(1, total=16 * GIB, free=12 * GIB)
    fs.mems_allowed("1")
    p = fs.platform()
    (dev,) = p.devices()
    assert (dev.index, dev.physical_index) == (0, 1)
    assert p.memory_info(0).free == 12 * GIB


def test_numa_node_without_file_lines_uses_file_pages_less_shmem(fs: HostFS) -> None:
    fs.numa_node(0, total=8 * GIB, free=GIB, active_file=None, inactive_file=None,
                 file_pages=3 * GIB, shmem=GIB)  # fmt: skip
    fs.numa_node(1, total=8 * GIB, free=GIB)
    assert fs.platform().memory_info(0).free == GIB + 2 * GIB


def test_numa_node_clamped_by_cgroup(fs: HostFS) -> None:
    fs.numa_node(0, total=16 * GIB, free=10 * GIB)
    fs.numa_node(1, total=16 * GIB, free=10 * GIB)
    fs.cgroup_v2("/pod")
    fs.v2_level("/pod", max=4 * GIB, current=3 * GIB, inactive_file=0)
    info = fs.platform().memory_info(1)
    assert (info.total, info.free, info.used) == (4 * GIB, GIB, 3 * GIB)
    assert info.source == "numa-node+cgroup-v2"


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The monotonic clock the CPU backend's structure cache reads, moved by the test."""
    now = [1000.0]
    monkeypatch.setattr("accelplat._backends.cpu._monotonic", lambda: now[0])
    return now


def test_numa_node_losing_its_meminfo_is_no_longer_a_device(fs: HostFS, clock: list[float]) -> None:
    fs.numa_node(0, total=16 * GIB, free=10 * GIB)
    d = fs.numa_node(1, total=16 * GIB, free=10 * GIB)
    p = fs.platform()
    assert p.device_count() == 2
    fs.write(d / "meminfo", "Node 1 HugePages_Total:     0\n")
    clock[0] += CpuPlatform.STRUCTURE_TTL_S  # the node list is looked up again
    assert p.device_count() == 1  # one node left: the host is the device


def test_structure_is_reused_briefly_but_figures_are_read_every_time(
    fs: HostFS, clock: list[float]
) -> None:
    fs.meminfo(total=32 * GIB, available=30 * GIB, free=28 * GIB)
    fs.cgroup_v2("/job/step")
    fs.v2_level("/job", max="max", current=GIB)
    fs.v2_level("/job/step", max=4 * GIB, current=GIB)
    p = fs.platform()
    assert (p.memory_info(0).total, p.memory_info(0).free) == (4 * GIB, 3 * GIB)
    # a figure of a limited level changes: seen at once
    fs.v2_level("/job/step", max=8 * GIB, current=2 * GIB)
    assert (p.memory_info(0).total, p.memory_info(0).free) == (8 * GIB, 6 * GIB)
    # a limit set on a level that had none is found once the structure is looked up again
    fs.v2_level("/job", max=2 * GIB, current=GIB)
    assert p.memory_info(0).total == 8 * GIB
    clock[0] += CpuPlatform.STRUCTURE_TTL_S
    info = p.memory_info(0)
    assert (info.total, info.free, info.source) == (2 * GIB, GIB, "cgroup-v2")
    # limits that go away: seen at once (the levels are still read)
    fs.v2_level("/job", max="max", current=GIB)
    fs.v2_level("/job/step", max="max", current=GIB)
    assert p.memory_info(0).source == "meminfo"
    assert p.memory_info(0).total == 32 * GIB


def test_numa_node_without_memfree_is_a_backend_error(fs: HostFS) -> None:
    fs.numa_node(0, total=16 * GIB, free=8 * GIB)
    d = fs.numa_node(1, total=16 * GIB, free=10 * GIB)
    fs.write(d / "meminfo", "Node 1 MemTotal:       16777216 kB\n")
    p = fs.platform()
    with pytest.raises(BackendError, match="node 1"):
        p.memory_info(1)
    # the property never raises: it uses the nodes it can read
    assert p.default_memory_utilization == 0.45


# -- device names and index validation ----------------------------------------------------------


def test_cpu_model_from_arm_style_cpuinfo(fs: HostFS) -> None:
    fs.cpuinfo("Raspberry Pi 5 Model B Rev 1.0", key="Model")
    assert fs.platform().devices()[0].name == "Raspberry Pi 5 Model B Rev 1.0"


@pytest.mark.parametrize("bad", [1, -1, True, "0", 0.0, None])
def test_bad_device_index(fs: HostFS, bad: object) -> None:
    p = fs.platform()
    with pytest.raises(DeviceNotFoundError, match="cpu"):
        p.memory_info(bad)  # type: ignore[arg-type]
    with pytest.raises(DeviceNotFoundError):
        p.memory_holders(bad)  # type: ignore[arg-type]


def test_memory_holders_is_unknown(fs: HostFS) -> None:
    assert fs.platform().memory_holders(0) is None


# -- default memory utilization -----------------------------------------------------------------


def test_default_utilization_of_idle_machine(fs: HostFS) -> None:
    fs.meminfo(total=24 * GIB, available=23 * GIB + 512 * MIB)
    # 90 % of 23.5/24 = 0.88125 -> rounded down to 0.88
    assert fs.platform().default_memory_utilization == 0.88


def test_default_utilization_in_a_busy_container(fs: HostFS) -> None:
    fs.cgroup_v2("/ci")
    fs.v2_level("/ci", max=8 * GIB, current=6 * GIB, inactive_file=0)
    p = fs.platform()
    info = p.memory_info(0)
    u = p.default_memory_utilization
    assert u == 0.22  # 90 % of 2/8 = 0.225
    # vLLM's CPU worker check passes: ceil(total * u) <= available
    assert math.ceil(info.total * u) <= info.free


def test_default_utilization_floor_when_memory_is_exhausted(fs: HostFS) -> None:
    fs.meminfo(total=32 * GIB, available=256 * MIB)
    assert fs.platform().default_memory_utilization == 0.05


def test_default_utilization_is_min_over_numa_nodes(fs: HostFS) -> None:
    fs.numa_node(0, total=16 * GIB, free=15 * GIB)  # 0.84
    fs.numa_node(1, total=16 * GIB, free=8 * GIB)  # 0.45
    assert fs.platform().default_memory_utilization == 0.45


def test_default_utilization_passes_the_node_file_on_a_single_node_machine(fs: HostFS) -> None:
    # One node, so the host is device 0 (from /proc/meminfo) — but vLLM's CPU worker reads
    # node0/meminfo, which in some virtual machines reports far less than the host. The
    # default must pass the engine's check on the node reading too.
    fs.meminfo(total=24 * GIB, available=23 * GIB)
    fs.numa_node(0, total=9 * GIB, free=6 * GIB, active_file=GIB, inactive_file=0)
    p = fs.platform()
    assert p.device_count() == 1
    assert p.memory_info(0).total == 24 * GIB  # the device is still the host
    u = p.default_memory_utilization
    assert u == 0.7  # 90 % of 7/9 = 0.7 (node), smaller than 90 % of 23/24 (host)
    node_available = 7 * GIB
    assert math.ceil(9 * GIB * u) <= node_available


def test_default_utilization_follows_the_current_reading(fs: HostFS) -> None:
    p = fs.platform()
    fs.meminfo(total=10 * GIB, available=10 * GIB)
    first = p.default_memory_utilization
    fs.meminfo(total=10 * GIB, available=5 * GIB)
    assert (first, p.default_memory_utilization) == (0.9, 0.45)


def test_utilization_cap_and_degenerate_total() -> None:
    assert utilization_with_margin(2 * GIB, GIB) == 0.92
    assert utilization_with_margin(GIB, 0) == 0.05
    assert utilization_with_margin(-1, GIB) == 0.05


@given(
    total=st.integers(min_value=MIB, max_value=1 << 44),
    fraction=st.floats(min_value=0.0, max_value=1.0),
)
def test_utilization_rule_properties(total: int, fraction: float) -> None:
    free = int(total * fraction)
    u = utilization_with_margin(free, total)
    assert 0.05 <= u <= 0.92
    assert u == round(u, 2)  # two decimals
    if u > 0.05:
        # the engine's start-up check passes with the 10 % margin kept
        assert math.ceil(total * u) <= free
        assert total * u <= 0.9 * free + 1e-6 * total
    if u < 0.92:
        # the next hundredth would eat into the margin (or the floor applied)
        assert u == 0.05 or total * (u + 0.01) > 0.9 * free - 1e-6 * total


# -- conformance --------------------------------------------------------------------------------


def test_conformance_on_this_machine() -> None:
    from accelplat.testing import run_conformance

    report = run_conformance(CpuPlatform())
    assert report.passed, report.summary()


def test_conformance_on_a_fake_two_node_container(
    fs: HostFS, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelplat.testing import run_conformance

    fs.numa_node(0, total=16 * GIB, free=10 * GIB)
    fs.numa_node(1, total=16 * GIB, free=12 * GIB)
    fs.cgroup_v2("/pod")
    fs.v2_level("/pod", max=12 * GIB, current=3 * GIB, inactive_file=GIB)
    fs.use_env(monkeypatch)  # fresh-process checks inherit the environment
    report = run_conformance(CpuPlatform())
    assert report.passed, report.summary()


MEMINFO_ODD_LINES = """MemTotal:       16384 kB
MemFree:         2048 kB
  MemAvailable:  8192 kB
Buffers:          100
Cached: -5 kB
SwapCached:        0 kB
MemTotalX:        77 kB
Node 0 MemFree:   99 kB
Hugepagesize:    2048 kB
Cached:: 3 kB
MemFree:5 kB
garbage line without colon
"""


def test_filtered_meminfo_parse_keeps_exactly_the_unfiltered_entries() -> None:
    from accelplat._backends._common import _MEMINFO_KEYS, parse_kb_table

    everything = parse_kb_table(MEMINFO_ODD_LINES)
    wanted = {k: v for k, v in everything.items() if k in _MEMINFO_KEYS}
    filtered = parse_kb_table(MEMINFO_ODD_LINES, keys=_MEMINFO_KEYS)
    assert {k: v for k, v in filtered.items() if k in _MEMINFO_KEYS} == wanted
    assert wanted == {
        "MemTotal": 16384 * 1024,
        "MemFree": 2048 * 1024,
        "MemAvailable": 8192 * 1024,
        "Buffers": 100,
    }
    node = "Node 0 MemTotal: 4 kB\nNode 0 MemFree: 1 kB\nNode 0 Active: 9 kB\n"
    assert parse_kb_table(node, skip=2, keys=frozenset({"MemTotal", "MemFree"})) == {
        "MemTotal": 4096,
        "MemFree": 1024,
    }


_MEMINFO_PIECES = st.sampled_from(
    [
        "MemTotal:",
        "MemFree:",
        "MemAvailable:",
        "Buffers:",
        "Cached:",
        "SwapCached:",
        "MemTotalX:",
        "Node 0 ",
        ":",
        " ",
        "\t",
        "  ",
        "\n",
        "\r\n",
        "\r",
        "\x0b",
        "\x0c",
        "\x1c",
        "\x85",
        "\u2028",
        "\u00a0",
        "\u3000",
        "0",
        "7",
        "123",
        "-5",
        "\u0663",
        "99999999999999999999999",
        " kB",
        " KB",
        " MB",
        "x",
    ]
)


@given(st.lists(_MEMINFO_PIECES, max_size=40).map("".join))
def test_the_keyed_meminfo_parse_reads_what_the_full_parse_reads(text: str) -> None:
    """The keyed parse passes lines over unsplit; what it keeps must be what splitting reads."""
    from accelplat._backends._common import _MEMINFO_KEYS, parse_kb_table

    everything = parse_kb_table(text)
    wanted = {k: v for k, v in everything.items() if k in _MEMINFO_KEYS}
    filtered = parse_kb_table(text, keys=_MEMINFO_KEYS)
    assert {k: v for k, v in filtered.items() if k in _MEMINFO_KEYS} == wanted


def test_host_meminfo_names_the_file_under_the_proc_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelplat._backends._common import host_meminfo

    (tmp_path / "meminfo").write_text("MemTotal: 10 kB\nMemFree: 4 kB\nBuffers: 1 kB\n")
    monkeypatch.setenv("ACCELPLAT_PROC_ROOT", str(tmp_path))
    info = host_meminfo()
    assert info is not None
    assert (info.total, info.available) == (10240, 5120)  # no MemAvailable: free + buffers
    assert info.path == str(tmp_path / "meminfo")
    with pytest.raises(OSError, match="missing"):
        host_meminfo(tmp_path / "missing")

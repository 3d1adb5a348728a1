"""Where vLLM's GPU CI runs: H200 MIG slices, on bare metal and inside a restricted container."""

from __future__ import annotations

from pathlib import Path

import pytest

import accelplat
import accelplat.testing
from accelplat._backends.cuda import CudaPlatform
from accelplat.integrations import vllm as av
from accelplat.replay import replaying
from tests.hosts import make_mig

HOSTS = Path(__file__).resolve().parents[1] / "hosts"
BARE = HOSTS / "nvidia-h200-mig-7x1g18gb.tar.gz"
CONTAINER = HOSTS / "nvidia-h200-mig-1g35gb-container.tar.gz"
GIB = 1024**3


@pytest.mark.parametrize("host", make_mig.HOSTS, ids=lambda h: h.bundle)
def test_each_mig_host_is_what_its_facts_make(host: make_mig.Host) -> None:
    assert (HOSTS / host.bundle).read_bytes() == make_mig.build(host)


def test_a_bare_metal_host_offers_every_slice_as_a_unit() -> None:
    with replaying(BARE):
        platform = accelplat.current_platform()
        assert isinstance(platform, CudaPlatform)
        assert platform.device_count() == 1  # CUDA shows a process one MIG device
        units = platform.lease_units()
        assert len(units) == 7
        assert all(u.startswith("MIG-") for u in units)
        seen = [platform.restricted(u).devices() for u in units]
        assert [(d.index, d.uuid) for (d,) in seen] == [(0, u) for u in units]
        assert {platform.restricted(u).memory_info(0).total for u in units} == {16 * GIB}


def test_the_ci_container_decides_on_its_slice_where_nvml_refuses_the_parent() -> None:
    with replaying(CONTAINER):
        platform = accelplat.current_platform()
        assert isinstance(platform, CudaPlatform)
        (device,) = platform.devices()
        assert device.name == "NVIDIA H200 MIG 1g.35gb"
        assert platform.memory_info(0).total == 32 * GIB + GIB // 4
        assert platform.lease_units() == ()  # nothing beyond its slice
        # vllm#50463: vLLM read 0 bytes through the parent GPU and skipped these
        mark = av.large_gpu_mark(min_gb=32)
        assert mark.args == (False,)
        assert not accelplat.testing.requires(device_memory="32GiB").args[0]
        assert av.record_gpu_memory_usage_stats(devices=[0])[0][1] == 32.25

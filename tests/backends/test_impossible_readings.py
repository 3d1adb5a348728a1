"""Impossible memory readings are refused by one rule, on every backend, with a typed error.

Also: a GPU that has reported memory of its own is never measured as host RAM afterwards.
Vendor libraries are faked at their boundary (tests/fakes/); the impossible figures are the ones
real drivers produce: an unsigned 64-bit counter wrapped below zero (about 16 EiB), a reserved
size above the total, free or used above total.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import accelplat
from accelplat._backends._common import MAX_PLAUSIBLE_BYTES, checked_memory, implausible
from accelplat._backends.cuda import CudaPlatform
from accelplat._backends.simulated import SimulatedClock, SimulatedPlatform
from accelplat._types import GIB, MemoryInfo
from accelplat._vendor import nvml as _nvml
from accelplat.errors import BackendError, ImplausibleReadingError
from tests.conftest import Install
from tests.fakes.hostfs import HostFS
from tests.fakes.nvml import FakeGpu, FakeNvml, h200

U64 = 2**64
WRAPPED = U64 - 4096  # a counter that went 4 KiB below zero

# -- the rule ----------------------------------------------------------------------------------

figures = st.one_of(
    st.integers(-(2**65), 2**65),
    st.sampled_from([0, 1, -1, MAX_PLAUSIBLE_BYTES, MAX_PLAUSIBLE_BYTES + 1, WRAPPED, U64]),
)


@given(free=figures, total=figures, used=figures, reserved=figures)
def test_the_rule_accepts_exactly_the_possible_readings(
    free: int, total: int, used: int, reserved: int
) -> None:
    possible = (
        0 < total <= MAX_PLAUSIBLE_BYTES
        and 0 <= free <= total
        and 0 <= used <= total
        and 0 <= reserved <= MAX_PLAUSIBLE_BYTES
    )
    assert (implausible(free, total, used, reserved) is None) == possible
    if possible:
        info = checked_memory(
            "x", "dev", free=free, total=total, used=used, reserved=reserved, source="s"
        )
        assert info == MemoryInfo(free, total, used, reserved, "s")
    else:
        with pytest.raises(ImplausibleReadingError) as err:
            checked_memory(
                "x", "dev", free=free, total=total, used=used, reserved=reserved, source="s"
            )
        assert err.value.figures == {
            "free": free,
            "total": total,
            "used": used,
            "reserved": reserved,
        }
        assert isinstance(err.value, BackendError)
        assert "dev" in str(err.value)
        assert err.value.reason in str(err.value)


# -- CUDA: each way NVML's unsigned figures go wrong -------------------------------------------


def _patch_reading(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, **fields: int) -> None:
    """Make NVML's memory answers (both struct versions) carry ``fields`` as raw u64 values."""
    original = fake.nvmlDeviceGetMemoryInfo

    def patched(handle: Any, version: int | None = None) -> Any:
        mem = original(handle, version=version)
        for name, value in fields.items():
            if hasattr(mem, name):
                setattr(mem, name, value % U64)  # what a C uint64 holds
        return mem

    monkeypatch.setattr(fake, "nvmlDeviceGetMemoryInfo", patched)


CUDA_IMPOSSIBLE = [
    pytest.param({"free": -4096}, "free is above 8 EiB", id="free-wrapped"),
    pytest.param({"used": -4096}, "used is above 8 EiB", id="used-wrapped"),
    pytest.param({"total": -4096}, "total is above 8 EiB", id="total-wrapped"),
    pytest.param({"reserved": 200 * GIB}, "total is negative", id="reserved-above-total"),
    pytest.param({"used": 1000 * GIB}, "used exceeds total", id="used-above-total"),
    pytest.param({"free": 1000 * GIB}, "free exceeds total", id="free-above-total"),
    pytest.param({"total": 0, "reserved": 0, "free": 0, "used": 0}, "total is zero", id="zero"),
]


@pytest.mark.parametrize(("fields", "reason"), CUDA_IMPOSSIBLE)
@pytest.mark.parametrize("struct", ["v2", "v1"])
def test_cuda_refuses_impossible_nvml_figures(
    install: Install,
    monkeypatch: pytest.MonkeyPatch,
    fields: dict[str, int],
    reason: str,
    struct: str,
) -> None:
    fake = install(FakeNvml([h200(0, used=GIB)]))
    if struct == "v1":
        fake.memory_v2 = False  # a driver before R510
        if "reserved" in fields:
            fields = {"used": 1000 * GIB}  # v1 has no reserved field: its nearest nonsense
            reason = "used exceeds total"
    p = CudaPlatform()
    _patch_reading(fake, monkeypatch, **fields)
    with pytest.raises(ImplausibleReadingError) as err:
        p.memory_info(0)
    assert reason in str(err.value)
    assert err.value.platform == "cuda"
    assert "cuda device 0" in str(err.value)
    assert err.value.source == ("nvml-v2" if struct == "v2" else "nvml-v1")
    assert _nvml._state.active == 0


def test_an_impossible_reading_ends_a_wait_instead_of_passing_it(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    """free of 16 EiB would make "is the memory clear?" true; it must end the wait instead."""
    fake = install(FakeNvml([h200(0, used=60 * GIB)]))
    _patch_reading(fake, monkeypatch, used=-4096)
    with pytest.raises(ImplausibleReadingError):
        accelplat.wait_for_memory_to_clear(
            threshold_bytes=GIB, timeout_s=30, clock=SimulatedClock()
        )


# -- CUDA: never host RAM for a GPU that has its own memory ------------------------------------

MEMINFO = "MemTotal:       128000000 kB\nMemFree:         1000000 kB\nMemAvailable:   96000000 kB\n"


@pytest.mark.parametrize("v2", [True, False], ids=["v2-driver", "v1-driver"])
@pytest.mark.parametrize("times", [1, None], ids=["once", "for-good"])
def test_not_supported_after_the_gpu_reported_is_an_error_not_host_memory(
    install: Install, tmp_path: Path, v2: bool, times: int | None
) -> None:
    (tmp_path / "meminfo").write_text(MEMINFO)
    fake = install(FakeNvml([h200(0, used=60 * GIB)]))
    fake.memory_v2 = v2
    p = CudaPlatform(proc_root=tmp_path)
    before = p.memory_info(0)
    assert before.used == 60 * GIB + (0 if v2 else before.reserved or 644_939_776)
    fake.fail("nvmlDeviceGetMemoryInfo", "NotSupported", times=times)
    with pytest.raises(BackendError) as err:
        p.memory_info(0)
    assert err.value.vendor_error == "NVMLError_NotSupported"
    assert "not switching to host memory" in str(err.value)
    assert not isinstance(err.value, ImplausibleReadingError)
    if times is None:
        with pytest.raises(BackendError):  # still an error: nothing was switched for good
            p.memory_info(0)
    else:
        after = p.memory_info(0)  # the GPU answers again: its own figures, same source
        assert after.source == before.source
        assert after.used == before.used


def test_not_supported_in_the_middle_of_a_wait_ends_it(
    install: Install, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's case: the wait must not pass on host figures while the GPU holds 60 GiB."""
    (tmp_path / "meminfo").write_text(MEMINFO)
    monkeypatch.setenv("ACCELPLAT_PROC_ROOT", str(tmp_path))
    fake = install(FakeNvml([h200(0, used=60 * GIB)]))
    fake.fail("nvmlDeviceGetMemoryInfo", "NotSupported", after=3)
    with pytest.raises(BackendError, match="NotSupported"):
        accelplat.wait_for_memory_to_clear(
            threshold_bytes=2 * GIB, timeout_s=60, clock=SimulatedClock()
        )


def test_a_gpu_that_never_reported_still_uses_host_memory(install: Install, tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text(MEMINFO)
    install(FakeNvml([FakeGpu("NVIDIA GB10", "GPU-0b1", "00000000:01:00.0", unified_memory=True)]))
    p = CudaPlatform(proc_root=tmp_path)
    assert p.memory_info(0).source == "host-unified"
    assert p.memory_info(0).source == "host-unified"


# -- XPU and ROCm: the same rule ---------------------------------------------------------------


def test_xpu_uses_the_shared_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelplat._backends.xpu import XpuPlatform
    from tests.fakes.torch_xpu import FakeXpuDevice, install_fake_torch, make_fake_torch

    devices = [
        FakeXpuDevice(total=8 * GIB, free=9 * GIB),
        FakeXpuDevice(total=8 * GIB, free=WRAPPED),
        FakeXpuDevice(total=0, free=0),
    ]
    install_fake_torch(monkeypatch, make_fake_torch(devices))
    p = XpuPlatform(level_zero=False)
    reasons = []
    for i in range(3):
        with pytest.raises(ImplausibleReadingError) as err:
            p.memory_info(i)
        reasons.append(err.value.reason)
    assert reasons[0] == "free exceeds total"
    assert "8 EiB" in reasons[1]
    assert reasons[2] == "total is zero"


# -- host memory: CPU (host, cgroup, NUMA node, psutil), CUDA's unified memory, simulated ------

HOSTILE_MEMINFO = [
    pytest.param(
        "MemTotal: 8388608 kB\nMemFree: 1024 kB\nMemAvailable: 16777216 kB\n",
        "free exceeds total",
        id="available-above-total",
    ),
    pytest.param(
        "MemTotal: 18446744073709551612 kB\nMemAvailable: 1024 kB\n",
        "total is above 8 EiB",
        id="total-wrapped",
    ),
    pytest.param(
        "MemTotal: 8388608 kB\nMemAvailable: 18446744073709551612 kB\n",
        "free is above 8 EiB",
        id="available-wrapped",
    ),
    pytest.param(
        "MemTotal: " + "9" * 5000 + " kB\nMemAvailable: 1024 kB\n",
        "total is above 8 EiB",
        id="total-5000-digits",
    ),
    pytest.param(
        "MemTotal: 8388608 kB\nMemFree: 16777216 kB\nBuffers: 0 kB\nCached: 0 kB\n",
        "free exceeds total",
        id="old-kernel-free-above-total",
    ),
]
"""``/proc/meminfo`` figures no kernel writes: each is refused by the one rule, by name."""


@pytest.mark.parametrize(("text", "reason"), HOSTILE_MEMINFO)
def test_cpu_refuses_an_impossible_proc_meminfo(tmp_path: Path, text: str, reason: str) -> None:
    fs = HostFS(tmp_path)
    fs.write(fs.proc / "meminfo", text)
    with pytest.raises(ImplausibleReadingError) as err:
        fs.platform().memory_info(0)
    assert reason in str(err.value)
    assert str(fs.proc / "meminfo") in str(err.value)
    assert err.value.platform == "cpu"
    assert err.value.source == "meminfo"


@pytest.mark.parametrize(("text", "reason"), HOSTILE_MEMINFO)
def test_cpu_checks_the_host_figures_before_a_cgroup_limit_bounds_them(
    tmp_path: Path, text: str, reason: str
) -> None:
    """A limit below the host's memory must not hide the host's impossible figures."""
    fs = HostFS(tmp_path)
    fs.write(fs.proc / "meminfo", text)
    fs.cgroup_v2("/job")
    fs.v2_level("/job", max=GIB, current=GIB // 2)
    with pytest.raises(ImplausibleReadingError, match=reason):
        fs.platform().memory_info(0)


def test_cpu_refuses_a_cgroup_limit_of_zero_as_a_total(tmp_path: Path) -> None:
    fs = HostFS(tmp_path)
    fs.meminfo(total=16 * GIB, available=12 * GIB)
    fs.cgroup_v2("/job")
    fs.v2_level("/job", max=0, current=0)
    with pytest.raises(ImplausibleReadingError) as err:
        fs.platform().memory_info(0)
    assert err.value.reason == "total is zero"
    assert err.value.source == "cgroup-v2"
    assert "within the cgroup-v2 limit" in str(err.value)


def test_cpu_refuses_an_impossible_numa_node_reading(tmp_path: Path) -> None:
    fs = HostFS(tmp_path)
    fs.meminfo(total=64 * GIB, available=60 * GIB)
    fs.numa_node(0, total=32 * GIB, free=30 * GIB)
    node1 = fs.numa_node(1, total=32 * GIB, free=30 * GIB)
    fs.write(
        node1 / "meminfo",
        "Node 1 MemTotal:       33554432 kB\nNode 1 MemFree:        67108864 kB\n",
    )
    p = fs.platform()
    assert p.device_count() == 2
    assert p.memory_info(0).free == 30 * GIB  # the sound node still answers
    with pytest.raises(ImplausibleReadingError) as err:
        p.memory_info(1)
    assert err.value.reason == "free exceeds total"
    assert "NUMA node 1" in str(err.value)


def test_cpu_refuses_an_impossible_psutil_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without /proc/meminfo (macOS) psutil answers; its figures meet the same rule."""
    import psutil

    class _Memory:
        total = 8 * GIB
        available = 16 * GIB

    monkeypatch.setattr(psutil, "virtual_memory", _Memory)
    fs = HostFS(tmp_path)  # no meminfo written
    with pytest.raises(ImplausibleReadingError) as err:
        fs.platform().memory_info(0)
    assert err.value.reason == "free exceeds total"
    assert err.value.source == "psutil"


def test_an_impossible_host_reading_ends_a_cpu_wait_instead_of_passing_it(tmp_path: Path) -> None:
    """Clamped, MemAvailable above MemTotal would read as "all free": the wait must end."""
    fs = HostFS(tmp_path)
    fs.write(fs.proc / "meminfo", "MemTotal: 8388608 kB\nMemAvailable: 16777216 kB\n")
    with pytest.raises(ImplausibleReadingError):
        accelplat.wait_for_memory_to_clear(
            threshold_bytes=GIB, timeout_s=30, platform=fs.platform(), clock=SimulatedClock()
        )


@pytest.mark.parametrize(("text", "reason"), HOSTILE_MEMINFO)
def test_cuda_unified_memory_refuses_an_impossible_proc_meminfo(
    install: Install, tmp_path: Path, text: str, reason: str
) -> None:
    (tmp_path / "meminfo").write_text(text)
    install(FakeNvml([FakeGpu("NVIDIA GB10", "GPU-0b1", "00000000:01:00.0", unified_memory=True)]))
    p = CudaPlatform(proc_root=tmp_path)
    with pytest.raises(ImplausibleReadingError) as err:
        p.memory_info(0)
    assert reason in str(err.value)
    assert err.value.platform == "cuda"
    assert err.value.source == "host-unified"
    assert "cuda device 0" in str(err.value)
    assert str(tmp_path / "meminfo") in str(err.value)
    assert _nvml._state.active == 0


def test_a_simulated_device_of_no_memory_is_refused_like_a_drivers_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text('{"devices": [{"total": "80GiB", "used": "1GiB"}, {"total": 0}]}')
    monkeypatch.setenv("ACCELPLAT_SIMULATED_SPEC", str(spec))
    p = SimulatedPlatform()
    assert p.memory_info(0).used == GIB
    with pytest.raises(ImplausibleReadingError) as err:
        p.memory_info(1)
    assert err.value.reason == "total is zero"
    assert err.value.platform == "simulated"
    assert "simulated device 1 (SIM-1)" in str(err.value)
    with pytest.raises(ImplausibleReadingError):
        accelplat.wait_for_memory_to_clear(threshold_bytes=GIB, timeout_s=30, platform=p)

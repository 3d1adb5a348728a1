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
from accelplat import _nvml
from accelplat._types import GIB, MemoryInfo
from accelplat.backends._readings import MAX_PLAUSIBLE_BYTES, checked_memory, implausible
from accelplat.backends.cuda import CudaPlatform
from accelplat.backends.simulated import SimulatedClock
from accelplat.errors import BackendError, ImplausibleReadingError
from tests.conftest import Install
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
    from accelplat.backends.xpu import XpuPlatform
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

"""accelplat.integrations.vllm: vLLM 0.32 semantics under vLLM's names, and the runner hooks."""

from __future__ import annotations

import inspect
import json
import multiprocessing
import os
import pickle
import signal
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import accelplat
from accelplat import _registry as registry
from accelplat._backends.simulated import SimulatedClock, SimulatedPlatform
from accelplat._types import GIB
from accelplat.errors import (
    ConfigurationError,
    DeviceNotFoundError,
    MemoryNotSettledError,
    VllmMemoryNotFreeError,
)
from accelplat.integrations import vllm as av
from accelplat.integrations._vllm import EAGER_START_GRACE_S
from tests.fakes.hostfs import HostFS

pytest_plugins = ["pytester"]

# --------------------------------------------------------------------------------------------
# simulated platforms

EAGER = {"lazy": False, "stable_duration_s": 0.0, "settle_timeout_s": 30.0}
LAZY = {"lazy": True, "stable_duration_s": 2.0, "settle_timeout_s": 60.0, "idle_floor": "4GiB"}


def make_platform(
    devices: list[dict[str, Any]],
    *,
    release: Mapping[str, Any] = EAGER,
    **top: Any,
) -> tuple[SimulatedPlatform, SimulatedClock]:
    clock = SimulatedClock()
    spec = {"devices": devices, "release": dict(release), **top}
    platform = SimulatedPlatform.from_spec(spec, clock=clock)
    registry.set_current_platform(platform)
    return platform, clock


def device(total: str = "80GiB", used: str = "0GiB", **extra: Any) -> dict[str, Any]:
    return {"total": total, "used": used, **extra}


# --------------------------------------------------------------------------------------------
# record_gpu_memory_usage_stats


def test_record_stats_returns_used_and_total_gib_per_visible_device() -> None:
    make_platform([device("80GiB", "20GiB"), device("40GiB", "1GiB")])
    assert av.record_gpu_memory_usage_stats(devices=[1, 0]) == {1: (1.0, 40.0), 0: (20.0, 80.0)}
    assert av.record_gpu_memory_usage_stats(devices=[]) == {}


def test_record_stats_counts_reserved_memory_as_vllm_reads_nvml_v1() -> None:
    # The example: 1 GiB allocated on an 80 GiB device whose driver keeps 615 MiB.
    make_platform([device(f"{80 * 1024 - 615}MiB", "1GiB", reserved="615MiB")])
    used, total = av.record_gpu_memory_usage_stats(devices=[0])[0]
    assert round(used, 2) == 1.60
    assert total == 80.0
    # accelplat's own API keeps NVML v2 semantics
    assert accelplat.record_usage_stats([0])[0][0] == 1.0


def test_record_stats_on_fake_nvml_equal_nvmls_v1_struct(install: Any) -> None:
    from accelplat._backends.cuda import CudaPlatform
    from tests.fakes.nvml import FakeNvml, h200

    fake = install(FakeNvml([h200(0, used=GIB), h200(1, used=7 * GIB)]))
    registry.set_current_platform(CudaPlatform())
    stats = av.record_gpu_memory_usage_stats(devices=[0, 1])
    for index in (0, 1):
        v1 = fake.nvmlDeviceGetMemoryInfo(fake.nvmlDeviceGetHandleByIndex(index))
        assert stats[index] == (v1.used / GIB, v1.total / GIB)


@pytest.mark.parametrize("order", [None, "PCI_BUS_ID", "FASTEST_FIRST"])
def test_record_stats_reads_cuda_device_0_whatever_order_nvidia_visible_devices_lists(
    install: Any, monkeypatch: pytest.MonkeyPatch, order: str | None
) -> None:
    # The container runtime exposes the GPUs NVIDIA_VISIBLE_DEVICES lists, not their order:
    # inside, NVML lists them by PCI bus and CUDA numbers them fastest first, ties (one model)
    # by PCI bus, so device 0 is the lower bus id. vLLM's helper takes the variable's first
    # UUID for device 0 and reads torch's cuda:1 here.
    from accelplat._backends.cuda import CudaPlatform
    from tests.fakes.nvml import FakeNvml, h200

    gpu0, gpu1 = h200(0, used=GIB), h200(1, used=7 * GIB)  # buses 0x18 and 0x28
    install(FakeNvml([gpu0, gpu1]))
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", f"{gpu1.uuid},{gpu0.uuid}")
    if order is not None:
        monkeypatch.setenv("CUDA_DEVICE_ORDER", order)
    platform = CudaPlatform(order_resolver=lambda env: [gpu0.uuid, gpu1.uuid])
    registry.set_current_platform(platform)
    assert platform.devices()[0].uuid == gpu0.uuid
    used = av.record_gpu_memory_usage_stats(devices=[0])[0][0]
    assert used == pytest.approx((GIB + gpu0.reserved) / GIB)


def test_record_stats_rejects_an_invisible_device_as_index_error() -> None:
    make_platform([device()])
    with pytest.raises(DeviceNotFoundError) as info:
        av.record_gpu_memory_usage_stats(devices=[3])
    assert isinstance(info.value, IndexError)


# --------------------------------------------------------------------------------------------
# wait_for_gpu_memory_to_clear


def test_clear_returns_without_sleeping_when_already_free(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, clock = make_platform([device("80GiB", "1GiB")])
    av.wait_for_gpu_memory_to_clear(devices=[0], threshold_ratio=0.1)
    assert clock.sleeps == []
    assert capsys.readouterr().out.splitlines() == [
        "gpu memory used/total (GiB): 0=1.00/80.00; ",
        "Done waiting for free GPU memory on devices devices=[0] "
        "(threshold='device=0: 0.100') dur_s=0.00",
    ]


def test_clear_with_no_devices_returns_as_vllms_does() -> None:
    _, clock = make_platform([device("80GiB", "79GiB")])
    av.wait_for_gpu_memory_to_clear(devices=[], threshold_ratio=0.1, stable_duration_s=5)
    assert clock.sleeps == []


@pytest.mark.parametrize("release_at", [1.0, 12.0, 100.0])
def test_a_release_is_seen_within_50_ms_at_any_point_of_the_wait(release_at: float) -> None:
    _, clock = make_platform(
        [device("80GiB", "60GiB", timeline=[{"at": release_at, "used": "1GiB"}])]
    )
    av.wait_for_gpu_memory_to_clear(devices=[0], threshold_ratio=0.1, timeout_s=200)
    assert release_at <= clock.monotonic() <= release_at + 0.05
    assert max(clock.sleeps) <= 0.05  # poll_interval_s=5 sets the print cadence, not the sleep


def test_progress_is_printed_in_vllm_text_once_per_poll_interval(
    capsys: pytest.CaptureFixture[str],
) -> None:
    make_platform([device("80GiB", "60GiB", timeline=[{"at": 10.0, "used": "0GiB"}])])
    av.wait_for_gpu_memory_to_clear(devices=[0], threshold_ratio=0.1, poll_interval_s=2)
    lines = capsys.readouterr().out.splitlines()
    progress = [m for m in lines if m.startswith("gpu memory used/total (GiB): ")]
    assert progress[0] == "gpu memory used/total (GiB): 0=60.00/80.00; "
    assert 10 / 2 <= len(progress) <= 10 / 2 + 2
    assert lines[-1].startswith("Done waiting for free GPU memory on devices devices=[0] ")


def test_timeout_raises_value_error_in_vllm_032_shape_with_physical_indices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stuck = {"stuck": {"used": "30GiB", "pid": 4242, "name": "engine-core", "at": 0}}
    platform, clock = make_platform([device("80GiB", "0GiB", timeline=[stuck]), device()])
    physical = [replace(d, physical_index=7 - d.index) for d in platform.devices()]
    monkeypatch.setattr(platform, "devices", lambda: physical)
    with pytest.raises(VllmMemoryNotFreeError) as info:
        av.wait_for_gpu_memory_to_clear(devices=[0], threshold_bytes=2 * GIB, timeout_s=3)
    err = info.value
    assert isinstance(err, ValueError)
    assert isinstance(err, MemoryNotSettledError)
    first = str(err).splitlines()[0]
    assert first == (
        "Memory of devices devices=[7] not free after dur_s=3.00 (threshold='device=7: 2.00 GiB')"
    )
    assert "pid 4242" in str(err)
    assert "'engine-core'" in str(err)
    assert err.targets == {0: 2 * GIB}
    assert clock.monotonic() == pytest.approx(3.0)


def test_threshold_text_follows_vllm_032_for_ratio_and_both() -> None:
    make_platform([device("80GiB", "70GiB"), device("80GiB", "70GiB")])
    with pytest.raises(ValueError) as info:
        av.wait_for_gpu_memory_to_clear(devices=[0, 1], threshold_ratio=0.5, timeout_s=0)
    assert "(threshold='device=0: 0.500; device=1: 0.500')" in str(info.value)
    with pytest.raises(ValueError) as info:
        av.wait_for_gpu_memory_to_clear(
            devices=[1], threshold_bytes=6 * GIB, threshold_ratio=0.05, timeout_s=0
        )
    assert "(threshold='device=1: max(6.00 GiB, 0.050)')" in str(info.value)


def test_thresholds_are_judged_on_vllms_accounting() -> None:
    # 1.5 GiB allocated + 0.6 GiB reserved: vLLM sees 2.1 GiB used, above a 2 GiB threshold.
    make_platform([device("79GiB", "1536MiB", reserved="614MiB")])
    with pytest.raises(VllmMemoryNotFreeError):
        av.wait_for_gpu_memory_to_clear(devices=[0], threshold_bytes=2 * GIB, timeout_s=0)
    accelplat.wait_for_memory_to_clear([0], threshold_bytes=2 * GIB, timeout_s=0)


def test_with_both_thresholds_the_larger_target_wins() -> None:
    make_platform([device("80GiB", "10GiB")])
    # ratio 0.1 -> 8 GiB; bytes 12 GiB: the device at 10 GiB is clear
    av.wait_for_gpu_memory_to_clear(devices=[0], threshold_bytes=12 * GIB, threshold_ratio=0.1)
    with pytest.raises(ValueError, match="not free"):
        av.wait_for_gpu_memory_to_clear(
            devices=[0], threshold_bytes=9 * GIB, threshold_ratio=0.1, timeout_s=0
        )


def test_dict_thresholds_naming_other_devices_are_an_assertion_error() -> None:
    make_platform([device(), device()])
    with pytest.raises(AssertionError, match="exactly the devices") as info:
        av.wait_for_gpu_memory_to_clear(devices=[0, 1], threshold_bytes={0: GIB})
    assert not isinstance(info.value, ValueError)  # vLLM's cleanup fixture swallows ValueError
    av.wait_for_gpu_memory_to_clear(devices=[0, 1], threshold_bytes={0: GIB, 1: GIB})


def test_dict_thresholds_may_name_physical_indices(monkeypatch: pytest.MonkeyPatch) -> None:
    platform, _ = make_platform([device("80GiB", "10GiB"), device("80GiB", "1GiB")])
    physical = [replace(d, physical_index=d.index + 4) for d in platform.devices()]
    monkeypatch.setattr(platform, "devices", lambda: physical)
    av.wait_for_gpu_memory_to_clear(devices=[0, 1], threshold_bytes={4: 11 * GIB, 5: 2 * GIB})
    with pytest.raises(ValueError, match="device=4"):
        av.wait_for_gpu_memory_to_clear(
            devices=[0, 1], threshold_bytes={4: 2 * GIB, 5: 11 * GIB}, timeout_s=0
        )


def test_a_threshold_is_required_as_an_assertion() -> None:
    make_platform([device()])
    with pytest.raises(AssertionError, match="threshold"):
        av.wait_for_gpu_memory_to_clear(devices=[0])


def test_a_ratio_above_one_is_met_as_in_vllm() -> None:
    make_platform([device("80GiB", "80GiB")])
    av.wait_for_gpu_memory_to_clear(devices=[0], threshold_ratio=1.5, timeout_s=0)


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), True, "5"])
def test_poll_interval_must_be_a_number_of_seconds(bad: object) -> None:
    make_platform([device()])
    with pytest.raises(ConfigurationError, match="poll_interval_s"):
        av.wait_for_gpu_memory_to_clear(
            devices=[0],
            threshold_ratio=0.1,
            poll_interval_s=bad,  # type: ignore[arg-type]
        )


def test_idle_floor_comes_from_the_release_profile() -> None:
    # 3 GiB resident at idle on an 80 GiB device; ratio 0.01 asks for 0.8 GiB
    make_platform([device("80GiB", "3GiB")], release=LAZY)
    av.wait_for_gpu_memory_to_clear(devices=[0], threshold_ratio=0.01, timeout_s=1)
    make_platform([device("80GiB", "3GiB")], release=EAGER)
    with pytest.raises(ValueError):
        av.wait_for_gpu_memory_to_clear(devices=[0], threshold_ratio=0.01, timeout_s=1)
    make_platform([device("80GiB", "6GiB")], release=LAZY)
    with pytest.raises(ValueError) as info:
        av.wait_for_gpu_memory_to_clear(devices=[0], threshold_ratio=0.01, timeout_s=0)
    assert "(threshold='device=0: max(4.00 GiB, 0.010)')" in str(info.value)


def test_stable_duration_requires_usage_to_stay_within_tolerance() -> None:
    timeline = [
        {"at": 1.0, "used": "1GiB"},
        {"at": 1.5, "used": "3GiB"},  # jumps by 2 GiB: the window restarts
        {"at": 2.0, "used": "1GiB"},
    ]
    _, clock = make_platform([device("80GiB", "20GiB", timeline=timeline)])
    av.wait_for_gpu_memory_to_clear(
        devices=[0],
        threshold_ratio=0.1,
        stable_duration_s=1.0,
        stable_tolerance_bytes=GIB,
        poll_interval_s=0.1,
    )
    assert 3.0 - 1e-9 <= clock.monotonic() <= 3.05


# --------------------------------------------------------------------------------------------
# wait_for_memory_to_settle


def test_settle_does_nothing_on_an_eager_platform_even_when_full_or_misused() -> None:
    _, clock = make_platform([device("80GiB", "79GiB")], release=EAGER)
    av.wait_for_memory_to_settle()
    av.wait_for_memory_to_settle(threshold_ratio=None)  # HfRunner.__exit__ on CUDA and CPU
    av.wait_for_memory_to_settle(threshold_ratio={5: 0.1}, timeout_s=-1)  # vLLM looks at nothing
    assert clock.sleeps == []


def test_settle_does_nothing_without_an_accelerator() -> None:
    _, clock = make_platform([device("16GiB", "15GiB")], release=LAZY, device_type="cpu")
    av.wait_for_memory_to_settle()
    assert clock.sleeps == []


def test_settle_waits_on_every_device_with_a_window_on_a_lazy_platform() -> None:
    lazy_tail = {"lazy": {"start": 0.0, "delay": 1.0, "tau": 0.5, "to": "2GiB"}}
    _, clock = make_platform(
        [device("80GiB", "60GiB", timeline=[lazy_tail]), device("80GiB", "1GiB")], release=LAZY
    )
    av.wait_for_memory_to_settle(threshold_ratio=0.1)
    # 60 GiB -> below 8 GiB once exp(-(t-1)/0.5) * 58 < 6, i.e. t > 2.13; then a 2 s window
    assert clock.monotonic() >= 4.1


def test_settle_reads_none_as_one_tenth() -> None:
    make_platform([device("80GiB", "7GiB")], release=LAZY)
    av.wait_for_memory_to_settle(threshold_ratio=None)
    make_platform([device("80GiB", "9GiB")], release=LAZY)
    with pytest.raises(ValueError, match=r"device=0: 0\.100"):
        av.wait_for_memory_to_settle(threshold_ratio=None, timeout_s=1)


def test_settle_timeout_raises_value_error() -> None:
    make_platform([device("80GiB", "60GiB")], release=LAZY)
    with pytest.raises(ValueError, match=r"^Memory of devices devices=\[0\] not free"):
        av.wait_for_memory_to_settle(threshold_ratio=0.1, timeout_s=5)


# --------------------------------------------------------------------------------------------
# engine_kwargs


def test_engine_kwargs_fills_the_platform_default_in_a_new_dict() -> None:
    make_platform([device()], default_memory_utilization=0.9)
    given = {"model": "m", "max_model_len": 128}
    result = av.engine_kwargs(given)
    assert result == {"model": "m", "max_model_len": 128, "gpu_memory_utilization": 0.9}
    assert "gpu_memory_utilization" not in given
    assert av.engine_kwargs({"gpu_memory_utilization": None})["gpu_memory_utilization"] == 0.9


def test_engine_kwargs_keeps_a_valid_given_value() -> None:
    make_platform([device()], default_memory_utilization=0.9)
    assert av.engine_kwargs({"gpu_memory_utilization": 0.5})["gpu_memory_utilization"] == 0.5


@pytest.mark.parametrize("bad", [0, 0.0, 1.5, -0.1, float("nan"), "0.5", True])
def test_engine_kwargs_rejects_a_bad_utilization(bad: object) -> None:
    make_platform([device()])
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        av.engine_kwargs({"gpu_memory_utilization": bad})


def test_engine_kwargs_on_cpu_uses_what_the_host_has_free(tmp_path: Path) -> None:
    fs = HostFS(tmp_path)
    fs.meminfo(total=16 * GIB, available=8 * GIB)
    fs.proc_self_cgroup("0::/\n")
    platform = fs.platform()
    result = av.engine_kwargs({}, platform=platform)
    assert result["gpu_memory_utilization"] == pytest.approx(0.45)  # 90 % of 8/16


# --------------------------------------------------------------------------------------------
# before_engine_start / after_engine_shutdown


def test_before_start_waits_on_a_lazy_platform_for_one_minus_utilization() -> None:
    timeline = [{"at": 2.0, "used": "6GiB"}]  # 6 GiB <= (1 - 0.92) * 80 = 6.4 GiB
    _, clock = make_platform([device("80GiB", "40GiB", timeline=timeline)], release=LAZY)
    result = av.before_engine_start({"gpu_memory_utilization": 0.92})
    assert result.targets == {0: int(0.08 * 80 * GIB)}
    assert clock.monotonic() >= 2.0 + 2.0  # release, then the profile's 2 s window


def test_before_start_gives_an_eager_platform_a_short_grace() -> None:
    # memory of an exiting process comes back 0.3 s in: the engine would start, so must we
    make_platform([device("80GiB", "10GiB", timeline=[{"at": 0.3, "used": "0GiB"}])], release=EAGER)
    result = av.before_engine_start({"gpu_memory_utilization": 0.92})
    assert 0.3 <= result.waited_s <= 0.35


def test_before_start_reports_memory_still_held_after_the_grace() -> None:
    _, clock = make_platform([device("80GiB", "10GiB")], release=EAGER)
    with pytest.raises(VllmMemoryNotFreeError, match=r"not free after dur_s=2\.00"):
        av.before_engine_start({"gpu_memory_utilization": 0.92})
    assert clock.monotonic() == pytest.approx(EAGER_START_GRACE_S)


def test_before_start_does_nothing_without_an_accelerator() -> None:
    # vLLM's CPU engine checks host memory itself; 0.99 must not fail here
    _, clock = make_platform([device("16GiB", "8GiB")], device_type="cpu")
    result = av.before_engine_start({"gpu_memory_utilization": 0.99})
    assert result.polls == 0
    assert clock.sleeps == []
    with pytest.raises(VllmMemoryNotFreeError):
        av.before_engine_start({"gpu_memory_utilization": 0.99}, strict=True)


def test_before_start_passes_at_once_when_there_is_room() -> None:
    make_platform([device("80GiB", "2GiB")], release=EAGER)
    assert av.before_engine_start({}).already_settled


def test_before_start_uses_the_platform_default_utilization() -> None:
    # default 0.5 -> up to 40 GiB used is fine
    make_platform([device("80GiB", "30GiB")], default_memory_utilization=0.5)
    assert av.before_engine_start({}).targets == {0: 40 * GIB}


def test_before_start_looks_only_at_the_devices_the_engine_uses() -> None:
    make_platform([device("80GiB", "1GiB"), device("80GiB", "1GiB"), device("80GiB", "70GiB")])
    result = av.before_engine_start({"tensor_parallel_size": 2})
    assert sorted(result.snapshot.memory) == [0, 1]
    with pytest.raises(ValueError, match=r"devices=\[0, 1, 2\]"):
        av.before_engine_start({"tensor_parallel_size": 1, "pipeline_parallel_size": 4})


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_before_start_rejects_a_bad_parallel_size(bad: object) -> None:
    make_platform([device()])
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        av.before_engine_start({"tensor_parallel_size": bad})


def test_after_shutdown_settles_at_one_minus_utilization_on_a_lazy_platform() -> None:
    lazy_tail = {"lazy": {"start": 0.0, "tau": 1.0, "to": "1GiB"}}
    _, clock = make_platform([device("80GiB", "70GiB", timeline=[lazy_tail])], release=LAZY)
    result = av.after_engine_shutdown({"gpu_memory_utilization": 0.9})
    assert result.targets == {0: 8 * GIB}
    assert result.snapshot.memory[0].used <= 8 * GIB
    assert clock.monotonic() >= 2.0  # at least the profile's window


def test_after_shutdown_does_not_wait_on_an_eager_platform_unless_strict() -> None:
    timeline = [{"at": 1.0, "used": "1GiB"}]
    _, clock = make_platform([device("80GiB", "70GiB", timeline=timeline)], release=EAGER)
    result = av.after_engine_shutdown({"gpu_memory_utilization": 0.9})
    assert result.polls == 0
    assert clock.sleeps == []
    strict = av.after_engine_shutdown({"gpu_memory_utilization": 0.9}, strict=True)
    assert 1.0 <= strict.waited_s <= 1.05


def test_after_shutdown_timeout_is_a_value_error() -> None:
    make_platform(
        [device("80GiB", "70GiB")],
        release={**LAZY, "settle_timeout_s": 3.0},
    )
    with pytest.raises(ValueError, match=r"not free after dur_s=3\.00"):
        av.after_engine_shutdown({"gpu_memory_utilization": 0.9})


# --------------------------------------------------------------------------------------------
# memory_baseline (HfRunner)


def test_memory_baseline_waits_for_usage_back_within_tolerance_on_a_lazy_platform() -> None:
    timeline = [
        {"at": 1.0, "used": "30GiB"},  # the HF model loads
        {"lazy": {"start": 2.0, "tau": 0.5, "to": "2GiB"}},  # and is freed lazily
    ]
    _, clock = make_platform([device("80GiB", "2GiB", timeline=timeline)], release=LAZY)
    with av.memory_baseline() as baseline:
        assert baseline.memory[0].used == 2 * GIB
        clock.advance(2.0)
    # back within 2 GiB + 5 % of 80 GiB = 6 GiB, for the profile's window
    assert av.record_gpu_memory_usage_stats(devices=[0])[0][0] <= 6.0
    assert clock.monotonic() >= 2.0 + 2.0


def test_memory_baseline_does_not_wait_on_an_eager_platform() -> None:
    _, clock = make_platform(
        [device("80GiB", "2GiB", timeline=[{"at": 1.0, "used": "30GiB"}])], release=EAGER
    )
    with av.memory_baseline():
        clock.advance(1.0)
    assert clock.sleeps == []


def test_memory_baseline_lets_the_body_error_through_without_waiting() -> None:
    _, clock = make_platform(
        [device("80GiB", "2GiB", timeline=[{"at": 1.0, "used": "30GiB"}])], release=LAZY
    )

    def body() -> None:
        with av.memory_baseline():
            clock.advance(1.0)
            raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        body()
    assert clock.sleeps == []


def test_memory_baseline_times_out_with_a_value_error() -> None:
    _, clock = make_platform(
        [device("80GiB", "2GiB", timeline=[{"at": 1.0, "used": "30GiB"}])], release=LAZY
    )
    with (
        pytest.raises(ValueError, match=r"not free after dur_s=4\.00"),
        av.memory_baseline(0.1, timeout_s=4),
    ):
        clock.advance(1.0)


@pytest.mark.parametrize("bad", [-0.1, 1.5, True, "0.05"])
def test_memory_baseline_rejects_a_bad_tolerance(bad: object) -> None:
    make_platform([device()])
    with pytest.raises(ValueError, match="tolerance"), av.memory_baseline(bad):  # type: ignore[arg-type]
        pass


# --------------------------------------------------------------------------------------------
# error pickling


def test_not_free_error_survives_pickling() -> None:
    make_platform([device("80GiB", "70GiB")])
    with pytest.raises(VllmMemoryNotFreeError) as info:
        av.wait_for_gpu_memory_to_clear(devices=[0], threshold_ratio=0.1, timeout_s=0)
    copy = pickle.loads(pickle.dumps(info.value))
    assert type(copy) is VllmMemoryNotFreeError
    assert str(copy) == str(info.value)
    assert copy.targets == info.value.targets
    assert copy.snapshot == info.value.snapshot


# --------------------------------------------------------------------------------------------
# process isolation under vLLM's names


def _fail_with_value_error() -> None:
    raise ValueError("intentional failure")


def _skip_in_child() -> None:
    pytest.skip("nothing to do here")


class _Unpicklable(Exception):
    def __reduce__(self) -> Any:
        raise TypeError("no pickling")


def _raise_unpicklable() -> None:
    raise _Unpicklable("custom failure text")


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _fork_fails(x: int) -> None:
    raise KeyError(f"child got {x}")


def _spawn_fails() -> None:
    raise ValueError("intentional failure")


def _spawn_skips() -> None:
    pytest.skip("intentional skip")


def test_fork_brings_back_the_childs_own_exception() -> None:
    wrapped = av.fork_new_process_for_each_test(_fork_fails)
    with pytest.raises(KeyError, match="child got 3") as info:
        wrapped(3)
    assert "_fork_fails" in str(info.value.__cause__)


def test_fork_reports_an_exception_that_cannot_be_pickled_as_an_assertion() -> None:
    wrapped = av.fork_new_process_for_each_test(_raise_unpicklable)
    with pytest.raises(AssertionError, match="Test _raise_unpicklable failed when called") as info:
        wrapped()
    assert "custom failure text" in str(info.value)
    with pytest.raises(AssertionError, match="function _kill_self failed"):
        av.fork_new_process_for_each_test(_kill_self)()


def test_spawn_failure_is_a_runtime_error_with_the_exit_code_and_traceback() -> None:
    wrapped = av.spawn_new_process_for_each_test(_spawn_fails)
    with pytest.raises(RuntimeError) as info:
        wrapped()
    text = str(info.value)
    assert text.startswith("Test subprocess '_spawn_fails' failed (exit code 1):\n")
    assert "ValueError: intentional failure" in text
    with pytest.raises(RuntimeError, match=r"killed by SIGKILL \(-9\)"):
        av.spawn_new_process_for_each_test(_kill_self)()


def test_spawn_skip_in_the_child_is_a_skip_here() -> None:
    with pytest.raises(pytest.skip.Exception, match="intentional skip"):
        av.spawn_new_process_for_each_test(_spawn_skips)()


def test_spawn_carries_arguments_with_cloudpickle(tmp_path: Path) -> None:
    pytest.importorskip("cloudpickle")
    out = tmp_path / "x"
    # a lambda does not pickle with pickle, it does with cloudpickle
    av.spawn_new_process_for_each_test(_call_and_write)(lambda: "by value", str(out))
    assert out.read_text() == "by value"


def _call_and_write(make: Any, path: str) -> None:
    Path(path).write_text(make())


def test_create_new_process_picks_the_platform_method_when_the_test_runs() -> None:
    isolated = av.create_new_process_for_each_test()(_spawn_fails)
    make_platform([device()], preferred_start_method="fork")
    assert not av.requires_spawn_multiprocessing()
    with pytest.raises(ValueError, match="intentional failure"):
        isolated()
    make_platform([device()], preferred_start_method="spawn")
    assert av.requires_spawn_multiprocessing()
    with pytest.raises(RuntimeError, match="Test subprocess '_spawn_fails' failed"):
        isolated()
    assert av.create_new_process_for_each_test("fork") is av.fork_new_process_for_each_test
    assert av.create_new_process_for_each_test("spawn") is av.spawn_new_process_for_each_test
    with pytest.raises(AssertionError, match="method"):
        av.create_new_process_for_each_test("thread")  # type: ignore[arg-type]


def test_decorators_keep_the_signature_for_fixture_injection() -> None:
    def test_something(tmp_path: Path, accel_platform: object) -> None:
        pass

    for decorate in (
        av.fork_new_process_for_each_test,
        av.spawn_new_process_for_each_test,
        av.create_new_process_for_each_test(),
    ):
        wrapped = decorate(test_something)
        assert list(inspect.signature(wrapped).parameters) == ["tmp_path", "accel_platform"]
        assert wrapped.__name__ == "test_something"


@av.spawn_new_process_for_each_test
def test_a_spawned_test_receives_its_fixtures(tmp_path: Path) -> None:
    assert multiprocessing.parent_process() is not None  # not the pytest process
    assert tmp_path.is_dir()


@av.fork_new_process_for_each_test
def test_a_forked_test_runs_outside_the_pytest_process(tmp_path: Path) -> None:
    assert multiprocessing.parent_process() is not None
    assert tmp_path.is_dir()


# --------------------------------------------------------------------------------------------
# marks: plain skipif marks, decided when built


def _skipif(mark: Any) -> tuple[bool, str]:
    assert mark.name == "skipif"
    return bool(mark.args[0]), str(mark.kwargs["reason"])


def test_large_gpu_mark_counts_decimal_gigabytes_of_device_zero() -> None:
    make_platform([device("24GB"), device("80GiB")])
    assert _skipif(av.large_gpu_mark(24)) == (
        False,
        "Need at least 24GB GPU memory to run the test (found 24.0GB).",
    )
    skip, reason = _skipif(av.large_gpu_mark(25))
    assert skip
    assert reason == "Need at least 25GB GPU memory to run the test (found 24.0GB)."
    for bad in (float("nan"), True, "24"):
        with pytest.raises(ConfigurationError, match="min_gb"):
            av.large_gpu_mark(bad)  # type: ignore[arg-type]


def test_large_gpu_mark_finds_0gb_on_a_host_without_an_accelerator() -> None:
    make_platform([device("25GB")], device_type="cpu")
    assert _skipif(av.large_gpu_mark(24)) == (
        True,
        "Need at least 24GB GPU memory to run the test (found 0GB).",
    )


def test_large_gpu_test_applies_the_mark() -> None:
    make_platform([device("40GB")])

    def test_x() -> None:
        pass

    marked = av.large_gpu_test(min_gb=48)(test_x)
    (mark,) = marked.pytestmark  # type: ignore[attr-defined]
    assert _skipif(mark)[0]


@pytest.mark.parametrize("strict", [True, False])
def test_multi_gpu_test_marks_and_isolates(
    pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch, strict: bool
) -> None:
    make_platform([device(), device()])

    def test_x() -> None:
        pass

    # `distributed` is vLLM's marker: under --strict-markers, unregistered, it is left out.
    # pytest.mark consults the config it was bound to; bind it explicitly (pytester runs in
    # the same process may have re-bound it).
    assert pytestconfig.option.strict_markers
    monkeypatch.setattr(pytest.mark, "_config", pytestconfig if strict else None)
    expected = [] if strict else ["distributed"]
    marks = av.multi_gpu_marks(num_gpus=2)
    assert [m.name for m in marks] == [*expected, "skipif"]
    assert _skipif(marks[-1]) == (False, "Need at least 2 GPUs to run the test.")
    assert _skipif(av.multi_gpu_marks(num_gpus=3)[-1])[0]
    wrapped = av.multi_gpu_test(num_gpus=4)(test_x)
    assert wrapped._accelplat_isolated is test_x  # type: ignore[attr-defined]
    names = [m.name for m in wrapped.pytestmark]  # type: ignore[attr-defined]
    assert sorted(names) == sorted([*expected, "skipif"])
    make_platform([device(), device()], device_type="cpu")
    assert _skipif(av.multi_gpu_marks(num_gpus=1)[-1])[0]


def test_marks_work_without_the_plugin(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tmp_path / "sim.json"
    spec.write_text(json.dumps({"devices": [{"total": "16GB"}]}))
    pytester.makepyfile(
        """
        from accelplat.integrations.vllm import large_gpu_test, multi_gpu_test

        @large_gpu_test(min_gb=24)
        def test_large():
            pass

        @multi_gpu_test(num_gpus=2)
        def test_multi():
            pass

        @large_gpu_test(min_gb=8)
        def test_fits():
            pass
        """
    )
    monkeypatch.setenv("ACCELPLAT_PLATFORM", "simulated")
    monkeypatch.setenv("ACCELPLAT_SIMULATED_SPEC", str(spec))
    result = pytester.runpytest_subprocess("-p", "no:accelplat", "-rs")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["*Need at least 24GB GPU memory to run the test (found 16.0GB)*"])

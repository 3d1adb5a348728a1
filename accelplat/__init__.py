"""accelplat: one answer, on every accelerator, to the questions ML test suites ask.

Which platform is this and which devices can this process see? How much device memory is free
and used, asked without creating a device context? Does memory come back lazily, so the next
engine must wait? Can graphs be captured? What memory utilization should an engine default to?
Does a KV cache or a ``/dev/shm`` budget fit?

Importing this package imports no vendor library and never torch; names are loaded on first use.

Example:
    >>> import accelplat
    >>> p = accelplat.current_platform()
    >>> p.name in accelplat.available_platforms()
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelplat._lazy import lazy_namespace

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # value types
    "GIB": "accelplat._types",
    "MIB": "accelplat._types",
    "Candidate": "accelplat._types",
    "DeviceInfo": "accelplat._types",
    "FeatureRule": "accelplat._types",
    "GraphSupport": "accelplat._types",
    "HolderState": "accelplat._usage",
    "MemoryHolder": "accelplat._usage",
    "MemoryInfo": "accelplat._types",
    "ProbeResult": "accelplat._types",
    "ReleaseProfile": "accelplat._types",
    "SettleResult": "accelplat._usage",
    "UsageSnapshot": "accelplat._usage",
    # errors
    "AccelplatError": "accelplat.errors",
    "BackendError": "accelplat.errors",
    "ConfigurationError": "accelplat.errors",
    "DeviceNotFoundError": "accelplat.errors",
    "InsufficientMemoryError": "accelplat.errors",
    "InsufficientSharedMemoryError": "accelplat.errors",
    "MemoryNotSettledError": "accelplat.errors",
    "PlatformNotAvailableError": "accelplat.errors",
    # platforms and detection
    "BasePlatform": "accelplat._platform",
    "Platform": "accelplat._platform",
    "DetectionReport": "accelplat._registry",
    "available_platforms": "accelplat._registry",
    "current_platform": "accelplat._registry",
    "detect": "accelplat._registry",
    "get_platform": "accelplat._registry",
    "register_platform": "accelplat._registry",
    "set_current_platform": "accelplat._registry",
    "unregister_platform": "accelplat._registry",
    "use_platform": "accelplat._registry",
    # capabilities
    "Capability": "accelplat._capabilities",
    "capabilities": "accelplat._capabilities",
    "define_capability": "accelplat._capabilities",
    "has": "accelplat._capabilities",
    # memory primitives
    "PollPolicy": "accelplat._memory",
    "record_usage_stats": "accelplat._memory",
    "snapshot": "accelplat._memory",
    "wait_for_memory_to_clear": "accelplat._memory",
    "wait_for_memory_to_settle": "accelplat._memory",
    # device leases
    "Lease": "accelplat._leasing",
    "LeaseTimeoutError": "accelplat._leasing",
    "lease": "accelplat._leasing",
    "lease_status": "accelplat._leasing",
    # host and sizing
    "ShmInfo": "accelplat._host",
    "largest_shm_budget": "accelplat._host",
    "require_shm": "accelplat._host",
    "shm_info": "accelplat._host",
    "KVCacheTooSmallError": "accelplat._sizing",
    "check_kv_cache_fits": "accelplat._sizing",
    "dtype_bytes": "accelplat._sizing",
    "kv_cache_bytes": "accelplat._sizing",
    "max_model_len_that_fits": "accelplat._sizing",
    "parse_size": "accelplat._sizing",
}

__all__ = [
    "GIB",
    "MIB",
    "AccelplatError",
    "BackendError",
    "BasePlatform",
    "Candidate",
    "Capability",
    "ConfigurationError",
    "DetectionReport",
    "DeviceInfo",
    "DeviceNotFoundError",
    "FeatureRule",
    "GraphSupport",
    "HolderState",
    "InsufficientMemoryError",
    "InsufficientSharedMemoryError",
    "KVCacheTooSmallError",
    "Lease",
    "LeaseTimeoutError",
    "MemoryHolder",
    "MemoryInfo",
    "MemoryNotSettledError",
    "Platform",
    "PlatformNotAvailableError",
    "PollPolicy",
    "ProbeResult",
    "ReleaseProfile",
    "SettleResult",
    "ShmInfo",
    "UsageSnapshot",
    "__version__",
    "available_platforms",
    "capabilities",
    "check_kv_cache_fits",
    "current_platform",
    "define_capability",
    "detect",
    "dtype_bytes",
    "get_platform",
    "has",
    "kv_cache_bytes",
    "largest_shm_budget",
    "lease",
    "lease_status",
    "max_model_len_that_fits",
    "parse_size",
    "record_usage_stats",
    "register_platform",
    "require_shm",
    "set_current_platform",
    "shm_info",
    "snapshot",
    "unregister_platform",
    "use_platform",
    "wait_for_memory_to_clear",
    "wait_for_memory_to_settle",
]


__getattr__, __dir__ = lazy_namespace(__name__, _EXPORTS, globals())


if TYPE_CHECKING:
    from accelplat._capabilities import Capability, capabilities, define_capability, has
    from accelplat._host import ShmInfo, largest_shm_budget, require_shm, shm_info
    from accelplat._leasing import Lease, LeaseTimeoutError, lease, lease_status
    from accelplat._memory import (
        PollPolicy,
        record_usage_stats,
        snapshot,
        wait_for_memory_to_clear,
        wait_for_memory_to_settle,
    )
    from accelplat._platform import BasePlatform, Platform
    from accelplat._registry import (
        DetectionReport,
        available_platforms,
        current_platform,
        detect,
        get_platform,
        register_platform,
        set_current_platform,
        unregister_platform,
        use_platform,
    )
    from accelplat._sizing import (
        KVCacheTooSmallError,
        check_kv_cache_fits,
        dtype_bytes,
        kv_cache_bytes,
        max_model_len_that_fits,
        parse_size,
    )
    from accelplat._types import (
        GIB,
        MIB,
        Candidate,
        DeviceInfo,
        FeatureRule,
        GraphSupport,
        MemoryInfo,
        ProbeResult,
        ReleaseProfile,
    )
    from accelplat._usage import HolderState, MemoryHolder, SettleResult, UsageSnapshot
    from accelplat.errors import (
        AccelplatError,
        BackendError,
        ConfigurationError,
        DeviceNotFoundError,
        InsufficientMemoryError,
        InsufficientSharedMemoryError,
        MemoryNotSettledError,
        PlatformNotAvailableError,
    )

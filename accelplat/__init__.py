"""accelplat: one answer, on every accelerator, to the questions ML test suites ask.

The verbs live here; the values they take and return are in :mod:`accelplat.types`, the errors
in :mod:`accelplat.errors`. Importing the package imports no vendor library and never torch:
each name loads its module on first use. With ``ACCELPLAT_REPLAY`` set, the named capture
bundle answers in place of this machine's drivers from the start.

Example:
    >>> import accelplat
    >>> p = accelplat.current_platform()
    >>> p.name in accelplat.available_platforms()
    True
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from accelplat import _lazy
from accelplat._version import __version__ as __version__

_EXPORTS: dict[str, str] = {
    "GIB": "accelplat._types",
    "MIB": "accelplat._types",
    "BasePlatform": "accelplat._platform",
    "Platform": "accelplat._platform",
    "available_platforms": "accelplat._registry",
    "current_platform": "accelplat._registry",
    "detect": "accelplat._registry",
    "get_platform": "accelplat._registry",
    "register_platform": "accelplat._registry",
    "use_platform": "accelplat._registry",
    "record_usage_stats": "accelplat._memory",
    "snapshot": "accelplat._memory",
    "wait_for_memory_to_clear": "accelplat._memory",
    "wait_for_memory_to_settle": "accelplat._memory",
    "wait_for_release": "accelplat._memory",
    "capabilities": "accelplat._capabilities",
    "define_capability": "accelplat._capabilities",
    "has": "accelplat._capabilities",
    "lease": "accelplat._leasing",
    "lease_status": "accelplat._leasing",
    "largest_shm_budget": "accelplat._shm",
    "require_shm": "accelplat._shm",
    "shm_info": "accelplat._shm",
    "check_kv_cache_fits": "accelplat._sizing",
    "dtype_bytes": "accelplat._sizing",
    "kv_cache_bytes": "accelplat._sizing",
    "max_model_len_that_fits": "accelplat._sizing",
    "parse_size": "accelplat._validate",
}
"""The face: each public name and the private module that defines it (the one list)."""

__all__ = sorted([*_EXPORTS, "__version__"])  # noqa: PLE0605 (the keys of _EXPORTS: one list)


__getattr__, __dir__ = _lazy.lazy_namespace(__name__, _EXPORTS, globals())


if os.environ.get("ACCELPLAT_REPLAY"):
    from accelplat._replay._install import activate_from_environment

    activate_from_environment()


if TYPE_CHECKING:  # the same names, for type checkers (tests/contracts keeps the two equal)
    from accelplat._capabilities import capabilities as capabilities
    from accelplat._capabilities import define_capability as define_capability
    from accelplat._capabilities import has as has
    from accelplat._leasing import lease as lease
    from accelplat._leasing import lease_status as lease_status
    from accelplat._memory import record_usage_stats as record_usage_stats
    from accelplat._memory import snapshot as snapshot
    from accelplat._memory import wait_for_memory_to_clear as wait_for_memory_to_clear
    from accelplat._memory import wait_for_memory_to_settle as wait_for_memory_to_settle
    from accelplat._memory import wait_for_release as wait_for_release
    from accelplat._platform import BasePlatform as BasePlatform
    from accelplat._platform import Platform as Platform
    from accelplat._registry import available_platforms as available_platforms
    from accelplat._registry import current_platform as current_platform
    from accelplat._registry import detect as detect
    from accelplat._registry import get_platform as get_platform
    from accelplat._registry import register_platform as register_platform
    from accelplat._registry import use_platform as use_platform
    from accelplat._shm import largest_shm_budget as largest_shm_budget
    from accelplat._shm import require_shm as require_shm
    from accelplat._shm import shm_info as shm_info
    from accelplat._sizing import check_kv_cache_fits as check_kv_cache_fits
    from accelplat._sizing import dtype_bytes as dtype_bytes
    from accelplat._sizing import kv_cache_bytes as kv_cache_bytes
    from accelplat._sizing import max_model_len_that_fits as max_model_len_that_fits
    from accelplat._types import GIB as GIB
    from accelplat._types import MIB as MIB
    from accelplat._validate import parse_size as parse_size

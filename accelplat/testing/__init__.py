"""Testing tools: the conformance kit for backends, process isolation, the simulated platform.

* ``accelplat.testing.run_conformance("my-npu")`` runs the kit's checks and returns a
  :class:`ConformanceReport`; ``pytest --pyargs accelplat.testing._conformance
  --accelplat-platform my-npu`` runs them as tests, and ``test_conformance =
  make_conformance_test("my-npu")`` puts them in a plugin's own suite.
* :func:`run_in_new_process` and :func:`isolate` run a test in a process of its own.
* :class:`SimulatedPlatform` answers from a :class:`SimulatedSpec` (:func:`load_spec`).

``make_conformance_test`` and ``conformance_platform`` import pytest, on first use; the rest of
this package does not. ``import accelplat`` does not import this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from accelplat._backends.simulated import SimulatedPlatform, SimulatedSpec, load_spec
from accelplat.testing._checks import (
    CHECK_NAMES,
    CheckResult,
    ConformanceReport,
    run_conformance,
)
from accelplat.testing._isolation import isolate, run_in_new_process

if TYPE_CHECKING:
    from accelplat.testing._conformance import conformance_platform, make_conformance_test

__all__ = [
    "CHECK_NAMES",
    "CheckResult",
    "ConformanceReport",
    "SimulatedPlatform",
    "SimulatedSpec",
    "conformance_platform",
    "isolate",
    "load_spec",
    "make_conformance_test",
    "run_conformance",
    "run_in_new_process",
]

_PYTEST_NAMES = ("conformance_platform", "make_conformance_test")


def __getattr__(name: str) -> Any:
    # pytest costs ~120 ms to import, and the kit's fresh processes import this package
    if name in _PYTEST_NAMES:
        from accelplat.testing import _conformance

        return getattr(_conformance, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_PYTEST_NAMES})

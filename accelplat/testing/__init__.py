"""Testing tools: the conformance kit for backends, process isolation, the simulated platform.

:func:`run_conformance` runs the kit's checks (:func:`make_conformance_test`: as pytest tests);
:func:`run_in_new_process` and :func:`isolate` run a test in a process of its own;
:func:`requires` and :func:`skip_module_unless` decide requirements as plain pytest skips. Only
the pytest helpers import pytest; ``import accelplat`` does not import this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelplat import _lazy
from accelplat._backends.simulated import SimulatedPlatform, SimulatedSpec, load_spec
from accelplat.testing._checks import CHECK_NAMES, CheckResult, ConformanceReport, run_conformance
from accelplat.testing._isolation import isolate, run_in_new_process
from accelplat.testing._kit import Tolerance

if TYPE_CHECKING:
    from accelplat.testing._conformance import conformance_platform, make_conformance_test
    from accelplat.testing._requires import requires, skip_module_unless

__all__ = [
    "CHECK_NAMES",
    "CheckResult",
    "ConformanceReport",
    "SimulatedPlatform",
    "SimulatedSpec",
    "Tolerance",
    "conformance_platform",
    "isolate",
    "load_spec",
    "make_conformance_test",
    "requires",
    "run_conformance",
    "run_in_new_process",
    "skip_module_unless",
]

# pytest costs ~120 ms to import, and the kit's fresh processes import this package
_PYTEST_HELPERS: dict[str, str] = {
    "conformance_platform": "accelplat.testing._conformance",
    "make_conformance_test": "accelplat.testing._conformance",
    "requires": "accelplat.testing._requires",
    "skip_module_unless": "accelplat.testing._requires",
}

__getattr__, __dir__ = _lazy.lazy_namespace(__name__, _PYTEST_HELPERS, globals())

"""The conformance kit: a behavioural test suite every accelplat backend runs against itself.

Three ways to use it:

* from Python: ``report = accelplat.testing.run_conformance("my-npu")`` (or a platform
  instance), then ``report.passed``, ``report.failures``, ``report.summary()``;
* from the command line, one pytest test per check::

      pytest --pyargs accelplat.testing._conformance --accelplat-platform my-npu

  (without the accelplat pytest plugin, ``ACCELPLAT_PLATFORM=my-npu`` does the same);
* inside a plugin's own test suite::

      from accelplat.testing import make_conformance_test

      test_conformance = make_conformance_test("my-npu")

The checks and their tolerances are documented in :mod:`accelplat.testing._checks`. This package
imports neither pytest nor any framework; :func:`make_conformance_test` and
:func:`conformance_platform` come from :mod:`accelplat.testing._conformance` (which imports
pytest) on first use. ``import accelplat`` does not import this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelplat._lazy import lazy_namespace
from accelplat.testing._checks import (
    CHECK_NAMES,
    STABILITY_TOLERANCE,
    SUM_TOLERANCE,
    CheckResult,
    ConformanceReport,
    Tolerance,
    Verdict,
    run_conformance,
)

__all__ = [
    "CHECK_NAMES",
    "STABILITY_TOLERANCE",
    "SUM_TOLERANCE",
    "CheckResult",
    "ConformanceReport",
    "Tolerance",
    "Verdict",
    "conformance_platform",
    "make_conformance_test",
    "run_conformance",
]

_PYTEST_EXPORTS = dict.fromkeys(
    ("conformance_platform", "make_conformance_test"), "accelplat.testing._conformance"
)

__getattr__, __dir__ = lazy_namespace(__name__, _PYTEST_EXPORTS, globals())


if TYPE_CHECKING:
    from accelplat.testing._conformance import conformance_platform, make_conformance_test

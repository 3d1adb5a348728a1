"""The conformance kit as pytest tests: one test per check.

Run it against any registered platform with ``pytest --pyargs accelplat.testing._conformance
--accelplat-platform NAME`` (the option comes from accelplat's pytest plugin; without the plugin,
``ACCELPLAT_PLATFORM=NAME``; with neither, the detected platform is tested). In a plugin's own
suite, ``test_conformance = make_conformance_test("my-npu")``, or import the fixtures
``conformance_platform``, ``conformance_options`` and ``conformance_report`` (and
``test_conformance``) and override the first two.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from accelplat._platform import Platform
from accelplat.testing._checks import CHECK_NAMES, ConformanceReport, run_conformance

OPTION = "--accelplat-platform"
"""The pytest option (added by accelplat's pytest plugin) that names the platform to test."""


def requested_platform_name(config: pytest.Config) -> str | None:
    """Return the platform the session asks for: ``--accelplat-platform``, else the variable.

    Args:
        config: The pytest configuration.

    Returns:
        The lower-cased name, or ``None`` when neither the option (if registered) nor
        ``ACCELPLAT_PLATFORM`` names one.
    """
    value: Any = None
    try:
        value = config.getoption(OPTION, default=None)
    except ValueError:  # the option is not registered: accelplat's plugin is not loaded
        value = None
    if not isinstance(value, str) or not value.strip():
        value = os.environ.get("ACCELPLAT_PLATFORM", "")
    value = value.strip().lower()
    return value or None


@pytest.fixture(scope="session")
def conformance_platform(request: pytest.FixtureRequest) -> Platform:
    """The platform under test: the requested name, else the detected platform.

    Override this fixture in a plugin's test suite to test an instance built another way.
    """
    from accelplat._registry import current_platform, get_platform

    name = requested_platform_name(request.config)
    if name is not None:
        return get_platform(name)
    return current_platform()


@pytest.fixture(scope="session")
def conformance_options() -> dict[str, Any]:
    """Keyword arguments for :func:`~accelplat.testing.run_conformance`; override to tune."""
    return {}


@pytest.fixture(scope="session")
def conformance_report(
    conformance_platform: Platform, conformance_options: dict[str, Any]
) -> ConformanceReport:
    """Run every check once per session; each test then reports one verdict."""
    from accelplat import _registry as registry

    target: Platform | str = conformance_platform
    name = getattr(conformance_platform, "name", None)
    if isinstance(name, str) and name in registry.available_platforms():
        try:
            same = registry.get_platform(name) is conformance_platform
        except Exception:
            same = False
        if same:  # registered under its name: a fresh process can rebuild it by name
            target = name
    return run_conformance(target, **conformance_options)


def _judge(report: ConformanceReport, check: str) -> None:
    try:
        result = report.result(check)
    except KeyError:
        pytest.skip(f"{report.platform}: check {check!r} was not selected")
    if result.verdict == "skip":
        pytest.skip(f"{report.platform}: {result.detail}")
    if result.verdict == "fail":
        pytest.fail(f"{report.platform}: {check}: {result.detail}", pytrace=False)


@pytest.mark.parametrize("check", CHECK_NAMES)
def test_conformance(check: str, conformance_report: ConformanceReport) -> None:
    """One conformance check of the platform under test."""
    _judge(conformance_report, check)


def _is_factory(target: object) -> bool:
    if isinstance(target, str):
        return False
    if isinstance(target, type):
        return True
    from accelplat._registry import protocol_problems

    return callable(target) and bool(protocol_problems(target))


def make_conformance_test(
    platform: Platform | str | Callable[[], Any], **options: Any
) -> Callable[[str], None]:
    """Return a pytest test function, parametrized over every check, for one platform.

    Example::

        # tests/testing/test_conformance.py of a plugin
        from accelplat.testing import make_conformance_test

        test_conformance = make_conformance_test("my-npu")

    Args:
        platform: A registered name, a platform instance, or a class / zero-argument factory
            (built on the first test; also passed as ``factory=`` for the in-process fallbacks).
        **options: Keyword arguments for :func:`~accelplat.testing.run_conformance`.

    Returns:
        A test function taking the check name; assign it to a ``test_*`` name. The checks run
        once, on the first test, and every test reports one verdict.
    """
    cache: dict[str, ConformanceReport] = {}

    def report() -> ConformanceReport:
        if "report" not in cache:
            target: Any = platform
            kwargs = dict(options)
            if _is_factory(target):
                kwargs.setdefault("factory", target)
                target = target()
            cache["report"] = run_conformance(target, **kwargs)
        return cache["report"]

    @pytest.mark.parametrize("check", CHECK_NAMES)
    def test_conformance(check: str) -> None:
        _judge(report(), check)

    return test_conformance

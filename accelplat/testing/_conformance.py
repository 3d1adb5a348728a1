"""The conformance kit as pytest tests: one test per check.

``pytest --pyargs accelplat.testing._conformance --accelplat-platform NAME`` (else
``ACCELPLAT_PLATFORM``, else the detected platform); in a plugin's suite,
``make_conformance_test``, or these fixtures with the platform and options ones overridden.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import pytest

from accelplat._platform import Platform
from accelplat._registry import current_platform, get_platform, protocol_problems
from accelplat.testing._checks import CHECK_NAMES, ConformanceReport, run_conformance


@pytest.fixture(scope="session")
def conformance_platform() -> Platform:
    """The platform under test (the requested name, else detected); override to build another.

    The name is ``--accelplat-platform`` (which accelplat's plugin forces), else
    ``ACCELPLAT_PLATFORM``.
    """
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
    target: Platform | str = conformance_platform
    with suppress(Exception):  # one the registry built: a fresh process rebuilds it by name
        if get_platform(name := conformance_platform.name) is conformance_platform:
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
    _judge(conformance_report, check)


def _is_factory(target: object) -> bool:
    if isinstance(target, (str, type)):
        return isinstance(target, type)
    return callable(target) and bool(protocol_problems(target))


def make_conformance_test(
    platform: Platform | str | Callable[[], Any], **options: Any
) -> Callable[[str], None]:
    """Return a pytest test function, parametrized over every check, for one platform.

    E.g. ``test_conformance = make_conformance_test("my-npu")`` in a plugin's test module.

    Args:
        platform: A registered name, an instance, or a class / factory (built on the first test).
        **options: Keyword arguments for :func:`~accelplat.testing.run_conformance`.

    Returns:
        A test function taking the check name; the checks run once, on the first test.
    """

    @functools.cache
    def report() -> ConformanceReport:
        target: Any = platform
        if _is_factory(target):  # built here; a factory= of the options' own wins
            return run_conformance(target(), **{"factory": target, **options})
        return run_conformance(target, **options)

    @pytest.mark.parametrize("check", CHECK_NAMES)
    def test_conformance(check: str) -> None:
        _judge(report(), check)

    return test_conformance

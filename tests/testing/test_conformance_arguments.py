"""The conformance kit refuses a bad option itself, never as a verdict blamed on the platform."""

from __future__ import annotations

import math
from typing import Any

import pytest

from accelplat.errors import ConfigurationError
from accelplat.testing import Tolerance, run_conformance
from tests._hostile import HUGE, make_sim, rejects

_OPTIONS: list[tuple[str, list[Any]]] = [
    ("checks", ["protocol", b"protocol", 5, [["protocol"]], [None], ["nope"]]),
    ("isolation", ["fresh", None, ["auto"], 1]),
    ("factory", [5, "cuda", object()]),
    ("child", [5, "", "  ", b"cuda"]),
    ("sum_tolerance", ["1%", (64, 0.005), 0.005, None]),
    ("stability_tolerance", ["2%", {"min_bytes": 1, "ratio": 0.1}]),
    ("settle_timeout_s", [-1, math.nan, math.inf, "5", True]),
    ("settle_clock", [5, "real", object()]),
    ("empty_visible_hides_all", ["yes", 1, 0, [True]]),
    ("env", [5, "A=1", [("A", "1")], {"A": 1}, {1: "a"}, {"A": None}]),
]
CASES = [
    # an object()'s repr holds its address: ids must be the same in every xdist worker
    pytest.param(name, value, id=f"{name}={'object' if type(value) is object else repr(value):.30}")
    for name, values in _OPTIONS
    for value in values
]


@pytest.mark.parametrize(("option", "value"), CASES)
def test_a_bad_option_is_a_configuration_error_naming_it(option: str, value: Any) -> None:
    kwargs: dict[str, Any] = {"isolation": "inprocess", option: value}
    exc = rejects(lambda: run_conformance(make_sim(), **kwargs), option)
    assert isinstance(exc, ConfigurationError)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        *[("min_bytes", v) for v in [-1, 1.5, math.nan, "1", True, None]],
        *[("ratio", v) for v in [math.nan, math.inf, -0.1, 1.5, "0.1", True, None, HUGE]],
    ],
    ids=repr,
)
def test_a_tolerance_names_its_bad_field(field: str, value: Any) -> None:
    fields: dict[str, Any] = {"min_bytes": 0, "ratio": 0.5, field: value}
    exc = rejects(lambda: Tolerance(**fields), f"Tolerance.{field}")
    assert isinstance(exc, ConfigurationError)


@pytest.mark.parametrize(
    "total", [0, -5, 2**63, 10**400, 10**5000], ids=["0", "-5", "2**63", "10**400", "10**5000"]
)
def test_a_tolerance_is_exact_for_any_total(total: int) -> None:
    assert Tolerance(min_bytes=7, ratio=0.5).allowed(total) == max(7, max(0, total) // 2)

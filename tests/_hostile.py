"""Helpers shared by the hostile-input tests of several modules (bad arguments are named)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from accelplat._backends.simulated import (
    SimulatedClock,
    SimulatedPlatform,
)

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "accelplat"

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
"""Hypothesis settings for this file: few examples, no per-example deadline (2 shared cores)."""

LONG_DIGITS = "1" * 5000
"""More digits than Python's int() reads from text by default (4300)."""

HUGE = 10**400
"""An int too large for a float."""


def make_sim(*, lazy: bool = False) -> SimulatedPlatform:
    spec: dict[str, Any] = {
        "devices": [{"total": "80GiB", "used": "10GiB"}, {"total": "80GiB", "used": "1GiB"}],
        "release": {"lazy": lazy, "stable_duration_s": 1.0, "settle_timeout_s": 5.0},
    }
    return SimulatedPlatform.from_spec(spec, clock=SimulatedClock())


def rejects(call: Callable[[], Any], argument: str) -> BaseException:
    """Assert ``call()`` raises a ValueError or IndexError whose message names ``argument``."""
    with pytest.raises((ValueError, IndexError)) as info:
        call()
    assert argument in str(info.value), f"{info.type.__name__} does not name {argument!r}"
    return info.value


def show_value(value: Any) -> str:
    """A short test id for a value."""
    return "huge" if value is HUGE else repr(value)


def anything(value: Any) -> Any:
    """``value``, typed ``Any``: an argument of the wrong type, on purpose."""
    return value


BAD_NUMBERS = [math.nan, math.inf, -math.inf, -1, "1", True, None, [1]]
"""Values no numeric argument accepts (``None`` is left out where it means a default)."""


__all__ = [
    "BAD_NUMBERS",
    "FAST",
    "HUGE",
    "LONG_DIGITS",
    "PACKAGE",
    "REPO",
    "anything",
    "make_sim",
    "rejects",
    "show_value",
]

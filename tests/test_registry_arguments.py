"""``register_platform`` names a bad name or target, whatever the text."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import accelplat
from accelplat import _registry as registry
from accelplat.errors import (
    ConfigurationError,
)
from tests._hostile import FAST, make_sim, rejects


@pytest.mark.parametrize(
    "name", ["", "UPPER", "a b", "../x", "x" * 65, "-lead", "caf\u00e9", 5, None, b"cuda"]
)
def test_register_platform_names_a_bad_name(name: Any) -> None:
    exc = rejects(lambda: accelplat.register_platform(name, make_sim), "platform name")
    assert isinstance(exc, ConfigurationError)


@pytest.mark.parametrize("target", [5, None, "accelplat._backends.cpu:CpuPlatform"])
def test_register_platform_names_a_bad_target(target: Any) -> None:
    exc = rejects(lambda: accelplat.register_platform("mine", target), "register_platform")
    assert isinstance(exc, ConfigurationError)


@FAST
@given(st.text(max_size=70))
def test_register_platform_any_name_is_accepted_or_a_configuration_error(name: str) -> None:
    registry.reset()
    try:
        accelplat.register_platform(name, make_sim)
    except ConfigurationError as exc:
        message = str(exc)
    else:
        assert name in registry.available_platforms()
        return
    assert "platform name" in message or "already registered" in message

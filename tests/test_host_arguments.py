"""``/dev/shm`` budgets name their bad arguments; an enormous budget is a typed shortage."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

import accelplat
from accelplat.errors import (
    ConfigurationError,
    InsufficientSharedMemoryError,
)
from tests._hostile import HUGE, rejects


@pytest.mark.parametrize(
    ("argument", "call"),
    [
        *[
            pytest.param("required_bytes", lambda v=v: accelplat.require_shm(v), id=f"req={v!r}")
            for v in [-1, 1.5, math.nan, math.inf, "1GiB", True, None]
        ],
        *[
            pytest.param("name", lambda v=v: accelplat.require_shm(1, v), id=f"name={v!r}")
            for v in ["", "  ", 5, None]
        ],
        *[
            pytest.param("path", lambda v=v: accelplat.require_shm(1, path=v), id=f"path={v!r}")
            for v in ["", b"/dev/shm", 5, None, "a\x00b", "/no/such/mount", "x" * 5000]
        ],
        *[
            pytest.param("candidates", lambda v=v: accelplat.largest_shm_budget(v), id=f"c={v!r}")
            for v in [[], "4GiB", 5, None, [0], [-1], [math.nan], [1.5], [True], ["1"]]
        ],
        *[
            pytest.param(
                "headroom_bytes",
                lambda v=v: accelplat.largest_shm_budget([1], headroom_bytes=v),
                id=f"headroom={v!r}",
            )
            for v in [-1, math.nan, 1.5, "1", None]
        ],
    ],
)
def test_shared_memory_arguments_are_named(argument: str, call: Callable[[], Any]) -> None:
    exc = rejects(call, argument)
    assert isinstance(exc, ConfigurationError)


def test_an_enormous_shared_memory_budget_is_a_typed_shortage() -> None:
    with pytest.raises(InsufficientSharedMemoryError, match="MiB required") as info:
        accelplat.require_shm(HUGE)
    assert info.value.required == HUGE
    assert accelplat.largest_shm_budget([HUGE]) is None

"""``/dev/shm`` budgets name their bad arguments; an enormous budget is a typed shortage."""

from __future__ import annotations

import itertools
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


@pytest.mark.parametrize("required", [10**5000, 2**14_100 * 2**20], ids=["10**5000", "2**14120"])
def test_a_budget_beyond_printing_is_still_a_typed_shortage(required: int) -> None:
    with pytest.raises(InsufficientSharedMemoryError, match="MiB required"):
        accelplat.require_shm(required)
    assert accelplat.largest_shm_budget([required]) is None


@pytest.mark.parametrize(
    "endless",
    [
        lambda: itertools.count(1),
        lambda: itertools.repeat(2**60),
        lambda: (2**60 + i for i in itertools.count()),
    ],
    ids=["count", "repeat", "generator"],
)
def test_an_endless_list_of_candidates_is_refused(endless: Callable[[], Any]) -> None:
    rejects(lambda: accelplat.largest_shm_budget(endless()), "candidates")


def test_the_most_candidates_are_accepted() -> None:
    assert accelplat.largest_shm_budget([1] * 10_000) == 1


@pytest.mark.parametrize(
    "name", ["\x1b]0;owned\x07", "\u202etxt.exe", "a\rb", "x" * 100_000, "\x9b2J"], ids=repr
)
def test_a_shortage_message_escapes_and_caps_the_name(name: str) -> None:
    with pytest.raises(InsufficientSharedMemoryError) as info:
        accelplat.require_shm(HUGE, name)
    text = str(info.value)
    assert text.isprintable()
    assert len(text) < 800
    assert info.value.required == HUGE


@pytest.mark.parametrize("path", ["/no/such/\x1b[2J", "/no/such/" + "x" * 100_000], ids=repr)
def test_a_bad_path_is_escaped_and_capped(path: str) -> None:
    exc = rejects(lambda: accelplat.require_shm(1, path=path), "path")
    assert str(exc).isprintable()
    assert len(str(exc)) < 800

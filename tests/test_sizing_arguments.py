"""Sizing functions and ``parse_size`` name their bad arguments and stay exact for huge values."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import accelplat
import accelplat.errors
import accelplat.types
from accelplat._types import GIB
from accelplat._validate import parse_size
from accelplat.errors import (
    ConfigurationError,
)
from tests._hostile import FAST, HUGE, rejects

_KV = {"num_layers": 32, "num_kv_heads": 8, "head_size": 128, "max_model_len": 8192}
_KV_BAD = [0, -1, 1.5, math.nan, math.inf, "8", True, None, [8]]


_SIZING_ARGUMENTS = [
    (function, argument)
    for function in ("kv_cache_bytes", "check_kv_cache_fits", "max_model_len_that_fits")
    for argument in (*_KV, "block_size")
    if not (function == "max_model_len_that_fits" and argument == "max_model_len")
]


@pytest.mark.parametrize("value", _KV_BAD, ids=repr)
@pytest.mark.parametrize(("function", "argument"), _SIZING_ARGUMENTS)
def test_sizing_arguments_are_named(function: str, argument: str, value: Any) -> None:
    kwargs: dict[str, Any] = {**_KV, "dtype_bytes": "bf16", argument: value}
    if function == "kv_cache_bytes":
        rejects(lambda: accelplat.kv_cache_bytes(**kwargs), argument)
    elif function == "check_kv_cache_fits":
        rejects(lambda: accelplat.check_kv_cache_fits(GIB, **kwargs), argument)
    else:
        del kwargs["max_model_len"]
        rejects(lambda: accelplat.max_model_len_that_fits(GIB, **kwargs), argument)


@pytest.mark.parametrize("value", [-1, 1.5, math.nan, math.inf, "1GiB", True, None], ids=repr)
def test_available_bytes_is_named(value: Any) -> None:
    dims = {k: v for k, v in _KV.items() if k != "max_model_len"}
    rejects(
        lambda: accelplat.max_model_len_that_fits(value, dtype_bytes=2, **dims), "available_bytes"
    )
    rejects(lambda: accelplat.check_kv_cache_fits(value, dtype_bytes=2, **_KV), "available_bytes")


@pytest.mark.parametrize("value", ["auto", "fp4", "", 0, -2, 1.5, math.nan, None, True])
def test_dtype_is_named(value: Any) -> None:
    rejects(lambda: accelplat.kv_cache_bytes(dtype_bytes=value, **_KV), "dtype")


def test_sizing_stays_exact_and_typed_for_enormous_models() -> None:
    huge = {**_KV, "num_layers": HUGE}
    needed = accelplat.kv_cache_bytes(dtype_bytes=2, **huge)
    assert needed == HUGE * (8192 // 16) * (8 * 16 * 256 * 2)
    with pytest.raises(accelplat.errors.InsufficientMemoryError, match="GiB KV cache is needed"):
        accelplat.check_kv_cache_fits(GIB, dtype_bytes=2, **huge)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "abc",
        "-1G",
        "1e9",
        "1.5.5G",
        "nan",
        "inf",
        "4 GiB GiB",
        "4XB",
        "0x10",
        "9" * 1001,
        "9" * 1_000_001,
        -1,
        1.5,
        math.nan,
        None,
        True,
        b"1",
    ],
    ids=lambda v: repr(v)[:20],
)
def test_parse_size_names_its_argument(value: Any) -> None:
    exc = rejects(lambda: parse_size(value, argument="--threshold-bytes"), "--threshold-bytes")
    assert isinstance(exc, ConfigurationError)


@st.composite
def size_texts(draw: st.DrawFn) -> tuple[str, Fraction]:
    """A valid size text and its exact value in bytes."""
    whole = draw(st.text(alphabet="0123456789", min_size=1, max_size=40))
    frac = draw(st.none() | st.text(alphabet="0123456789", max_size=60))
    units = {
        "": 1,
        "b": 1,
        "k": 2**10,
        "KiB": 2**10,
        "mi": 2**20,
        "G": 2**30,
        "GB": 10**9,
        "tib": 2**40,
        "TB": 10**12,
        "P": 2**50,
        "pb": 10**15,
    }
    unit = draw(st.sampled_from(sorted(units)))
    text = whole + ("" if frac is None else "." + frac)
    value = Fraction(text) if frac != "" else Fraction(whole)
    space = draw(st.sampled_from(["", " "]))
    return f"{text}{space}{unit}", value * units[unit]


@FAST
@given(size_texts())
def test_parse_size_is_exact_for_long_numbers(case: tuple[str, Fraction]) -> None:
    text, exact = case
    assert parse_size(text, bare_bytes=True) == math.floor(exact)


@FAST
@given(st.text(max_size=40) | st.from_regex(r"\s*[0-9.]{0,30}\s*[A-Za-z]{0,4}\s*", fullmatch=True))
def test_parse_size_of_any_text_is_bytes_or_a_configuration_error(text: str) -> None:
    try:
        value = parse_size(text)
    except ConfigurationError:
        return
    assert type(value) is int
    assert value >= 0


_BEYOND_STR = 10**5000
"""An int with more digits than ``str()`` writes (4300): no message may try to print it."""

_SHAPE = {"num_layers": 32, "num_kv_heads": 8, "head_size": 128, "dtype_bytes": 2}


@pytest.mark.parametrize(
    "argument",
    ["num_layers", "num_kv_heads", "head_size", "block_size", "head_size_v", "dtype_bytes"],
)
@pytest.mark.parametrize("value", [2**2001, _BEYOND_STR], ids=["2**2001", "10**5000"])
def test_counts_beyond_printing_are_named_not_crashes(argument: str, value: int) -> None:
    kwargs: dict[str, Any] = {**_SHAPE, argument: value}
    rejects(lambda: accelplat.types.KVCacheShape(**kwargs), argument)
    rejects(lambda: accelplat.kv_cache_bytes(max_model_len=16, **kwargs), argument)
    rejects(lambda: accelplat.check_kv_cache_fits(GIB, max_model_len=16, **kwargs), argument)


@pytest.mark.parametrize("value", [2**2001, _BEYOND_STR], ids=["2**2001", "10**5000"])
def test_lengths_and_budgets_beyond_printing_are_named(value: int) -> None:
    rejects(
        lambda: accelplat.check_kv_cache_fits(GIB, max_model_len=value, **_SHAPE), "max_model_len"
    )
    rejects(
        lambda: accelplat.check_kv_cache_fits(value, max_model_len=16, **_SHAPE), "available_bytes"
    )
    rejects(lambda: accelplat.max_model_len_that_fits(value, **_SHAPE), "available_bytes")


def test_the_largest_accepted_counts_still_give_a_printable_message() -> None:
    edge = 2**2000 - 1
    kwargs = dict.fromkeys(("num_layers", "num_kv_heads", "head_size", "block_size"), edge)
    with pytest.raises(accelplat.errors.KVCacheTooSmallError) as info:
        accelplat.check_kv_cache_fits(0, max_model_len=edge, dtype_bytes=8, **kwargs)
    assert "GiB KV cache is needed" in str(info.value)


@pytest.mark.parametrize("dtype", ["x" * 100_000, "\x1b[2J" * 1000], ids=["long", "escapes"])
def test_long_dtype_names_are_not_echoed_in_full(dtype: str) -> None:
    exc = rejects(lambda: accelplat.dtype_bytes(dtype), "dtype")
    assert len(str(exc)) < 1000
    assert "\x1b" not in str(exc)

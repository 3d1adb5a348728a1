"""The one validation module: the general number, text and int checks, and JSON field checks."""

from __future__ import annotations

import argparse
import math

import pytest

from accelplat import _validate
from accelplat.errors import ConfigurationError


@pytest.mark.parametrize(
    ("value", "bounds", "ok"),
    [
        (0, {"minimum": 0}, True),
        (-0.5, {"minimum": 0}, False),
        (0, {"above": 0}, False),
        (1e-300, {"above": 0}, True),
        (1, {"above": 0, "maximum": 1}, True),
        (1.0000001, {"above": 0, "maximum": 1}, False),
        (math.inf, {}, False),
        (math.nan, {}, False),
        (True, {}, False),
        ("1", {}, False),
        (None, {}, False),
    ],
)
def test_number_accepts_exactly_the_range(
    value: object, bounds: dict[str, float], ok: bool
) -> None:
    if ok:
        assert _validate.number(value, "x", **bounds) == float(value)  # type: ignore[arg-type]
    else:
        with pytest.raises(ConfigurationError, match=r"^x must be "):
            _validate.number(value, "x", **bounds)


def test_number_names_the_condition_that_failed() -> None:
    with pytest.raises(ConfigurationError, match=r"^x must be in \(0, 1\], got 2$"):
        _validate.number(2, "x", above=0, maximum=1)
    with pytest.raises(ConfigurationError, match=r"^x must be >= 0, got -1$"):
        _validate.number(-1, "x", minimum=0)
    with pytest.raises(ConfigurationError, match=r"^x must be finite, got nan$"):
        _validate.number(math.nan, "x", minimum=0)
    with pytest.raises(ConfigurationError, match=r"^x must be a number >= 0, got True$"):
        _validate.number(True, "x", minimum=0)
    with pytest.raises(ConfigurationError, match=r"^x must be 'auto' or >= 0, got 'a'$"):
        _validate.number("a", "x", minimum=0, expected="'auto' or >= 0")


def test_the_shorthands_name_the_argument_and_the_range() -> None:
    assert _validate.duration(1, "t") == 1.0
    assert _validate.byte_count(2.9, "b") == 2
    assert _validate.ratio(0.5, "r") == 0.5
    assert _validate.integer(0, "n", minimum=0) == 0
    for check, bad, words in (
        (_validate.duration, -1, "t must be >= 0, got -1"),
        (_validate.byte_count, "4GiB", "t must be a number >= 0, got '4GiB'"),
        (_validate.ratio, 1.5, r"t must be in \[0, 1\], got 1.5"),
        (_validate.number, math.inf, "t must be finite, got inf"),
        (
            lambda v, a: _validate.integer(v, a, minimum=0),
            1.0,
            "t must be an int >= 0, got float 1.0",
        ),
    ):
        with pytest.raises(ConfigurationError, match=f"^{words}$"):
            check(bad, "t")
    with pytest.raises(ConfigurationError, match=r"^n must be an int >= 1, got 0$"):
        _validate.integer(0, "n", minimum=1)


def test_an_int_beyond_any_float_is_refused_without_its_digits() -> None:
    with pytest.raises(ConfigurationError) as info:
        _validate.number(10**400, "x")
    assert "too large for a float" in str(info.value)
    assert "0000" not in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        _validate.integer(10**5000, "n", maximum=10)
    assert "0000" not in str(info.value)


def test_the_callers_error_type_is_raised() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected a fraction, got 'x'$"):
        _validate.number(
            "x", "", expected="a fraction", from_text=True, error=argparse.ArgumentTypeError
        )
    with pytest.raises(ValueError) as info:
        _validate.number(5, "u", maximum=1, error=ValueError)
    assert type(info.value) is ValueError


@pytest.mark.parametrize(
    ("text", "expected"),
    [(" 1.5 ", 1.5), ("2e3", 2000.0), ("0", None), ("nan", None), ("inf", None), ("", None),
     ("1,5", None), ("-1", None)],
)  # fmt: skip
def test_text_is_parsed_and_quoted_as_given(text: str, expected: float | None) -> None:
    if expected is not None:
        assert _validate.number(text, "T", above=0, from_text=True) == expected
    else:
        with pytest.raises(ConfigurationError) as info:
            _validate.number(text, "T", above=0, from_text=True)
        assert str(info.value).endswith(f"got {text!r}")


def test_integer_refuses_bools_and_floats_naming_their_type() -> None:
    assert _validate.integer(3, "n", minimum=1) == 3
    with pytest.raises(ConfigurationError, match=r"^n must be an int >= 1, got bool True$"):
        _validate.integer(True, "n", minimum=1)
    with pytest.raises(ConfigurationError, match=r"^n must be an int >= 1, got float 2.0$"):
        _validate.integer(2.0, "n", minimum=1)
    with pytest.raises(ConfigurationError, match=r"^n must be an int in \[1, 4\], got 5$"):
        _validate.integer(5, "n", minimum=1, maximum=4)


def test_json_fields_in_both_wordings() -> None:
    trace = _validate.JsonFields("trace field", max_items=2, max_text=4)
    with pytest.raises(
        ConfigurationError, match=r"^trace field a\[0\]: expected an object, got 3$"
    ):
        trace.mapping(3, "a[0]")
    spec = _validate.JsonFields(
        "", max_items=2, max_text=4, wording="must be", object_noun="a table", array_noun="a list"
    )
    with pytest.raises(ConfigurationError, match=r"^d must be a list, got 'x'$"):
        spec.array("x", "d")
    with pytest.raises(ConfigurationError, match=r"^d: 3 entries; at most 2 are allowed$"):
        spec.array([1, 2, 3], "d")
    with pytest.raises(ConfigurationError, match=r"^d: unknown key 'z' \(allowed: a, b\)$"):
        spec.mapping({"z": 1}, "d", {"a", "b"})
    with pytest.raises(ConfigurationError, match=r"^d: missing required key 'a'$"):
        spec.mapping({"b": 1}, "d", {"a", "b"}, {"a"})
    assert spec.mapping({"a": 1}, "d", {"a", "b"}, {"a"}) == {"a": 1}


@pytest.mark.parametrize(
    ("text", "expected"),
    [("7", 7), (" 12 ", 12), ("0", None), ("-3", None), ("+3", None), ("３", None), ("²", None),
     ("1.0", None), ("1" * 19, None), ("101", None), ("", None)],
)  # fmt: skip
def test_counts_from_text_are_ascii_digits_in_range(text: str, expected: int | None) -> None:
    if expected is not None:
        assert _validate.integer(text, "N", minimum=1, maximum=100, from_text=True) == expected
    else:
        with pytest.raises(ConfigurationError) as info:
            _validate.integer(text, "N", minimum=1, maximum=100, from_text=True)
        assert str(info.value) == f"N must be an int in [1, 100], got {text!r}"


class _Index:
    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def test_a_device_index_is_any_integer_type_in_range_and_never_a_bool() -> None:
    from accelplat.errors import DeviceNotFoundError

    assert _validate.device_index(1, 2, "sim") == 1
    assert _validate.device_index(_Index(0), 2, "sim") == 0
    for bad in (2, -1, True, 0.0, "0", None, _Index(5)):
        with pytest.raises(DeviceNotFoundError) as caught:
            _validate.device_index(bad, 2, "sim")
        assert isinstance(caught.value, IndexError)


def test_json_fields_raise_the_documents_own_error_type() -> None:
    from accelplat.errors import BundleError

    fields = _validate.JsonFields(
        "",
        max_items=1,
        max_text=3,
        wording="must be",
        error_type=lambda where, words: BundleError("b.tar.gz", words, field=where),
    )
    with pytest.raises(BundleError) as caught:
        fields.integer("7", "host.json: n", minimum=0, maximum=9)
    assert caught.value.field == "host.json: n"
    assert str(caught.value) == "b.tar.gz: host.json: n: must be an integer in 0..9, got '7'"
    with pytest.raises(BundleError, match="must be a string of at most 3 characters, got 'long'"):
        fields.text("long", "host.json: t")


# -- sizes --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4GiB", 4 * 2**30), ("512MiB", 512 * 2**20), ("1.5G", 3 * 2**29), ("8GB", 8 * 10**9),
     ("100B", 100), ("4 gib", 4 * 2**30), (" .5K ", 512), ("0", 0), ("0.0", 0), (4096, 4096)],
)  # fmt: skip
def test_parse_size_reads_numbers_with_units(text: str | int, expected: int) -> None:
    assert _validate.parse_size(text) == expected


@pytest.mark.parametrize("text", ["4", " 1024 ", "1.5"])
def test_a_size_typed_as_text_needs_a_unit(text: str) -> None:
    shown = text.strip()
    with pytest.raises(ConfigurationError) as info:
        _validate.parse_size(text, argument="--require")
    assert str(info.value) == (
        f'--require: "{shown}" has no unit; write {shown}GiB, {shown}GB or {shown}B'
    )
    assert _validate.parse_size(text, bare_bytes=True) == int(float(shown))


@pytest.mark.parametrize("bad", ["", "GiB", "-1GiB", "4XB", "1e9", "nan", "4GiB4", "1,5G"])
def test_parse_size_refuses_what_is_not_a_size(bad: str) -> None:
    with pytest.raises(ConfigurationError, match=r"^--x must be a non-negative size"):
        _validate.parse_size(bad, argument="--x")

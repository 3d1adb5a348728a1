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
        (1, {"below": 1}, False),
        (0.999, {"below": 1}, True),
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


def test_number_words_default_to_the_range_and_follow_the_caller() -> None:
    with pytest.raises(ConfigurationError, match=r"^x must be a finite number in \(0, 1\], got 2$"):
        _validate.number(2, "x", above=0, maximum=1)
    with pytest.raises(ConfigurationError, match=r"^x must be a finite number >= 0, got -1$"):
        _validate.number(-1, "x", minimum=0)
    with pytest.raises(ConfigurationError, match=r"^x must be a count of things, got 'a'$"):
        _validate.number("a", "x", expected="in range", not_a_number="a count of things")
    with pytest.raises(ConfigurationError, match=r"^x must be in range, got -1$"):
        _validate.number(-1, "x", minimum=0, expected="in range", not_a_number="a count")


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


def test_integer_refuses_bools_and_floats_and_names_the_type_when_asked() -> None:
    assert _validate.integer(3, "n", minimum=1) == 3
    with pytest.raises(ConfigurationError, match=r"^n must be an int >= 1, got True$"):
        _validate.integer(True, "n", minimum=1)
    with pytest.raises(ConfigurationError, match=r"^n must be an int >= 1, got float 2.0$"):
        _validate.integer(2.0, "n", minimum=1, show_type=True)
    with pytest.raises(ConfigurationError, match=r"^n must be an int in \[1, 4\], got 5$"):
        _validate.integer(5, "n", minimum=1, maximum=4)
    with pytest.raises(ConfigurationError, match=r"^n must be whole, got 'a'$"):
        _validate.integer("a", "n", minimum=1, not_an_int="whole")


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

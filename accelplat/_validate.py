"""The one module that checks numbers and fields that come from users or untrusted files.

Two kinds of input pass through here:

* **Arguments** of public functions and options (durations, ratios, byte counts): a
  :class:`~accelplat.errors.ConfigurationError` names the argument and the accepted range.
  ``bool`` is never a number; an ``int`` too large for a float (``10**400``) is refused like an
  infinity, without echoing its digits back.
* **Fields of untrusted JSON documents** (timeline traces, simulated specs, capture bundles):
  :class:`JsonFields` checks each field's type and range and names it by its path
  (``tests[3].end``), with the document's own prefix (``"trace field"``).

The general checks, :func:`number` (of a value, or of text) and :func:`integer`, take the caller's
words for what is accepted (``expected``) and, where the caller must raise another type (a
``ValueError``, a pytest usage error, an argparse type error), the error class: the *check* is
defined once here, the message keeps each caller's documented wording, worded
``"<argument> must be <expected>, got <value>"`` (or ``"expected <expected>, got <value>"``
when no argument is named).

Sizes written as text go through the one size grammar, :func:`accelplat._sizing.parse_size`.
Nothing here touches a device.
"""

from __future__ import annotations

import math
import operator
import sys
from collections.abc import Callable, Mapping, Sequence, Set
from typing import Any, Literal, SupportsFloat, TypeGuard

from accelplat.errors import ConfigurationError, DeviceNotFoundError

__all__ = [
    "FLOAT_MAX_TEXT",
    "JsonFields",
    "byte_count",
    "byte_int",
    "device_index",
    "duration",
    "finite_number",
    "integer",
    "number",
    "ratio",
]

ErrorType = Callable[[str], Exception]
"""What a check raises: an exception class (or factory) taking the message."""

FLOAT_MAX_TEXT = f"{sys.float_info.max:.2g}"
"""The largest float, as messages quote it: numeric arguments are compared as floats."""


def _is_real(value: object) -> TypeGuard[SupportsFloat]:
    """``value`` is a real number and not a ``bool`` (``numbers.Real``: numpy floats too)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    import numbers  # only for other kinds of number: importing this module stays cheap

    return isinstance(value, numbers.Real)


def finite_number(
    value: object, argument: str, *, accepted: str = "finite", not_a_number: str = "a number"
) -> float:
    """Return ``value`` as a finite float.

    Args:
        value: A real number (``bool`` refused).
        argument: Its name, for the message.
        accepted: Words for the accepted values, used when ``value`` is too large for a float.
        not_a_number: Words for what is accepted, used when ``value`` is no number.

    Returns:
        ``float(value)``.

    Raises:
        ConfigurationError: For a non-number, NaN, an infinity or an int beyond any float; the
            digits of such an int are not echoed (an int of more than 4300 digits has no repr).
    """
    if not _is_real(value):
        raise ConfigurationError(f"{argument} must be {not_a_number}, got {value!r}")
    try:
        result = float(value)
    except OverflowError:
        raise ConfigurationError(
            f"{argument} must be {accepted}, got a number too large for a float"
        ) from None
    if not math.isfinite(result):
        raise ConfigurationError(f"{argument} must be finite, got {value!r}")
    return result


def duration(value: object, argument: str) -> float:
    """Return a number of seconds ``>= 0`` (finite).

    Raises:
        ConfigurationError: Naming ``argument``.
    """
    result = finite_number(
        value, argument, accepted=f"a number of seconds in [0, {FLOAT_MAX_TEXT}]"
    )
    if result < 0:
        raise ConfigurationError(f"{argument} must be >= 0 seconds, got {value!r}")
    return result


def byte_count(value: object, argument: str, *, not_a_number: str = "a number") -> int:
    """Return a number of bytes ``>= 0``, a float rounded down.

    Args:
        value: A real number.
        argument: Its name, for the message.
        not_a_number: Words for what is accepted, used when ``value`` is no number.

    Raises:
        ConfigurationError: Naming ``argument``.
    """
    accepted = f"a number of bytes in [0, {FLOAT_MAX_TEXT}]"
    result = finite_number(value, argument, accepted=accepted, not_a_number=not_a_number)
    if result < 0:
        raise ConfigurationError(f"{argument} must be >= 0 bytes, got {value!r}")
    return math.floor(result)


def ratio(value: object, argument: str, *, not_a_number: str = "a number") -> float:
    """Return a fraction in ``[0, 1]``.

    Args:
        value: A real number.
        argument: Its name, for the message.
        not_a_number: Words for what is accepted, used when ``value`` is no number.

    Raises:
        ConfigurationError: Naming ``argument``.
    """
    result = finite_number(value, argument, accepted="in [0, 1]", not_a_number=not_a_number)
    if not 0.0 <= result <= 1.0:
        raise ConfigurationError(f"{argument} must be in [0, 1], got {value!r}")
    return result


def byte_int(value: object, argument: str, *, positive: bool = False) -> int:
    """Return an exact ``int`` number of bytes, ``>= 0`` (or ``> 0``); floats are refused.

    Raises:
        ConfigurationError: Naming ``argument``, for a non-int (``bool`` included), a
            non-finite float, or a value out of range.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigurationError(f"{argument} must be a finite number of bytes, got {value!r}")
        raise ConfigurationError(
            f"{argument} must be an int number of bytes, got {type(value).__name__} {value!r}"
        )
    if value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise ConfigurationError(f"{argument} must be {bound}, got {value!r}")
    return value


def _must(argument: str, expected: str, shown: str) -> str:
    if argument:
        return f"{argument} must be {expected}, got {shown}"
    return f"expected {expected}, got {shown}"


def _range_words(
    minimum: float | None, maximum: float | None, above: float | None, below: float | None
) -> str:
    low = f"{above:g}" if above is not None else None if minimum is None else f"{minimum:g}"
    high = f"{below:g}" if below is not None else None if maximum is None else f"{maximum:g}"
    if low is not None and high is not None:
        left = "(" if above is not None else "["
        right = ")" if below is not None else "]"
        return f"in {left}{low}, {high}{right}"
    if low is not None:
        return f"{'>' if above is not None else '>='} {low}"
    if high is not None:
        return f"{'<' if below is not None else '<='} {high}"
    return ""


def _check_range(
    value: float,
    *,
    minimum: float | None,
    maximum: float | None,
    above: float | None,
    below: float | None,
) -> bool:
    return (
        (minimum is None or value >= minimum)
        and (maximum is None or value <= maximum)
        and (above is None or value > above)
        and (below is None or value < below)
    )


def number(
    value: object,
    argument: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
    expected: str | None = None,
    not_a_number: str | None = None,
    from_text: bool = False,
    error: ErrorType = ConfigurationError,
) -> float:
    """Return ``value`` as a float if it is a finite real number in the given range.

    Args:
        value: A real number (``bool`` refused); with ``from_text``, text to parse.
        argument: Its name, for the message (``""``: the message starts with ``expected``).
        minimum: Smallest accepted value (inclusive).
        maximum: Largest accepted value (inclusive).
        above: Exclusive lower bound.
        below: Exclusive upper bound.
        expected: Words for what is accepted; by default built from the bounds
            (``"a finite number in (0, 1]"``).
        not_a_number: Words used instead of ``expected`` when ``value`` is no number at all.
        from_text: ``value`` is text from an option or an environment variable: parsed as a
            Python ``float`` literal (``"1.5"``, ``"2e3"``, blanks around it ignored), and
            quoted as given in the message.
        error: The exception class to raise.

    Returns:
        The number as a float.

    Raises:
        ConfigurationError: (or ``error``) For a non-number, NaN, an infinity, an int beyond
            any float (its digits not echoed) or a value out of range.
    """
    words = expected or f"a finite number {_range_words(minimum, maximum, above, below)}".rstrip()
    if from_text:
        shown = repr(value)
        try:
            value = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            value = None
    elif isinstance(value, int) and value.bit_length() >= 4000:
        shown = "an int"  # too long to echo (an int of more than 4300 digits has no repr)
    else:
        shown = repr(value)
    if not _is_real(value):
        raise error(_must(argument, not_a_number or words, shown))
    try:
        result = float(value)
    except OverflowError:  # an int beyond any float: its digits are not echoed
        raise error(_must(argument, words, "a number too large for a float")) from None
    if not (
        math.isfinite(result)
        and _check_range(result, minimum=minimum, maximum=maximum, above=above, below=below)
    ):
        raise error(_must(argument, words, shown))
    return result


def integer(
    value: object,
    argument: str,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    expected: str | None = None,
    not_an_int: str | None = None,
    show_type: bool = False,
    from_text: bool = False,
    error: ErrorType = ConfigurationError,
) -> int:
    """Return ``value`` if it is an ``int`` (``bool`` refused, floats refused) in range.

    Args:
        value: The value to check.
        argument: Its name, for the message (``""``: the message starts with ``expected``).
        minimum: Smallest accepted value (inclusive).
        maximum: Largest accepted value (inclusive).
        expected: Words for what is accepted; by default ``"an int >= 1"`` and the like.
        not_an_int: Words used instead of ``expected`` when ``value`` is no int.
        show_type: Name the type of a value that is no int (``"got float 128.0"``).
        from_text: ``value`` is text from an option: ASCII digits only (no sign, at most 18),
            blanks around them ignored, quoted as given in the message.
        error: The exception class to raise.

    Returns:
        ``value``.

    Raises:
        ConfigurationError: (or ``error``) For a non-int or a value out of range.
    """
    words = expected or f"an int {_range_words(minimum, maximum, None, None)}".rstrip()
    if from_text:
        text = value.strip() if isinstance(value, str) else ""
        if not (text.isascii() and text.isdigit() and len(text) <= 18):
            raise error(_must(argument, not_an_int or words, repr(value)))
        if not _check_range(int(text), minimum=minimum, maximum=maximum, above=None, below=None):
            raise error(_must(argument, words, repr(value)))
        return int(text)
    if isinstance(value, bool) or not isinstance(value, int):
        shown = f"{type(value).__name__} {value!r}" if show_type else repr(value)
        raise error(_must(argument, not_an_int or words, shown))
    if not _check_range(value, minimum=minimum, maximum=maximum, above=None, below=None):
        shown = repr(value) if value.bit_length() < 4000 else "an int of more than 1200 digits"
        raise error(_must(argument, words, shown))
    return value


def device_index(value: object, count: int, platform: str) -> int:
    """Return ``value`` as the index of one of ``count`` visible devices.

    Any integer type (``operator.index``: numpy integers too) is accepted; ``bool`` is not.

    Args:
        value: The index a caller passed.
        count: How many devices are visible.
        platform: The platform's name, for the error.

    Returns:
        The index as an ``int`` in ``range(count)``.

    Raises:
        DeviceNotFoundError: For a non-integer or an index out of range (also an
            ``IndexError``).
    """
    if not isinstance(value, bool):
        try:
            index = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
        else:
            if 0 <= index < count:
                return int(index)
    raise DeviceNotFoundError(value, count, platform)


class JsonFields:
    """Type and range checks for the fields of one kind of untrusted JSON (or TOML) document.

    Every failure is a :class:`~accelplat.errors.ConfigurationError` naming the field by its
    path, worded ``"<prefix> <path>: expected <what>, got <value>"`` or, with
    ``wording="must be"``, ``"<path> must be <what>, got <value>"``; the value is shortened to
    60 characters.

    Args:
        prefix: How the document names its fields, e.g. ``"trace field"`` (may be empty).
        max_items: Default bound on array lengths.
        max_text: Bound on string lengths.
        wording: Which of the two message forms above the document's errors use.
        object_noun: The document's word for an object (``"a table/object"`` where TOML is
            read too).
        array_noun: The document's word for an array.
        error_type: Builds the error from the field's path and the words describing the
            problem, for documents with their own error type (a capture bundle's
            :class:`~accelplat.errors.BundleError`); by default a ``ConfigurationError``
            worded as above.
    """

    def __init__(
        self,
        prefix: str,
        *,
        max_items: int,
        max_text: int,
        wording: Literal["expected", "must be"] = "expected",
        object_noun: str = "an object",
        array_noun: str = "an array",
        error_type: Callable[[str, str], ConfigurationError] | None = None,
    ) -> None:
        self.prefix = prefix
        self.max_items = max_items
        self.max_text = max_text
        self.wording = wording
        self.object_noun = object_noun
        self.array_noun = array_noun
        self.error_type = error_type

    def error(self, where: str, expected: str, got: object) -> ConfigurationError:
        """Return (not raise) the error for field ``where`` holding ``got``."""
        shown = repr(got)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        if self.wording == "must be":
            return self.problem(where, f"must be {expected}, got {shown}", sep=" ")
        return self.problem(where, f"expected {expected}, got {shown}")

    def problem(self, where: str, words: str, *, sep: str = ": ") -> ConfigurationError:
        """Return (not raise) an error for field ``where`` described in ``words``."""
        if self.error_type is not None:
            return self.error_type(where, words)
        name = f"{self.prefix} {where}" if self.prefix else where
        return ConfigurationError(f"{name}{sep}{words}")

    def mapping(
        self,
        value: object,
        where: str,
        allowed: Set[str] | None = None,
        required: Set[str] = frozenset(),
    ) -> Mapping[str, Any]:
        """Return ``value`` if it is an object whose keys are all ``allowed`` and ``required``.

        Args:
            value: The field.
            where: Its path.
            allowed: The keys it may have (``None``: any key).
            required: The keys it must have.
        """
        if not isinstance(value, Mapping):
            raise self.error(where, self.object_noun, value)
        if allowed is not None:
            for key in value:
                if not isinstance(key, str) or key not in allowed:
                    names = ", ".join(sorted(allowed))
                    raise self.problem(where, f"unknown key {key!r} (allowed: {names})")
        for key in sorted(required):
            if key not in value:
                raise self.problem(where, f"missing required key {key!r}")
        return value

    def array(self, value: object, where: str, limit: int | None = None) -> Sequence[Any]:
        """Return ``value`` if it is a JSON array of at most ``limit`` entries."""
        bound = self.max_items if limit is None else limit
        if not isinstance(value, list):
            raise self.error(where, self.array_noun, value)
        if len(value) > bound:
            raise self.problem(where, f"{len(value)} entries; at most {bound} are allowed")
        return value

    def integer(self, value: object, where: str, *, minimum: int, maximum: int) -> int:
        """Return ``value`` if it is an integer (not a boolean) in ``minimum..maximum``."""
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            raise self.error(where, f"an integer in {minimum}..{maximum}", value)
        return value

    def number(self, value: object, where: str, *, maximum: float) -> float:
        """Return ``value`` as a float if it is a finite number in ``0..maximum``."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(where, "a number", value)
        try:
            f = float(value)
        except OverflowError:  # an integer beyond any float, 10**400 say
            f = math.inf
        if not (math.isfinite(f) and 0 <= f <= maximum):
            raise self.error(where, f"a number in 0..{maximum:g}", value)
        return f

    def text(self, value: object, where: str) -> str:
        """Return ``value`` if it is a string of at most ``max_text`` characters."""
        if not isinstance(value, str) or len(value) > self.max_text:
            raise self.error(where, f"a string of at most {self.max_text} characters", value)
        return value

    def boolean(self, value: object, where: str) -> bool:
        """Return ``value`` if it is ``true`` or ``false``."""
        if not isinstance(value, bool):
            raise self.error(where, "true or false", value)
        return value

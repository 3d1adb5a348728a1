"""The one module that checks numbers and fields that come from users or untrusted files.

Two kinds of input pass through here:

* **Arguments** of public functions and options (durations, ratios, byte counts): a
  :class:`~accelplat.errors.ConfigurationError` names the argument and the accepted range.
  ``bool`` is never a number; an ``int`` too large for a float (``10**400``) is refused like an
  infinity, without echoing its digits back.
* **Fields of untrusted JSON documents** (timeline traces, simulated specs, capture bundles):
  :class:`JsonFields` checks each field's type and range and names it by its path
  (``tests[3].end``), with the document's own prefix (``"trace field"``).

Sizes written as text go through the one size grammar, :func:`accelplat.sizing.parse_size`.
Nothing here touches a device.
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from accelplat.errors import ConfigurationError

__all__ = [
    "FLOAT_MAX_TEXT",
    "JsonFields",
    "byte_count",
    "byte_int",
    "duration",
    "finite_number",
    "ratio",
]

FLOAT_MAX_TEXT = f"{sys.float_info.max:.2g}"
"""The largest float, as messages quote it: numeric arguments are compared as floats."""


def finite_number(value: object, argument: str, *, accepted: str = "finite") -> float:
    """Return ``value`` as a finite float.

    Args:
        value: A real number (``bool`` refused).
        argument: Its name, for the message.
        accepted: Words for the accepted values, used when ``value`` is too large for a float.

    Returns:
        ``float(value)``.

    Raises:
        ConfigurationError: For a non-number, NaN, an infinity or an int beyond any float; the
            digits of such an int are not echoed (an int of more than 4300 digits has no repr).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigurationError(f"{argument} must be a number, got {value!r}")
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


def byte_count(value: object, argument: str) -> int:
    """Return a number of bytes ``>= 0``, a float rounded down.

    Raises:
        ConfigurationError: Naming ``argument``.
    """
    accepted = f"a number of bytes in [0, {FLOAT_MAX_TEXT}]"
    result = finite_number(value, argument, accepted=accepted)
    if result < 0:
        raise ConfigurationError(f"{argument} must be >= 0 bytes, got {value!r}")
    return math.floor(result)


def ratio(value: object, argument: str) -> float:
    """Return a fraction in ``[0, 1]``.

    Raises:
        ConfigurationError: Naming ``argument``.
    """
    result = finite_number(value, argument, accepted="in [0, 1]")
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


class JsonFields:
    """Type and range checks for the fields of one kind of untrusted JSON document.

    Every failure is a :class:`~accelplat.errors.ConfigurationError` worded
    ``"<prefix> <path>: expected <what>, got <value>"``, the value shortened to 60 characters.

    Args:
        prefix: How the document names its fields, e.g. ``"trace field"``.
        max_items: Default bound on array lengths.
        max_text: Bound on string lengths.
    """

    def __init__(self, prefix: str, *, max_items: int, max_text: int) -> None:
        self.prefix = prefix
        self.max_items = max_items
        self.max_text = max_text

    def error(self, where: str, expected: str, got: object) -> ConfigurationError:
        """Return (not raise) the error for field ``where`` holding ``got``."""
        shown = repr(got)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        return ConfigurationError(f"{self.prefix} {where}: expected {expected}, got {shown}")

    def problem(self, where: str, words: str) -> ConfigurationError:
        """Return (not raise) an error for field ``where`` described in ``words``."""
        return ConfigurationError(f"{self.prefix} {where}: {words}")

    def mapping(self, value: object, where: str) -> Mapping[str, Any]:
        """Return ``value`` if it is a JSON object."""
        if not isinstance(value, dict):
            raise self.error(where, "an object", value)
        return value

    def array(self, value: object, where: str, limit: int | None = None) -> Sequence[Any]:
        """Return ``value`` if it is a JSON array of at most ``limit`` entries."""
        bound = self.max_items if limit is None else limit
        if not isinstance(value, list):
            raise self.error(where, "an array", value)
        if len(value) > bound:
            raise self.problem(where, f"more than {bound} entries")
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
        if not isinstance(value, str):
            raise self.error(where, "a string", value)
        if len(value) > self.max_text:
            raise self.problem(where, f"longer than {self.max_text} characters")
        return value

    def boolean(self, value: object, where: str) -> bool:
        """Return ``value`` if it is ``true`` or ``false``."""
        if not isinstance(value, bool):
            raise self.error(where, "true or false", value)
        return value

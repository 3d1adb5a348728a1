"""The one module that checks numbers, sizes and fields that come from users or untrusted files.

Numbers (:func:`number`, :func:`integer` and shorthands): ``bool``, NaN, infinities and ints beyond
any float are refused, worded ``"<argument> must be <expected>, got <value>"``. Sizes as text:
:func:`parse_size`, the one size grammar. Fields of untrusted JSON documents: :class:`JsonFields`
names each bad field by its path (``tests[3].end``).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence, Set
from contextlib import suppress
from dataclasses import KW_ONLY, dataclass
from typing import Any, Literal, SupportsFloat, TypeGuard

from accelplat import _util
from accelplat.errors import ConfigurationError, DeviceNotFoundError

ErrorType = Callable[[str], Exception]  # an exception class (or factory) taking the message

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")  # a platform or capability name


def _is_real(value: object) -> TypeGuard[SupportsFloat]:
    """``value`` is a real number and not a ``bool`` (``numbers.Real``: numpy floats too)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    import numbers  # only for other kinds of number: importing this module stays cheap

    return isinstance(value, numbers.Real)


def _must(argument: str, expected: str, shown: str) -> str:
    if argument:
        return f"{argument} must be {expected}, got {shown}"
    return f"expected {expected}, got {shown}"


def _range_words(minimum: float | None, maximum: float | None, above: float | None) -> str:
    low = f"{above:g}" if above is not None else None if minimum is None else f"{minimum:g}"
    high = None if maximum is None else f"{maximum:g}"
    if low is not None and high is not None:
        return f"in {'(' if above is not None else '['}{low}, {high}]"
    if low is not None:
        return f"{'>' if above is not None else '>='} {low}"
    return "" if high is None else f"<= {high}"


def _in_range(
    value: float, minimum: float | None, maximum: float | None, above: float | None
) -> bool:
    return (
        (minimum is None or value >= minimum)
        and (maximum is None or value <= maximum)
        and (above is None or value > above)
    )


def number(
    value: object,
    argument: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    expected: str | None = None,
    from_text: bool = False,
    error: ErrorType = ConfigurationError,
) -> float:
    """Return ``value`` as a float, raising ``error`` unless it is a finite real number in range.

    ``above`` is an exclusive lower bound; ``expected`` replaces the range's words where the caller
    accepts more than a number; ``from_text`` parses text as a ``float`` literal.
    """
    shown = _util.shown(value)
    if from_text:
        try:
            value = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            value = None
    bounds = _range_words(minimum, maximum, above)
    if not _is_real(value):
        raise error(_must(argument, expected or f"a number {bounds}".rstrip(), shown))
    try:
        result = float(value)
    except OverflowError:  # an int beyond any float: its digits are not echoed
        raise error(_must(argument, expected or "finite", "an int too large for a float")) from None
    if not math.isfinite(result):
        raise error(_must(argument, expected or "finite", shown))
    if not _in_range(result, minimum, maximum, above):
        raise error(_must(argument, expected or bounds, shown))
    return result


def integer(
    value: object,
    argument: str,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    expected: str | None = None,
    from_text: bool = False,
    error: ErrorType = ConfigurationError,
) -> int:
    """Return ``value`` if it is an ``int`` in range (not ``bool``, not a float), else raise.

    ``from_text``: text of at most 18 ASCII digits (no sign), blanks around them ignored.
    """
    words = expected or f"an int {_range_words(minimum, maximum, None)}".rstrip()
    if from_text:
        text = value.strip() if isinstance(value, str) else ""
        if not (text.isascii() and text.isdigit() and len(text) <= 18) or not _in_range(
            int(text), minimum, maximum, None
        ):
            raise error(_must(argument, words, repr(value)))
        return int(text)
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(_must(argument, words, f"{type(value).__name__} {_util.shown(value)}"))
    if not _in_range(value, minimum, maximum, None):
        raise error(_must(argument, words, _util.shown(value)))
    return value


def duration(value: object, argument: str) -> float:
    """Return a finite number of seconds ``>= 0``."""
    return number(value, argument, minimum=0)


def byte_count(value: object, argument: str) -> int:
    """Return a finite number of bytes ``>= 0``, a float rounded down."""
    return math.floor(number(value, argument, minimum=0))


def ratio(value: object, argument: str) -> float:
    """Return a fraction in ``[0, 1]``."""
    return number(value, argument, minimum=0, maximum=1)


def flag(value: object, argument: str) -> bool:
    """Return ``value`` if it is ``True`` or ``False`` (not merely truthy)."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"{argument} must be True or False, got {_util.shown(value)}")
    return value


def device_index(value: object, count: int, platform: str) -> int:
    """Return ``value`` (any integer type but ``bool``) as an index in ``range(count)``."""
    with suppress(TypeError):  # not an integer type
        index = -1 if isinstance(value, bool) else operator.index(value)  # type: ignore[arg-type]
        if 0 <= index < count:
            return int(index)
    raise DeviceNotFoundError(value, count, platform)


# -- sizes ------------------------------------------------------------------------------------

_UNITS: dict[str, int] = {
    "b": 1,
    **{u: 1024**i for i, p in enumerate("kmgtp", 1) for u in (p, p + "i", p + "ib")},
    **{p + "b": 1000**i for i, p in enumerate("kmgtp", 1)},
}

# ASCII digits, an optional fraction, an optional unit; no sign, no exponent. Compiled by
# re.match on first use (the size grammar is not on the detection path).
_SIZE = r"^[ \t]*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)[ \t]*([A-Za-z]*)[ \t]*$"
_MAX_SIZE_DIGITS = 1000  # far beyond any real size; bounds the work


def parse_size(
    value: str | int,
    *,
    argument: str = "size",
    maximum: int | None = None,
    bare_bytes: bool = False,
) -> int:
    """Parse a byte size such as ``"4GiB"``, ``"512MiB"``, ``"1.5G"``, ``"8GB"`` or ``"100B"``.

    Units are case-insensitive: binary ``K``/``Ki``/``KiB`` up to ``PiB`` (a bare letter is
    binary, as docker's ``--shm-size 2g``), decimal ``KB`` up to ``PB`` (``"24GB"`` is 24 * 10**9,
    as vLLM's ``large_gpu_mark`` counts), or ``B``; fractions round down (docs/concepts.md).

    Args:
        value: The text, or a non-negative ``int`` of bytes.
        argument: The name used in error messages (e.g. ``"--available"``).
        maximum: The largest size accepted; ``None``: no bound.
        bare_bytes: Accept text without a unit as bytes (otherwise only ``"0"`` may omit it).

    Returns:
        Bytes, ``>= 0``.

    Raises:
        ConfigurationError: For a malformed value, no unit, over 1000 digits, or above ``maximum``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigurationError(
            f"{argument} must be a size such as '4GiB' or an int of bytes, "
            f"got {type(value).__name__} {_util.shown(value)}"
        )
    if isinstance(value, int):
        size = integer(value, argument, minimum=0)
    else:
        m = re.match(_SIZE, value, re.ASCII)
        unit = m.group(2).lower() if m else ""
        if m is None or (unit and unit not in _UNITS):
            raise ConfigurationError(
                f"{argument} must be a non-negative size: a number with a unit ('4GiB', "
                f"'512MiB', '1.5G', '8GB', '100B'); got {_util.shown(value)}"
            )
        whole, _, fraction = str(m.group(1)).partition(".")
        whole = whole.lstrip("0")
        if not unit and not bare_bytes and (whole or fraction.strip("0")):
            n = value.strip()
            fix = f"{n}GiB, {n}GB or {n}B" if len(n) <= 24 else "it with GiB, GB or B"
            raise ConfigurationError(f'{argument}: "{n[:24]}" has no unit; write {fix}')
        if len(whole) + len(fraction) > _MAX_SIZE_DIGITS:
            raise ConfigurationError(
                f"{argument} has more than {_MAX_SIZE_DIGITS} digits; got {value[:40]!r}…"
            )
        # Exact integer arithmetic: no rounding of long numbers, no overflow, floor of fractions.
        scale = 10 ** len(fraction)
        size = (int(whole or "0") * scale + int(fraction or "0")) * _UNITS[unit or "b"] // scale
    if maximum is not None and size > maximum:
        raise ConfigurationError(f"{argument} must be at most {maximum} bytes, got {value!r}")
    return size


# -- untrusted documents ------------------------------------------------------------------------


@dataclass(frozen=True)
class JsonFields:
    """Type and range checks for the fields of one kind of untrusted JSON (or TOML) document.

    Each failure names the field by its path: ``"<prefix> <path>: expected <what>, got <value>"``
    or (``wording="must be"``) ``"<path> must be <what>, got <value>"``. ``error_type`` builds the
    error from path and words, for documents with their own (a bundle's ``BundleError``).
    """

    prefix: str
    _: KW_ONLY
    max_items: int
    max_text: int
    wording: Literal["expected", "must be"] = "expected"
    object_noun: str = "an object"
    array_noun: str = "an array"
    error_type: Callable[[str, str], ConfigurationError] | None = None

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
        """Return ``value`` if it is an object of ``allowed`` keys (None: any) with ``required``."""
        if not isinstance(value, Mapping):
            raise self.error(where, self.object_noun, value)
        if allowed is not None:
            for key in value:
                if not isinstance(key, str) or key not in allowed:
                    names = ", ".join(sorted(allowed))
                    raise self.problem(where, f"unknown key {_util.shown(key)} (allowed: {names})")
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

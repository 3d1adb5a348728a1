"""Small shared helpers: the :class:`Clock` waits read and sleep on, and formatting for people."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Monotonic time that can also sleep (a virtual clock's ``sleep`` advances it).

    It may also offer ``time()`` (epoch seconds) for ``UsageSnapshot.wall_time``, else time.time.
    """

    def monotonic(self) -> float:
        """Return the current monotonic time in seconds."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds`` (or advance virtual time by that much)."""
        ...


class RealClock:
    """Real time: :func:`time.monotonic`, :func:`time.sleep` and :func:`time.time`."""

    def monotonic(self) -> float:
        """Return :func:`time.monotonic`."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """Sleep for ``seconds`` of real time (nothing for ``seconds <= 0``)."""
        if seconds > 0:
            time.sleep(seconds)

    def time(self) -> float:
        """Return :func:`time.time`."""
        return time.time()

    def __repr__(self) -> str:
        return "RealClock()"


REAL_CLOCK: Clock = RealClock()


def set_environ(
    values: Mapping[str, str | None], environ: MutableMapping[str, str] | None = None
) -> Callable[[], None]:
    """Set ``values`` in ``environ`` (default ``os.environ``), removing each one that is ``None``.

    Returns:
        A function that puts the previous values back.
    """
    target = os.environ if environ is None else environ
    previous = {name: target.get(name) for name in values}

    def put(chosen: Mapping[str, str | None]) -> None:
        for name, value in chosen.items():
            if value is None:
                target.pop(name, None)
            else:
                target[name] = value

    put(values)
    return lambda: put(previous)


_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: int | float | None) -> str:
    """Format bytes with a binary unit (``"1.50 GiB"``, ``"12 B"``); None or non-finite: ``"?"``.

    The one size formatter for people: every message that shows a size goes through it, so one
    size reads the same everywhere (``+1.00 GiB``, never ``+1024 MiB``).
    """
    if n is None or not math.isfinite(n):
        return "?"
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    unit = 0
    # 1023.999 MiB would print "1024.00 MiB": a value that rounds to 1024 takes the next unit
    while (value >= 1024 or (unit and round(value, 2) >= 1024)) and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{sign}{int(value)} B"
    return f"{sign}{value:.2f} {_UNITS[unit]}"


def gib_digits(n: int) -> str:
    """Return ``n`` bytes in GiB with two decimals, exact for sizes too large for a float."""
    if n < 2**1000:
        return f"{n / 1024**3:.2f}"
    return f"{n // 1024**3}.00"


def printable(text: object, *, keep_newlines: bool = False) -> str:
    r"""Return ``str(text)`` safe for a terminal: non-printables escaped as ``repr`` does.

    A device, process or driver name can hold escape sequences (``"\x1b]0;…"`` retitles a
    terminal) or bidirectional overrides; ``keep_newlines`` keeps ``"\n"`` as a line break.
    """
    shown = str(text)
    if shown.isprintable():
        return shown
    return "".join(
        char if char.isprintable() or (keep_newlines and char == "\n") else _escape(ord(char))
        for char in shown
    )


def _escape(code: int) -> str:
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def clip(text: str, limit: int) -> str:
    """Return ``text`` cut to ``limit`` characters, the last one ``…``, when it is longer."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def shown(value: object, limit: int = 200) -> str:
    """``repr(value)`` for a message: bounded (a variable may hold 100 KB), never an error."""
    if isinstance(value, int) and value.bit_length() >= 4000:
        return "an int of more than 1200 digits"  # an int of more than 4300 digits has no repr
    try:
        return shorten(repr(value), limit)
    except RecursionError:  # a list nested deeper than repr goes
        return f"a deeply nested {type(value).__name__}"


def shorten(text: object, limit: int = 200) -> str:
    """Return ``text`` cut to ``limit`` characters and ``… (N characters)`` when it is longer.

    For values echoed in messages: an environment variable can hold 100 KB.
    """
    shown = str(text)
    return shown if len(shown) <= limit else f"{shown[:limit]}… ({len(shown)} characters)"

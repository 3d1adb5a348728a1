"""Argument types shared by the sub-commands (``type=`` callables for argparse)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from accelplat import _validate
from accelplat._sizing import parse_size

__all__ = ["count_arg", "parse_devices", "parse_size_arg", "ratio_arg", "seconds_arg"]


def parse_devices(text: str) -> list[int] | None:
    """Parse ``--devices``: a comma-separated list of visible indices, or ``all``.

    Args:
        text: E.g. ``"0,1"``; ``"all"`` (or an empty string) means every visible device.

    Returns:
        The indices, or ``None`` for every device.

    Raises:
        argparse.ArgumentTypeError: For anything that is not a list of integers >= 0 without
            duplicates.
    """
    stripped = text.strip()
    if stripped.lower() in ("", "all"):
        return None
    devices: list[int] = []
    for part in stripped.split(","):
        item = part.strip()
        if not item.isdigit() or len(item) > 6:
            raise argparse.ArgumentTypeError(
                f"--devices takes comma-separated device indices such as 0,1 (or 'all'); "
                f"got {text!r}"
            )
        devices.append(int(item))
    if len(set(devices)) != len(devices):
        raise argparse.ArgumentTypeError(f"--devices lists a device twice: {text!r}")
    return devices


def parse_size_arg(text: str) -> int:
    """Parse a size argument such as ``4GiB``, ``512MiB``, ``8GB`` or a byte count.

    Uses :func:`accelplat._sizing.parse_size` (binary for ``KiB``/``K`` …, decimal for ``KB`` …).

    Raises:
        argparse.ArgumentTypeError: With the parser's explanation.
    """
    try:
        return parse_size(text.strip(), argument="size")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def seconds_arg(*, allow_zero: bool, maximum: float | None = None) -> Callable[[str], float]:
    """Return an argparse type for a finite number of seconds, ``> 0`` or ``>= 0``.

    Args:
        allow_zero: Whether ``0`` is accepted.
        maximum: The most seconds accepted, if bounded.
    """
    bound = ">= 0" if allow_zero else "> 0"
    if maximum is not None:
        bound = f"in {'[' if allow_zero else '('}0, {maximum:g}]"

    def parse(text: str) -> float:
        return _validate.number(
            text,
            "",
            minimum=0 if allow_zero else None,
            above=None if allow_zero else 0,
            maximum=maximum,
            expected=f"a finite number of seconds {bound}",
            not_a_number="a number of seconds",
            from_text=True,
            error=argparse.ArgumentTypeError,
        )

    return parse


def ratio_arg(text: str) -> float:
    """Parse a fraction in ``[0, 1]`` (``--threshold-ratio``, ``--min-free-ratio``).

    Raises:
        argparse.ArgumentTypeError: For anything else, quoting ``text``.
    """
    return _validate.number(
        text,
        "",
        minimum=0,
        maximum=1,
        expected="a fraction in [0, 1]",
        from_text=True,
        error=argparse.ArgumentTypeError,
    )


def count_arg(*, minimum: int, maximum: int | None = None, what: str) -> Callable[[str], int]:
    """Return an argparse type for a whole number (ASCII digits) in ``minimum..maximum``.

    Args:
        minimum: The smallest accepted count.
        maximum: The largest accepted count, if bounded.
        what: Words for what is accepted, e.g. ``"a number of devices >= 1"``.
    """

    def parse(text: str) -> int:
        return _validate.integer(
            text,
            "",
            minimum=minimum,
            maximum=maximum,
            expected=what,
            from_text=True,
            error=argparse.ArgumentTypeError,
        )

    return parse

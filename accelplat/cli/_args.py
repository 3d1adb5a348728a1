"""Argument types shared by the sub-commands (``type=`` callables for argparse)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from accelplat import _validate
from accelplat.sizing import parse_size

__all__ = ["parse_devices", "parse_size_arg", "seconds_arg"]


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

    Uses :func:`accelplat.sizing.parse_size` (binary for ``KiB``/``K`` …, decimal for ``KB`` …).

    Raises:
        argparse.ArgumentTypeError: With the parser's explanation.
    """
    try:
        return parse_size(text.strip(), argument="size")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def seconds_arg(*, allow_zero: bool) -> Callable[[str], float]:
    """Return an argparse type for a finite number of seconds, ``> 0`` or ``>= 0``.

    Args:
        allow_zero: Whether ``0`` is accepted.
    """
    bound = ">= 0" if allow_zero else "> 0"

    def parse(text: str) -> float:
        return _validate.number(
            text,
            "",
            minimum=0 if allow_zero else None,
            above=None if allow_zero else 0,
            expected=f"a finite number of seconds {bound}",
            not_a_number="a number of seconds",
            from_text=True,
            error=argparse.ArgumentTypeError,
        )

    return parse

"""Human-readable formatting shared by the command line and error messages."""

from __future__ import annotations

import math

__all__ = ["format_bytes"]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: int | float | None) -> str:
    """Format a byte count with a binary unit, e.g. ``format_bytes(1536 * 1024**2) == "1.50 GiB"``.

    Args:
        n: Bytes; ``None`` or a non-finite value formats as ``"?"``.

    Returns:
        The count with two decimals in the largest unit that keeps it ≥ 1 (bytes are whole).
    """
    if n is None or not math.isfinite(n):
        return "?"
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    unit = 0
    while value >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{sign}{int(value)} B"
    return f"{sign}{value:.2f} {_UNITS[unit]}"

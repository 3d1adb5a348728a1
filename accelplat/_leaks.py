"""The one definition of a device-memory leak, shared by the leak check and the timeline.

A test leaks on a device when ``held_after - before`` (used bytes once memory had its chance to
come back, less those as it began) is **more than** the tolerance. Both plugin options judge
with :func:`is_leak` and one ``--accelplat-leak-tolerance``, so they give the same verdict.
"""

from __future__ import annotations

from accelplat._types import MIB
from accelplat._validate import parse_size

# allocator slack and runtime workspaces stay under it, a forgotten model or KV cache does not
DEFAULT_LEAK_TOLERANCE_BYTES = 256 * MIB
MAX_LEAK_TOLERANCE_BYTES = 2**63 - 1  # a signed 64-bit count, like every size in a trace


def leaked_bytes(before: int | None, held_after: int | None) -> int | None:
    """Return ``held_after - before`` (negative: the test freed memory); ``None`` if unknown."""
    if before is None or held_after is None:
        return None
    return held_after - before


def is_leak(before: int | None, held_after: int | None, tolerance_bytes: int) -> bool:
    """Return whether the growth is known and strictly above ``tolerance_bytes``."""
    grown = leaked_bytes(before, held_after)
    return grown is not None and grown > tolerance_bytes


def parse_leak_tolerance(text: str | int, *, argument: str) -> int:
    """Parse a leak tolerance (``"256MiB"`` or bytes) with the one size grammar (parse_size)."""
    if isinstance(text, str):
        text = text.strip()
    return parse_size(text, argument=argument, maximum=MAX_LEAK_TOLERANCE_BYTES)

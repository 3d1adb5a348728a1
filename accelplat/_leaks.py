"""The one definition of a device-memory leak, shared by the leak check and the timeline.

A test **leaks** on a device when the memory it still holds after the test, once memory has had
its chance to come back, exceeds what it held before by **more than** the tolerance::

    leaked = held_after - before
    leak   = leaked > tolerance        # exclusive: growth of exactly the tolerance is not a leak

``--accelplat-leak-check`` and ``--accelplat-timeline`` both judge with :func:`is_leak` and one
tolerance (``--accelplat-leak-tolerance``), so a test gets the same verdict from either.
"""

from __future__ import annotations

from accelplat._types import MIB
from accelplat._validate import parse_size

DEFAULT_LEAK_TOLERANCE_BYTES = 256 * MIB
"""Growth across one test that is not a leak: allocator slack and runtime workspaces stay under
it, a forgotten model or KV cache does not."""

MAX_LEAK_TOLERANCE_BYTES = 2**63 - 1
"""The largest tolerance accepted (a signed 64-bit count, like every size in a trace)."""


def leaked_bytes(before: int | None, held_after: int | None) -> int | None:
    """Return what a test left held on a device: ``held_after - before``.

    Args:
        before: Used bytes as the test began; ``None`` if unknown.
        held_after: Used bytes once memory had its chance to come back; ``None`` if unknown.

    Returns:
        The growth in bytes (negative when the test freed memory), or ``None`` when either
        reading is unknown.
    """
    if before is None or held_after is None:
        return None
    return held_after - before


def is_leak(before: int | None, held_after: int | None, tolerance_bytes: int) -> bool:
    """Return whether a test leaked on a device: growth strictly above ``tolerance_bytes``.

    Args:
        before: Used bytes as the test began; ``None`` if unknown (never a leak).
        held_after: Used bytes once memory had its chance to come back; ``None`` if unknown.
        tolerance_bytes: Growth that is not a leak.

    Returns:
        ``True`` for a leak.
    """
    grown = leaked_bytes(before, held_after)
    return grown is not None and grown > tolerance_bytes


def parse_leak_tolerance(text: str | int, *, argument: str) -> int:
    """Parse a leak tolerance with the one size grammar (:func:`accelplat._validate.parse_size`).

    Args:
        text: A size such as ``"256MiB"``, or bytes.
        argument: The option's name, for the message.

    Returns:
        Bytes, at most :data:`MAX_LEAK_TOLERANCE_BYTES`.

    Raises:
        ConfigurationError: Naming ``argument``, for what is not a size or is too large.
    """
    if isinstance(text, str):
        text = text.strip()
    return parse_size(text, argument=argument, maximum=MAX_LEAK_TOLERANCE_BYTES)

"""Pure parsers of the vendors' visible-devices variables: no environment, no vendor library."""

from accelplat._util import shorten


def shown(value: str) -> str:
    """Return ``repr(value)`` for a message, shortened: a variable may hold 100 KB."""
    return shorten(repr(value))

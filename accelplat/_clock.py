"""Time sources for waits: the real clock, and the protocol a virtual one satisfies.

Waits read time and sleep only through a :class:`Clock`, so tests and the simulated platform can
substitute a virtual clock whose ``sleep`` advances time instantly. This module sits below both
:mod:`accelplat.memory` and the backends, which share it.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

__all__ = ["REAL_CLOCK", "Clock", "RealClock"]


@runtime_checkable
class Clock(Protocol):
    """A source of monotonic time that can also sleep.

    A clock may also offer ``time() -> float`` (wall-clock seconds since the epoch), used for
    :attr:`~accelplat.UsageSnapshot.wall_time`; without it :func:`time.time` is used.
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
"""The process's real clock."""

"""The simulated platform's virtual clock: sleeps advance time at once, deterministically."""

from __future__ import annotations

import threading

from accelplat import _validate


class SimulatedClock:
    """A thread-safe virtual clock: only :meth:`sleep` and :meth:`advance` move its time."""

    def __init__(self, start: float = 0.0, *, epoch: float = 1_700_000_000.0) -> None:
        self._now = _validate.number(start, "SimulatedClock start", expected="a finite number")
        epoch = _validate.number(epoch, "SimulatedClock epoch", expected="a finite number")
        self._offset = epoch - self._now
        self._lock = threading.Lock()  # for updates: reading one attribute is atomic
        self.sleeps: list[float] = []  # every duration passed to sleep(), in order (for tests)

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        """Return the virtual wall-clock time, ``epoch`` plus the time elapsed since ``start``."""
        return self._now + self._offset

    def sleep(self, seconds: float) -> None:
        """Advance virtual time by ``seconds`` and record it in :attr:`sleeps`."""
        self.advance(seconds)
        with self._lock:
            self.sleeps.append(float(seconds))

    def advance(self, seconds: float) -> None:
        """Move virtual time forward by ``seconds`` without recording a sleep."""
        step = _validate.number(seconds, "a sleep", minimum=0)
        with self._lock:
            self._now += step

    def __repr__(self) -> str:
        return f"SimulatedClock(now={self.monotonic():g})"

"""The simulated platform's virtual clock: sleeps advance time at once, deterministically."""

from __future__ import annotations

import threading

from accelplat import _validate


class SimulatedClock:
    """A virtual clock: :meth:`sleep` advances time instantly, so waits take no real time.

    Thread-safe; time only moves through :meth:`sleep` and :meth:`advance`.

    Args:
        start: The initial reading of :meth:`monotonic`.
        epoch: Wall-clock seconds (since 1970) that correspond to ``start``, for :meth:`time`.

    Raises:
        ConfigurationError: For non-finite ``start`` or ``epoch``.
    """

    def __init__(self, start: float = 0.0, *, epoch: float = 1_700_000_000.0) -> None:
        self._now = _validate.number(start, "SimulatedClock start", expected="a finite number")
        epoch = _validate.number(epoch, "SimulatedClock epoch", expected="a finite number")
        self._offset = epoch - self._now
        self._lock = threading.Lock()
        self.sleeps: list[float] = []
        """Every duration passed to :meth:`sleep`, in order (for tests)."""

    def monotonic(self) -> float:
        """Return the current virtual time."""
        with self._lock:
            return self._now

    def time(self) -> float:
        """Return the virtual wall-clock time, ``epoch`` plus the time elapsed since ``start``."""
        with self._lock:
            return self._now + self._offset

    def sleep(self, seconds: float) -> None:
        """Advance virtual time by ``seconds`` (finite, ``>= 0``) and record it in :attr:`sleeps`.

        Raises:
            ConfigurationError: For a negative, non-finite or non-numeric duration.
        """
        self.advance(seconds)
        with self._lock:
            self.sleeps.append(float(seconds))

    def advance(self, seconds: float) -> None:
        """Move virtual time forward by ``seconds`` (finite, ``>= 0``) without recording a sleep.

        Raises:
            ConfigurationError: For a negative, non-finite or non-numeric duration.
        """
        step = _validate.number(seconds, "a sleep", minimum=0)
        with self._lock:
            self._now += step

    def __repr__(self) -> str:
        return f"SimulatedClock(now={self.monotonic():g})"

"""The vendor boundary: the one place where a capture records, and a replay answers, the host.

Every seam (a vendor Python module, a ctypes library, a host file, a distribution's version, a
process's identity) asks here first. Normally nothing is installed and the seam answers live;
while :mod:`accelplat.replay` records or replays, an :class:`Interceptor` gets each question
with the live way of answering it, so the backends above run unchanged.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable
from typing import Any, Protocol, TypeVar, cast

T = TypeVar("T")

Loaded = tuple[Any, str, str]  # (module or library, reason, vendor error): None when unusable


class Interceptor(Protocol):
    """What a recorder or a replayer offers the seams; each method gets the live way to answer."""

    def call(self, channel: str, key: tuple[Hashable, ...], live: Callable[[], Any]) -> Any:
        """Answer ``key`` (JSON-able scalars) of ``channel``; ``live`` may raise ``OSError``."""
        ...

    def vendor(self, channel: str, live: Callable[[], Loaded]) -> Loaded:
        """Return the vendor module or library of ``channel``; ``live`` never raises."""
        ...


_lock = threading.Lock()
_active: Interceptor | None = None
_on_reset: list[Callable[[], None]] = []


def on_reset(forget: Callable[[], None]) -> Callable[[], None]:
    """Call ``forget`` (drops a cache of host answers; never raises) at each install; decorator."""
    _on_reset.append(forget)
    return forget


def install(interceptor: Interceptor | None) -> Interceptor | None:
    """Install ``interceptor`` (``None`` removes it) and call every :func:`on_reset` function.

    Returns the previous one.
    """
    global _active
    with _lock:
        previous, _active = _active, interceptor
    for forget in tuple(_on_reset):
        forget()
    return previous


def active() -> Interceptor | None:
    """Return the installed interceptor, or ``None`` when the host answers live."""
    return _active


def check() -> None:
    """Raise the ``failure`` of the installed interceptor (a replay that could not load)."""
    failure = getattr(_active, "failure", None)
    if isinstance(failure, BaseException):
        raise failure.with_traceback(None)


def call(channel: str, key: tuple[Hashable, ...], live: Callable[[], T]) -> T:
    """Answer a host question through the interceptor, or ``live()`` when none is installed."""
    interceptor = _active
    return live() if interceptor is None else cast(T, interceptor.call(channel, key, live))


def vendor(channel: str, live: Callable[[], Loaded]) -> Loaded:
    """Load a vendor module or library through the interceptor, or ``live()`` when none is."""
    interceptor = _active
    return live() if interceptor is None else interceptor.vendor(channel, live)


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

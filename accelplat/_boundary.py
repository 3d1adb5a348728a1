"""The vendor boundary: the one place where a capture records, and a replay answers, the host.

Everything accelplat learns about a machine crosses one of a few seams: a vendor Python module
(``pynvml``, ``amdsmi``), a vendor library driven through ctypes (the Level Zero loader), a host
file, an installed distribution's version, a process's identity. Each seam asks this module
first. Normally nothing is installed and the seam answers live at the cost of one global read.
While :mod:`accelplat.replay` records or replays a host, an :class:`Interceptor` installed here
gets each question together with the live way of answering it; the backends above run
unchanged, so a replayed host goes through the same code paths as a live one.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

Loaded = tuple[Any, str, str]
"""``(module or library, reason, vendor error)``: the object is ``None`` when it is unusable."""


class Interceptor(Protocol):
    """What a recorder or a replayer offers the seams.

    Every method receives the live way of answering, so a recorder can run it and keep the
    answer, and a replayer can ignore it.
    """

    def call(self, channel: str, key: tuple[Hashable, ...], live: Callable[[], Any]) -> Any:
        """Answer one question (a file read, a version, a process's identity).

        Args:
            channel: The seam, e.g. ``"file"``, ``"dist"``, ``"proc"``.
            key: The question within the channel (JSON-able scalars).
            live: Answers it on this host; may raise ``OSError`` and the like.
        """
        ...

    def vendor(self, channel: str, live: Callable[[], Loaded]) -> Loaded:
        """Return the vendor module or library to use, loading it as the seam would.

        Args:
            channel: ``"nvml"``, ``"amdsmi"`` (Python modules) or ``"levelzero"`` (ctypes).
            live: Loads the real one; returns ``(object, "", "")`` or, when it cannot be
                used, ``(None, reason, vendor_error_name)``. Never raises.

        Returns:
            The same shape: a recording proxy or a replayed stand-in in place of the object.
        """
        ...


_lock = threading.Lock()
_active: Interceptor | None = None
_on_reset: list[Callable[[], None]] = []


def on_reset(forget: Callable[[], None]) -> Callable[[], None]:
    """Call ``forget`` each time an interceptor is installed or removed.

    A module that caches what the host answered (a vendor session, the detected platform)
    registers the function that drops the cache, as with :func:`os.register_at_fork`, so the
    next question crosses the boundary again.

    Args:
        forget: Takes no argument; must not raise.

    Returns:
        ``forget`` (usable as a decorator).
    """
    _on_reset.append(forget)
    return forget


def install(interceptor: Interceptor | None) -> Interceptor | None:
    """Install ``interceptor`` for the whole process (``None`` removes it).

    Args:
        interceptor: The recorder or replayer, or ``None``.

    Returns:
        The interceptor installed before.

    Side effects:
        Every seam consults the new interceptor from its next question on; every function
        registered with :func:`on_reset` is called.
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


def call(channel: str, key: tuple[Hashable, ...], live: Callable[[], T]) -> T:
    """Answer a host question through the interceptor, or live when none is installed.

    Args:
        channel: The seam (``"file"``, ``"dist"``, ``"proc"`` …).
        key: The question within the channel.
        live: Answers it on this host.

    Returns:
        The live answer, or the recorded one while replaying.
    """
    interceptor = _active
    if interceptor is None:
        return live()
    result: T = interceptor.call(channel, key, live)
    return result


def vendor(channel: str, live: Callable[[], Loaded]) -> Loaded:
    """Load a vendor module or library through the interceptor, or live when none is installed.

    Args:
        channel: ``"nvml"``, ``"amdsmi"`` or ``"levelzero"``.
        live: Loads it (see :meth:`Interceptor.vendor`).

    Returns:
        ``(object, reason, vendor_error)``; the object is ``None`` when it cannot be used.
    """
    interceptor = _active
    if interceptor is None:
        return live()
    return interceptor.vendor(channel, live)


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

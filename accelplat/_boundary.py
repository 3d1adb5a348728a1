"""The vendor boundary: the one place where a capture records, and a replay answers, the host.

Everything accelplat learns about a machine crosses one of a few seams: a vendor Python module
(``pynvml``, ``amdsmi``), a vendor shared library driven through ctypes (the Level Zero loader),
a host file (sysfs, procfs, cgroup), an installed distribution's version, a process's identity.
Each seam asks this module first. Normally nothing is installed and the seam does the live work
itself at the cost of one global read. While :mod:`accelplat.replay` records a host (``accelplat
capture``) or replays one (``ACCELPLAT_REPLAY``, ``accelplat info --replay``), an
:class:`Interceptor` is installed here and the seams hand it their question together with the
live way of answering it; the backends above run unchanged, so a replayed host goes through the
same code paths as a live one.

``ACCELPLAT_REPLAY=bundle.tar.gz`` is honoured on the first question any seam asks (and at the
start of detection): :mod:`accelplat.replay` is then imported by name and installs the replay.

Side effects: none at import; no vendor library, no framework.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable, Hashable
from typing import Any, Protocol, TypeVar

__all__ = [
    "ENV_REPLAY",
    "Interceptor",
    "Loaded",
    "active",
    "call",
    "install",
    "uninstall",
    "vendor",
]

ENV_REPLAY = "ACCELPLAT_REPLAY"
"""Variable naming a capture bundle that this process answers from instead of the host."""

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
            channel: ``"nvml"``, ``"amdsmi"`` (Python modules) or ``"levelzero"`` (a ctypes
                library).
            live: Loads the real one; returns ``(object, "", "")`` or, when it cannot be
                used, ``(None, reason, vendor_error_name)``. Never raises.

        Returns:
            The same shape: a recording proxy or a replayed stand-in in place of the object.
        """
        ...


_lock = threading.Lock()
_active: Interceptor | None = None
_env_checked = False


def install(interceptor: Interceptor | None) -> Interceptor | None:
    """Install ``interceptor`` for the whole process (``None`` removes it).

    Args:
        interceptor: The recorder or replayer, or ``None``.

    Returns:
        The interceptor installed before.

    Side effects:
        Every seam consults the new interceptor from its next question on. Also marks
        ``ACCELPLAT_REPLAY`` as handled, so the variable is not applied on top.
    """
    global _active, _env_checked
    with _lock:
        previous = _active
        _active = interceptor
        _env_checked = True
    return previous


def uninstall() -> None:
    """Remove any interceptor: the seams answer live again."""
    install(None)


def active() -> Interceptor | None:
    """Return the installed interceptor, applying ``ACCELPLAT_REPLAY`` on the first call.

    Returns:
        The interceptor, or ``None`` when the host answers live.

    Raises:
        accelplat.errors.BundleError: When ``ACCELPLAT_REPLAY`` names a bundle that cannot be
            loaded (missing, malformed, a future format).
    """
    global _env_checked
    current = _active
    if current is not None or _env_checked:
        return current
    with _lock:
        if _env_checked:
            return _active
        path = os.environ.get(ENV_REPLAY, "").strip()
        if not path:
            _env_checked = True
            return None
    # Imported by name: the replay machinery sits above every seam that calls this.
    replay = importlib.import_module("accelplat.replay")
    replay.activate(path)
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
    interceptor = active()
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
    interceptor = active()
    if interceptor is None:
        return live()
    return interceptor.vendor(channel, live)


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

"""Classify the processes a driver says hold device memory.

A pid alone does not say whether the memory is ours, a child's, a stranger's, or a ghost the
driver still lists after the process died: what a CI log needs to say on a timeout.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from accelplat import _boundary
from accelplat._types import HolderState, MemoryHolder
from accelplat.errors import BackendError

if TYPE_CHECKING:
    import psutil


def classify_pid(pid: int) -> tuple[HolderState, str]:
    """Return what host ``pid`` is to this process (``CHILD``: a live descendant) and its name."""
    answer: object = _boundary.call("proc", ("classify", pid), lambda: _classify_live(pid))
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return HolderState.GONE, ""
    state, name = answer
    try:
        checked = HolderState(state)
    except ValueError:
        return HolderState.GONE, ""
    return checked, name if isinstance(name, str) else ""


def _classify_live(pid: int) -> tuple[HolderState, str]:
    import psutil

    if pid == os.getpid():
        return HolderState.SELF, _name(psutil.Process(pid))
    try:
        proc = psutil.Process(pid)
        status = proc.status()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError, OverflowError):
        return HolderState.GONE, ""
    name = _name(proc)
    if status == psutil.STATUS_ZOMBIE:
        return HolderState.ZOMBIE, name
    try:
        parents = proc.parents()
    except (psutil.Error, OSError):
        parents = []
    if any(p.pid == os.getpid() for p in parents):
        return HolderState.CHILD, name
    return HolderState.ALIVE, name


def _name(proc: psutil.Process) -> str:
    import psutil

    try:
        return str(proc.name())
    except (psutil.Error, OSError):
        return ""


_PID_MAX = 2**31 - 1  # pid_t is a signed 32-bit integer
_BYTES_MAX = 2**63 - 1  # above it, an unsigned counter wrapped (MAX_PLAUSIBLE_BYTES)


def driver_holder(
    platform: str, where: str, pid: object, used_bytes: object, *, not_available: int | None = None
) -> MemoryHolder:
    """Build a :class:`MemoryHolder` of a driver's process entry; ``BackendError`` if malformed."""
    if used_bytes is not None and used_bytes == not_available:
        used_bytes = None
    bad_pid = isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid <= _PID_MAX
    bad_used = used_bytes is not None and (
        isinstance(used_bytes, bool)
        or not isinstance(used_bytes, int)
        or not 0 <= used_bytes <= _BYTES_MAX
    )
    if bad_pid or bad_used:
        field = "pid" if bad_pid else "used memory"
        raise BackendError(
            platform,
            f"the driver listed a malformed process on {where}: {field} is "
            f"{(pid if bad_pid else used_bytes)!r:.80}",
            vendor_error="malformed process entry",
        )
    assert isinstance(pid, int)
    return make_holder(pid, used_bytes if isinstance(used_bytes, int) else None)


def make_holder(pid: int, used_bytes: int | None) -> MemoryHolder:
    """Return the :class:`MemoryHolder` of ``pid`` (classified) holding ``used_bytes``."""
    state, name = classify_pid(pid)
    return MemoryHolder(pid=pid, used_bytes=used_bytes, state=state, name=name)


def process_details(pid: int, *, width: int = 200) -> tuple[str, str]:
    """Return ``(user, command line)`` of ``pid`` (``""`` when unreadable), cut to ``width``."""
    import psutil

    try:
        proc = psutil.Process(pid)
    except (psutil.Error, ValueError, OverflowError):
        return "", ""
    try:
        user = str(proc.username())
    except (psutil.Error, OSError, KeyError):
        user = ""
    try:
        command = " ".join(proc.cmdline()) or _name(proc)
    except (psutil.Error, OSError):
        command = _name(proc)
    command = "".join(c if c.isprintable() else "?" for c in command)
    if len(command) > width:
        command = command[: width - 1] + "…"
    return user, command

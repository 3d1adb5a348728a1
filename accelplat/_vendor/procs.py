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
    """Return what ``pid`` (a host pid, as a driver reports it) is to this process, and its name.

    Returns:
        ``(state, name)``: ``SELF``, ``CHILD`` (a live descendant), ``ZOMBIE`` (exited, unreaped),
        ``ALIVE`` (any other live process) or ``GONE`` (not visible; ``name`` is ``""``).

    Side effects:
        Reads ``/proc`` through psutil, asked through the vendor boundary (a replay answers).
    """
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
    me = os.getpid()
    if any(p.pid == me for p in parents):
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
    """Build a :class:`MemoryHolder` from one process entry a driver returned, checking it.

    Args:
        platform: The platform's name, for the error.
        where: The device, for the error.
        pid: The entry's process id.
        used_bytes: Its memory in bytes, or ``None`` when the driver does not say.
        not_available: The driver's "value not available" marker for ``used_bytes`` (NVML's is
            2**64 - 1), read as ``None``.

    Raises:
        BackendError: For a process id that is not a positive integer of a ``pid_t``, or a
            byte count that is not an integer in ``[0, 2**63 - 1]``; the message shows the entry.
    """
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
    """Return the user and the command line of ``pid``, for people reading a holder list.

    Args:
        pid: A process id.
        width: Longest command line returned (longer ones end in ``…``).

    Returns:
        ``(user, command)``; an item that cannot be read (gone, another namespace, denied) is
        ``""``.
    """
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

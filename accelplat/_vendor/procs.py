"""Classify the processes a driver says hold device memory.

A pid alone does not say whether the memory is ours, a child's, a stranger's, or a ghost the
driver still lists after the process died: what a CI log needs to say on a timeout.
"""

from __future__ import annotations

import contextlib
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
    with contextlib.suppress(ValueError):  # a replay's answer may be anything
        if isinstance(answer, (tuple, list)) and len(answer) == 2:
            state, name = answer
            return HolderState(state), name if isinstance(name, str) else ""
    return HolderState.GONE, ""


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
    ours = False
    with contextlib.suppress(psutil.Error, OSError):
        ours = any(p.pid == os.getpid() for p in proc.parents())
    if ours:
        _seen.add(pid)  # a descendant, even an unreaped one: its memory stays ours once it is gone
    if status == psutil.STATUS_ZOMBIE:
        return HolderState.ZOMBIE, name
    return (HolderState.CHILD if ours else HolderState.ALIVE), name


# Pids seen as descendants of this process: a child that exited but whose memory the driver still
# lists (a killed engine, a dead parent whose fork()ed child keeps its memory) stays ours by them.
_seen: set[int] = set()
_SEEN_MAX = 65536  # a long session that starts many children forgets the oldest half


def descendants(pid: int | None = None) -> frozenset[int]:
    """Return the live descendants of ``pid`` (``None``: this process), zombies included.

    Each is remembered as this process's own when ``pid`` is this process or one of its
    descendants (see :func:`was_ours`). Returns an empty set where ``pid`` is gone.
    """
    target = os.getpid() if pid is None else pid
    answer: object = _boundary.call("proc", ("descendants", target), lambda: _descendants(target))
    if not isinstance(answer, (list, tuple)):  # a replay that was not told: none
        return frozenset()
    found = frozenset(p for p in answer if isinstance(p, int) and not isinstance(p, bool))
    if target == os.getpid() or target in _seen:
        remember(found)
    return found


def _descendants(pid: int) -> list[int]:
    import psutil

    with contextlib.suppress(psutil.Error, OSError, ValueError, OverflowError):
        return sorted(p.pid for p in psutil.Process(pid).children(recursive=True))
    return []


def remember(pids: frozenset[int] | set[int]) -> None:
    """Note ``pids`` as descendants of this process (see :func:`was_ours`)."""
    if len(_seen) + len(pids) > _SEEN_MAX:
        _seen.difference_update(sorted(_seen)[: len(_seen) // 2])
    _seen.update(pids)


def was_ours(pid: int) -> bool:
    """Whether ``pid`` was seen as a descendant of this process (a later stranger may reuse it)."""
    return pid in _seen


# The kernel's initial pid namespace has this fixed inode (PROC_PID_INIT_INO, include/linux/
# proc_ns.h); /proc/self/ns/pid names another in a container with its own pid namespace.
_INIT_PID_NAMESPACE = "pid:[4026531836]"


def foreign_pid_namespace() -> bool:
    """Whether this process runs in a pid namespace of its own (a container's).

    Drivers report host pids (NVML, KFD, Level Zero have no pid-namespace support), which then
    name no process here, or the wrong one. ``False`` where it cannot be told (not Linux).
    """
    return _boundary.call("proc", ("pid-namespace",), _pid_namespace_live) is True


def _pid_namespace_live() -> bool:
    with contextlib.suppress(OSError):
        return os.readlink("/proc/self/ns/pid") != _INIT_PID_NAMESPACE
    return False


if hasattr(os, "register_at_fork"):  # a forked child's descendants are not its parent's
    os.register_at_fork(after_in_child=_seen.clear)


def _name(proc: psutil.Process) -> str:
    import psutil

    with contextlib.suppress(psutil.Error, OSError):
        return str(proc.name())
    return ""


_PID_MAX = 2**31 - 1  # pid_t is a signed 32-bit integer
_BYTES_MAX = 2**63 - 1  # above it, an unsigned counter wrapped (MAX_PLAUSIBLE_BYTES)


def driver_holder(platform: str, where: str, pid: object, used_bytes: object) -> MemoryHolder:
    """Build a :class:`MemoryHolder` of a driver's process entry; ``BackendError`` if malformed."""
    if type(pid) is not int or not 0 < pid <= _PID_MAX:
        field, value = "pid", pid
    elif used_bytes is None or (type(used_bytes) is int and 0 <= used_bytes <= _BYTES_MAX):
        return make_holder(pid, used_bytes)
    else:
        field, value = "used memory", used_bytes
    why = f"the driver listed a malformed process on {where}: {field} is {value!r:.80}"
    raise BackendError(platform, why, vendor_error="malformed process entry")


def make_holder(pid: int, used_bytes: int | None) -> MemoryHolder:
    """Return the :class:`MemoryHolder` of ``pid`` (classified) holding ``used_bytes``."""
    state, name = classify_pid(pid)
    return MemoryHolder(pid=pid, used_bytes=used_bytes, state=state, name=name)


MAX_ARGS, MAX_ARG_CHARS = 256, 4096  # a command line read from /proc is untrusted: bounded


def process_details(pid: int) -> tuple[str, tuple[str, ...]]:
    """Return ``(user, argv)`` of ``pid`` (empty when unreadable; argv: its name at least).

    The argv is bounded: at most ``MAX_ARGS`` arguments (then ``"…"``), each cut to
    ``MAX_ARG_CHARS`` (then ``…``), and characters that are not printable read ``?``.
    """
    import psutil

    try:  # what access denies (another user's process, a zombie) reads None
        info = psutil.Process(pid).as_dict(["username", "cmdline", "name"], ad_value=None)
    except (psutil.Error, OSError, ValueError, OverflowError):
        return "", ()
    user = str(info["username"] or "")
    argv = [str(a) for a in (info["cmdline"] or [])[: MAX_ARGS + 1]]
    if not argv and info["name"]:  # a kernel thread, a zombie, or too little permission
        argv = [str(info["name"])]
    if len(argv) > MAX_ARGS:
        argv = [*argv[:MAX_ARGS], "…"]
    cut = (a if len(a) <= MAX_ARG_CHARS else a[: MAX_ARG_CHARS - 1] + "…" for a in argv)
    return user, tuple("".join(c if c.isprintable() else "?" for c in a) for a in cut)

"""The queue: waiting requests as ticket files, served by one order rule (the oldest first).

A lease that has to wait takes a ticket in ``queue/``: a holder document saying what it waits
for, named ``<platform>~<time_ns>~<pid>~<sequence>.ticket`` (its place in the queue) and locked
by its waiter before it appears under that name (a rename keeps the lock). A ticket nobody holds
is a waiter that died: the next reader removes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import re
import time
from pathlib import Path
from typing import NamedTuple

from accelplat._leasing._locks import LeaseRecord, create, describe, held, read_holder, unlock
from accelplat._util import format_bytes

QUEUE_DIR = "queue"
_TICKET = re.compile(r"([A-Za-z0-9_.-]{1,64})~([0-9]{1,20})~([0-9]{1,7})~([0-9]{1,9})\.ticket")
_sequence = itertools.count()


def kept_free(ahead: LeaseRecord | None, total: int) -> int:
    """The order rule: the bytes of a device of ``total`` that a newer request must leave free.

    While an older request waits, a newer one may not take what it waits for: an older
    whole-device request keeps the whole device (a newer whole-device request waits; a newer
    share finds no room), an older share keeps its budget on each device. A large request is
    therefore never starved by a stream of small ones.
    """
    if ahead is None:
        return 0
    return total if ahead.budget_bytes is None else ahead.budget_bytes


def waiting(ahead: LeaseRecord) -> str:
    """Name an older request: who, and what it waits for."""
    budget = ahead.budget_bytes
    what = "whole devices" if budget is None else f"{format_bytes(budget)} on each device"
    return f"{describe(ahead)}, waiting for {what}"


class Ticket(NamedTuple):
    """A place in the queue; older ones (smaller ``order``, compared first) are served first."""

    order: tuple[int, int, int]  # time_ns of entry, pid, the pid's sequence number
    name: str  # its file's name (unique, so it never decides between two orders)


def enter(queue: Path, platform: str, doc: dict[str, object]) -> tuple[Ticket, int]:
    """Take a ticket saying ``doc``; return it and the descriptor holding its lock."""
    order = (time.time_ns(), os.getpid(), next(_sequence))
    name = f"{platform}~{order[0]}~{order[1]}~{order[2]}.ticket"
    tmp = queue / f".{name}.tmp"
    fd = create(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, json.dumps(doc).encode())
        os.rename(tmp, queue / name)
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return Ticket(order, name), fd


def leave(queue: Path, ticket: Ticket, fd: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(queue / ticket.name)
    unlock(fd)


def ahead_of(queue: Path, platform: str, mine: Ticket | None) -> LeaseRecord | None:
    """The oldest live request older than ``mine`` (any, when ``None``), or ``None``.

    Every name of ``queue`` is read (names that are no ticket of ``platform`` are passed over).
    A ticket whose lock cannot be opened (not made by this version, or planted) is passed over
    too: it could otherwise hold every newer request back for ever.
    """
    try:
        names = os.listdir(queue)
    except OSError:
        return None
    ours = [m for m in map(_TICKET.fullmatch, names) if m is not None and m[1] == platform]
    for ticket in sorted(Ticket((int(m[2]), int(m[3]), int(m[4])), m[0]) for m in ours):
        if mine is not None and ticket >= mine:
            return None
        state = held(queue / ticket.name)
        if state:
            return read_holder(queue / ticket.name)
        if state is False:  # its waiter died waiting: nobody will lock this name again
            with contextlib.suppress(OSError):
                os.unlink(queue / ticket.name)
    return None

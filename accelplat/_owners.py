"""The reading: devices' memory, the processes holding it and whose it is, from one sample.

:func:`sample` is the one sampler: every feature that reads a platform over time (the waits, the
leak check, the pack monitor, the timeline, ``stats``) takes its readings from it and judges them.
:func:`attribute` is the one rule that turns a driver's process list into an
:class:`~accelplat._types.Attribution`, saying plainly when it cannot (docs/memory.md, "Owners").
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence

from accelplat._platform import Platform, optional
from accelplat._types import (
    GIB,
    MIB,
    Attribution,
    HolderState,
    MemoryHolder,
    MemoryInfo,
    UsageSnapshot,
)
from accelplat._util import REAL_CLOCK, Clock
from accelplat._validate import number
from accelplat._vendor import procs
from accelplat.errors import AccelplatError

Reader = Callable[[int], MemoryInfo]  # reads one visible device (platform.memory_info)

NOT_AN_ACCELERATOR = "the {name} platform's memory is the host's: no process holds device memory"
NO_HOLDERS = "the {name} platform cannot list the processes holding memory on device {device}"
FOREIGN_NAMESPACE = (
    "this process runs in a pid namespace of its own (a container): the driver names holders by "
    "host pid, which match no process here"
)
UNLISTED = (
    "the driver lists holders of {listed} of the {used} used on device {device}: the rest is held "
    "by processes it does not list (in a container whose pid namespace hides them, NVML lists "
    "none)"
)
# Used memory no listed process accounts for, beyond the platform's idle floor, that still lets
# the list stand for the device: allocator slack, driver bookkeeping (vLLM's 512 MiB tolerance).
UNLISTED_SLACK_BYTES = 512 * MIB
BYTES_UNREPORTED = (
    "the driver lists the holders of device {device} but not their bytes (MIG without "
    "per-process accounting, or too little permission)"
)
_CONSISTENT_TRIES = 3  # counter and list read again at most this often when they disagree


def gib(n: int) -> str:
    """``n`` bytes as the waits' messages show them: ``8.51 GiB``."""
    return f"{n / GIB:.2f} GiB"


def default_clock(platform: object) -> Clock:
    """Return the platform's ``clock`` when it is a :class:`~accelplat._util.Clock`, else real."""
    candidate = optional(platform, "clock")
    return candidate if isinstance(candidate, Clock) else REAL_CLOCK


def unavailable_reason(platform: Platform, device: int) -> str:
    """Return why ``platform`` cannot attribute memory of ``device`` whatever it lists, or ``""``.

    Checked before asking for holders: the host CPU, and host pids seen from a pid namespace.
    """
    if not optional(platform, "is_accelerator"):
        return NOT_AN_ACCELERATOR.format(name=platform.name)
    if optional(platform, "holder_pids_are_host_pids") and procs.foreign_pid_namespace():
        return FOREIGN_NAMESPACE
    return ""


def running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie has closed its device files)."""
    return procs.classify_pid(pid)[0] in (HolderState.SELF, HolderState.CHILD, HolderState.ALIVE)


def is_ours(holder: MemoryHolder) -> bool:
    """Whether ``holder`` is a descendant of this process: alive, or exited and still listed."""
    if holder.state is HolderState.CHILD:
        return True
    return holder.state in (HolderState.ZOMBIE, HolderState.GONE) and procs.was_ours(holder.pid)


def attribute(
    platform: Platform,
    device: int,
    used: int,
    holders: Sequence[MemoryHolder] | None,
    *,
    reason: str | None = None,
) -> Attribution:
    """Split ``used`` bytes of ``device`` by owner from the driver's ``holders``.

    Args:
        platform: The platform the holders come from.
        device: The visible device index.
        used: The device's used bytes at the same sample.
        holders: What ``platform.memory_holders(device)`` returned (``None``: it cannot tell).
        reason: :func:`unavailable_reason` when already asked; ``None``: ask it here.

    Returns:
        The attribution; its ``reason`` says why not where the device-wide rules must apply.
    """
    why = unavailable_reason(platform, device) if reason is None else reason
    if not why and holders is None:
        why = optional(platform, "holders_note") or NO_HOLDERS.format(
            name=platform.name, device=device
        )
    listed = tuple(holders or ())
    if not why and any(h.used_bytes is None for h in listed):
        why = BYTES_UNREPORTED.format(device=device)
    if not why and _unexplained(platform, used, listed):
        held = sum(h.used_bytes or 0 for h in listed)
        why = UNLISTED.format(listed=gib(held), used=gib(used), device=device)
    self_bytes = sum(h.used_bytes or 0 for h in listed if h.state is HolderState.SELF)
    others = [h for h in listed if h.state is not HolderState.SELF]
    return Attribution(
        used=used,
        self_bytes=None if why else self_bytes,
        children=tuple(h for h in others if is_ours(h)),
        others=tuple(h for h in others if not is_ours(h)),
        reason=why,
    )


def sample(
    platform: Platform,
    devices: Iterable[int],
    *,
    read: Reader | None = None,
    holders: bool = True,
    clock: Clock | None = None,
    on_error: Callable[[int, Exception], None] | None = None,
    remember: bool = True,
) -> UsageSnapshot:
    """Read ``devices`` of ``platform`` once: the one sampler, and the only reader over time.

    With ``holders``, each device's process list and its attribution come with its memory,
    consistent with each other: the two are separate driver calls, and a co-tenant that frees
    memory between them leaves the list short of the counter, which :func:`attribute` would take
    for unlisted holders; so while the list leaves memory unexplained, the counter is read
    again, and if it moved, both are read anew.

    Args:
        platform: The platform to read.
        devices: Visible device indices, already checked.
        read: How to read one device's memory; ``None``: ``platform.memory_info``.
        holders: Also list the processes holding memory and say whose it is.
        clock: What stamps the reading; ``None``: :func:`default_clock` of the platform.
        on_error: Told ``(device, exception)`` of a device that could not be read, which the
            reading then leaves out; ``None``: the exception propagates.
        remember: With ``holders``, first note this process's descendants as its own (so that one
            that exits but stays listed stays ours): a walk of the process table, which a caller
            sampling many times a second does once, at its first reading.

    Returns:
        The reading (a :class:`~accelplat._types.UsageSnapshot`).

    Raises:
        ConfigurationError: For a clock that gives no finite number.
    """
    read = platform.memory_info if read is None else read
    if holders and remember and optional(platform, "is_accelerator"):
        procs.descendants()  # remember this process's children before one of them exits
    memory: dict[int, MemoryInfo] = {}
    held: dict[int, tuple[MemoryHolder, ...]] = {}
    owners: dict[int, Attribution] = {}
    for device in devices:
        try:
            info, found = read(device), None
            if holders:
                why, found = unavailable_reason(platform, device), _holders(platform, device)
                for _ in range(_CONSISTENT_TRIES if not why else 0):
                    # nothing listed: no co-tenant freed in between (a container reads once)
                    if not found or not _unexplained(platform, info.used, found):
                        break
                    again = read(device)
                    if abs(again.used - info.used) <= UNLISTED_SLACK_BYTES:
                        break  # the counter stood still: the unexplained memory is real
                    info, found = again, _holders(platform, device)
                owners[device] = attribute(platform, device, info.used, found, reason=why)
        except Exception as exc:  # the timeline's sampler must never break what it watches
            if on_error is None:
                raise
            on_error(device, exc)
            continue
        memory[device] = info
        if found is not None:
            held[device] = tuple(found)
    clock = default_clock(platform) if clock is None else clock
    stamp = number(clock.monotonic(), "clock.monotonic()")
    wall = getattr(clock, "time", None)  # the simulated clock has a virtual wall time
    wall_time = number(wall(), "clock.time()") if callable(wall) else time.time()
    return UsageSnapshot(stamp, wall_time, memory, held, owners)


def _unexplained(platform: Platform, used: int, holders: Sequence[MemoryHolder]) -> bool:
    held = sum(h.used_bytes or 0 for h in holders)
    return used - held > platform.release.idle_floor_bytes + UNLISTED_SLACK_BYTES


def _holders(platform: Platform, device: int) -> Sequence[MemoryHolder] | None:
    try:
        return platform.memory_holders(device)
    except AccelplatError:  # holders are attribution; a failing list reads the device whole
        return None


def held_by_tree(holders: Sequence[MemoryHolder], root_pid: int) -> int:
    """Return the bytes the driver lists for ``root_pid`` and its live descendants.

    For this process the holders' own classification counts (itself and its running
    descendants), with no walk of the process table; for another, its descendants are read now.
    An exited process still listed is no one's use: the share rule counts its memory beside the
    promises, not inside the budget of the lease it once ran under.
    """
    if root_pid == os.getpid():
        mine = (h for h in holders if h.pid == root_pid or h.state is HolderState.CHILD)
        return sum(h.used_bytes or 0 for h in mine)
    tree = procs.descendants(root_pid) | {root_pid}
    return sum(h.used_bytes or 0 for h in holders if h.pid in tree)

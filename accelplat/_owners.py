"""Whose device memory it is: this process (its context included), its descendants, others.

The one rule that turns a driver's process list into an :class:`~accelplat._types.Attribution`,
and says plainly when it cannot (docs/memory.md, "Owners"). Waits and the leak rule read it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

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
from accelplat._vendor import procs
from accelplat.errors import AccelplatError

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

# States of a holder that are this process's own without more ado (SELF is this process).
_CHILD_STATES = frozenset({HolderState.CHILD})
_EXITED_STATES = frozenset({HolderState.ZOMBIE, HolderState.GONE})


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def unavailable_reason(platform: Platform, device: int) -> str:
    """Return why ``platform`` cannot attribute memory of ``device`` whatever it lists, or ``""``.

    Checked before asking for holders: the host CPU, and host pids seen from a pid namespace.
    """
    if not optional(platform, "is_accelerator"):
        return NOT_AN_ACCELERATOR.format(name=platform.name)
    if optional(platform, "holder_pids_are_host_pids") and procs.foreign_pid_namespace():
        return FOREIGN_NAMESPACE
    return ""


def is_ours(holder: MemoryHolder) -> bool:
    """Whether ``holder`` is a descendant of this process: alive, or exited and still listed."""
    if holder.state in _CHILD_STATES:
        return True
    return holder.state in _EXITED_STATES and procs.was_ours(holder.pid)


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
        why = UNLISTED.format(listed=_gib(held), used=_gib(used), device=device)
    self_bytes = sum(h.used_bytes or 0 for h in listed if h.state is HolderState.SELF)
    children = tuple(h for h in listed if h.state is not HolderState.SELF and is_ours(h))
    others = tuple(h for h in listed if h.state is not HolderState.SELF and not is_ours(h))
    return Attribution(
        used=used,
        self_bytes=None if why else self_bytes,
        children=children,
        others=others,
        reason=why,
    )


class OwnedReading:
    """Reads a device as the settle wait on ``owners="ours"`` sees it, keeping the real sample.

    Called as a wait's ``read``: the bytes of this process and its descendants, where the first
    sample of the device attributes its memory; else the device whole (``fallback`` says why).
    :class:`ReleaseReading` reads what given processes hold instead.
    """

    def __init__(self, platform: Platform, devices: Sequence[int], *, decide: bool = False) -> None:
        self.platform = platform
        self.devices = tuple(devices)
        self.fallback: dict[int, str] = {}
        self.decided: set[int] = set()
        self.info: dict[int, MemoryInfo] = {}
        self.holders: dict[int, tuple[MemoryHolder, ...]] = {}
        self.attribution: dict[int, Attribution] = {}
        if decide:  # now, rather than at each device's first sample
            for device in self.devices:
                self.observe(device)

    def _decide(self, device: int, used: int, found: Sequence[MemoryHolder] | None) -> None:
        """Read ``device`` whole from now on unless its first sample attributes it."""
        self.decided.add(device)
        why = unavailable_reason(self.platform, device)
        if not why:
            why = attribute(self.platform, device, used, found, reason="").reason
            if why == BYTES_UNREPORTED.format(device=device):
                why = ""  # the list still names the holders: a wait on them holds
        if why:
            self.fallback[device] = why

    def observe(self, device: int) -> tuple[MemoryInfo, Attribution]:
        """Sample ``device``: its memory and, unless it is read whole, its holders."""
        info = self.platform.memory_info(device)
        why = self.fallback.get(device)
        found = None
        if not why:
            reading, found = read_owned(self.platform, device, info)
            assert isinstance(reading, MemoryInfo)
            info = reading
        self.info[device] = info
        if device not in self.decided:
            self._decide(device, info.used, found)
            why = self.fallback.get(device)
        if found is not None:
            self.holders[device] = tuple(found)
        else:
            self.holders.pop(device, None)
        attribution = attribute(self.platform, device, info.used, found, reason=why or "")
        self.attribution[device] = attribution
        return info, attribution

    def __call__(self, device: int) -> MemoryInfo:
        info, attribution = self.observe(device)
        ours = attribution.ours_bytes
        if ours is None:
            return info
        return dataclasses.replace(info, used=ours, source=f"{info.source}, ours")

    def real(self, synthetic: UsageSnapshot) -> UsageSnapshot:
        """Return ``synthetic`` (a wait's sample of this reader) with the real memory and owners."""
        return dataclasses.replace(
            synthetic,
            memory={d: self.info.get(d, m) for d, m in synthetic.memory.items()},
            holders=dict(self.holders),
            attribution=dict(self.attribution),
        )

    def others_note(self) -> str:
        """Name the co-tenants' memory a wait on ours did not wait for, per device; or ``""``."""
        parts = [
            f"device {d}: {a.describe()}"
            for d, a in sorted(self.attribution.items())
            if a.available and a.others
        ]
        fell = [f"device {d} judged whole: {why}" for d, why in sorted(self.fallback.items())]
        return "; ".join([*(f"not waited for, {p}" for p in parts), *fell])


_CONSISTENT_TRIES = 3


def read_owned(
    platform: Platform, device: int, used: int | MemoryInfo | None = None
) -> tuple[MemoryInfo | int, Sequence[MemoryHolder] | None]:
    """Read ``device``'s memory (unless given) and its holders, consistent with each other.

    The two are separate driver calls: a co-tenant that frees memory between them leaves the
    list short of the counter, which :func:`attribute` would take for unlisted holders. When the
    list leaves memory unexplained, the counter is read again; if it moved, both are read anew.

    Returns:
        The reading the holders go with (``used`` as given, or a newer ``MemoryInfo``), and the
        holders (``None``: the platform cannot tell).
    """
    now: MemoryInfo | int = platform.memory_info(device) if used is None else used
    found = _holders(platform, device)
    for _ in range(_CONSISTENT_TRIES):
        # nothing listed: no co-tenant freed in between (the container case reads once)
        if not found or not _unexplained(platform, _used(now), found):
            break
        again = platform.memory_info(device)
        if abs(again.used - _used(now)) <= UNLISTED_SLACK_BYTES:
            break  # the counter stood still: the unexplained memory is real
        now, found = again, _holders(platform, device)
    return now, found


def _used(reading: MemoryInfo | int) -> int:
    return reading.used if isinstance(reading, MemoryInfo) else reading


def _unexplained(platform: Platform, used: int, holders: Sequence[MemoryHolder]) -> bool:
    held = sum(h.used_bytes or 0 for h in holders)
    return used - held > platform.release.idle_floor_bytes + UNLISTED_SLACK_BYTES


def _holders(platform: Platform, device: int) -> Sequence[MemoryHolder] | None:
    try:
        return platform.memory_holders(device)
    except AccelplatError:  # holders are attribution; a failing list reads the device whole
        return None


class ReleaseReading(OwnedReading):
    """Reads, per device, what the processes ``pids`` still hold, for a wait on their release.

    Attributed devices: the bytes the driver lists for them (one byte for a listing without
    bytes), and on a lazy platform also the bytes of a holder the driver stopped listing until
    the device's used counter has fallen by them (``pending``): KFD removes a process's files
    before TTM frees its buffers, so the list moves before the counter. Devices read whole: while
    a process lives, more than ``total``; then the device's used bytes, which the wait's
    stability window watches settle.
    """

    def __init__(
        self, platform: Platform, devices: Sequence[int], pids: frozenset[int], *, lazy: bool
    ) -> None:
        super().__init__(platform, devices, decide=True)
        self.pids = pids
        self.lazy = lazy
        self.listed: dict[int, dict[int, int]] = {
            d: {
                h.pid: (h.used_bytes if h.used_bytes is not None else 1)
                for h in self.holders.get(d, ())
                if h.pid in pids
            }
            for d in self.devices
        }
        self.used_before: dict[int, int] = {d: i.used for d, i in self.info.items()}
        self.pending: dict[int, tuple[int, int]] = {}  # device: (bytes awaited, used before)
        self.running = self.alive() if self.fallback else frozenset()

    def alive(self) -> frozenset[int]:
        """The tracked processes that still run (zombies have closed their device files)."""
        return frozenset(p for p in self.pids if procs.classify_pid(p)[0] in _RUNNING)

    def outstanding(self, device: int) -> int:
        """Bytes still held by the tracked processes on ``device`` (attributed devices)."""
        info, _ = self.observe(device)
        now = {
            h.pid: (h.used_bytes if h.used_bytes is not None else 1)
            for h in self.holders.get(device, ())
            if h.pid in self.pids
        }
        before = self.listed[device]
        if self.lazy:
            vanished = sum(b for p, b in before.items() if p not in now)
            awaited, used_before = self.pending.get(device, (0, info.used))
            if vanished:
                previous = self.used_before.get(device, info.used)
                awaited, used_before = awaited + vanished, max(used_before, previous)
            fallen = used_before - info.used
            if awaited and fallen >= awaited - min(awaited // 10, _PENDING_SLACK):
                awaited = 0
            self.pending[device] = (awaited, used_before if awaited else info.used)
        self.listed[device] = now
        self.used_before[device] = info.used
        return sum(now.values()) + self.pending.get(device, (0, 0))[0]

    def __call__(self, device: int) -> MemoryInfo:
        if device == self.devices[0] and self.fallback:  # once per sample, devices in order
            self.running = self.alive()
        if device in self.fallback:
            info, _ = self.observe(device)
            if self.running:
                return dataclasses.replace(info, used=info.total + 1)
            return info
        held = self.outstanding(device)
        return dataclasses.replace(self.info[device], used=held, source="held by the processes")

    def still_holding(self) -> dict[int, list[MemoryHolder]]:
        """Per attributed device, the tracked processes the driver still lists."""
        return {
            d: [h for h in self.holders.get(d, ()) if h.pid in self.pids]
            for d in self.devices
            if d not in self.fallback
        }


_RUNNING = frozenset({HolderState.SELF, HolderState.CHILD, HolderState.ALIVE})
_PENDING_SLACK = 64 * MIB  # a lazily freed holder's bytes count back within this (or a tenth)


def held_by_tree(holders: Sequence[MemoryHolder], root_pid: int) -> int:
    """Return the bytes the driver lists for ``root_pid`` and its live descendants.

    For this process the holders' own classification counts (itself, its descendants, those
    that were), with no walk of the process table; for another, its descendants are read now.
    """
    if root_pid == os.getpid():
        return sum(h.used_bytes or 0 for h in holders if h.pid == root_pid or is_ours(h))
    tree = procs.descendants(root_pid) | {root_pid}
    return sum(h.used_bytes or 0 for h in holders if h.pid in tree)

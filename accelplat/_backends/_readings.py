"""One plausibility rule for the memory figures a driver reports, shared by every backend.

A driver that answers at all can still answer nonsense: an unsigned 64-bit counter that wrapped
below zero reads as about 16 EiB, a reserved size above the total makes "total less reserved"
negative, a user-mode driver can report more free memory than there is. None of these is a fact
about the device, and a wait that believed one would pass or fail for the wrong reason. Every
built-in backend passes its figures through :func:`checked_memory` before building a
:class:`~accelplat.MemoryInfo` (CUDA, ROCm, XPU, the CPU platform's host, cgroup and NUMA
figures, CUDA's host-unified memory and the simulated platform); what fails the rule is an
:class:`~accelplat.errors.ImplausibleReadingError` naming the figures. Figures are judged as the
source gave them, before anything else bounds them, so a clamp never hides an impossible one.

Creates no device context and imports no vendor library.
"""

from __future__ import annotations

from accelplat._types import MemoryInfo, memory_info_fast
from accelplat.errors import ImplausibleReadingError

__all__ = ["MAX_PLAUSIBLE_BYTES", "checked_memory", "implausible", "require_plausible"]

MAX_PLAUSIBLE_BYTES = 2**63 - 1
"""The largest byte count taken as real (8 EiB): above it, an unsigned counter has wrapped."""


def implausible(free: int, total: int, used: int, reserved: int = 0) -> str | None:
    """Return what is impossible about a reading, or ``None`` when it is plausible.

    The rule: every figure lies in ``[0, MAX_PLAUSIBLE_BYTES]``; ``total`` (what applications
    can use) is above zero; ``free`` and ``used`` are each at most ``total``.

    Args:
        free: Bytes free.
        total: Bytes usable by applications (already less ``reserved`` where that applies).
        used: Bytes in use.
        reserved: Bytes the driver keeps for itself.

    Returns:
        A phrase naming the first impossible figure, or ``None``.
    """
    for name, value in (("total", total), ("used", used), ("reserved", reserved)):
        why = _out_of_range(name, value)
        if why is not None:
            return why
    if total == 0:
        return "total is zero"
    if used > total:
        return "used exceeds total"
    why = _out_of_range("free", free)
    if why is not None:
        return why
    if free > total:
        return "free exceeds total"
    return None


def _out_of_range(name: str, value: int) -> str | None:
    if value < 0:
        return f"{name} is negative"
    if value > MAX_PLAUSIBLE_BYTES:
        return f"{name} is above 8 EiB (a wrapped-around unsigned counter)"
    return None


def require_plausible(
    platform: str,
    where: str,
    *,
    free: int,
    total: int,
    used: int,
    reserved: int = 0,
    source: str,
) -> None:
    """Check that these figures are possible, building nothing.

    For figures that are judged as read but not returned as they are (a host's own figures
    before a cgroup limit bounds them); :func:`checked_memory` checks and builds in one step.

    Args:
        platform: The platform's name, for the error.
        where: What was read, e.g. ``"cuda device 0 (GPU-…)"``, for the error.
        free: Bytes free.
        total: Bytes usable by applications.
        used: Bytes in use.
        reserved: Bytes the driver keeps for itself.
        source: ``MemoryInfo.source``, for the error.

    Raises:
        ImplausibleReadingError: When :func:`implausible` finds something impossible; the
            message names every figure and the source.

    Side effects:
        None; pure arithmetic (it sits on the polling path of every wait).
    """
    why = (
        None
        if 0 <= free <= total <= MAX_PLAUSIBLE_BYTES
        and 0 <= used <= total
        and 0 <= reserved <= MAX_PLAUSIBLE_BYTES
        and total > 0
        else implausible(free, total, used, reserved)
    )
    if why is not None:
        raise ImplausibleReadingError(
            platform,
            where,
            why,
            {"free": free, "total": total, "used": used, "reserved": reserved},
            source,
        )


def checked_memory(
    platform: str,
    where: str,
    *,
    free: int,
    total: int,
    used: int,
    reserved: int = 0,
    source: str,
) -> MemoryInfo:
    """Return a :class:`MemoryInfo` of these figures, after checking they are possible.

    Args:
        platform: The platform's name, for the error.
        where: What was read, e.g. ``"cuda device 0 (GPU-…)"``, for the error.
        free: Bytes free.
        total: Bytes usable by applications.
        used: Bytes in use.
        reserved: Bytes the driver keeps for itself.
        source: ``MemoryInfo.source``.

    Returns:
        The reading.

    Raises:
        ImplausibleReadingError: When :func:`implausible` finds something impossible; the
            message names every figure and the source.

    Side effects:
        None; pure arithmetic (it sits on the polling path of every wait).
    """
    require_plausible(
        platform, where, free=free, total=total, used=used, reserved=reserved, source=source
    )
    return memory_info_fast(free, total, used, reserved, source)

"""The one definition of a device-memory leak, shared by the leak check and the timeline.

A test leaks on a device when what :func:`judge` blames on it is **more than** the tolerance:
where memory is attributed per process, this process's growth beyond its first device context
plus what children started by the test still hold; elsewhere the device's growth (``held_after
- before``: used bytes once memory had its chance to come back, less those as it began). Both
plugin options judge with :func:`judge` and one ``--accelplat-leak-tolerance``, so they give
the same verdict (docs/pytest-plugin.md, "Leaks with blame").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from accelplat._owners import sample
from accelplat._platform import Platform, optional
from accelplat._types import GIB, MIB, Attribution, UsageSnapshot
from accelplat._validate import parse_size

# allocator slack and runtime workspaces stay under it, a forgotten model or KV cache does not
DEFAULT_LEAK_TOLERANCE_BYTES = 256 * MIB
MAX_LEAK_TOLERANCE_BYTES = 2**63 - 1  # a signed 64-bit count, like every size in a trace


def parse_leak_tolerance(text: str | int, *, argument: str) -> int:
    """Parse a leak tolerance (``"256MiB"`` or bytes) with the one size grammar (parse_size)."""
    if isinstance(text, str):
        text = text.strip()
    return parse_size(text, argument=argument, maximum=MAX_LEAK_TOLERANCE_BYTES)


# A device context's first use costs ~527 MiB on an H200 (CUDA 13, lazy module loading) and ~1 GiB
# on Intel's runtime; the first test that creates this process's context may own up to this much
# as "context" — beyond it, its growth is judged as any test's.
CONTEXT_ALLOWANCE_BYTES = 1 * GIB


@dataclass(frozen=True, slots=True)
class Holdings:
    """What one device held at one moment, as the leak rule reads it.

    Attributes:
        used: The device's used bytes.
        own: This process's bytes (its context included); ``None``: memory is not attributed.
        children: Bytes per pid of this process's descendants the driver lists.
        others: Bytes other processes hold; ``None``: not attributed.
        judged: ``False`` where memory is not the test's to leak (the host CPU's memory).
    """

    used: int
    own: int | None = None
    children: Mapping[int, int] = field(default_factory=dict)
    others: int | None = None
    judged: bool = True

    @classmethod
    def of(cls, owners: Attribution, *, used: int | None = None, judged: bool = True) -> Holdings:
        """Return the holdings an :class:`~accelplat._types.Attribution` describes.

        ``used``: the device's used bytes to judge it whole by (default: the attribution's).
        """
        used = owners.used if used is None else used
        if not owners.available:
            return cls(used, judged=judged)
        children = {h.pid: h.used_bytes or 0 for h in owners.children}
        return cls(used, owners.self_bytes, children, owners.others_bytes, judged)


@dataclass(frozen=True, slots=True)
class Blame:
    """The leak rule's verdict on one test and one device.

    Attributes:
        leaked: Bytes blamed on the test (negative: it freed memory); ``None``: not judged.
        context: Bytes of this process's device context, first seen in this test, not blamed.
        children: Bytes per pid of descendants new since the test began that still hold memory.
        others: How much co-tenants' memory changed during the test, not blamed; ``None``: unknown.
        attributed: ``True`` when judged by owner, ``False`` when judged on the whole device.
    """

    leaked: int | None
    context: int = 0
    children: Mapping[int, int] = field(default_factory=dict)
    others: int | None = None
    attributed: bool = False

    def is_leak(self, tolerance_bytes: int) -> bool:
        """Whether the blamed growth is known and strictly above ``tolerance_bytes``."""
        return self.leaked is not None and self.leaked > tolerance_bytes


def judge(before: Holdings, after: Holdings, context: int = 0) -> Blame:
    """The one leak rule: what a test is blamed for on one device, ``before`` to ``after`` it.

    Attributed: this process's growth less ``context`` (its first device context), plus what
    descendants new since ``before`` still hold; co-tenants' change is reported, not blamed.
    Not attributed: the device's growth less ``context``. Not judged (the host's memory): none.
    """
    if not (before.judged and after.judged):
        return Blame(None)
    if before.own is not None and after.own is not None:
        new = {p: b for p, b in after.children.items() if p not in before.children and b > 0}
        others = None
        if before.others is not None and after.others is not None:
            others = after.others - before.others
        leaked = after.own - before.own - context + sum(new.values())
        return Blame(leaked, context, new, others, attributed=True)
    return Blame(after.used - before.used - context, context)


def first_context(
    seen: set[int],
    device: int,
    before: Holdings,
    after: Holdings,
    allowance: int = CONTEXT_ALLOWANCE_BYTES,
) -> int:
    """Return the bytes of ``after.own`` that are this process's device context, seen first now.

    The first test after which this process holds memory of its own on ``device``, having held
    none before it, is given up to ``allowance`` bytes of it as "context"; a context present
    before the first judged test is given to no test. ``seen``: the devices decided so far, to
    which ``device`` is added once decided.
    """
    if device in seen or before.own is None or after.own is None:
        return 0
    if before.own > 0 or after.own > 0:
        seen.add(device)
    return min(after.own, allowance) if before.own <= 0 < after.own else 0


def holdings(
    platform: Platform, reading: UsageSnapshot, used: Mapping[int, int] | None = None
) -> dict[int, Holdings]:
    """Return what each device of ``reading`` held, by owner where the driver told.

    ``used``: each device's used bytes read at the same moment elsewhere (the timeline's), which
    the device-wide rule then judges; the host's memory is not judged.
    """
    judged = bool(optional(platform, "is_accelerator"))
    return {
        d: Holdings.of(a, used=None if used is None else used[d], judged=judged)
        for d, a in reading.attribution.items()
    }


def current_holdings(
    platform: Platform, used: Mapping[int, int] | None = None
) -> dict[int, Holdings]:
    """Return what every visible device holds now (:func:`holdings` of a reading taken now)."""
    return holdings(platform, sample(platform, range(platform.device_count())), used)
